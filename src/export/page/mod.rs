//! The run in one page: a single HTML file, its script, style and data inside, that opens from a
//! file with no network. Memory over the run stacked by kind or by line ([`crate::report::timeline`]),
//! with the growing lines (`leaks`), the peak's holders (`peak`), NVML's table (`summary`) and
//! the failed allocations (`oom`) beside it; several traces (the ranks of a job) behind a picker.
//!
//! Every string from a trace reaches the page as JSON inside a `<script type="application/json">`
//! element, with `<`, `>` and `&` written as `\u003c` escapes so no string can close it, and the
//! script puts strings on the page only as text (`textContent`), never as markup.

use super::xml;
use crate::report::timeline::{Lane, named};
use crate::trace::reader::{ReadError, ReadOptions};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// Holders listed per table (the page is read, not searched).
const HOLDERS: usize = 12;
/// Lines listed under each kind.
const PER_KIND: usize = 5;
/// Failed allocations listed in full.
const OOMS: usize = 20;

/// The page for `paths` (the ranks of a job, or one trace); `step` tells what is being read.
pub fn page_html(
    paths: &[PathBuf],
    at: Option<u64>,
    opts: &ReadOptions,
    step: &dyn Fn(&str),
) -> Result<String, ReadError> {
    use crate::report::analysis::{Wants, analyze_job};
    step(&match paths {
        [one] => crate::files::shown(one).to_string(),
        many => format!("{} traces, one core each", many.len()),
    });
    let mut traces = Vec::new();
    // With a batch: what fits, its requests from the same read as the page's reports; a
    // job's traces' each read after, one at a time, so that one trace's requests are held
    // at a time.
    let wants = Wants {
        requests: at.is_some() && paths.len() == 1,
        ..Wants::page()
    };
    for (name, mut a) in analyze_job(paths, opts, &wants)? {
        let path = a.info.path.clone();
        let saved = crate::report::analysis::saved::is_saved(&path);
        let requests = a.requests.take();
        let (mut t, summary) = trace_data(&name, saved, a)?;
        if let Some(at) = at {
            step(&format!("{name}: what fits"));
            t["fit"] = if saved {
                json!({"error": "what fits needs the trace itself, not a saved analysis"})
            } else {
                use crate::report::analysis::run_from_requests;
                let run = run_from_requests(requests, &path, Some(&summary), None, opts);
                fit_curve(run, at, opts)
            };
        }
        traces.push(t);
    }
    // Named by what the page holds: a saved analysis of a job brings every rank it joined.
    let ranks = traces
        .iter()
        .filter(|t| t["label"].as_str().is_some_and(|l| l.starts_with("rank ")))
        .count();
    let title = match (paths, traces.len()) {
        ([one], 1) => format!("gpushim: {}", crate::files::shown(one)),
        (_, n) if ranks == n => format!("gpushim: a job of {n} ranks"),
        (_, n) => format!("gpushim: {n} traces"),
    };
    let kinds: Vec<Value> = crate::report::kinds::Kind::ALL
        .iter()
        .map(|k| json!({"id": k, "name": k.name()}))
        .collect();
    let data = json!({
        "title": title,
        "version": env!("CARGO_PKG_VERSION"),
        "kinds": kinds,
        "traces": traces,
    });
    Ok(assemble(&title, &data))
}

/// The HTML: style, data and script inline.
fn assemble(title: &str, data: &Value) -> String {
    let data = script_safe(&data.to_string());
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n\
         <title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <noscript>This page draws with JavaScript; the same figures come from \
         <code>gpushim summary</code>, <code>leaks</code> and <code>peak</code>.</noscript>\n\
         <div id=\"app\"></div>\n\
         <script id=\"gpushim-data\" type=\"application/json\">{data}</script>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        xml(title)
    )
}

