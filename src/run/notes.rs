//! What `gpushim run` believes its processes wrote: each leaves a note of its trace in a folder
//! of the user's alone, and a trace is read only when the file matches its note.

use super::{RunError, private_folder};
use std::path::{Path, PathBuf};

/// The folder the run's processes leave their notes in (`GPUSHIM_RUN_REPORT`): new, with a
/// random name, mode 0700 (so its notes lie in a folder only the user can list or write), inside
/// [`private_folder`] (or, when there is none, the system's temporary folder, whose sticky bit
/// keeps others from moving or replacing it), removed when the run ends. A note says which file a process wrote
/// (`DEV INO\nPATH`); a trace is believed only when the file at PATH, opened without following
/// a link or blocking, is a regular file of this user's with that device and inode and the
/// trace magic. Nothing else in the trace's folder is read.
pub(super) struct RunNotes(tempfile::TempDir);

impl RunNotes {
    pub(super) fn new() -> Result<RunNotes, RunError> {
        use std::os::unix::fs::PermissionsExt;
        let mut b = tempfile::Builder::new();
        // 0700 whatever the umask: the notes name the run's traces, and in the system's
        // temporary folder (no private folder) anyone could otherwise list them.
        b.prefix("run-")
            .permissions(std::fs::Permissions::from_mode(0o700));
        let made = match private_folder() {
            Ok(base) => b.tempdir_in(&base).map_err(|e| RunError::Io(base, e)),
            Err(_) => b
                .tempdir()
                .map_err(|e| RunError::Io(std::env::temp_dir(), e)),
        }?;
        Ok(RunNotes(made))
    }

    pub(super) fn folder(&self) -> &Path {
        self.0.path()
    }

    /// The traces the notes name that hold up, sorted by path.
    pub(super) fn traces(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.folder()) else {
            return out;
        };
        for e in entries.flatten().take(MAX_NOTES) {
            if let Some(t) = believed(&e.path()) {
                out.push(t);
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The most processes of one run whose traces `run` names (the rest are still written).
const MAX_NOTES: usize = 65_536;

/// The trace a note names, if the file there is the one the note describes.
fn believed(note: &Path) -> Option<PathBuf> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let text =
        crate::files::read_own(note, 2 * crate::trace::recorder::PATH_CAP as u64 + 64).ok()?;
    let nl = text.iter().position(|&b| b == b'\n')?;
    let ids = std::str::from_utf8(&text[..nl]).ok()?;
    let (dev, ino) = ids.split_once(' ')?;
    let (dev, ino): (u64, u64) = (dev.parse().ok()?, ino.parse().ok()?);
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&text[nl + 1..]));
    let (mut f, meta) = crate::files::open_own(&path).ok()?;
    if meta.dev() != dev || meta.ino() != ino {
        return None;
    }
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic).ok()?;
    if magic != crate::trace::format::MAGIC {
        return None;
    }
    // What `run` reads of the trace after (its summary) is this file, whatever is renamed
    // over its name meanwhile.
    crate::trace::reader::pin(&path, &f, &meta);
    Some(path)
}
