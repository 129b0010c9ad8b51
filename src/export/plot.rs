//! The timeline picture: live and reserved memory of every device over time, with NVML's figure
//! for the process where the trace has it (SVG).

use super::ticks::{nice_step, tick_label};
use super::{aligned, xml};
use crate::report::Change;
use crate::report::units::human_bytes;
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::series::{Point, Series, Spans, thin};

/// Live and reserved memory over time, per device of each trace; several traces (the ranks
/// of a job) share one time axis, aligned by their wall-clock start.
const W: f64 = 1000.0;
const H: f64 = 420.0;
const L: f64 = 80.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 60.0;

/// What the picture shows, read from the traces: times since the first allocation.
struct Data {
    /// (time, live, reserved) by (trace, device).
    points: BTreeMap<(usize, u8), Vec<Point>>,
    /// NVML's samples (time, bytes) by (trace, device).
    nvml: BTreeMap<(usize, u8), Vec<(u64, u64)>>,
    /// NVTX ranges of the first trace: spans by the string id of their name (bounded).
    ranges: HashMap<u64, Spans>,
    /// Each trace's offset on the common clock, label and header.
    traces: Vec<(u64, String, crate::trace::reader::TraceInfo)>,
    /// When the program's memory starts (the axis's zero) on the common clock, and the last
    /// trace's end after it.
    start: u64,
    end: u64,
    reader: crate::trace::reader::TraceReader,
    /// The first trace's iterations (`leaks`), read with it.
    leaks: Option<crate::report::Leaks>,
}

/// Reads every trace's series, NVML samples and (of the first) NVTX ranges.
fn gather(paths: &[std::path::PathBuf], opts: &ReadOptions) -> Result<Option<Data>, ReadError> {
    let mut points: BTreeMap<(usize, u8), Vec<Point>> = BTreeMap::new();
    let mut nvml: BTreeMap<(usize, u8), Vec<(u64, u64)>> = BTreeMap::new();
    let mut ranges: HashMap<u64, Spans> = HashMap::new();
    let mut open: HashMap<u16, Vec<(u64, u64)>> = HashMap::new();
    // Start/end ranges open: (string id, start) by range id.
    let mut started: HashMap<u64, (u64, u64)> = HashMap::new();
    let traces = aligned(paths)?;
    let mut end = 1u64;
    let mut first_reader = None;
    for (n, (path, (offset, _, _))) in paths.iter().zip(&traces).enumerate() {
        let offset = *offset;
        // This trace's devices' changes, bounded (see `series`).
        let mut series: BTreeMap<u8, Series> = BTreeMap::new();
        // The first trace's iterations too (`leaks`), from the same read, for the ticks of a
        // run without NVTX ranges.
        let wants = crate::report::analysis::Wants {
            leaks: (n == 0).then_some(None),
            ..Default::default()
        };
        let mut each = |_: &crate::trace::reader::TraceReader,
                        rp: &crate::report::Replay,
                        r: &crate::trace::format::Record,
                        c: Change| {
            let t = r.time_ns + offset;
            // A checkpoint restores state: of the time before the ring it keeps NVML's samples
            // and a coarse series of live and reserved memory (below), not every change.
            if rp.restored.active || r.kind == RecordKind::Restore {
                if r.kind == RecordKind::DeviceMemory {
                    nvml.entry((n, r.device)).or_default().push((t, r.ptr));
                }
                return;
            }
            match r.kind {
                RecordKind::RangePush if n == 0 => {
                    open.entry(r.thread).or_default().push((r.ptr, t))
                }
                RecordKind::RangePop if n == 0 => {
                    if let Some((id, t0)) = open.get_mut(&r.thread).and_then(Vec::pop) {
                        ranges.entry(id).or_default().push((t0, t));
                    }
                }
                RecordKind::RangeStart if n == 0 => {
                    started.insert(r.size, (r.ptr, t));
                }
                RecordKind::RangeEnd if n == 0 => {
                    if let Some((id, t0)) = started.remove(&r.size) {
                        ranges.entry(id).or_default().push((t0, t));
                    }
                }
                RecordKind::DeviceMemory => nvml.entry((n, r.device)).or_default().push((t, r.ptr)),
                _ => {}
            }
            // Where PyTorch's tensors are recorded, a device allocation of the program's is
            // most likely PyTorch's segment, reserved memory once its record comes a moment
            // later: no point of its own (the next point has the allocation if it stays live).
            let raw = rp.tensors.recorded()
                && matches!(r.kind, RecordKind::Alloc | RecordKind::PhysCreate);
            let d = match c {
                Change::Alloc { .. } | Change::Physical { .. } if raw => return,
                Change::Alloc { device, .. } | Change::Physical { device } => device,
                Change::Free { .. } => rp.freed.device,
                Change::Other | Change::StackOfRaw => return,
            };
            series
                .entry(d)
                .or_default()
                .push((t, rp.live_on(d), rp.reserved_on(d)));
        };
        let (a, reader, rp) = crate::report::analysis::analyze_each(path, opts, &wants, &mut each)?;
        for (d, s) in series {
            points.insert((n, d), s.finish());
        }
        // The coarse series the checkpoint kept comes before the ring's detail.
        let mut coarse: BTreeMap<u8, Vec<Point>> = BTreeMap::new();
        for &(t, d, live, reserved) in &rp.restored.series {
            coarse
                .entry(d)
                .or_default()
                .push((t + offset, live, reserved));
        }
        for (d, mut before) in coarse {
            let pts = points.entry((n, d)).or_default();
            before.append(pts);
            *pts = before;
        }
        // The run's memory ends with its last change: what the trace records after it (the
        // NVML sampler's last figure as the process exits, its thread's start) would stretch
        // the axis past the run, squeezing it into the first part of the picture.
        let last_change = points
            .range((n, 0)..=(n, u8::MAX))
            .filter_map(|(_, pts)| pts.last().map(|p| p.0))
            .max();
        let trace_end = last_change.unwrap_or(rp.time_ns + offset);
        end = end.max(trace_end);
        clamp_to_end(&mut nvml, n, trace_end);
        hold_to_end(&mut points, &mut nvml, n, trace_end);
        if n == 0 {
            first_reader = Some((reader, a.leaks));
        }
    }
    let Some((reader, leaks)) = first_reader else {
        return Ok(None);
    };
    let mut d = Data {
        points,
        nvml,
        ranges,
        traces,
        start: 0,
        end,
        reader,
        leaks,
    };
    d.start_at_first_allocation();
    Ok(Some(d))
}

