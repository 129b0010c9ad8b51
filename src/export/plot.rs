//! The timeline picture: live and reserved memory of every device over time, with NVML's figure
//! for the process where the trace has it (SVG).

use super::{aligned, xml};
use crate::report::units::human_bytes;
use crate::report::{Change, replay_each};
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// (time, live, reserved) at one change.
type Point = (u64, u64, u64);

/// Live and reserved memory over time, per device of each trace; several traces (the ranks
/// of a job) share one time axis, aligned by their wall-clock start.
pub fn plot_svg(paths: &[std::path::PathBuf], opts: &ReadOptions) -> Result<String, ReadError> {
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
    // NVML's samples (time, bytes) by (trace, device).
    let mut nvml: BTreeMap<(usize, u8), Vec<(u64, u64)>> = BTreeMap::new();
    let mut ranges: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut open: HashMap<u16, Vec<(u64, u64)>> = HashMap::new();
    // Start/end ranges open: (string id, start) by range id.
    let mut started: HashMap<u64, (u64, u64)> = HashMap::new();
    let traces = aligned(paths, opts)?;
    let mut end = 1u64;
    let mut first_reader = None;
    for (n, (path, (offset, _, _))) in paths.iter().zip(&traces).enumerate() {
        let offset = *offset;
        let (reader, rp) = replay_each(path, opts, |_, rp, r, c| {
            let t = r.time_ns + offset;
            // A checkpoint restores state: of the time before the ring it keeps NVML's samples
            // and a coarse series of live and reserved memory (below), not every change.
            if rp.restoring || r.kind == RecordKind::Restore {
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
        // The coarse series the checkpoint kept comes before the ring's detail.
        let mut coarse: BTreeMap<u8, Vec<Point>> = BTreeMap::new();
        for &(t, d, live, reserved) in &rp.series {
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
        for ((m, _), pts) in nvml.range_mut((n, 0)..=(n, u8::MAX)) {
            debug_assert_eq!(*m, n);
            if let Some(&(t, bytes)) = pts.last()
                && t < trace_end
            {
                pts.push((trace_end, bytes));
            }
        }
        if n == 0 {
            first_reader = Some(reader);
        }
    }
    let Some(reader) = first_reader else {
        return Ok(String::new());
    };
    // The axis starts where the program's memory does, not at the trace's start (a Python
    // program's imports can take most of the run before its first allocation).
    let start = points
        .values()
        .filter_map(|p| p.first())
        .map(|p| p.0)
        .min()
        .unwrap_or(0)
        .min(end.saturating_sub(1));
    for p in points.values_mut().flatten() {
        p.0 = p.0.saturating_sub(start);
    }
    for p in nvml.values_mut().flatten() {
        p.0 = p.0.saturating_sub(start);
    }
    for spans in ranges.values_mut() {
        for (a, b) in spans.iter_mut() {
            *a = a.saturating_sub(start);
            *b = b.saturating_sub(start);
        }
    }
    let end = end.saturating_sub(start).max(1);
    let trace_end = end;
    let data_max = points
        .values()
        .flatten()
        .map(|p| p.1.max(p.2))
        .max()
        .unwrap_or(0);
    let nvml_max = nvml.values().flatten().map(|p| p.1).max().unwrap_or(0);
    // NVML's figure holds the CUDA context and the code (hundreds of MiB): a program holding a
    // few MiB would be a line along the floor under it. Then the scale is the program's, and
    // NVML's line runs along the top, said in a note.
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
    let legend_rows = points.len() * 3 + nvml.keys().filter(|k| points.contains_key(k)).count();
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
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle"{}>{}</text>"#,
        W / 2.0,
        super::fitted(&title, 15.0, W - 20.0),
        xml(&title)
    );
    if nvml_above {
        let note = format!(
            "NVML's figure (up to {}) is above this scale: its dotted line runs along the top",
            human_bytes(nvml_max)
        );
        caption(&mut s, L + 6.0, T + 14.0, "start", W - L - R - 12.0, &note);
    }
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
        let note = format!(
            "shaded: every other NVTX range '{}'{}",
            reader.string(*id).unwrap_or("?"),
            if traces.len() > 1 {
                format!(" of {}", traces[0].1.trim_end())
            } else {
                String::new()
            }
        );
        caption(&mut s, W - R, T - 4.0, "end", W - R - L, &note);
    }
    // Without NVTX ranges: each iteration of a detected period marked on the time axis.
    if ranges.is_empty()
        && let Ok(l) = crate::report::leaks(&paths[0], None, opts)
        && let Some(it) = l.iterations.filter(|i| i.boundary_times_ns.len() >= 2)
    {
        for &t in &it.boundary_times_ns {
            let xx = x((t + traces[0].0).saturating_sub(start));
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
            it.boundary.chars().take(110).collect::<String>()
        );
        caption(&mut s, W - R, T - 4.0, "end", W - R - L, &note);
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
        r#"<text x="{}" y="{}" text-anchor="middle">time since the first allocation, {} after the {}trace started ({tunit})</text>"#,
        (L + W - R) / 2.0,
        H - 20.0,
        crate::report::units::human_duration(start),
        if traces.len() == 1 { "" } else { "first " }
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
            let path = steps(
                thin.iter()
                    .map(|p| (x(p.0), y(if series == 1 { p.1 } else { p.2 }))),
            );
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
        if let Some(samples) = nvml.get(&(*n, *d)) {
            // Held from its last sample to the end of the trace (a single sample is a line too).
            let last = samples.last().map(|p| (trace_end.max(p.0), p.1));
            let path = steps(
                samples
                    .iter()
                    .copied()
                    .chain(last)
                    .map(|p| (x(p.0), y(p.1.min(ymax)))),
            );
            let _ = writeln!(
                s,
                r#"<path d="{path}" fill="none" stroke="{c}" stroke-width="1" stroke-dasharray="1 3"/>"#
            );
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{legend_y:.1}" x2="{}" y2="{legend_y:.1}" stroke="{c}" stroke-width="2" stroke-dasharray="1 3"/><text x="{}" y="{:.1}">{who}device {d} as NVML saw the process (its CUDA context and code included)</text>"#,
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

/// A round tick spacing near `raw`: 1, 2, 2.5 or 5 times a power of ten.
pub(super) fn nice_step(raw: f64) -> f64 {
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
pub(super) fn tick_label(v: f64, step: f64) -> String {
    let decimals = (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(6) as usize;
    format!("{v:.decimals$}")
}