/// Peak reserved memory against the batch, under the run's setting and the other, up to past
/// the largest batch that fits; or why there is none. The run is read once for both asks, with
/// the page's reports, and its headroom taken from the page's summary of it.
fn fit_curve(
    run: Result<crate::report::fit::FitRun, crate::report::fit::FitError>,
    at: u64,
    opts: &ReadOptions,
) -> Value {
    use crate::report::fit::{Ask, fit_run};
    let run = match run {
        Ok(r) => r,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let first = Ask::largest(at, 4096);
    let largest = match fit_run(&run, &first, opts) {
        Ok(f) => f
            .settings
            .iter()
            .map(|s| s.largest_batch)
            .max()
            .unwrap_or(at),
        Err(e) => return json!({"error": e.to_string()}),
    };
    // Sixteen batches from 1 to past the largest (or twice the run's).
    let top = largest.max(at).saturating_mul(5) / 4 + 1;
    let mut batches: Vec<u64> = (1..=16u64).map(|k| (top * k).div_ceil(16).max(1)).collect();
    batches.push(at);
    batches.sort_unstable();
    batches.dedup();
    let ask = Ask { batches, ..first };
    match fit_run(&run, &ask, opts) {
        Ok(f) => serde_json::to_value(&f).unwrap_or(Value::Null),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// JSON that cannot end the `<script>` element it sits in, nor open a comment in it.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// Everything the page shows of one trace: its analysis, named `name` (a saved analysis's
/// trace is named by the host that saved it).
fn trace_data(
    name: &str,
    saved: bool,
    a: crate::report::analysis::Analysis,
) -> Result<(Value, crate::report::summary::Summary), ReadError> {
    let crate::report::analysis::Analysis {
        info,
        summary,
        leaks,
        peaks,
        ooms,
        lanes,
        ..
    } = a;
    let (Some(s), Some(l), Some(peaks), Some(ooms)) = (summary, leaks, peaks, ooms) else {
        let why = std::io::Error::other("the analysis is not whole");
        return Err(ReadError::Io(info.path, why));
    };
    let label = match s.run.rank {
        Some(r) => format!("rank {r}"),
        None if saved => name.to_string(),
        None => info
            .path
            .file_name()
            .map(|n| crate::files::shown(Path::new(n)).to_string())
            .unwrap_or_else(|| name.to_string()),
    };
    let name = name.to_string();
    let growing_lines: Vec<&str> = l
        .iterations
        .iter()
        .flat_map(|i| i.growing.iter().map(|g| g.call_site.as_str()))
        .collect();
    let steps = l
        .iterations
        .as_ref()
        .map(|i| crate::report::timeline::Boundaries {
            name: &i.boundary,
            count: i.count,
            times_ns: &i.boundary_times_ns,
            growing: &growing_lines,
        });
    let lanes: Vec<Lane> = named(lanes.unwrap_or_default(), &label, steps);
    let growing = growing_json(&l);
    let peaks = peaks_json(&peaks);
    let oom_count = ooms.len();
    let ooms = ooms_json(&ooms);
    let mut notes = Vec::new();
    if let Some(cut) = &l.trace_cut {
        notes.push(format!("The trace is incomplete: {cut}"));
    }
    if l.running {
        notes.push("The process was still running: what is live at the end is what was live when the trace was read.".to_string());
    }
    if let Some(off) = &s.tensors_off {
        notes.push(format!("No tensors of PyTorch's allocator: {off}"));
    }
    let data = json!({
        "label": label,
        "path": name,
        "program": s.run.program,
        "pid": s.run.pid,
        "host": s.run.host,
        "duration_ns": s.duration_ns,
        "events": s.events,
        "lanes": lanes,
        "iterations": l.iterations.as_ref().map(|i| json!({"boundary": i.boundary, "count": i.count})),
        "growing": growing,
        "live_at_exit": l.live_at_exit_bytes,
        "peaks": peaks,
        "device_memory": s.device_memory,
        "ooms": ooms,
        "oom_count": oom_count,
        "notes": notes,
    });
    Ok((data, s))
}

/// The growing lines, as the page lists them.
fn growing_json(l: &crate::report::Leaks) -> Vec<Value> {
    l.iterations
        .as_ref()
        .map(|i| {
            i.growing
                .iter()
                .map(|g| {
                    json!({
                        "line": g.call_site,
                        "kind": g.kind,
                        "per_step": g.bytes_per_iteration,
                        "first": g.live_at_first_boundary,
                        "last": g.live_at_last_boundary,
                        "kept_with": g.kept_with.iter().map(|k| &k.call_site).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Each device's peak, its kinds and lines, as the page shows them.
fn peaks_json(peaks: &[crate::report::peak::Peak]) -> Vec<Value> {
    peaks
        .iter()
        .map(|p| {
            let by_kind: Vec<Value> = p
                .by_kind
                .iter()
                .map(|k| {
                    json!({
                        "kind": k.kind,
                        "bytes": k.bytes,
                        "tensors": k.tensors,
                        "lines": k.by_call_site.iter().take(PER_KIND).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "device": p.device,
                "live": p.live_bytes,
                "reserved": p.reserved_bytes,
                "time_ns": p.time_ns,
                "by_kind": by_kind,
                "kinds_from_lines": p.kinds_from_lines,
                "lines": p.by_call_site.iter().take(HOLDERS).collect::<Vec<_>>(),
            })
        })
        .collect()
}

/// The failed allocations listed in full (the first [`OOMS`]).
fn ooms_json(ooms: &[crate::report::oom::Oom]) -> Vec<Value> {
    ooms.iter()
        .take(OOMS)
        .map(|o| {
            json!({
                "time_ns": o.time_ns,
                "api": o.api,
                "device": o.device,
                "requested": o.requested_bytes,
                "live": o.live_bytes,
                "reserved": o.reserved_bytes,
                "site": o.request_site,
                "by_kind": o.by_kind,
                "holders": o.holders.iter().take(5).collect::<Vec<_>>(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_string_can_close_the_data_element() {
        let s = super::script_safe(r#"{"a":"</script><script>alert(1)</script><!--&"}"#);
        assert!(
            !s.contains('<') && !s.contains('>') && !s.contains('&'),
            "{s}"
        );
        let back: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(back["a"], "</script><script>alert(1)</script><!--&");
    }
}
