//! `plot --by kind` and `--by line`: memory over the run stacked by the kinds of PyTorch's
//! tensors or by the lines that held most, as the page draws it ([`crate::report::timeline`]),
//! one panel per device of each trace: the x axis counts allocations and frees (start-up and
//! pauses take no width) with the iterations marked on it, the peak and every failed allocation
//! marked, reserved memory dashed.

use super::ticks::{nice_step, tick_label};
use super::xml;
use crate::report::kinds::Kind;
use crate::report::timeline::{Boundaries, Lane, named};
use crate::report::units::human_bytes;
use crate::trace::reader::{ReadError, ReadOptions};
use std::fmt::Write as _;

/// What the bands are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackBy {
    Kind,
    Line,
}

const W: f64 = 1000.0;
const L: f64 = 80.0;
const R: f64 = 20.0;
/// A panel: its title, the chart, the axis's labels; then its legend.
const TITLE: f64 = 54.0;
const CHART: f64 = 300.0;
const AXIS: f64 = 44.0;
const ROW: f64 = 16.0;
/// Lines drawn on their own in a picture (the page draws more).
const LINES_SHOWN: usize = 12;

/// The colour of each kind, as the page has it.
pub fn kind_color(k: Kind) -> &'static str {
    match k {
        Kind::Parameter => "#4e79a7",
        Kind::Gradient => "#f28e2b",
        Kind::OptimizerState => "#b07aa1",
        Kind::Activation => "#59a14f",
        Kind::Temporary => "#a0cbe8",
        Kind::Input => "#9c755f",
        Kind::Workspace => "#76b7b2",
        Kind::Communication => "#edc948",
        Kind::Unknown => "#bab0ac",
    }
}
const NOT_TENSORS: &str = "#86bcb6";
const CACHED: &str = "#e4e4e4";
const OUTSIDE: &str = "#9a9a9a";
const EARLY: &str = "#c9b98f";

/// One band: its name, colour and bytes per column.
struct Band {
    name: String,
    color: String,
    values: Vec<u64>,
}

/// The picture of every trace's lanes, stacked `by`.
pub fn stacked_svg(
    paths: &[std::path::PathBuf],
    by: StackBy,
    opts: &ReadOptions,
) -> Result<String, ReadError> {
    let mut lanes = Vec::new();
    for path in paths {
        let wants = crate::report::analysis::Wants {
            leaks: Some(None),
            timeline: Some(Vec::new()),
            ..Default::default()
        };
        let a = crate::report::analysis::analyze(path, opts, &wants)?;
        let Some(l) = a.leaks else {
            continue;
        };
        let growing_lines: Vec<&str> = l
            .iterations
            .iter()
            .flat_map(|i| i.growing.iter().map(|g| g.call_site.as_str()))
            .collect();
        let steps = l.iterations.as_ref().map(|i| Boundaries {
            name: &i.boundary,
            count: i.count,
            times_ns: &i.boundary_times_ns,
            growing: &growing_lines,
        });
        let label = crate::files::shown(path).to_string();
        lanes.extend(named(a.lanes.unwrap_or_default(), &label, steps));
    }
    let mut body = String::new();
    let mut top = 0.0;
    for lane in &lanes {
        top = panel(&mut body, lane, by, top);
    }
    let height = top.max(60.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{height}" fill="white"/>"#);
    if lanes.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="34" text-anchor="middle">the trace holds no allocation (or none that the filters keep)</text>"#,
            W / 2.0
        );
    }
    s.push_str(&body);
    s.push_str("</svg>\n");
    Ok(s)
}