/// NVML's samples of trace `n` after its memory's last change, taken as at that change: the
/// figure as the run's memory ended (one sample past it: the latest).
fn clamp_to_end(nvml: &mut BTreeMap<(usize, u8), Vec<(u64, u64)>>, n: usize, trace_end: u64) {
    for (_, pts) in nvml.range_mut((n, 0)..=(n, u8::MAX)) {
        let inside = pts.partition_point(|p| p.0 <= trace_end);
        if let Some(&(_, bytes)) = pts.last()
            && inside < pts.len()
        {
            pts.truncate(inside);
            pts.push((trace_end, bytes));
        }
    }
}

/// Memory holds its last value until trace `n` ends (at `trace_end`), not until its last
/// allocation.
fn hold_to_end(
    points: &mut BTreeMap<(usize, u8), Vec<Point>>,
    nvml: &mut BTreeMap<(usize, u8), Vec<(u64, u64)>>,
    n: usize,
    trace_end: u64,
) {
    for (_, pts) in points.range_mut((n, 0)..=(n, u8::MAX)) {
        if let Some(&(t, live, reserved)) = pts.last()
            && t < trace_end
        {
            pts.push((trace_end, live, reserved));
        }
    }
    for (_, pts) in nvml.range_mut((n, 0)..=(n, u8::MAX)) {
        if let Some(&(t, bytes)) = pts.last()
            && t < trace_end
        {
            pts.push((trace_end, bytes));
        }
    }
}

