//! Chrome trace event JSON, which Perfetto and chrome://tracing open.

use super::aligned;
use crate::report::{Change, replay_each};
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions};
use std::collections::HashMap;
use std::io::Write;

/// Chrome trace event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open: one
/// counter track per device (live and reserved bytes), NVTX push/pop ranges as slices on their
/// thread, start/end ranges as async slices (they belong to no thread), marks as instants.
/// Several traces (the ranks of a job) go in one file: a process each, named by rank, on one
/// time axis aligned by their wall-clock starts.
pub fn perfetto(
    paths: &[std::path::PathBuf],
    out: &mut dyn Write,
    opts: &ReadOptions,
) -> Result<super::Written, ReadError> {
    let traces = aligned(paths)?;
    let mut summarized = Vec::new();
    let mut ev = Emitted::default();
    let _ = writeln!(out, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    for (n, (path, (offset, who, info))) in paths.iter().zip(&traces).enumerate() {
        // Process ids of different hosts may repeat: number the processes when there are many.
        let pid = if traces.len() == 1 {
            u64::from(info.pid)
        } else {
            n as u64 + 1
        };
        let name = format!("{who}{} (pid {} on {})", info.program, info.pid, info.host);
        ev.value(
            out,
            serde_json::json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name.trim()}}),
        );
        ev.value(
            out,
            serde_json::json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": n}}),
        );
        let offset = *offset;
        let mut last: HashMap<u8, (u64, u64)> = HashMap::new();
        // Start/end ranges open: the name by range id (the end record carries only the id).
        let mut started: HashMap<u64, String> = HashMap::new();
        let (reader, _) = replay_each(path, opts, |reader, rp, r, c| {
            let ts = (r.time_ns + offset) as f64 / 1000.0;
            match r.kind {
                RecordKind::RangePush => ev.value(
                    out,
                    serde_json::json!({"ph": "B", "name": reader.string(r.ptr).unwrap_or("range"),
                        "cat": "nvtx", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                RecordKind::RangePop => ev.value(
                    out,
                    serde_json::json!({"ph": "E", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                RecordKind::RangeStart => {
                    let name = reader.string(r.ptr).unwrap_or("range").to_string();
                    ev.value(
                        out,
                        serde_json::json!({"ph": "b", "name": name, "cat": "nvtx",
                            "id2": {"local": r.size}, "pid": pid, "tid": r.thread, "ts": ts}),
                    );
                    started.insert(r.size, name);
                }
                RecordKind::RangeEnd => {
                    if let Some(name) = started.remove(&r.size) {
                        ev.value(
                            out,
                            serde_json::json!({"ph": "e", "name": name, "cat": "nvtx",
                                "id2": {"local": r.size}, "pid": pid, "tid": r.thread, "ts": ts}),
                        );
                    }
                }
                RecordKind::Mark => ev.value(
                    out,
                    serde_json::json!({"ph": "i", "s": "t", "name": reader.string(r.ptr).unwrap_or("mark"),
                        "cat": "nvtx", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                _ => {}
            }
            // As the plot: no counter point at a device allocation that is most likely
            // PyTorch's segment, reserved memory once its record comes a moment later.
            let raw = rp.tensors.recorded()
                && matches!(r.kind, RecordKind::Alloc | RecordKind::PhysCreate);
            let device = match c {
                Change::Alloc { .. } | Change::Physical { .. } if raw => None,
                Change::Alloc { device, .. } | Change::Physical { device } => Some(device),
                Change::Free { .. } => Some(rp.freed.device),
                Change::Other
                    if matches!(
                        r.kind,
                        RecordKind::SegmentReserve | RecordKind::SegmentRelease
                    ) =>
                {
                    Some(if r.device == crate::trace::format::DEVICE_UNKNOWN {
                        0
                    } else {
                        r.device
                    })
                }
                Change::Other | Change::StackOfRaw => None,
            };
            if let Some(d) = device {
                let now = (rp.live_on(d), rp.reserved_on(d));
                if last.get(&d) != Some(&now) {
                    last.insert(d, now);
                    ev.counter(out, (d, pid, ts), now);
                }
            }
        })?;
        summarized.push((path.clone(), reader.info().summarized));
    }
    let _ = writeln!(out, "\n]}}");
    Ok(super::Written {
        items: ev.count,
        summarized,
        dropped: 0,
        dropped_for_bytes: 0,
    })
}

/// The events written so far, each after a separator but the first.
#[derive(Default)]
struct Emitted {
    count: u64,
}

impl Emitted {
    fn separator(&mut self) -> &'static str {
        self.count += 1;
        if self.count == 1 { "" } else { ",\n" }
    }

    fn value(&mut self, out: &mut dyn Write, v: serde_json::Value) {
        let sep = self.separator();
        let _ = write!(out, "{sep}{v}");
    }

    /// A device's counter point, written as the value of [`Emitted::value`] would be (its
    /// keys in order) but without making one: there is one at most allocations and frees.
    fn counter(&mut self, out: &mut dyn Write, (device, pid, ts): (u8, u64, f64), now: (u64, u64)) {
        let sep = self.separator();
        let _ = write!(
            out,
            "{sep}{{\"args\":{{\"live_bytes\":{},\"reserved_bytes\":{}}},\
             \"name\":\"device {device} memory\",\"ph\":\"C\",\"pid\":{pid},\"ts\":",
            now.0, now.1
        );
        let _ = serde_json::to_writer(&mut *out, &ts);
        let _ = out.write_all(b"}");
    }
}