/// The bands of `lane`, bottom first, and whether NVML's part was left off (it dwarfs the rest).
fn bands(lane: &Lane, by: StackBy) -> (Vec<Band>, bool) {
    let c = &lane.columns;
    let n = c.len();
    let pre = lane.before_ring;
    let mut out = Vec::new();
    let mut early = vec![0u64; n];
    match by {
        StackBy::Kind => {
            for (k, v) in Kind::ALL.iter().zip(&c.kinds) {
                if v.iter().any(|&b| b > 0) {
                    out.push(Band {
                        name: k.name().to_string(),
                        color: kind_color(*k).to_string(),
                        values: v.clone(),
                    });
                }
            }
            let mut other: Vec<u64> = (0..n).map(|i| c.not_tensors(i)).collect();
            for i in 0..pre.min(n) {
                early[i] = std::mem::take(&mut other[i]);
            }
            let name = if lane.tensors_recorded {
                "other allocations (libraries, the program's own)"
            } else {
                "allocations"
            };
            out.push(Band {
                name: name.into(),
                color: NOT_TENSORS.into(),
                values: other,
            });
        }
        StackBy::Line => {
            let shown = lane.lines.len().min(LINES_SHOWN);
            // Lines of one kind share its hue, each a shade of its own.
            let mut seen = [0usize; Kind::ALL.len() + 1];
            for l in &lane.lines[..shown] {
                let base = l.kind.map_or(NOT_TENSORS, kind_color);
                let kind = l.kind.map_or("not a tensor", Kind::name);
                let k = &mut seen[l.kind.map_or(Kind::ALL.len(), |k| k as usize)];
                const SHADES: [f64; 6] = [0.0, 0.35, -0.25, 0.55, -0.4, 0.2];
                out.push(Band {
                    name: format!("{} ({kind})", l.label),
                    color: shade(base, SHADES[*k % SHADES.len()]),
                    values: l.bytes.clone(),
                });
                *k += 1;
            }
            let mut other: Vec<u64> = (0..n)
                .map(|i| {
                    lane.lines[shown..]
                        .iter()
                        .fold(lane.other_lines[i], |s, l| s.saturating_add(l.bytes[i]))
                })
                .collect();
            for i in 0..pre.min(n) {
                early[i] = std::mem::take(&mut other[i]);
            }
            out.push(Band {
                name: "other lines".into(),
                color: "#d4d4d4".into(),
                values: other,
            });
        }
    }
    if pre > 0 {
        out.insert(
            0,
            Band {
                name: "live before the ring's detail (kinds and lines not kept)".into(),
                color: EARLY.into(),
                values: early,
            },
        );
    }
    out.push(Band {
        name: if lane.tensors_recorded {
            "PyTorch's cache, unused".into()
        } else {
            "held by a pool, unused".into()
        },
        color: CACHED.into(),
        values: (0..n).map(|i| c.cached(i)).collect(),
    });
    let most = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    let dwarfs = most(&c.nvml) as f64 > 2.5 * most(&c.reserved) as f64;
    if !dwarfs {
        out.push(Band {
            name: "no allocating call (CUDA context, module code)".into(),
            color: OUTSIDE.into(),
            values: (0..n).map(|i| c.outside(i)).collect(),
        });
    }
    out.retain(|b| b.values.iter().any(|&v| v > 0));
    (out, dwarfs)
}

/// Draws one lane's panel from `top`; the panel's bottom.
fn panel(s: &mut String, lane: &Lane, by: StackBy, top: f64) -> f64 {
    let c = &lane.columns;
    let n = c.len();
    let (bands, dwarfs) = bands(lane, by);
    let mut ymax = 1u64;
    for (i, &reserved) in c.reserved.iter().enumerate() {
        let stacked = bands
            .iter()
            .fold(0u64, |a, b| a.saturating_add(b.values[i]));
        ymax = ymax.max(stacked).max(reserved);
    }
    let (div, unit) = unit_of(ymax);
    let ystep = nice_step(ymax as f64 / div / 5.0);
    let yticks = ((ymax as f64 / div / ystep).ceil() as u32).max(1);
    let yend = f64::from(yticks) * ystep * div;
    let y0 = top + TITLE;
    let y = |b: u64| y0 + CHART * (1.0 - b as f64 / yend);
    let x = |i: usize| {
        if n > 1 {
            L + (W - L - R) * i as f64 / (n - 1) as f64
        } else {
            L + (W - L - R) / 2.0
        }
    };
    panel_title(s, lane, by, top, dwarfs);
    // Grid.
    for i in 0..=yticks {
        let v = f64::from(i) * ystep;
        let yy = y((v * div) as u64);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{} {unit}</text>"##,
            W - R,
            L - 6.0,
            yy + 4.0,
            tick_label(v, ystep)
        );
    }
    // Bands.
    let mut lo = vec![0u64; n];
    for b in &bands {
        let hi: Vec<u64> = lo
            .iter()
            .zip(&b.values)
            .map(|(a, v)| a.saturating_add(*v))
            .collect();
        let mut d = String::new();
        for (i, &h) in hi.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { 'M' } else { 'L' },
                x(i),
                y(h)
            );
        }
        for i in (0..n).rev() {
            let _ = write!(d, "L{:.1},{:.1}", x(i), y(lo[i]));
        }
        let _ = writeln!(
            s,
            r#"<path d="{d}Z" fill="{}" stroke="white" stroke-width="0.3"><title>{}</title></path>"#,
            b.color,
            xml(&b.name)
        );
        lo = hi;
    }
    // Reserved, dashed.
    let mut d = String::new();
    for i in 0..n {
        let _ = write!(
            d,
            "{}{:.1},{:.1}",
            if i == 0 { 'M' } else { 'L' },
            x(i),
            y(c.reserved[i])
        );
    }
    let _ = writeln!(
        s,
        r##"<path d="{d}" fill="none" stroke="#333" stroke-width="1.2" stroke-dasharray="5 3"/>"##
    );
    marks(s, lane, &x, &y, y0);
    axis(s, lane, y0 + CHART, &x);
    legend(s, &bands, y0 + CHART + AXIS)
}

