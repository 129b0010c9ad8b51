//! The files the command writes and the files it trusts, in folders other users may share.
//!
//! Three rules, each held by `tests/hostile_folders.rs` (the security model is in
//! `docs/internals.md`, "Safe with anyone's files"):
//! - A folder is *trusted* when no other user can change what a name in it refers to: it and
//!   every folder above it are owned by this user or root, and none is writable by group or
//!   others, except a sticky folder above it (`/tmp`), where others may add names but never
//!   move or replace ours ([`trusted_folder`]). Names the command chooses itself (a picture's
//!   default name, the shim it writes out) go only into trusted folders.
//! - What the command writes appears whole and private: a new file (mode 0600, a random name,
//!   `O_EXCL`) in the same folder, renamed over the name when complete ([`write_whole`]). A
//!   rename replaces a link another user planted; it never writes through it.
//! - What the command reads because a process or a trace said so is opened without following
//!   a link and without blocking, must be a regular file of this user's, and is read up to a
//!   bound ([`read_own`]).

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a folder is not trusted, naming the folder that makes it so.
#[derive(Debug)]
pub enum Untrusted {
    /// It (or a folder above it) cannot be read (the system's reason).
    Io(PathBuf, io::Error),
    /// A folder on the way belongs to another user (its uid).
    Owner(PathBuf, u32),
    /// A folder on the way can be written by group or others (its mode).
    Open(PathBuf, u32),
    /// A name on the way is not a folder.
    NotFolder(PathBuf),
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Untrusted::Io(p, e) => write!(f, "cannot check {}: {e}", shown(p)),
            Untrusted::Owner(p, uid) => {
                write!(f, "{} belongs to another user (uid {uid})", shown(p))
            }
            Untrusted::Open(p, mode) => write!(
                f,
                "{} can be written by others (mode {:o})",
                shown(p),
                mode & 0o7777
            ),
            Untrusted::NotFolder(p) => write!(f, "{} is not a folder", shown(p)),
        }
    }
}

impl std::error::Error for Untrusted {}

/// A path as a message may print it: control characters, backslashes and bytes that are not
/// UTF-8 escaped (`\x1b`), so a file name cannot move the reader's terminal or split a line.
pub fn shown(p: &Path) -> crate::fixedfmt::Escaped<'_> {
    use std::os::unix::ffi::OsStrExt;
    crate::fixedfmt::Escaped(p.as_os_str().as_bytes())
}

/// The real user id of this process.
pub fn my_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// `dir` made absolute with every link resolved, if no other user can change what a name in it
/// refers to (see the module's rules); the path returned is the one checked, so using it
/// involves no link another user could swap.
pub fn trusted_folder(dir: &Path) -> Result<PathBuf, Untrusted> {
    checked_folder(dir, false)
}

/// `dir` made absolute with every link resolved, if no other user controls what is in it: as
/// [`trusted_folder`], except that `dir` itself may be a shared sticky folder (`/tmp`), where
/// others may add names but never move, replace or delete ours. A file the user names in such
/// a folder is theirs to name; a folder another user owns, or can change, is not.
pub fn others_control(dir: &Path) -> Result<PathBuf, Untrusted> {
    checked_folder(dir, true)
}

fn checked_folder(dir: &Path, sticky_last: bool) -> Result<PathBuf, Untrusted> {
    let canonical = dir
        .canonicalize()
        .map_err(|e| Untrusted::Io(dir.to_path_buf(), e))?;
    let me = my_uid();
    let mut at = PathBuf::new();
    let parts: Vec<_> = canonical.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at).map_err(|e| Untrusted::Io(at.clone(), e))?;
        if !meta.is_dir() {
            return Err(Untrusted::NotFolder(at));
        }
        if meta.uid() != me && meta.uid() != 0 {
            return Err(Untrusted::Owner(at, meta.uid()));
        }
        let last = i + 1 == parts.len();
        let sticky = meta.mode() & 0o1000 != 0;
        if meta.mode() & 0o022 != 0 && ((last && !sticky_last) || !sticky) {
            return Err(Untrusted::Open(at, meta.mode()));
        }
    }
    Ok(canonical)
}

