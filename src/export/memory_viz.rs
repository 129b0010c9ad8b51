//! PyTorch's memory_viz snapshot (a pickle), for the viewer at pytorch.org/memory_viz.

use super::ExportError;
use crate::report::{Change, Live, Replay, replay_each};
use crate::trace::format::{Record, RecordKind};
use crate::trace::reader::{ReadOptions, TraceReader};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::Path;

#[derive(Clone, Serialize)]
struct Frame {
    filename: String,
    line: u64,
    name: String,
}

#[derive(Serialize)]
struct VizBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct VizSegment {
    device: u64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u64,
    segment_type: &'static str,
    segment_pool_id: (u64, u64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<VizBlock>,
}

#[derive(Serialize)]
struct VizTrace {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: u64,
    time_us: u64,
    /// Shared by the events of one stack (named once; an event holds a pointer).
    #[serde(serialize_with = "shared_frames")]
    frames: Option<std::rc::Rc<Vec<Frame>>>,
    /// The stack whose frames these are, named when the history is written (only the events
    /// kept are named).
    #[serde(skip)]
    stack: u64,
}

/// An event's frames as the viewer reads them: a list, empty where none.
fn shared_frames<S: serde::Serializer>(
    f: &Option<std::rc::Rc<Vec<Frame>>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match f {
        Some(f) => f.as_slice().serialize(s),
        None => s.collect_seq(std::iter::empty::<&Frame>()),
    }
}

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<VizSegment>,
    device_traces: Vec<Vec<VizTrace>>,
}

fn frames(reader: &TraceReader, stack: u64) -> Vec<Frame> {
    crate::report::sites::shown_frames(reader, reader.stack(stack).unwrap_or(&[]))
        .iter()
        .map(|&ip| {
            let f = crate::report::symbolize::frame(reader, ip);
            Frame {
                filename: f
                    .file
                    .clone()
                    .or_else(|| f.module.clone())
                    .unwrap_or_default(),
                line: u64::from(f.line.unwrap_or(0)),
                name: f.function.clone().unwrap_or_else(|| f.label()),
            }
        })
        .collect()
}

/// A trace event's device, for records that do not know it (device 0, as PyTorch's viewer
/// has no other place).
fn device_or_0(d: u8) -> u8 {
    if d == crate::trace::format::DEVICE_UNKNOWN {
        0
    } else {
        d
    }
}

/// One event of PyTorch's viewer with no frames (yet).
fn viz(action: &'static str, addr: u64, size: u64, stream: u64, time_us: u64) -> VizTrace {
    VizTrace {
        action,
        addr,
        size,
        stream,
        time_us,
        frames: None,
        stack: 0,
    }
}

/// What record `r` (with its replay change `c`) adds to the viewer's events per device.
fn viz_event(rp: &Replay, r: &Record, c: Change, traces: &mut History) {
    let us = r.time_ns / 1000;
    let (device, t) = match c {
        Change::Alloc { ptr, device } => {
            (device, viz("alloc", ptr, r.size, u64::from(r.stream), us))
        }
        // A framework's segment: the cudaMalloc just traced as a block was the segment (its
        // record follows the call). One segment, no block that came and went.
        Change::Free { ptr } if r.kind == RecordKind::SegmentReserve => {
            let live = rp.freed;
            let list = traces.by_device.entry(live.device).or_default();
            if let Some(i) = list
                .iter()
                .rposition(|t| t.action == "alloc" && t.addr == ptr)
            {
                list.remove(i);
            }
            (live.device, viz("segment_alloc", r.ptr, r.size, 0, us))
        }
        Change::Free { ptr } => (
            rp.freed.device,
            VizTrace {
                stack: rp.freed.stack,
                ..viz(
                    "free_completed",
                    ptr,
                    rp.freed.size,
                    u64::from(rp.freed.stream),
                    us,
                )
            },
        ),
        // memory_viz has no place for memory outside an address range.
        Change::Physical { .. } => return,
        Change::Other | Change::StackOfRaw => match r.kind {
            RecordKind::SegmentReserve => (
                device_or_0(r.device),
                viz("segment_alloc", r.ptr, r.size, 0, us),
            ),
            RecordKind::SegmentRelease => (
                device_or_0(r.device),
                viz("segment_free", r.ptr, r.size, 0, us),
            ),
            RecordKind::Alloc | RecordKind::AllocAsync if r.status == 2 => (
                device_or_0(r.device),
                viz("oom", 0, r.size, u64::from(r.stream), us),
            ),
            RecordKind::StackRef => {
                // The stack of the allocation just traced.
                if let Some(list) = traces.by_device.values_mut().find(|l| {
                    l.back().is_some_and(|t| {
                        t.action == "alloc"
                            && rp.live.get(&t.addr).is_some_and(|l| l.stack == r.ptr)
                    })
                }) && let Some(t) = list.back_mut()
                {
                    t.stack = r.ptr;
                }
                return;
            }
            _ => return,
        },
    };
    traces.push(device, t);
}