/// A panel's title, and what it leaves off or shows differently.
fn panel_title(s: &mut String, lane: &Lane, by: StackBy, top: f64, dwarfs: bool) {
    let c = &lane.columns;
    let how = match by {
        StackBy::Kind => "by kind",
        StackBy::Line => "by line",
    };
    let title = format!("{}, device {}: memory {how}", lane.trace, lane.device);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-size="15" text-anchor="middle"{}>{}</text>"#,
        W / 2.0,
        top + 20.0,
        super::fitted(&title, 15.0, W - 20.0),
        xml(&title)
    );
    let mut note = Vec::new();
    if dwarfs {
        let nvml = c.nvml.iter().copied().max().unwrap_or(0);
        note.push(format!(
            "NVML's figure (up to {}) is left off: mostly what no allocating call made (the CUDA context)",
            human_bytes(nvml)
        ));
    }
    if lane.before_ring > 0 {
        note.push("left: the checkpoint's series of the time before the ring's detail".into());
    }
    if !note.is_empty() {
        let text = note.join("; ");
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle" fill="#555"{}>{}</text>"##,
            W / 2.0,
            top + 36.0,
            super::fitted(&text, 12.0, W - 20.0),
            xml(&text)
        );
    }
}

/// The peak (a dot) and each failed allocation (a red mark at the top).
fn marks(s: &mut String, lane: &Lane, x: &dyn Fn(usize) -> f64, y: &dyn Fn(u64) -> f64, y0: f64) {
    let n = lane.columns.len();
    if let Some(p) = lane.peak {
        let (px, py) = (x(p.column), y(p.bytes));
        let right = px > W - 220.0;
        let _ = writeln!(
            s,
            r##"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="black"/><text x="{:.1}" y="{:.1}" text-anchor="{}">peak {} live</text>"##,
            if right { px - 8.0 } else { px + 8.0 },
            (py - 6.0).max(y0 + 10.0),
            if right { "end" } else { "start" },
            human_bytes(p.bytes)
        );
    }
    for f in &lane.failures {
        let fx = x(f.column.min(n.saturating_sub(1)));
        let _ = writeln!(
            s,
            r##"<path d="M{:.1},{:.1}l10,0l-5,9Z" fill="#c0392b"><title>failed: {} of {}</title></path><line x1="{fx:.1}" y1="{:.1}" x2="{fx:.1}" y2="{:.1}" stroke="#c0392b" stroke-width="0.6"/>"##,
            fx - 5.0,
            y0 - 10.0,
            xml(&f.api),
            human_bytes(f.requested_bytes),
            y0,
            y0 + CHART
        );
    }
}