/// Where a file the command names itself goes (a picture beside its trace): `beside`'s folder
/// when it is trusted, else the working folder when that is, else nowhere (`Err` says why and
/// what to do). A note on stderr says when the working folder was chosen.
pub fn default_output(beside: &Path, name: &str) -> Result<PathBuf, String> {
    let folder = match beside.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let why = match trusted_folder(folder) {
        Ok(f) => return Ok(f.join(name)),
        Err(why) => why,
    };
    match trusted_folder(Path::new(".")) {
        Ok(cwd) => {
            eprintln!(
                "gpushim: not writing beside the trace ({why}); writing into the working folder"
            );
            Ok(cwd.join(name))
        }
        Err(cwd_why) => Err(format!(
            "not writing beside the trace ({why}) nor into the working folder ({cwd_why}): \
             name the file with --output"
        )),
    }
}

/// Why a file could not be written.
#[derive(Debug)]
pub enum WriteError {
    /// The name is a folder.
    Folder(PathBuf),
    /// Writing, renaming or opening failed (the path, the system's reason).
    Io(PathBuf, io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Folder(p) => write!(f, "{} is a folder: name a file", shown(p)),
            WriteError::Io(p, e) if e.kind() == io::ErrorKind::PermissionDenied => write!(
                f,
                "cannot write {}: {e} (in a shared folder a name another user holds cannot be \
                 replaced: name another file)",
                shown(p)
            ),
            WriteError::Io(p, e) => write!(f, "cannot write {}: {e}", shown(p)),
        }
    }
}

impl std::error::Error for WriteError {}

/// Writes the file the user named `path` with what `fill` writes, so that it appears whole
/// and private (0600): into a new file beside it, renamed over `path` once complete. A link
/// at `path` is replaced, not written through, unless it is this user's or root's own link
/// (`/dev/stdout`, a link the user made). A name that is not a regular file (`/dev/null`, a
/// FIFO, a terminal) is written in place, as the user asked, only when it is this user's or
/// root's: another user's FIFO or device in a shared folder is refused, never written. It is
/// opened without blocking (a FIFO nobody reads is an error, not a hang) and checked on the
/// open descriptor, so nothing swapped in between is written.
pub fn write_whole<T>(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<T, WriteError> {
    let io = |e| WriteError::Io(path.to_path_buf(), e);
    let me = my_uid();
    let in_place = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io(e)),
        Ok(l) if l.file_type().is_symlink() && l.uid() != me && l.uid() != 0 => false,
        Ok(l) => match std::fs::metadata(path) {
            // A dangling link of the user's own: replaced like a missing file.
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(io(e)),
            Ok(m) if m.is_dir() => return Err(WriteError::Folder(path.to_path_buf())),
            Ok(m) => !m.is_file() || l.file_type().is_symlink(),
        },
    };
    if in_place {
        let f = open_in_place(path).map_err(io)?;
        let mut w = io::BufWriter::new(f);
        let out = fill(&mut w).map_err(io)?;
        w.flush().map_err(io)?;
        return Ok(out);
    }
    replace_whole(path, 0o600, fill)
}

/// Opens `path` to be written in place: without blocking (a FIFO with no reader answers at
/// once), then, on the descriptor itself, refused unless it is this user's or root's; a
/// regular file (reached through the user's own link) is emptied only after that check, and
/// the descriptor then blocks as a writer expects.
fn open_in_place(path: &Path) -> io::Result<File> {
    // Looked at first, so another user's FIFO is not even opened (its reader would see a
    // writer come and go); then again on the descriptor, against a swap in between.
    let owner = |uid: u32| {
        if uid == my_uid() || uid == 0 {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "it belongs to another user (uid {uid}), who would receive what is written: \
                 name a file of your own"
            )))
        }
    };
    owner(std::fs::metadata(path)?.uid())?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => io::Error::other(
                "a FIFO that nobody is reading: start its reader first, or name a file",
            ),
            _ => e,
        })?;
    let meta = f.metadata()?;
    owner(meta.uid())?;
    if meta.is_file() {
        f.set_len(0)?;
    }
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: fcntl on a descriptor this function owns; only the status flags change.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Writes what `fill` writes into a new file beside `path` (mode `mode`, a random name,
/// `O_EXCL`), and renames it over `path` once complete: whatever was at `path` (a file, a
/// link) is replaced, never written through, and nothing half-written is ever at `path`.
pub fn replace_whole<T>(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<T>,
) -> Result<T, WriteError> {
    use std::os::unix::fs::PermissionsExt;
    let io = |e| WriteError::Io(path.to_path_buf(), e);
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".gpushim-")
        .suffix(".part")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(folder)
        .map_err(io)?;
    let mut w = io::BufWriter::new(tmp);
    let out = fill(&mut w).map_err(io)?;
    let tmp = w.into_inner().map_err(|e| io(e.into_error()))?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(out)
}