impl Data {
    /// The axis starts where the program's memory does, not at the trace's start (a Python
    /// program's imports can take most of the run before its first allocation).
    fn start_at_first_allocation(&mut self) {
        let start = self
            .points
            .values()
            .filter_map(|p| p.first())
            .map(|p| p.0)
            .min()
            .unwrap_or(0)
            .min(self.end.saturating_sub(1));
        for p in self.points.values_mut().flatten() {
            p.0 = p.0.saturating_sub(start);
        }
        for p in self.nvml.values_mut().flatten() {
            p.0 = p.0.saturating_sub(start);
        }
        for spans in self.ranges.values_mut() {
            for (a, b) in spans.kept.iter_mut() {
                *a = a.saturating_sub(start);
                *b = b.saturating_sub(start);
            }
        }
        self.start = start;
        self.end = self.end.saturating_sub(start).max(1);
    }
}

/// The axes: units, round ticks (1, 2, 2.5 or 5 times a power of ten), ends on a tick.
struct Scale {
    ymax: u64,
    unit: &'static str,
    div: f64,
    ystep: f64,
    yticks: u32,
    tunit: &'static str,
    tdiv: f64,
    tstep: f64,
    tticks: u32,
    /// The time axis's end (a tick at or after the last trace's end).
    end: u64,
    /// NVML's figure is over four times the program's: the scale is the program's.
    nvml_above: bool,
    nvml_max: u64,
}

impl Scale {
    fn of(d: &Data) -> Scale {
        let data_max = d
            .points
            .values()
            .flatten()
            .map(|p| p.1.max(p.2))
            .max()
            .unwrap_or(0);
        let nvml_max = d.nvml.values().flatten().map(|p| p.1).max().unwrap_or(0);
        // NVML's figure holds the CUDA context and the code (hundreds of MiB): a program
        // holding a few MiB would be a line along the floor under it. Then the scale is the
        // program's, and NVML's line runs along the top, said in a note.
        let nvml_above = data_max > 0 && nvml_max > data_max.saturating_mul(4);
        let ymax = if nvml_above {
            data_max
        } else {
            data_max.max(nvml_max)
        }
        .max(1);
        let (unit, div) = if ymax >= 1 << 30 {
            ("GiB", (1u64 << 30) as f64)
        } else if ymax >= 1 << 20 {
            ("MiB", (1u64 << 20) as f64)
        } else {
            ("KiB", 1024.0)
        };
        let (tunit, tdiv) = if d.end >= 2_000_000_000 {
            ("s", 1e9)
        } else if d.end >= 2_000_000 {
            ("ms", 1e6)
        } else {
            ("µs", 1e3)
        };
        let ystep = nice_step(ymax as f64 / div / 5.0);
        let yticks = (ymax as f64 / div / ystep).ceil().max(1.0) as u32;
        let tstep = nice_step(d.end as f64 / tdiv / 6.0);
        let tticks = (d.end as f64 / tdiv / tstep).ceil().max(1.0) as u32;
        Scale {
            ymax: (f64::from(yticks) * ystep * div).ceil() as u64,
            unit,
            div,
            ystep,
            yticks,
            tunit,
            tdiv,
            tstep,
            tticks,
            end: (f64::from(tticks) * tstep * tdiv).ceil() as u64,
            nvml_above,
            nvml_max,
        }
    }

    fn x(&self, t: u64) -> f64 {
        L + (W - L - R) * t as f64 / self.end as f64
    }

    fn y(&self, b: u64) -> f64 {
        H - B - (H - T - B) * b as f64 / self.ymax as f64
    }
}

pub fn plot_svg(paths: &[std::path::PathBuf], opts: &ReadOptions) -> Result<String, ReadError> {
    let Some(d) = gather(paths, opts)? else {
        return Ok(String::new());
    };
    let sc = Scale::of(&d);
    // The legend goes under the chart, where no line can run through it: three rows a series.
    let legend_rows =
        d.points.len() * 3 + d.nvml.keys().filter(|k| d.points.contains_key(k)).count();
    let height = H + 8.0 + 16.0 * legend_rows as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{height}" fill="white"/>"#);
    title(&mut s, &d, &sc);
    marks(&mut s, &d, &sc);
    axes(&mut s, &d, &sc);
    series(&mut s, &d, &sc);
    s.push_str("</svg>\n");
    Ok(s)
}