/// The x axis: iterations where the run has them, else the changes counted.
fn axis(s: &mut String, lane: &Lane, base: f64, x: &dyn Fn(usize) -> f64) {
    let _ = writeln!(
        s,
        r#"<line x1="{L}" y1="{base}" x2="{}" y2="{base}" stroke="black"/>"#,
        W - R
    );
    let label = if lane.steps.len() > 1 {
        let every = lane.steps.len().div_ceil(20);
        for (k, st) in lane.steps.iter().enumerate() {
            let sx = x(st.column);
            let long = k % every == 0;
            // Past a few hundred, a tick for each would only blacken the axis.
            if !long && lane.steps.len() > 200 {
                continue;
            }
            let _ = writeln!(
                s,
                r#"<line x1="{sx:.1}" y1="{base}" x2="{sx:.1}" y2="{}" stroke="black"/>"#,
                base + if long { 6.0 } else { 3.0 }
            );
            if long {
                let _ = writeln!(
                    s,
                    r#"<text x="{sx:.1}" y="{}" text-anchor="middle">{}</text>"#,
                    base + 18.0,
                    st.n
                );
            }
        }
        let name = lane.step_name.as_deref().unwrap_or("detected");
        let name: String = if name.chars().count() > 80 {
            name.chars().take(79).chain(['\u{2026}']).collect()
        } else {
            name.to_string()
        };
        format!("iteration ({name}); each as wide as the memory it moves, start-up folded")
    } else {
        let n = lane.columns.len();
        for f in [0.0, 0.25, 0.5, 0.75, 1.0] {
            let i = ((n.saturating_sub(1)) as f64 * f).round() as usize;
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                x(i),
                base + 18.0,
                lane.columns.change.get(i).copied().unwrap_or(0)
            );
        }
        "allocations and frees so far (start-up and pauses take no width)".to_string()
    };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle"{}>{}</text>"#,
        (L + W - R) / 2.0,
        base + 36.0,
        super::fitted(&label, 12.0, W - L - R),
        xml(&label)
    );
}

/// The legend under the chart, top band first, wrapped into rows; the bottom it reaches.
fn legend(s: &mut String, bands: &[Band], top: f64) -> f64 {
    let mut xx = L;
    let mut yy = top + 4.0;
    let mut items: Vec<(String, &str)> = bands
        .iter()
        .rev()
        .map(|b| (b.name.clone(), b.color.as_str()))
        .collect();
    items.push(("- - reserved".into(), "none"));
    for (name, color) in items {
        let shown: String = if name.chars().count() > 110 {
            name.chars().take(109).chain(['\u{2026}']).collect()
        } else {
            name
        };
        let wide = 18.0 + shown.chars().count() as f64 * 6.6 + 14.0;
        if xx + wide > W - R && xx > L {
            xx = L;
            yy += ROW;
        }
        if color != "none" {
            let _ = writeln!(
                s,
                r##"<rect x="{xx:.1}" y="{:.1}" width="11" height="11" fill="{color}" stroke="#999" stroke-width="0.5"/>"##,
                yy - 10.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{yy:.1}">{}</text>"#,
            xx + 16.0,
            xml(&shown)
        );
        xx += wide;
    }
    yy + 20.0
}

/// `hex` (`#rrggbb`) lighter (`f` > 0, towards white) or darker (`f` < 0).
fn shade(hex: &str, f: f64) -> String {
    let n = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0x888888);
    let part = |shift: u32| {
        let x = f64::from((n >> shift) & 0xff);
        let v = if f > 0.0 {
            x + (255.0 - x) * f
        } else {
            x * (1.0 + f)
        };
        v.round().clamp(0.0, 255.0) as u8
    };
    format!("#{:02x}{:02x}{:02x}", part(16), part(8), part(0))
}

/// A binary unit for a figure this large: its size and name.
fn unit_of(max: u64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1.0, "B"),
        (1024.0, "KiB"),
        (1048576.0, "MiB"),
        (1073741824.0, "GiB"),
        (1099511627776.0, "TiB"),
    ];
    let mut u = UNITS[0];
    for cand in UNITS {
        if max as f64 >= cand.0 {
            u = cand;
        }
    }
    u
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_shade_goes_towards_white_or_black() {
        assert_eq!(super::shade("#808080", 0.0), "#808080");
        assert_eq!(super::shade("#808080", 1.0), "#ffffff");
        assert_eq!(super::shade("#808080", -1.0), "#000000");
    }
}
