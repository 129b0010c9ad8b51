//! `peak` as text: each device's peak and who held it, of one trace or a job's.

use super::holders::holders_text_all;
use crate::report::peak::*;
use crate::report::units::{self, human_bytes};
use std::fmt::Write as _;

/// The text `gpushim peak` prints: each trace's peaks by call site and by NVTX range (`top` of
/// each), and with several traces the job's; `filtered` says whether filters were given.
pub fn render_peaks(
    all: &[(String, Vec<Peak>)],
    combined: &JobPeak,
    top: usize,
    filtered: bool,
) -> String {
    let mut o = String::new();
    if all.len() > 1 {
        side_by_side(&mut o, all);
    }
    for (i, (t, peaks)) in all.iter().enumerate() {
        if i > 0 || all.len() > 1 {
            let _ = writeln!(o);
        }
        let _ = writeln!(o, "{t}");
        if peaks.is_empty() {
            let _ = writeln!(
                o,
                "no allocation{}: nothing was live on any device",
                if filtered {
                    " that the filters keep"
                } else {
                    " in this trace"
                }
            );
        }
        for p in peaks {
            // With PyTorch, reserved counts its cache and every other allocation beside it,
            // where `summary`'s PyTorch line counts its cache alone.
            let whose = if p.by_kind.is_empty() {
                ""
            } else {
                ": PyTorch's cache and every other allocation"
            };
            let _ = writeln!(
                o,
                "device {}: peak live {} at {} (reserved then {}{whose})",
                p.device,
                human_bytes(p.live_bytes),
                units::human_duration(p.time_ns),
                human_bytes(p.reserved_bytes)
            );
            if !p.by_kind.is_empty() {
                let _ = writeln!(
                    o,
                    "  PyTorch's tensors by kind{}, then call site:",
                    if p.kinds_from_lines {
                        " (from their lines alone: the checkpoint of a ring keeps no lifetimes, \
                         so temporaries count with what their phase keeps)"
                    } else {
                        ""
                    }
                );
                for k in &p.by_kind {
                    let _ = writeln!(
                        o,
                        "    {} {} ({} tensor{})",
                        k.kind.name(),
                        human_bytes(k.bytes),
                        k.tensors,
                        if k.tensors == 1 { "" } else { "s" }
                    );
                    o.push_str(&holders_text_all(&k.by_call_site, top.min(5), "      "));
                }
            }
            let _ = writeln!(o, "  by call site:");
            o.push_str(&holders_text_all(&p.by_call_site, top, "    "));
            let _ = writeln!(o, "  by NVTX range:");
            o.push_str(&holders_text_all(&p.by_range, top, "    "));
        }
    }
    if all.len() > 1 {
        let c = &combined;
        let _ = writeln!(o);
        let _ = writeln!(o, "all {} traces together", c.traces);
        let _ = writeln!(
            o,
            "sum of the peaks {}; the largest {} (device {} of {})",
            human_bytes(c.sum_of_peaks),
            human_bytes(c.largest_bytes),
            c.largest_device,
            c.largest_trace
        );
        let _ = writeln!(o, "  live at the peaks, by call site:");
        o.push_str(&holders_text_all(&c.by_call_site, top, "    "));
        let _ = writeln!(o, "  by NVTX range:");
        o.push_str(&holders_text_all(&c.by_range, top, "    "));
    }
    o
}

/// A job's traces side by side, before each one's details: each device's peak, what was
/// reserved then, and its tensors by kind; then how far apart the largest and smallest are.
fn side_by_side(o: &mut String, all: &[(String, Vec<Peak>)]) {
    let rows: Vec<(&str, &Peak)> = all
        .iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.as_str(), p)))
        .collect();
    let width = units::column(rows.iter().map(|(t, _)| t.len()).max().unwrap_or(5));
    let _ = writeln!(
        o,
        "the peaks side by side ({} traces):\n  {:width$}  {:>6}  {:>12}  {:>14}  tensors by kind",
        all.len(),
        "trace",
        "device",
        "peak live",
        "reserved then"
    );
    for (t, p) in &rows {
        let kinds: Vec<String> = p
            .by_kind
            .iter()
            .map(|k| format!("{} {}", k.kind.name(), human_bytes(k.bytes)))
            .collect();
        let _ = writeln!(
            o,
            "  {t:width$}  {:>6}  {:>12}  {:>14}  {}",
            p.device,
            human_bytes(p.live_bytes),
            human_bytes(p.reserved_bytes),
            if kinds.is_empty() {
                "-".to_string()
            } else {
                kinds.join(", ")
            }
        );
    }
    let most = rows.iter().max_by_key(|(_, p)| p.live_bytes);
    let least = rows.iter().min_by_key(|(_, p)| p.live_bytes);
    if let (Some((tm, m)), Some((tl, l))) = (most, least)
        && m.live_bytes > l.live_bytes
    {
        let _ = writeln!(
            o,
            "  skew: {} peaks {} above {} ({} against {})",
            tm,
            human_bytes(m.live_bytes - l.live_bytes),
            tl,
            human_bytes(m.live_bytes),
            human_bytes(l.live_bytes)
        );
    }
}
