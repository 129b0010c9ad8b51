//! Traces in the viewers people already use: Perfetto / Chrome JSON, PyTorch's memory_viz
//! pickle, RMM's replay CSV; and pictures: a timeline of live and reserved memory (SVG) and a
//! flame graph of live bytes by stack (SVG).

use crate::analysis::{Change, Live, Peak, Replay, replay_each, site_label};
use crate::format::RecordKind;
use crate::reader::{ReadError, TraceReader};
use crate::summary::human_bytes;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

/// Chrome trace event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open: one
/// counter track per device (live and reserved bytes), NVTX ranges as slices on their thread,
/// marks as instants. Several traces (the ranks of a job) go in one file: a process each,
/// named by rank, on one time axis aligned by their wall-clock starts.
pub fn perfetto(paths: &[std::path::PathBuf], out: &mut dyn Write) -> Result<u64, ReadError> {
    let traces = aligned(paths)?;
    let mut events = 0u64;
    let mut first = true;
    let mut emit = |out: &mut dyn Write, v: serde_json::Value| {
        let sep = if first { "" } else { ",\n" };
        first = false;
        let _ = write!(out, "{sep}{v}");
        events += 1;
    };
    let _ = writeln!(out, "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
    for (n, (path, (offset, who, info))) in paths.iter().zip(&traces).enumerate() {
        // Process ids of different hosts may repeat: number the processes when there are many.
        let pid = if traces.len() == 1 {
            u64::from(info.pid)
        } else {
            n as u64 + 1
        };
        let name = format!("{who}{} (pid {} on {})", info.program, info.pid, info.host);
        emit(
            out,
            serde_json::json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name.trim()}}),
        );
        emit(
            out,
            serde_json::json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": n}}),
        );
        let offset = *offset;
        let mut last: HashMap<u8, (u64, u64)> = HashMap::new();
        replay_each(path, |reader, rp, r, c| {
            let ts = (r.time_ns + offset) as f64 / 1000.0;
            match r.kind {
                RecordKind::RangePush => emit(
                    out,
                    serde_json::json!({"ph": "B", "name": reader.string(r.ptr).unwrap_or("range"),
                        "cat": "nvtx", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                RecordKind::RangePop => emit(
                    out,
                    serde_json::json!({"ph": "E", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                RecordKind::Mark => emit(
                    out,
                    serde_json::json!({"ph": "i", "s": "t", "name": reader.string(r.ptr).unwrap_or("mark"),
                        "cat": "nvtx", "pid": pid, "tid": r.thread, "ts": ts}),
                ),
                _ => {}
            }
            let device = match c {
                Change::Alloc { device, .. } | Change::Physical { device } => Some(device),
                Change::Free { live, .. } => Some(live.device),
                Change::Other
                    if matches!(
                        r.kind,
                        RecordKind::SegmentReserve | RecordKind::SegmentRelease
                    ) =>
                {
                    Some(if r.device == crate::format::DEVICE_UNKNOWN {
                        0
                    } else {
                        r.device
                    })
                }
                Change::Other => None,
            };
            if let Some(d) = device {
                let now = (rp.live_on(d), rp.reserved_on(d));
                if last.get(&d) != Some(&now) {
                    last.insert(d, now);
                    emit(
                        out,
                        serde_json::json!({"ph": "C", "name": format!("device {d} memory"), "pid": pid,
                            "ts": ts, "args": {"live_bytes": now.0, "reserved_bytes": now.1}}),
                    );
                }
            }
        })?;
    }
    let _ = writeln!(out, "\n]}}");
    Ok(events)
}

/// RMM's replay log: `Thread,Time,Action,Pointer,Size,Stream`, one row per allocation and free
/// (time in seconds since the trace started).
pub fn rmm_csv(path: &Path, out: &mut dyn Write) -> Result<u64, ReadError> {
    let _ = writeln!(out, "Thread,Time,Action,Pointer,Size,Stream");
    let mut rows = 0;
    replay_each(path, |_, _, r, c| {
        let (action, ptr, size) = match c {
            Change::Alloc { ptr, .. } => ("allocate", ptr, r.size),
            Change::Free { ptr, live } => ("free", ptr, live.size),
            Change::Other | Change::Physical { .. } => return,
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
    Ok(rows)
}

#[derive(Serialize)]
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
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Snapshot {
    segments: Vec<VizSegment>,
    device_traces: Vec<Vec<VizTrace>>,
}

fn frames(reader: &TraceReader, stack: u64) -> Vec<Frame> {
    reader
        .stack(stack)
        .unwrap_or(&[])
        .iter()
        .map(|&ip| {
            let f = crate::symbolize::frame(reader, ip);
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

/// PyTorch's memory snapshot (what `torch.cuda.memory._snapshot()` pickles), for
/// https://pytorch.org/memory_viz: the segments and blocks live at the end of the trace, and
/// every allocation, free and segment change as `device_traces`. With the shim's pool the
/// segments are its segments; without, each allocation is its own segment.
pub fn memory_viz(path: &Path, out: &mut dyn Write, protocol: u8) -> Result<u64, String> {
    let mut traces: BTreeMap<u8, Vec<VizTrace>> = BTreeMap::new();
    let (reader, rp) = replay_each(path, |reader, rp, r, c| {
        let us = r.time_ns / 1000;
        let (device, t) = match c {
            Change::Alloc { ptr, device } => (
                device,
                VizTrace {
                    action: "alloc",
                    addr: ptr,
                    size: r.size,
                    stream: u64::from(r.stream),
                    time_us: us,
                    frames: Vec::new(),
                },
            ),
            Change::Free { ptr, live } => (
                live.device,
                VizTrace {
                    action: "free_completed",
                    addr: ptr,
                    size: live.size,
                    stream: u64::from(live.stream),
                    time_us: us,
                    frames: frames(reader, live.stack),
                },
            ),
            // memory_viz has no place for memory outside an address range.
            Change::Physical { .. } => return,
            Change::Other => match r.kind {
                RecordKind::SegmentReserve | RecordKind::SegmentRelease => (
                    if r.device == crate::format::DEVICE_UNKNOWN {
                        0
                    } else {
                        r.device
                    },
                    VizTrace {
                        action: if r.kind == RecordKind::SegmentReserve {
                            "segment_alloc"
                        } else {
                            "segment_free"
                        },
                        addr: r.ptr,
                        size: r.size,
                        stream: 0,
                        time_us: us,
                        frames: Vec::new(),
                    },
                ),
                RecordKind::Alloc | RecordKind::AllocAsync if r.status == 2 => (
                    if r.device == crate::format::DEVICE_UNKNOWN {
                        0
                    } else {
                        r.device
                    },
                    VizTrace {
                        action: "oom",
                        addr: 0,
                        size: r.size,
                        stream: u64::from(r.stream),
                        time_us: us,
                        frames: Vec::new(),
                    },
                ),
                RecordKind::StackRef => {
                    // The stack of the allocation just traced.
                    if let Some(list) = traces.values_mut().find(|l| {
                        l.last().is_some_and(|t| {
                            t.action == "alloc"
                                && rp.live.get(&t.addr).is_some_and(|l| l.stack == r.ptr)
                        })
                    }) && let Some(t) = list.last_mut()
                    {
                        t.frames = frames(reader, r.ptr);
                    }
                    return;
                }
                _ => return,
            },
        };
        traces.entry(device).or_default().push(t);
    })
    .map_err(|e| e.to_string())?;
    let segments = segments_of(&reader, &rp);
    let max_device = traces
        .keys()
        .chain(rp.live_bytes.keys())
        .copied()
        .max()
        .unwrap_or(0);
    let device_traces = (0..=max_device)
        .map(|d| traces.remove(&d).unwrap_or_default())
        .collect();
    let snap = Snapshot {
        segments,
        device_traces,
    };
    let opts = match protocol {
        2 => serde_pickle::SerOptions::new().proto_v2(),
        3 | 4 => serde_pickle::SerOptions::new(),
        _ => {
            return Err(format!(
                "pickle protocol {protocol} is not offered (2, 3 or 4)"
            ));
        }
    };
    let n = snap.segments.len() as u64;
    let mut bytes = serde_pickle::to_vec(&snap, opts).map_err(|e| e.to_string())?;
    if protocol == 4 {
        // Protocol 4 adds opcodes and optional framing; a stream of protocol-3 opcodes under a
        // protocol-4 header is a valid protocol-4 pickle.
        if bytes.starts_with(&[0x80, 3]) {
            bytes[1] = 4;
        }
    }
    out.write_all(&bytes).map_err(|e| e.to_string())?;
    Ok(n)
}

/// The memory_viz snapshot inside a page that opens PyTorch's viewer on it: PyTorch's
/// `MemoryViz.js`, loaded from its CDN (the page needs the network), given the pickle inline,
/// as `torch.cuda._memory_viz` writes its own pages. `view` is the viewer's first tab:
/// "Active Memory Timeline", "Active Cached Segment Timeline" or "Allocator State History".
pub fn memory_viz_html(path: &Path, out: &mut dyn Write, view: &str) -> Result<u64, String> {
    use base64::Engine;
    let mut pickle = Vec::new();
    let n = memory_viz(path, &mut pickle, 3)?;
    // The viewer decodes in 3-byte groups; trailing zero bytes follow the pickle's STOP.
    pickle.resize(pickle.len().div_ceil(3) * 3, 0);
    let data = base64::engine::general_purpose::STANDARD.encode(&pickle);
    let files = serde_json::json!([{"name": "gpushim.pickle", "base64": data}]);
    let view = serde_json::Value::String(view.to_string());
    write!(
        out,
        "<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n\
         <title>gpushim: {title}</title>\n</head>\n<body>\n\
         <script type=\"module\">\n\
         import {{add_local_files}} from \"{MEMORY_VIZ_JS}\"\n\
         const local_files = {files}\n\
         add_local_files(local_files, {view})\n\
         </script>\n</body>\n</html>\n",
        title = html_escape(&path.display().to_string()),
    )
    .map_err(|e| e.to_string())?;
    Ok(n)
}

/// PyTorch's memory viewer, as `torch.cuda._memory_viz` loads it.
pub const MEMORY_VIZ_JS: &str =
    "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js";

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
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
    if rp.segments.is_empty() {
        for (&p, l) in &rp.live {
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
    for (&base, &(size, device)) in &rp.segments {
        let mut blocks = Vec::new();
        // A hostile trace may name a segment that runs past 2^64: saturate.
        let end = base.saturating_add(size);
        let mut at = base;
        let mut allocated = 0u64;
        for (&p, l) in rp.live.range(base..end) {
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
            is_expandable: false,
            frames: Vec::new(),
            blocks,
        });
    }
    out
}

/// Live and reserved memory per device over time, with the NVTX ranges of the most frequent
/// name shaded, as an SVG line chart with labelled axes.
/// Where each trace starts on a shared clock: its offset from the earliest start (wall clock at
/// `CLOCK_REALTIME`), and the name of its series ("device 0", or "rank 1 device 0" with
/// several traces).
fn aligned(
    paths: &[std::path::PathBuf],
) -> Result<Vec<(u64, String, crate::reader::TraceInfo)>, ReadError> {
    let infos = paths
        .iter()
        .map(|p| Ok(TraceReader::open(p)?.info().clone()))
        .collect::<Result<Vec<_>, ReadError>>()?;
    let t0 = infos.iter().map(|i| i.start_realtime_ns).min().unwrap_or(0);
    Ok(infos
        .into_iter()
        .enumerate()
        .map(|(n, i)| {
            let who = if paths.len() == 1 {
                String::new()
            } else if i.rank >= 0 {
                format!("rank {} ", i.rank)
            } else {
                // The file's name says which run it is; its position in the list does not.
                let file = paths[n]
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| format!("trace {}", n + 1));
                format!("{file} ")
            };
            (i.start_realtime_ns - t0, who, i)
        })
        .collect())
}

/// (time, live, reserved) at one change.
type Point = (u64, u64, u64);

/// Live and reserved memory over time, per device of each trace; several traces (the ranks
/// of a job) share one time axis, aligned by their wall-clock start.
pub fn plot_svg(paths: &[std::path::PathBuf]) -> Result<String, ReadError> {
    // (time, live, reserved) per device, thinned to at most 2 points per pixel column by
    // keeping each column's maximum.
    const W: f64 = 1000.0;
    const H: f64 = 420.0;
    const L: f64 = 80.0;
    const R: f64 = 20.0;
    const T: f64 = 40.0;
    const B: f64 = 60.0;
    // Series by (trace, device); NVTX ranges of the first trace.
    let mut points: BTreeMap<(usize, u8), Vec<Point>> = BTreeMap::new();
    let mut ranges: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut open: HashMap<u16, Vec<(u64, u64)>> = HashMap::new();
    let traces = aligned(paths)?;
    let mut end = 1u64;
    let mut first_reader = None;
    for (n, (path, (offset, _, _))) in paths.iter().zip(&traces).enumerate() {
        let offset = *offset;
        let (reader, rp) = replay_each(path, |_, rp, r, c| {
            let t = r.time_ns + offset;
            match r.kind {
                RecordKind::RangePush if n == 0 => {
                    open.entry(r.thread).or_default().push((r.ptr, t))
                }
                RecordKind::RangePop if n == 0 => {
                    if let Some((id, t0)) = open.get_mut(&r.thread).and_then(Vec::pop) {
                        ranges.entry(id).or_default().push((t0, t));
                    }
                }
                _ => {}
            }
            let d = match c {
                Change::Alloc { device, .. } | Change::Physical { device } => device,
                Change::Free { live, .. } => live.device,
                Change::Other => return,
            };
            points
                .entry((n, d))
                .or_default()
                .push((t, rp.live_on(d), rp.reserved_on(d)));
        })?;
        let trace_end = rp.time_ns + offset;
        end = end.max(trace_end);
        // Memory holds its last value until the trace ends, not until the last allocation.
        for ((m, _), pts) in points.range_mut((n, 0)..=(n, u8::MAX)) {
            debug_assert_eq!(*m, n);
            if let Some(&(t, live, reserved)) = pts.last()
                && t < trace_end
            {
                pts.push((trace_end, live, reserved));
            }
        }
        if n == 0 {
            first_reader = Some(reader);
        }
    }
    let Some(reader) = first_reader else {
        return Ok(String::new());
    };
    let ymax = points
        .values()
        .flatten()
        .map(|p| p.1.max(p.2))
        .max()
        .unwrap_or(1)
        .max(1);
    let (unit, div) = if ymax >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else if ymax >= 1 << 20 {
        ("MiB", (1u64 << 20) as f64)
    } else {
        ("KiB", 1024.0)
    };
    let (tunit, tdiv) = if end >= 2_000_000_000 {
        ("s", 1e9)
    } else if end >= 2_000_000 {
        ("ms", 1e6)
    } else {
        ("µs", 1e3)
    };
    // Round ticks (1, 2, 2.5 or 5 times a power of ten); the axes end on a tick.
    let ystep = nice_step(ymax as f64 / div / 5.0);
    let yticks = (ymax as f64 / div / ystep).ceil().max(1.0) as u32;
    let ymax = (f64::from(yticks) * ystep * div).ceil() as u64;
    let tstep = nice_step(end as f64 / tdiv / 6.0);
    let tticks = (end as f64 / tdiv / tstep).ceil().max(1.0) as u32;
    let end = (f64::from(tticks) * tstep * tdiv).ceil() as u64;
    let x = |t: u64| L + (W - L - R) * t as f64 / end as f64;
    let y = |b: u64| H - B - (H - T - B) * b as f64 / ymax as f64;
    // The legend goes under the chart, where no line can run through it: three rows a series.
    let legend_rows = points.len() * 3;
    let height = H + 8.0 + 16.0 * legend_rows as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{height}" fill="white"/>"#);
    let title = if traces.len() == 1 {
        format!(
            "{} (pid {}): device memory over time",
            reader.info().program,
            reader.info().pid
        )
    } else {
        format!(
            "{} traces on one wall clock: device memory over time",
            traces.len()
        )
    };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        W / 2.0,
        xml(&title)
    );
    // The NVTX range that repeats most, shaded.
    if let Some((id, spans)) = ranges.iter().max_by_key(|(_, v)| v.len()) {
        for (i, (a, b)) in spans.iter().enumerate() {
            if i % 2 == 0 {
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{T}" width="{:.1}" height="{}" fill="#eef3fb"/>"##,
                    x(*a),
                    (x(*b) - x(*a)).max(0.5),
                    H - T - B
                );
            }
        }
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" fill="#6a7fa0" text-anchor="end">shaded: every other NVTX range '{}'{}</text>"##,
            W - R,
            T - 4.0,
            xml(reader.string(*id).unwrap_or("?")),
            if traces.len() > 1 {
                format!(" of {}", traces[0].1.trim_end())
            } else {
                String::new()
            }
        );
    }
    // Axes and grid.
    for i in 0..=yticks {
        let v = f64::from(i) * ystep;
        let yy = y((v * div) as u64);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - R,
            L - 6.0,
            yy + 4.0,
            tick_label(v, ystep)
        );
    }
    for i in 0..=tticks {
        let t = f64::from(i) * tstep;
        let xx = x((t * tdiv) as u64);
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" y1="{}" x2="{xx:.1}" y2="{}" stroke="black"/><text x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"#,
            H - B,
            H - B + 4.0,
            H - B + 18.0,
            tick_label(t, tstep)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>"#,
        H - B,
        W - R,
        H - B,
        H - B
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{} ({tunit})</text>"#,
        (L + W - R) / 2.0,
        H - 20.0,
        if traces.len() == 1 {
            "time since the trace started"
        } else {
            "time since the first trace started"
        }
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">memory ({unit})</text>"#,
        (T + H - B) / 2.0,
        (T + H - B) / 2.0
    );
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let mut legend_y = H + 4.0;
    for (i, ((n, d), pts)) in points.iter().enumerate() {
        let who = &traces[*n].1;
        let c = colors[i % colors.len()];
        let thin = thin(pts, (W - L - R) as usize, end);
        for (series, dash, name) in [(1usize, "", "live"), (2, "6 4", "reserved")] {
            let mut path = String::new();
            let mut prev: Option<u64> = None;
            for p in &thin {
                let v = if series == 1 { p.1 } else { p.2 };
                // Steps: memory holds its value until the next event.
                if let Some(pv) = prev {
                    let _ = write!(path, "L{:.1},{:.1} ", x(p.0), y(pv));
                } else {
                    let _ = write!(path, "M{:.1},{:.1} ", x(p.0), y(v));
                }
                let _ = write!(path, "L{:.1},{:.1} ", x(p.0), y(v));
                prev = Some(v);
            }
            let _ = writeln!(
                s,
                r#"<path d="{path}" fill="none" stroke="{c}" stroke-width="1.5" stroke-dasharray="{dash}"/>"#
            );
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{legend_y:.1}" x2="{}" y2="{legend_y:.1}" stroke="{c}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{:.1}">{who}device {d} {name}</text>"#,
                L + 10.0,
                L + 40.0,
                L + 46.0,
                legend_y + 4.0
            );
            legend_y += 16.0;
        }
        let peak = pts.iter().map(|p| p.1).max().unwrap_or(0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}">{who}device {d}: peak live {}</text>"#,
            L + 10.0,
            legend_y + 4.0,
            human_bytes(peak)
        );
        legend_y += 16.0;
    }
    s.push_str("</svg>\n");
    Ok(s)
}

/// At most two points per pixel column: the first and the highest, so peaks survive.
fn thin(pts: &[(u64, u64, u64)], columns: usize, end: u64) -> Vec<(u64, u64, u64)> {
    if pts.len() <= columns * 2 {
        return pts.to_vec();
    }
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut col = usize::MAX;
    for &p in pts {
        let c = (p.0 as f64 / end as f64 * columns as f64) as usize;
        if c != col {
            out.push(p);
            col = c;
        } else if let Some(last) = out.last_mut()
            && (p.1 > last.1 || p.2 > last.2)
        {
            *last = (last.0, last.1.max(p.1), last.2.max(p.2));
        }
    }
    out
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A flame graph of the live bytes at a peak: outermost frames at the bottom, width by bytes.
pub fn flamegraph_svg(peak: &Peak, title: &str) -> String {
    #[derive(Default)]
    struct Node {
        bytes: u64,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for (frames, bytes) in &peak.stacks {
        root.bytes += bytes;
        let mut n = &mut root;
        for f in frames.iter().rev() {
            n = n.children.entry(f.clone()).or_default();
            n.bytes += bytes;
        }
    }
    fn depth(n: &Node) -> usize {
        1 + n.children.values().map(depth).max().unwrap_or(0)
    }
    const W: f64 = 1200.0;
    const ROW: f64 = 18.0;
    let rows = depth(&root);
    let h = ROW * rows as f64 + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="20" font-family="sans-serif" font-size="15" text-anchor="middle">{}</text>"#,
        W / 2.0,
        xml(title)
    );
    #[allow(clippy::too_many_arguments)]
    fn draw(
        s: &mut String,
        name: &str,
        n: &Node,
        x: f64,
        w: f64,
        level: usize,
        h: f64,
        total: u64,
    ) {
        const ROW: f64 = 18.0;
        if w < 0.5 {
            return;
        }
        let y = h - 10.0 - ROW * (level as f64 + 1.0);
        let hue = 20 + (name.len() * 37 % 40);
        let label = format!(
            "{name} ({}, {:.1}%)",
            human_bytes(n.bytes),
            100.0 * n.bytes as f64 / total.max(1) as f64
        );
        let _ = writeln!(
            s,
            r#"<g><title>{}</title><rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{}" fill="hsl({hue},85%,60%)" stroke="white"/>"#,
            xml(&label),
            w,
            ROW - 1.0
        );
        let chars = ((w - 6.0) / 6.6) as usize;
        if chars > 3 {
            let text: String = if label.chars().count() > chars {
                label
                    .chars()
                    .take(chars.saturating_sub(2))
                    .collect::<String>()
                    + ".."
            } else {
                label.clone()
            };
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                x + 3.0,
                y + 12.5,
                xml(&text)
            );
        }
        s.push_str("</g>\n");
        let mut cx = x;
        for (child, c) in &n.children {
            let cw = w * c.bytes as f64 / n.bytes.max(1) as f64;
            draw(s, child, c, cx, cw, level + 1, h, total);
            cx += cw;
        }
    }
    let total = root.bytes;
    draw(
        &mut s,
        &format!("all live at the peak, device {}", peak.device),
        &root,
        10.0,
        W - 20.0,
        0,
        h,
        total,
    );
    s.push_str("</svg>\n");
    s
}

/// The site labels of a trace's live allocations at its end (for `diff`).
pub fn live_by_site(path: &Path) -> Result<(u64, HashMap<String, u64>), ReadError> {
    let (reader, rp) = replay_each(path, |_, _, _, _| {})?;
    let mut by: HashMap<String, u64> = HashMap::new();
    for l in rp.all_live() {
        *by.entry(site_label(&reader, crate::analysis::site_key(l)))
            .or_default() += l.size;
    }
    Ok((rp.live_bytes.values().sum(), by))
}

/// A round tick spacing near `raw`: 1, 2, 2.5 or 5 times a power of ten.
fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(raw.log10().floor());
    let m = raw / p;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 2.5 {
        2.5
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * p
}

/// A tick value with as many decimals as its step needs (2.5 -> one, 0.25 -> two).
fn tick_label(v: f64, step: f64) -> String {
    let decimals = (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(6) as usize;
    format!("{v:.decimals$}")
}

/// Renders one of our SVGs to PNG (twice the SVG's size, on white) with the DejaVu fonts
/// built into the command, so the picture reads the same on a machine without fonts.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, String> {
    use resvg::{tiny_skia, usvg};
    let mut opt = usvg::Options::default();
    let db = opt.fontdb_mut();
    db.load_font_data(dejavu::sans::regular().to_vec());
    db.load_font_data(dejavu::sans_mono::regular().to_vec());
    db.set_sans_serif_family("DejaVu Sans");
    db.set_serif_family("DejaVu Sans");
    db.set_monospace_family("DejaVu Sans Mono");
    opt.font_family = "DejaVu Sans".to_string();
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| format!("cannot read the SVG: {e}"))?;
    let scale = 2.0;
    let size = tree.size().to_int_size();
    let (w, h) = (
        (size.width() as f32 * scale).ceil() as u32,
        (size.height() as f32 * scale).ceil() as u32,
    );
    let mut pixmap =
        tiny_skia::Pixmap::new(w, h).ok_or_else(|| format!("cannot make a {w}x{h} image"))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{nice_step, tick_label};

    #[test]
    fn png_text_is_drawn_with_the_built_in_fonts() {
        // The same picture with and without its text must differ, whatever fonts the machine
        // has (the GPU machine has none).
        let with = r#"<svg xmlns="http://www.w3.org/2000/svg" width="80" height="20" font-family="sans-serif"><rect width="80" height="20" fill="white"/><text x="4" y="14">memory</text></svg>"#;
        let without = with.replace("memory", "");
        let a = super::svg_to_png(with).unwrap();
        let b = super::svg_to_png(&without).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(nice_step(0.87), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(0.22), 0.25);
        assert_eq!(nice_step(870.0), 1000.0);
        assert_eq!(nice_step(3.1), 5.0);
        assert_eq!(tick_label(7.5, 2.5), "7.5");
        assert_eq!(tick_label(0.75, 0.25), "0.75");
        assert_eq!(tick_label(400.0, 200.0), "400");
    }
}