/// The alloc/free history of each device, the newest `most` events of each kept (as PyTorch
/// keeps it under `_record_memory_history(max_entries=...)`): memory bounded by `most`, not by
/// the trace's length.
struct History {
    by_device: BTreeMap<u8, VecDeque<VizTrace>>,
    most: usize,
    /// Events left out, the oldest first.
    dropped: u64,
}

impl History {
    fn push(&mut self, device: u8, t: VizTrace) {
        if self.most == 0 {
            self.dropped += 1;
            return;
        }
        let list = self.by_device.entry(device).or_default();
        if list.len() >= self.most {
            list.pop_front();
            self.dropped += 1;
        }
        list.push_back(t);
    }
}

/// The most bytes the history's events may take in the pickle, about (their frames written out
/// for each event, as the viewer reads them; a stack of 64 long frames is tens of KB an
/// event): the newest events up to it are kept, and the older ones left out are counted.
pub const MOST_HISTORY_BYTES: u64 = 512 << 20;

/// About the bytes one event takes in the pickle: its fields, and each frame's dict.
fn pickled_bytes(frames: &[Frame]) -> u64 {
    let each = |f: &Frame| 48 + f.filename.len() as u64 + f.name.len() as u64;
    frames.iter().map(each).fold(96, u64::saturating_add)
}

/// Leaves out the oldest events of each device past `most` bytes in all, the newest kept
/// first (across devices, newest by time): how many were left out.
fn within_bytes(traces: &mut BTreeMap<u8, Vec<VizTrace>>, most: u64) -> u64 {
    let mut order: Vec<(u64, u8, usize)> = traces
        .iter()
        .flat_map(|(&d, l)| l.iter().enumerate().map(move |(i, t)| (t.time_us, d, i)))
        .collect();
    order.sort_unstable_by(|a, b| b.cmp(a));
    let mut total = 0u64;
    let mut keep_from: BTreeMap<u8, usize> = BTreeMap::new();
    for (_, d, i) in order {
        let Some(t) = traces.get(&d).and_then(|l| l.get(i)) else {
            continue;
        };
        let bytes = t.frames.as_deref().map_or(96, |f| pickled_bytes(f));
        total = total.saturating_add(bytes);
        if total > most {
            let from = keep_from.entry(d).or_insert(0);
            *from = (*from).max(i + 1);
        }
    }
    let mut dropped = 0u64;
    for (d, from) in keep_from {
        if let Some(l) = traces.get_mut(&d) {
            let from = from.min(l.len());
            dropped += from as u64;
            l.drain(..from);
        }
    }
    dropped
}

/// PyTorch's memory snapshot (what `torch.cuda.memory._snapshot()` pickles), for
/// https://pytorch.org/memory_viz: the segments and blocks live at the end of the trace, and
/// every allocation, free and segment change as `device_traces`. With the shim's pool the
/// segments are its segments; without, each allocation is its own segment.
/// `max_entries`: the newest alloc/free events kept per device (the segments and blocks at the
/// end are whole whatever it is).
pub fn memory_viz(
    path: &Path,
    out: &mut dyn Write,
    (protocol, max_entries): (u8, usize),
    opts: &ReadOptions,
) -> Result<super::Written, ExportError> {
    // Refused before the trace is read, which can take minutes.
    let pickle_opts = match protocol {
        2 => serde_pickle::SerOptions::new().proto_v2(),
        3 | 4 => serde_pickle::SerOptions::new(),
        _ => return Err(ExportError::Protocol(protocol)),
    };
    let mut traces = History {
        by_device: BTreeMap::new(),
        most: max_entries,
        dropped: 0,
    };
    let (reader, rp) = replay_each(path, opts, |_, rp, r, c| viz_event(rp, r, c, &mut traces))?;
    let segments = segments_of(&reader, &rp);
    let dropped = traces.dropped;
    // The kept events' stacks named, each stack once.
    let mut named: std::collections::HashMap<u64, std::rc::Rc<Vec<Frame>>> = Default::default();
    let mut traces: BTreeMap<u8, Vec<VizTrace>> = traces
        .by_device
        .into_iter()
        .map(|(d, l)| {
            let mut l = Vec::from(l);
            for t in l.iter_mut().filter(|t| t.stack != 0) {
                t.frames = Some(
                    named
                        .entry(t.stack)
                        .or_insert_with(|| std::rc::Rc::new(frames(&reader, t.stack)))
                        .clone(),
                );
            }
            (d, l)
        })
        .collect();
    let dropped_for_bytes = within_bytes(&mut traces, MOST_HISTORY_BYTES);
    let max_device = traces
        .keys()
        .copied()
        .chain(rp.peaks().map(|(d, _, _)| d))
        .max()
        .unwrap_or(0);
    let device_traces = (0..=max_device)
        .map(|d| traces.remove(&d).unwrap_or_default())
        .collect();
    let snap = Snapshot {
        segments,
        device_traces,
    };
    let n = snap.segments.len() as u64;
    // Written as it is made (a pickle of many events is large). Protocol 4 adds opcodes and
    // optional framing; a stream of protocol-3 opcodes under a protocol-4 header is a valid
    // protocol-4 pickle.
    let mut w = Protocol4 {
        out,
        at: 0,
        first: 0,
        four: protocol == 4,
    };
    serde_pickle::to_writer(&mut w, &snap, pickle_opts).map_err(|e| match e {
        serde_pickle::Error::Io(e) => ExportError::Write(e),
        e => ExportError::Pickle(e.to_string()),
    })?;
    Ok(super::Written {
        items: n,
        summarized: vec![(path.to_path_buf(), reader.info().summarized)],
        dropped,
        dropped_for_bytes,
    })
}

