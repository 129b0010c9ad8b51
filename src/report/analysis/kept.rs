//! What a trace holds, for an error that says so: a filter that keeps no allocation is refused
//! with the devices, the time span and the NVTX ranges the trace does have.

use crate::report::units::human_duration;
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use std::collections::BTreeSet;
use std::path::Path;

fn allocates(k: RecordKind) -> bool {
    use RecordKind::*;
    matches!(
        k,
        Alloc | AllocAsync | ManagedAlloc | TensorAlloc | PhysCreate
    )
}

/// `Ok` when the filters of `opts` keep at least one allocation of the trace at `path` (or the
/// trace holds none at all); otherwise what the trace holds, in words. For the commands that
/// read their traces otherwise than by the analysis, which checks as it reads
/// ([`refused_filter`]).
pub fn filter_keeps_any(path: &Path, opts: &ReadOptions) -> Result<(), String> {
    let err = |e: ReadError| e.to_string();
    let quiet = ReadOptions {
        progress: None,
        symbols: false,
        ..opts.clone()
    };
    let kept = TraceReader::open_with(path, &quiet).map_err(err)?;
    if kept.into_iter().any(|r| allocates(r.kind) && r.status == 0) {
        return Ok(());
    }
    what_it_holds(path, opts).map_err(|why| format!("{}: {why}", crate::files::shown(path)))
}

/// The analysis's check of its filter, once its first pass has read every record: a filter
/// that kept no allocation of a trace that holds some is refused with what the trace holds
/// (read again, unfiltered, by the same name: only then).
pub fn refused_filter(reader: &TraceReader, opts: &ReadOptions) -> Result<(), ReadError> {
    if reader.filter_kept_any() != Some(false) {
        return Ok(());
    }
    let path = &reader.info().path;
    what_it_holds(path, opts).map_err(|why| ReadError::Io(path.clone(), std::io::Error::other(why)))
}

/// `Ok` where the trace at `path` holds no allocation at all; otherwise the devices, the time
/// span and the NVTX ranges of its allocations, and what to widen.
fn what_it_holds(path: &Path, opts: &ReadOptions) -> Result<(), String> {
    let all = ReadOptions {
        progress: None,
        symbols: false,
        filter: Default::default(),
        ..opts.clone()
    };
    let mut reader = TraceReader::open_with(path, &all).map_err(|e| e.to_string())?;
    let (mut devices, mut ranges) = (BTreeSet::new(), BTreeSet::new());
    let (mut first, mut last, mut any) = (u64::MAX, 0u64, false);
    while let Some(r) = reader.next() {
        match r.kind {
            k if allocates(k) && r.status == 0 => {
                any = true;
                devices.insert(r.device);
                first = first.min(r.time_ns);
                last = last.max(r.time_ns);
            }
            RecordKind::RangePush | RecordKind::RangeStart => {
                if let Some(name) = reader.string(r.ptr) {
                    // A name from the trace, shown on one line as it is.
                    ranges.insert(crate::fixedfmt::Escaped(name.as_bytes()).to_string());
                }
            }
            _ => {}
        }
    }
    if !any {
        return Ok(());
    }
    let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    let ranges = if ranges.is_empty() {
        "none".to_string()
    } else {
        ranges.into_iter().take(12).collect::<Vec<_>>().join(", ")
    };
    Err(format!(
        "the filters keep no allocation: it holds allocations on device {}, from {} to {} \
         after it began; NVTX ranges: {ranges}. Widen the filters (--device, --from/--to, \
         --range, --thread, --stream)",
        devices.join(", "),
        human_duration(first),
        human_duration(last),
    ))
}
