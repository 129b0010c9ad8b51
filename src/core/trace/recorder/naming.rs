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
    /// The way to the trace's folder goes through a link that another user (this uid) owns:
    /// that user, not the one who named the path, decides where the trace lands.
    ForeignLink(u32),
    /// The way to the trace's folder goes through a link (the user's own) and lands in a
    /// folder that another user owns (`owner`), or that others can write without the sticky
    /// bit (`mode`), or below one: that user could replace the trace or what it is written
    /// into.
    LinkIntoOthers {
        owner: u32,
        mode: u32,
    },
}

impl core::fmt::Display for OpenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            OpenError::Busy => write!(f, "the trace is already open"),
            OpenError::PathTooLong => write!(f, "the trace path is longer than {PATH_CAP} bytes"),
            OpenError::Create(e) => write!(f, "cannot create the file: {}", ErrnoText(*e)),
            OpenError::Map(e) => write!(f, "cannot reserve or map the file: {}", ErrnoText(*e)),
            OpenError::ForeignLink(uid) => write!(
                f,
                "its folder is reached through a link another user (uid {uid}) owns, which \
                 decides where the trace lands: name a folder of your own in GPUSHIM_TRACE"
            ),
            OpenError::LinkIntoOthers { owner, mode } => write!(
                f,
                "its folder is reached through a link and lands in or below a folder that \
                 another user controls (owner uid {owner}, mode {mode:04o}), who could replace \
                 the trace: name a folder of your own in GPUSHIM_TRACE"
            ),
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

/// How many other names a trace tries when its name is taken.
pub const OTHER_NAMES: u32 = 16;

/// `path` with `.XXXXXXXX` (eight hex digits of `word`) before its `.trace` ending, or after
/// it when it has none: the name a trace takes when its own is already there (a file, a link,
/// a name someone made in advance in a shared folder). Its length, or `None` when it does not
/// fit `out`.
pub fn another_name(path: &[u8], word: u32, out: &mut [u8; PATH_CAP]) -> Option<usize> {
    const END: &[u8] = b".trace";
    let (stem, end) = match path.strip_suffix(END) {
        Some(stem) if !stem.ends_with(b"/") && !stem.is_empty() => (stem, END),
        _ => (path, &b""[..]),
    };
    let len = stem.len() + 9 + end.len();
    if len >= PATH_CAP {
        return None;
    }
    out[..stem.len()].copy_from_slice(stem);
    out[stem.len()] = b'.';
    for i in 0..8 {
        let digit = ((word >> (28 - 4 * i)) & 0xf) as u8;
        out[stem.len() + 1 + i] = if digit < 10 {
            b'0' + digit
        } else {
            b'a' + digit - 10
        };
    }
    out[stem.len() + 9..len].copy_from_slice(end);
    out[len] = 0;
    Some(len)
}

/// 32 bits no other user can guess: from the kernel's random source, else the clock mixed
/// with the process and thread ids (never blocks, never allocates).
pub fn unguessable_word() -> u32 {
    let mut w = [0u8; 4];
    // SAFETY: `w` is 4 writable bytes; GRND_NONBLOCK never waits for entropy.
    let n = unsafe { libc::getrandom(w.as_mut_ptr().cast(), 4, libc::GRND_NONBLOCK) };
    if n == 4 {
        return u32::from_le_bytes(w);
    }
    let t = super::clock_ns(libc::CLOCK_MONOTONIC);
    // SAFETY: getpid and gettid have no preconditions.
    let ids = unsafe { (libc::getpid() as u64) << 32 | libc::gettid() as u64 };
    let mixed = (t ^ ids).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 32) as u32
}

/// The owner of the first link on the way to `path`'s folder that belongs neither to this user
/// nor to root, if there is one: each leading part of the folder (`/tmp/tr`, then
/// `/tmp/tr/x`, ...) is looked at without following it. The user's own links and the system's
/// (`/home` on another disk) are followed as named; one planted by another user in a shared
/// folder is not. Allocates nothing.
pub fn foreign_link(path: &[u8]) -> Option<u32> {
    leading_parts(path, |st, me| {
        (st.st_mode & libc::S_IFMT == libc::S_IFLNK && st.st_uid != me && st.st_uid != 0)
            .then_some(st.st_uid)
    })
}

/// Where `path`'s folder is reached through any link (the user's own included), the owner and
/// mode of the first folder that another user controls from where it lands up to `/`: one
/// owned by neither this user nor root, or one that group or others can write without the
/// sticky bit (as `files::others_control` rules for `gpushim run`). A folder named as it is,
/// with no link on the way, is the user's choice and is not looked at. Each folder is looked
/// at by descriptor (`..` from the one below), so no link is followed twice; allocates nothing.
pub fn link_into_others(path: &[u8]) -> Option<(u32, u32)> {
    let end = path.iter().rposition(|&b| b == b'/')?;
    if end >= PATH_CAP {
        return None;
    }
    leading_parts(path, |st, _| {
        (st.st_mode & libc::S_IFMT == libc::S_IFLNK).then_some(0)
    })?;
    let mut folder = [0u8; PATH_CAP];
    folder.get_mut(..end)?.copy_from_slice(path.get(..end)?);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: `folder` is NUL-terminated at `end` (PATH_CAP > end, checked by the slice).
    let mut fd = unsafe { libc::open(folder.as_ptr().cast(), flags) };
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let mut found = None;
    // A path has fewer than PATH_CAP folders above it.
    for _ in 0..PATH_CAP {
        if fd < 0 {
            break;
        }
        // SAFETY: an all-zero stat is a valid value; fstat fills it for our open `fd`.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            break;
        }
        let open = st.st_mode & 0o022 != 0 && st.st_mode & 0o1000 == 0;
        if (st.st_uid != me && st.st_uid != 0) || open {
            found = Some((st.st_uid, st.st_mode & 0o7777));
            break;
        }
        // SAFETY: `fd` is an open folder; ".." is NUL-terminated.
        let up = unsafe { libc::openat(fd, c"..".as_ptr(), flags) };
        // SAFETY: as above, for `up` when it opened.
        let mut above: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `up` is checked before use; `above` is a valid out-pointer.
        let top = up < 0
            || unsafe { libc::fstat(up, &mut above) } != 0
            || (above.st_dev == st.st_dev && above.st_ino == st.st_ino);
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
        fd = up;
        if top {
            break;
        }
    }
    if fd >= 0 {
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
    }
    found
}

/// The first `Some` that `check` gives for a leading part of `path`'s folder (`/tmp/tr`,
/// then `/tmp/tr/x`, ...), each looked at with `lstat` (not followed), with this user's uid.
fn leading_parts(path: &[u8], check: impl Fn(&libc::stat, u32) -> Option<u32>) -> Option<u32> {
    let end = path.iter().rposition(|&b| b == b'/')?;
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    if end >= PATH_CAP {
        return None;
    }
    // The folder's path once; each leading part is ended in place by a NUL, then restored.
    let mut part = [0u8; PATH_CAP];
    part[..end].copy_from_slice(&path[..end]);
    for i in 1..=end {
        if (i < end && path[i] != b'/') || path[i - 1] == b'/' {
            continue;
        }
        let kept = part[i];
        part[i] = 0;
        // SAFETY: an all-zero stat is a valid value; lstat fills it.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `part` is NUL-terminated at `i`; `st` is a valid out-pointer.
        let rc = unsafe { libc::lstat(part.as_ptr().cast(), &mut st) };
        part[i] = kept;
        if rc != 0 {
            return None;
        }
        if let Some(v) = check(&st, me) {
            return Some(v);
        }
    }
    None
}
