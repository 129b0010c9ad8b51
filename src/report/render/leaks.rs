//! `leaks` as text: what was live at exit and what grew, of one trace or a job's.

use super::holders::holders_text_all;
use crate::report::leaks::*;
use crate::report::units::human_bytes;
use std::fmt::Write as _;

/// Fewer iteration boundaries than this, and `leaks` says its answer may not hold.
const FEW_ITERATIONS: u64 = 5;

/// Lines kept alive with a growing line that the text shows (the JSON has them all).
const KEPT_WITH_SHOWN: usize = 4;

/// One growing call site as `leaks` prints it, with the lines kept alive with it.
fn render_growth(o: &mut String, g: &Growth) {
    let _ = writeln!(
        o,
        "  grows {} per iteration ({} -> {}){}  {}",
        human_bytes(g.bytes_per_iteration),
        human_bytes(g.live_at_first_boundary),
        human_bytes(g.live_at_last_boundary),
        g.kind.map_or(String::new(), |k| format!(", {}", k.name())),
        g.call_site
    );
    for k in g.kept_with.iter().take(KEPT_WITH_SHOWN) {
        let how = match k.freed_together {
            0 => "freed in the same chains".to_string(),
            n => format!("freed together {n} times"),
        };
        let _ = writeln!(o, "    kept alive with {} ({how})", k.call_site);
    }
    if g.kept_with.len() > KEPT_WITH_SHOWN {
        let _ = writeln!(
            o,
            "    and with {} more growing lines (--json lists them)",
            g.kept_with.len() - KEPT_WITH_SHOWN
        );
    }
}

/// The text `gpushim leaks` prints for each trace and, with several, for the job.
pub fn render_leaks(
    all: &[(String, Leaks)],
    combined: &JobLeaks,
    boundary: Option<&str>,
    top: usize,
) -> String {
    let mut o = String::new();
    for (i, (t, l)) in all.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(o);
        }
        let _ = writeln!(o, "{t}");
        let _ = writeln!(
            o,
            "{}: {}{}{}",
            if l.running {
                "live now"
            } else {
                "live at exit"
            },
            human_bytes(l.live_at_exit_bytes),
            l.live_figures
                .as_ref()
                .map(|w| format!(" in the records the trace kept ({w})"))
                .unwrap_or_default(),
            if l.clean_exit {
                ""
            } else if l.running {
                " (the process is still running)"
            } else {
                " (the process did not exit cleanly: this is what was live when the trace ends)"
            }
        );
        if let Some(cut) = &l.trace_cut {
            let _ = writeln!(
                o,
                "the trace is incomplete: {cut}; this report covers what it holds"
            );
        }
        if !l.live_at_exit_by_kind.is_empty() {
            let kinds: Vec<String> = l
                .live_at_exit_by_kind
                .iter()
                .map(|k| format!("{} {}", k.kind.name(), human_bytes(k.bytes)))
                .collect();
            let _ = writeln!(o, "  PyTorch's tensors by kind: {}", kinds.join(", "));
        }
        o.push_str(&holders_text_all(&l.live_at_exit, top, "  "));
        if let Some(seen) = &l.boundary_not_found {
            let _ = writeln!(
                o,
                "iterations: --boundary {} names no NVTX range or mark of this trace; it holds {}",
                boundary.unwrap_or(""),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            );
            continue;
        }
        match &l.iterations {
            None => {
                let _ = writeln!(
                    o,
                    "iterations: none found (no repeating NVTX range or mark, no regular allocation)"
                );
            }
            Some(it) => {
                let _ = writeln!(
                    o,
                    "iterations: {} boundaries (where one iteration ends and the next begins), by {}",
                    it.count, it.boundary
                );
                if let (Some(a), Some(b)) =
                    (it.live_at_boundaries.first(), it.live_at_boundaries.last())
                {
                    let _ = writeln!(
                        o,
                        "  live at the first boundary {}, at the last {}",
                        human_bytes(*a),
                        human_bytes(*b)
                    );
                }
                if it.growing.is_empty() {
                    let _ = writeln!(
                        o,
                        "  no call site grows steadily from one iteration to the next"
                    );
                }
                if it.count < FEW_ITERATIONS {
                    let _ = writeln!(
                        o,
                        "  only {} boundaries: memory made once in the first iterations is told \
                         from growth where a line rises in two of them or more; a leak smaller \
                         or slower than that shows only over more iterations (run {} or more)",
                        it.count, FEW_ITERATIONS
                    );
                }
                for g in &it.growing {
                    render_growth(&mut o, g);
                }
            }
        }
    }
    if all.len() > 1 {
        render_job(&mut o, combined, top);
    }
    o
}

/// Every trace of a job together: what is live at exit, and the lines growing in each.
fn render_job(o: &mut String, combined: &JobLeaks, top: usize) {
    let c = combined;
    let _ = writeln!(o);
    let _ = writeln!(o, "all {} traces together", c.traces);
    let _ = writeln!(o, "live at exit: {}", human_bytes(c.live_at_exit_bytes));
    o.push_str(&holders_text_all(&c.live_at_exit, top, "  "));
    if !c.unclean.is_empty() {
        let _ = writeln!(o, "did not exit cleanly: {}", c.unclean.join(", "));
    }
    if c.growing.is_empty() {
        let _ = writeln!(o, "no call site grows steadily in any trace");
    }
    for g in &c.growing {
        // Where it grows on some ranks only, which: a leak of those ranks' own work.
        let which = if g.traces < c.traces {
            format!(" (only {})", g.in_traces.join(", "))
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "  grows {} per iteration in {} of {} traces{which}  {}",
            human_bytes(g.bytes_per_iteration),
            g.traces,
            c.traces,
            g.call_site
        );
    }
}