/// The title, and the note when NVML's figure is above the scale.
fn title(s: &mut String, d: &Data, sc: &Scale) {
    let title = if d.traces.len() == 1 {
        format!(
            "{} (pid {}): device memory over time",
            d.reader.info().program,
            d.reader.info().pid
        )
    } else {
        format!(
            "{} traces on one wall clock: device memory over time",
            d.traces.len()
        )
    };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle"{}>{}</text>"#,
        W / 2.0,
        super::fitted(&title, 15.0, W - 20.0),
        xml(&title)
    );
    if sc.nvml_above {
        let note = format!(
            "NVML's figure (up to {}) is above this scale: its dotted line runs along the top",
            human_bytes(sc.nvml_max)
        );
        caption(s, L + 6.0, T + 14.0, "start", W - L - R - 12.0, &note);
    }
}

/// The NVTX range that repeats most, shaded; without NVTX ranges, each iteration of a
/// detected period marked on the time axis (of the first trace, from its read).
fn marks(s: &mut String, d: &Data, sc: &Scale) {
    // The most frequent name (of two as frequent, the smaller string id: the same choice at
    // every reading, where the map's order is not).
    let most = d
        .ranges
        .iter()
        .max_by_key(|(id, v)| (v.count, std::cmp::Reverse(**id)));
    if let Some((id, spans)) = most {
        for (i, (a, b)) in spans.kept.iter().enumerate() {
            if i % 2 == 0 {
                let _ = writeln!(
                    s,
                    r##"<rect x="{:.1}" y="{T}" width="{:.1}" height="{}" fill="#eef3fb"/>"##,
                    sc.x(*a),
                    (sc.x(*b) - sc.x(*a)).max(0.5),
                    H - T - B
                );
            }
        }
        let thinned = match spans.stride {
            0 | 1 => String::new(),
            k => format!(" (one in {k} of its {} drawn)", spans.count),
        };
        let note = format!(
            "shaded: every other NVTX range '{}'{thinned}{}",
            d.reader.string(*id).unwrap_or("?"),
            if d.traces.len() > 1 {
                format!(" of {}", d.traces[0].1.trim_end())
            } else {
                String::new()
            }
        );
        caption(s, W - R, T - 4.0, "end", W - R - L, &note);
        return;
    }
    let Some(it) = d
        .leaks
        .as_ref()
        .and_then(|l| l.iterations.as_ref())
        .filter(|i| i.boundary_times_ns.len() >= 2)
    else {
        return;
    };
    for &t in &it.boundary_times_ns {
        let xx = sc.x((t + d.traces[0].0).saturating_sub(d.start));
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{}" x2="{xx:.1}" y2="{}" stroke="#6a7fa0" stroke-width="1"/>"##,
            H - B - 8.0,
            H - B
        );
    }
    let note = format!(
        "ticks on the time axis: {} iterations ({})",
        it.count,
        super::shortened(&it.boundary, 110)
    );
    caption(s, W - R, T - 4.0, "end", W - R - L, &note);
}

/// The grid, the ticks and the axes' names.
fn axes(s: &mut String, d: &Data, sc: &Scale) {
    for i in 0..=sc.yticks {
        let v = f64::from(i) * sc.ystep;
        let yy = sc.y((v * sc.div) as u64);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            W - R,
            L - 6.0,
            yy + 4.0,
            tick_label(v, sc.ystep)
        );
    }
    for i in 0..=sc.tticks {
        let t = f64::from(i) * sc.tstep;
        let xx = sc.x((t * sc.tdiv) as u64);
        let _ = writeln!(
            s,
            r#"<line x1="{xx:.1}" y1="{}" x2="{xx:.1}" y2="{}" stroke="black"/><text x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"#,
            H - B,
            H - B + 4.0,
            H - B + 18.0,
            tick_label(t, sc.tstep)
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
        r#"<text x="{}" y="{}" text-anchor="middle">time since the first allocation, {} after the {}trace started ({})</text>"#,
        (L + W - R) / 2.0,
        H - 20.0,
        crate::report::units::human_duration(d.start),
        if d.traces.len() == 1 { "" } else { "first " },
        sc.tunit
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">memory ({})</text>"#,
        (T + H - B) / 2.0,
        (T + H - B) / 2.0,
        sc.unit
    );
}

