//! What a trace is opened with: its options, the path pattern (`%p`, `%h`, `%r`) and the
//! errors, said in words, without allocating.

use super::PATH_CAP;

/// What a trace is opened with. Everything is borrowed; nothing is copied to the heap.
pub struct OpenOptions<'a> {
    /// NUL-free path of the file to create.
    pub path: &'a [u8],
    pub pid: u32,
    pub rank: i32,
    pub host: &'a [u8],
    pub program: &'a [u8],
    /// NUL-separated arguments, as in `/proc/self/cmdline`.
    pub cmdline: &'a [u8],
    /// Settings of the program's libraries that the reports replay (`NAME=value`, NUL
    /// separated): PyTorch's allocator settings.
    pub env: &'a [u8],
    pub trace_max: u64,
    /// Lay the file out as a ring with a checkpoint area (see `format::ring`): the records
    /// wrap once a summarizer runs ([`super::Recorder::run_summarizer`]) instead of stopping
    /// at `trace_max`.
    pub ring: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenError {
    /// The trace is already open, or another thread is opening it.
    Busy,
    PathTooLong,
    /// `open` failed with this errno (`EEXIST` when the file exists: traces are never reused).
    Create(i32),
    /// The first chunk could not be reserved or mapped.
    Map(i32),
}

impl core::fmt::Display for OpenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            OpenError::Busy => write!(f, "the trace is already open"),
            OpenError::PathTooLong => write!(f, "the trace path is longer than {PATH_CAP} bytes"),
            OpenError::Create(e) => write!(f, "cannot create the file: {}", ErrnoText(*e)),
            OpenError::Map(e) => write!(f, "cannot reserve or map the file: {}", ErrnoText(*e)),
        }
    }
}

/// An errno value in words, or its number where it has none here (no allocation, unlike
/// `strerror_r` paths).
pub struct ErrnoText(pub i32);

impl core::fmt::Display for ErrnoText {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match errno_text(self.0) {
            Some(t) => f.write_str(t),
            None => write!(f, "system error (errno {})", self.0),
        }
    }
}

/// A short, static description of an errno value, if it has one here.
pub fn errno_text(e: i32) -> Option<&'static str> {
    Some(match e {
        libc::EEXIST => {
            "it already exists (traces are never overwritten; remove it or pick another GPUSHIM_TRACE)"
        }
        libc::EACCES | libc::EPERM => "permission denied",
        libc::ENOENT => "a directory in the path does not exist",
        libc::ENOSPC => "no space left on the device",
        libc::ELOOP => "the path is a symbolic link (refused)",
        libc::EROFS => "read-only file system",
        libc::ENOMEM => "out of memory",
        libc::EDQUOT => "disk quota exceeded",
        libc::ENAMETOOLONG => "a name in the path is too long",
        libc::ENOTDIR => "a component of the path is not a directory",
        libc::EISDIR => "the path is a directory",
        libc::EMFILE | libc::ENFILE => "too many open files",
        libc::ENXIO => "the path is a special file with nothing behind it",
        libc::ETXTBSY => "the file is busy",
        libc::EFBIG => "the file would be too large",
        libc::EINVAL => "the file system does not support this file",
        _ => return None,
    })
}

/// Expands a `GPUSHIM_TRACE` pattern into `out`: `%p` pid, `%h` host, `%r` rank, `%%` a percent
/// sign. Returns the length written.
pub fn expand_pattern(
    pattern: &[u8],
    pid: u32,
    host: &[u8],
    rank: i32,
    out: &mut [u8],
) -> Result<usize, PatternError> {
    let mut w = 0usize;
    let mut push = |w: &mut usize, b: &[u8]| -> Result<(), PatternError> {
        if *w + b.len() >= out.len() {
            return Err(PatternError::TooLong);
        }
        out[*w..*w + b.len()].copy_from_slice(b);
        *w += b.len();
        Ok(())
    };
    let mut num = [0u8; 24];
    let mut i = 0;
    while i < pattern.len() {
        let b = pattern[i];
        if b != b'%' {
            push(&mut w, &[b])?;
            i += 1;
            continue;
        }
        match pattern.get(i + 1) {
            Some(b'p') => push(&mut w, format_int(pid as i64, &mut num))?,
            Some(b'h') => push(&mut w, host)?,
            Some(b'r') => push(&mut w, format_int(rank.max(0) as i64, &mut num))?,
            Some(b'%') => push(&mut w, b"%")?,
            Some(&c) => return Err(PatternError::UnknownEscape(c)),
            None => return Err(PatternError::TrailingPercent),
        }
        i += 2;
    }
    if w == 0 {
        return Err(PatternError::Empty);
    }
    Ok(w)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatternError {
    UnknownEscape(u8),
    TrailingPercent,
    TooLong,
    Empty,
}

impl core::fmt::Display for PatternError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PatternError::UnknownEscape(c) => write!(
                f,
                "'%{}' is not a known escape (use %p pid, %h host, %r rank, %% percent)",
                *c as char
            ),
            PatternError::TrailingPercent => {
                write!(
                    f,
                    "the pattern ends in a lone '%' (write %% for a percent sign)"
                )
            }
            PatternError::TooLong => write!(f, "the expanded path is longer than {PATH_CAP} bytes"),
            PatternError::Empty => write!(f, "the pattern is empty"),
        }
    }
}

impl std::error::Error for PatternError {}

/// Formats `v` in decimal into `buf`, returning the digits.
pub fn format_int(v: i64, buf: &mut [u8; 24]) -> &[u8] {
    let neg = v < 0;
    let mut u = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        if u == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}
