//! RMM's replay CSV (`rmm::detail::replay`'s input).

use crate::report::{Change, replay_each};
use crate::trace::reader::{ReadError, ReadOptions};
use std::io::Write;
use std::path::Path;

/// RMM's replay log: `Thread,Time,Action,Pointer,Size,Stream`, one row per allocation and free
/// (time in seconds since the trace started).
pub fn rmm_csv(
    path: &Path,
    out: &mut dyn Write,
    opts: &ReadOptions,
) -> Result<super::Written, ReadError> {
    let _ = writeln!(out, "Thread,Time,Action,Pointer,Size,Stream");
    let mut rows = 0;
    let (reader, _) = replay_each(path, opts, |_, rp, r, c| {
        let (action, ptr, size) = match c {
            Change::Alloc { ptr, .. } => ("allocate", ptr, r.size),
            Change::Free { ptr } => ("free", ptr, rp.freed.size),
            Change::Other | Change::StackOfRaw | Change::Physical { .. } => return,
        };
        rows += 1;
        let _ = writeln!(
            out,
            "{},{:.9},{action},{ptr:#x},{size},{}",
            r.thread,
            r.time_ns as f64 / 1e9,
            r.stream
        );
    })?;
    Ok(super::Written {
        items: rows,
        summarized: vec![(path.to_path_buf(), reader.info().summarized)],
        dropped: 0,
        dropped_for_bytes: 0,
    })
}