/// Each (trace, device): live and reserved lines, NVML's line, and their legend rows.
fn series(s: &mut String, d: &Data, sc: &Scale) {
    let colors = [
        "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
    ];
    let mut legend_y = H + 4.0;
    for (i, ((n, dev), pts)) in d.points.iter().enumerate() {
        let who = &d.traces[*n].1;
        let c = colors[i % colors.len()];
        let thin = thin(pts, (W - L - R) as usize, sc.end);
        for (series, dash, name) in [(1usize, "", "live"), (2, "6 4", "reserved")] {
            let path = steps(
                thin.iter()
                    .map(|p| (sc.x(p.0), sc.y(if series == 1 { p.1 } else { p.2 }))),
            );
            let _ = writeln!(
                s,
                r#"<path d="{path}" fill="none" stroke="{c}" stroke-width="1.5" stroke-dasharray="{dash}"/>"#
            );
            legend_row(s, legend_y, c, dash, &format!("{who}device {dev} {name}"));
            legend_y += 16.0;
        }
        if let Some(samples) = d.nvml.get(&(*n, *dev)) {
            // Held from its last sample to the end of the trace (a single sample is a line too).
            let last = samples.last().map(|p| (d.end.max(p.0), p.1));
            let path = steps(
                samples
                    .iter()
                    .copied()
                    .chain(last)
                    .map(|p| (sc.x(p.0), sc.y(p.1.min(sc.ymax)))),
            );
            let _ = writeln!(
                s,
                r#"<path d="{path}" fill="none" stroke="{c}" stroke-width="1" stroke-dasharray="1 3"/>"#
            );
            // Sampled once, at the run's end (a run shorter than the sampler's period): a dot,
            // where a line would have no length.
            if let Some(&(t, bytes)) = samples.last()
                && samples.iter().all(|p| p.0 == t)
            {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="none" stroke="{c}"><title>NVML: {}</title></circle>"#,
                    sc.x(t),
                    sc.y(bytes.min(sc.ymax)),
                    human_bytes(bytes)
                );
            }
            let name = format!(
                "{who}device {dev} as NVML saw the process (its CUDA context and code included)"
            );
            legend_row(s, legend_y, c, "1 3", &name);
            legend_y += 16.0;
        }
        let peak = pts.iter().map(|p| p.1).max().unwrap_or(0);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}">{}device {dev}: peak live {}</text>"#,
            L + 10.0,
            legend_y + 4.0,
            xml(who),
            human_bytes(peak)
        );
        legend_y += 16.0;
    }
}

/// One legend row at `y`: a stretch of line in color `c` with `dash`, and its name.
fn legend_row(s: &mut String, y: f64, c: &str, dash: &str, name: &str) {
    let _ = writeln!(
        s,
        r#"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="{c}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{:.1}">{}</text>"#,
        L + 10.0,
        L + 40.0,
        L + 46.0,
        y + 4.0,
        xml(name)
    );
}

/// A note on the chart (12 px, the notes' grey) anchored at its start or end at (`x`, `y`),
/// squeezed into `room` pixels if it is longer.
fn caption(s: &mut String, x: f64, y: f64, anchor: &str, room: f64, text: &str) {
    let _ = writeln!(
        s,
        r##"<text x="{x}" y="{y}" fill="#6a7fa0" text-anchor="{anchor}"{}>{}</text>"##,
        super::fitted(text, 12.0, room),
        xml(text)
    );
}

/// An SVG path through `points` as steps: memory holds its value until the next event.
fn steps(points: impl Iterator<Item = (f64, f64)>) -> String {
    let mut path = String::new();
    let mut prev: Option<f64> = None;
    for (px, py) in points {
        if let Some(pv) = prev {
            let _ = write!(path, "L{px:.1},{pv:.1} ");
        } else {
            let _ = write!(path, "M{px:.1},{py:.1} ");
        }
        let _ = write!(path, "L{px:.1},{py:.1} ");
        prev = Some(py);
    }
    path
}