/// A writer that makes a protocol-3 pickle's header (`0x80 3`) a protocol-4 one as it passes.
struct Protocol4<'a> {
    out: &'a mut dyn Write,
    /// Bytes written so far (counted up to the header's two), and the first.
    at: usize,
    first: u8,
    four: bool,
}

impl Write for Protocol4<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.four && self.at < 2 && !buf.is_empty() {
            // One byte at a time through the header: the second is the protocol's.
            let b = match (self.at, self.first, buf[0]) {
                (1, 0x80, 3) => 4,
                (_, _, b) => b,
            };
            self.first = if self.at == 0 { b } else { self.first };
            self.out.write_all(&[b])?;
            self.at += 1;
            return Ok(1);
        }
        self.at = self.at.saturating_add(buf.len());
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn segments_of(reader: &TraceReader, rp: &Replay) -> Vec<VizSegment> {
    let block = |p: u64, l: &Live| VizBlock {
        address: p,
        size: l.size,
        requested_size: l.size,
        state: "active_allocated",
        frames: frames(reader, l.stack),
    };
    let mut out = Vec::new();
    let sorted = rp.live_in_order();
    if rp.segments.is_empty() {
        for &(p, l) in &sorted {
            out.push(VizSegment {
                device: u64::from(l.device),
                address: p,
                total_size: l.size,
                allocated_size: l.size,
                active_size: l.size,
                requested_size: l.size,
                stream: u64::from(l.stream),
                segment_type: if l.size <= 1 << 20 { "small" } else { "large" },
                segment_pool_id: (0, 0),
                is_expandable: false,
                frames: frames(reader, l.stack),
                blocks: vec![block(p, l)],
            });
        }
        return out;
    }
    for (&base, seg) in &rp.segments {
        let (size, device) = (seg.size, seg.device);
        let mut blocks = Vec::new();
        // A hostile trace may name a segment that runs past 2^64: saturate.
        let end = base.saturating_add(size);
        let mut at = base;
        let mut allocated = 0u64;
        for &(p, l) in crate::report::live::in_range(&sorted, base, end) {
            if p > at {
                blocks.push(VizBlock {
                    address: at,
                    size: p - at,
                    requested_size: 0,
                    state: "inactive",
                    frames: Vec::new(),
                });
            }
            blocks.push(block(p, l));
            allocated = allocated.saturating_add(l.size);
            at = at.max(p.saturating_add(l.size));
        }
        if at < end {
            blocks.push(VizBlock {
                address: at,
                size: end - at,
                requested_size: 0,
                state: "inactive",
                frames: Vec::new(),
            });
        }
        out.push(VizSegment {
            device: u64::from(device),
            address: base,
            total_size: size,
            allocated_size: allocated,
            active_size: allocated,
            requested_size: allocated,
            stream: 0,
            segment_type: if size <= 2 << 20 { "small" } else { "large" },
            segment_pool_id: (0, 0),
            is_expandable: seg.pages,
            frames: Vec::new(),
            blocks,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events of two devices, each with a stack of 40 frames of 256-byte names: past the
    /// budget the oldest of each go, the newest stay whole, and every one left out is counted.
    #[test]
    fn the_history_is_cut_at_its_bytes_oldest_first() {
        let long = "f".repeat(256);
        let frames = std::rc::Rc::new(
            (0..40)
                .map(|i| Frame {
                    filename: long.clone(),
                    line: i,
                    name: long.clone(),
                })
                .collect::<Vec<_>>(),
        );
        let each = pickled_bytes(&frames);
        let mut traces: BTreeMap<u8, Vec<VizTrace>> = BTreeMap::new();
        for d in 0..2u8 {
            let l = (0..100u64)
                .map(|i| {
                    let mut t = viz("alloc", i, 1, 0, 2 * i + u64::from(d));
                    t.frames = Some(frames.clone());
                    t
                })
                .collect();
            traces.insert(d, l);
        }
        let dropped = within_bytes(&mut traces, 50 * each);
        assert_eq!(dropped, 150);
        let kept: Vec<u64> = traces.values().flatten().map(|t| t.time_us).collect();
        assert_eq!(kept.len(), 50);
        // The newest 50 by time: 150..=199 of the interleaved times.
        assert!(kept.iter().all(|&t| t >= 150), "{kept:?}");
        let mut small: BTreeMap<u8, Vec<VizTrace>> = BTreeMap::new();
        small.insert(0, vec![viz("alloc", 1, 1, 0, 1)]);
        assert_eq!(within_bytes(&mut small, 50 * each), 0);
    }
}
