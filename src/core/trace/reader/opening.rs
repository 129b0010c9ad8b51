//! The file a trace is read from: opened without blocking, a regular file, and a folder given
//! where a trace goes answered with the traces in it.

use std::fs::File;
use std::path::Path;

/// Opens `path` to be read as a trace (or a saved analysis, which goes where a trace goes):
/// without blocking (a FIFO named as a trace would stall the command until a writer came), and
/// only as a regular file. Where this process pins the traces it opens
/// ([`pin_opened_traces`]), a name opened before is the file it named then: opened again
/// through the descriptor kept (an offset of its own), not by its name, and not counted again.
pub fn open_named(path: &Path) -> std::io::Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(pinned) = pinned(path) {
        return Ok(pinned);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if let Ok(mut p) = PINNED.lock()
        && let Some(pins) = p.as_mut()
    {
        pins.opened += 1;
    }
    if meta.is_dir() {
        return Err(std::io::Error::other(folder_of_traces(path)));
    }
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file (a trace is one)"));
    }
    pin(path, &file, &meta);
    Ok((file, meta))
}

/// A trace's name as this process first opened it, the descriptor it opened (a copy, kept
/// open), and the file it was (device, inode).
struct Pinned {
    path: std::path::PathBuf,
    file: File,
    id: (u64, u64),
}

/// The traces this process pinned (`None`: it pins none, as a library reading what it is told
/// to). A command pins them: its parts read the file the first named, whatever is renamed
/// over the name meanwhile (a filter's check, the analysis, a replay's requests of a job's
/// trace). Process-wide as the descriptors it keeps are: the command's files, whichever of
/// its parts opens them.
static PINNED: std::sync::Mutex<Option<Pins>> = std::sync::Mutex::new(None);

/// The traces pinned, how many may be, and how many files were opened by their names.
struct Pins {
    kept: Vec<Pinned>,
    /// A quarter of the descriptors the process may have open (each pinned trace keeps one;
    /// the rest are for the traces being read, a core each, and what is written), at least 64;
    /// 256 under the usual limit of 1,024. The limit is not raised: `run`'s program inherits
    /// it. A job's further traces are opened by name each time.
    most: usize,
    /// Files opened by their names where a trace goes (a trace, its header alone, a saved
    /// analysis): a command opens each name once (`GPUSHIM_READS=1` says it; the tests count
    /// them).
    opened: u64,
}

/// From now on, each trace this process opens is pinned (see [`open_named`]).
pub fn pin_opened_traces() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit; RLIMIT_NOFILE is a constant of the platform.
    let most = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur / 4)
            .unwrap_or(usize::MAX)
            .clamp(64, 1 << 14),
        _ => 64,
    };
    if let Ok(mut p) = PINNED.lock() {
        p.get_or_insert(Pins {
            kept: Vec::new(),
            most,
            opened: 0,
        });
    }
}

/// Files this process opened by their names where a trace goes, since it began pinning them
/// (0 where it pins none).
pub fn opened_by_name() -> u64 {
    PINNED
        .lock()
        .ok()
        .and_then(|p| p.as_ref().map(|p| p.opened))
        .unwrap_or(0)
}

/// `path`'s file, pinned before: opened again through the kept descriptor and checked to be
/// the same file; `None` where not pinned (or not the same file, or not to be reopened).
fn pinned(path: &Path) -> Option<(File, std::fs::Metadata)> {
    use std::os::fd::AsRawFd;
    let (fd, id) = {
        let p = PINNED.lock().ok()?;
        let kept = p.as_ref()?.kept.iter().find(|k| k.path == path)?;
        (kept.file.as_raw_fd(), kept.id)
    };
    reopen(fd, id).ok().filter(|(_, meta)| meta.is_file())
}

/// The file open at descriptor `fd` of this process, opened anew (an offset of its own, at its
/// start) through `/proc/self/fd`, and checked to be file `id` (device, inode).
pub(super) fn reopen(
    fd: std::os::fd::RawFd,
    id: (u64, u64),
) -> std::io::Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::MetadataExt;
    let file = File::open(format!("/proc/self/fd/{fd}"))?;
    let meta = file.metadata()?;
    if (meta.dev(), meta.ino()) != id {
        return Err(std::io::Error::other(
            "the trace's descriptor names another file",
        ));
    }
    Ok((file, meta))
}

/// Keeps a copy of `file`'s descriptor (`meta` its metadata) for `path`, where this process
/// pins its traces and has room: a caller that opened and checked a trace its own way (`run`,
/// which believes only the file its program's process described) has the command read that
/// file under the name from then on.
pub fn pin(path: &Path, file: &File, meta: &std::fs::Metadata) {
    use std::os::unix::fs::MetadataExt;
    let Ok(mut p) = PINNED.lock() else {
        return;
    };
    // A name pinned before stays the file it was (the first the command opened).
    let Some(kept) = p
        .as_mut()
        .filter(|p| p.kept.len() < p.most && !p.kept.iter().any(|k| k.path == path))
        .map(|p| &mut p.kept)
    else {
        return;
    };
    if let Ok(copy) = file.try_clone() {
        kept.push(Pinned {
            path: path.to_path_buf(),
            file: copy,
            id: (meta.dev(), meta.ino()),
        });
    }
}

/// What a folder given as a trace is told: the traces in it (names ending `.trace`, at most a
/// few shown), so the command to run is at hand.
fn folder_of_traces(dir: &Path) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .take(100_000)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name())
                .filter(|n| n.as_encoded_bytes().ends_with(b".trace"))
                .map(|n| {
                    use std::os::unix::ffi::OsStrExt;
                    crate::fixedfmt::Escaped(dir.join(n).as_os_str().as_bytes()).to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    match names.len() {
        0 => "a folder, with no .trace file in it: name a trace file".into(),
        n => format!(
            "a folder: name the traces in it ({n}: {}{})",
            names[..n.min(SHOWN)].join(" "),
            if n > SHOWN { " ..." } else { "" }
        ),
    }
}
