//! The file a trace is read from: opened without blocking, a regular file, and a folder given
//! where a trace goes answered with the traces in it.

use std::fs::File;
use std::path::Path;

/// Opens `path` to be read as a trace: without blocking (a FIFO named as a trace would stall
/// the command until a writer came), and only as a regular file.
pub(super) fn open_trace_file(path: &Path) -> std::io::Result<(File, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_dir() {
        return Err(std::io::Error::other(folder_of_traces(path)));
    }
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file (a trace is one)"));
    }
    Ok((file, meta))
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