/// Why a file named by a process or a trace was not read.
#[derive(Debug)]
pub enum ReadRefused {
    Io(io::Error),
    /// A FIFO, a device, a folder: not a regular file.
    NotRegular,
    /// A regular file of another user's (its uid).
    Owner(u32),
    /// Longer than the bound.
    TooLong(u64),
}

impl std::fmt::Display for ReadRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadRefused::Io(e) => write!(f, "{e}"),
            ReadRefused::NotRegular => f.write_str("not a regular file"),
            ReadRefused::Owner(uid) => write!(f, "it belongs to another user (uid {uid})"),
            ReadRefused::TooLong(n) => write!(f, "{n} bytes, more than expected"),
        }
    }
}

/// Opens `path` without following a link at its end and without blocking, as a regular file
/// of this user's: the file and its metadata, or why not.
pub fn open_own(path: &Path) -> Result<(File, std::fs::Metadata), ReadRefused> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(ReadRefused::Io)?;
    let meta = f.metadata().map_err(ReadRefused::Io)?;
    if !meta.is_file() {
        return Err(ReadRefused::NotRegular);
    }
    if meta.uid() != my_uid() {
        return Err(ReadRefused::Owner(meta.uid()));
    }
    Ok((f, meta))
}

/// The whole of a small file of this user's ([`open_own`]), at most `max` bytes.
pub fn read_own(path: &Path, max: u64) -> Result<Vec<u8>, ReadRefused> {
    use std::io::Read;
    let (f, meta) = open_own(path)?;
    if meta.len() > max {
        return Err(ReadRefused::TooLong(meta.len()));
    }
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out).map_err(ReadRefused::Io)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gpushim-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn a_folder_open_to_others_is_not_trusted_and_a_private_one_under_tmp_is() {
        let d = scratch("trust");
        assert_eq!(trusted_folder(&d).unwrap(), d.canonicalize().unwrap());
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(trusted_folder(&open), Err(Untrusted::Open(..))));
        // Below a folder open to others without the sticky bit: others can move it away.
        let inner = open.join("inner");
        std::fs::create_dir(&inner).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(trusted_folder(&inner), Err(Untrusted::Open(..))));
        // Sticky above: others can add names, not move ours.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(trusted_folder(&inner).is_ok());
        // But the sticky folder itself takes no name of ours.
        assert!(matches!(trusted_folder(&open), Err(Untrusted::Open(..))));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_planted_link_is_replaced_never_written_through() {
        let d = scratch("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let out = d.join("out.svg");
        // A link owned by this user counts as the user's own; a foreign one cannot be made
        // without a second user, so the rule is shown on a dangling link and on a file.
        std::os::unix::fs::symlink(d.join("absent"), &out).unwrap();
        write_whole(&out, |w| w.write_all(b"<svg/>")).unwrap();
        assert!(std::fs::symlink_metadata(&out).unwrap().is_file());
        assert!(!d.join("absent").exists());
        std::fs::remove_file(&out).unwrap();
        std::fs::write(&out, b"old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_whole(&out, |w| w.write_all(b"new")).unwrap();
        let meta = std::fs::symlink_metadata(&out).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "written private");
        assert_eq!(std::fs::read(&out).unwrap(), b"new");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        // Nothing half-written is left beside it.
        let left: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(matches!(
            write_whole(&d, |w| w.write_all(b"x")),
            Err(WriteError::Folder(_))
        ));
        // A device named by the user is written in place.
        write_whole(Path::new("/dev/null"), |w| w.write_all(b"x")).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(
            std::fs::symlink_metadata("/dev/null")
                .unwrap()
                .file_type()
                .is_char_device()
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_small_regular_files_of_this_user_are_read() {
        let d = scratch("read");
        let f = d.join("f");
        std::fs::write(&f, b"12345").unwrap();
        assert_eq!(read_own(&f, 5).unwrap(), b"12345");
        assert!(matches!(read_own(&f, 4), Err(ReadRefused::TooLong(5))));
        let link = d.join("l");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(matches!(read_own(&link, 5), Err(ReadRefused::Io(_))));
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_own(&fifo, 5), Err(ReadRefused::NotRegular)));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
