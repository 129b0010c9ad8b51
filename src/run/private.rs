//! The folder of the user's alone where `gpushim run` keeps what it writes and later trusts (the
//! shim it preloads, the `sitecustomize` of `--pluggable`), and how a file there is believed.

use super::RunError;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` unless it holds them already, through a new file renamed into
/// place (never through a link another user made). What is there is believed only when it is
/// a regular file of this user's, reached without a link, with one name, written by no one
/// else, and byte for byte the same.
pub fn write_checked(path: &Path, bytes: &[u8], mode: u32) -> Result<(), RunError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    if let Ok((f, meta)) = crate::files::open_own(path)
        && meta.nlink() == 1
        && meta.mode() & 0o022 == 0
        && meta.len() == bytes.len() as u64
    {
        let mut held = Vec::with_capacity(bytes.len());
        if f.take(bytes.len() as u64 + 1)
            .read_to_end(&mut held)
            .is_ok()
            && held == bytes
        {
            return Ok(());
        }
    }
    crate::files::replace_whole(path, mode, |w| w.write_all(bytes)).map_err(|e| match e {
        crate::files::WriteError::Io(p, e) => RunError::Io(p, e),
        crate::files::WriteError::Folder(p) => {
            RunError::Io(p, std::io::Error::other("a folder of that name is there"))
        }
    })
}

/// A folder of this user's alone (mode 0700) for the files `gpushim run` writes and later
/// trusts: `$XDG_CACHE_HOME/gpushim`, `~/.cache/gpushim`, else `$XDG_RUNTIME_DIR/gpushim`. A
/// fixed name in a shared folder (`/tmp`) is not used: anyone could create it first and stop
/// every run of this user. A base is taken only when no other user can change what its path
/// names ([`crate::files::trusted_folder`]: every folder above owned by this user or root and
/// open to no one else), so the shim checked there is the shim loaded, with no window between;
/// the path returned has no link in it.
pub(crate) fn private_folder() -> Result<PathBuf, RunError> {
    private_folder_among(&[
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    ])
}

/// [`private_folder`] among the bases given, in order.
pub fn private_folder_among(bases: &[Option<PathBuf>]) -> Result<PathBuf, RunError> {
    let mut last = None;
    for base in bases.iter().flatten().filter(|p| p.is_absolute()) {
        if !base.exists() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(base);
        }
        let base = match crate::files::trusted_folder(base) {
            Ok(b) => b,
            Err(why) => {
                last = Some(RunError::Untrusted(why));
                continue;
            }
        };
        let dir = base.join("gpushim");
        match ensure_private(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(RunError::NoPrivateFolder))
}

/// Makes `dir` and checks, before anything is changed in it, that it is
/// a real folder (not a link) owned by this user; a mode open to others is then closed through
/// the folder itself, never through a path a link could redirect.
pub(super) fn ensure_private(dir: &Path) -> Result<(), RunError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(RunError::Io(dir.to_path_buf(), e)),
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| RunError::Io(dir.to_path_buf(), e))?;
    if !meta.is_dir() || meta.uid() != uid {
        return Err(RunError::NotPrivate(dir.to_path_buf()));
    }
    if meta.mode() & 0o077 != 0 {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| RunError::NotPrivate(dir.to_path_buf()))?;
        // SAFETY: a NUL-terminated path; O_NOFOLLOW refuses a link put there meanwhile.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(RunError::NotPrivate(dir.to_path_buf()));
        }
        // SAFETY: `fd` is the folder just opened, closed right after.
        let ok = unsafe { libc::fchmod(fd, 0o700) == 0 && libc::close(fd) == 0 };
        if !ok {
            return Err(RunError::NotPrivate(dir.to_path_buf()));
        }
    }
    Ok(())
}
