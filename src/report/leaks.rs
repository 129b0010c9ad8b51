//! `leaks`: what is still held at the end, and what grows every iteration, by call site.

use super::live::{Change, replay_each, site_key};
use super::sites::holders_text;
use super::sites::{Holder, holders, merge_holders, site_label};
use crate::report::summary::human_bytes;
use crate::trace::format::RecordKind;
use crate::trace::reader::{ReadError, ReadOptions};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct Growth {
    pub call_site: String,
    /// Median growth between consecutive iteration boundaries.
    pub bytes_per_iteration: u64,
    pub live_at_first_boundary: u64,
    pub live_at_last_boundary: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Iterations {
    /// What marks an iteration: an NVTX range or mark name, or a detected period.
    pub boundary: String,
    pub count: u64,
    /// Live bytes (all devices) at each boundary.
    pub live_at_boundaries: Vec<u64>,
    /// When each boundary came (since the trace started), for pictures.
    #[serde(skip)]
    pub boundary_times_ns: Vec<u64>,
    pub growing: Vec<Growth>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Leaks {
    /// `--boundary NAME` named no NVTX range or mark of the trace: the names it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary_not_found: Option<Vec<String>>,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    pub iterations: Option<Iterations>,
    pub clean_exit: bool,
    /// What the trace is missing, when it was cut or damaged: the report covers the rest.
    pub trace_cut: Option<String>,
}

/// Keeps at most this many boundaries (evenly thinned past it).
const MAX_BOUNDARIES: usize = 1000;

/// What was live at exit, by call site; and, with iteration boundaries (an NVTX range or mark
/// that repeats, `boundary` if given, else a detected period), the call sites whose live bytes
/// grow steadily from one iteration to the next.
pub fn leaks(path: &Path, boundary: Option<&str>, opts: &ReadOptions) -> Result<Leaks, ReadError> {
    // Pass 1: candidate boundaries (NVTX names) and allocation sites for period detection.
    let mut names: HashMap<u64, (u64, bool)> = HashMap::new();
    // Allocation times by site: by stack where stacks were recorded, else by API and size.
    // Positions in the sequence of allocations, not times: an iteration's allocations come in
    // the same order every time, while their timing varies with the machine.
    let mut by_stack: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut by_size: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut pending: HashMap<u16, u64> = HashMap::new();
    let mut allocations = 0u64;
    let (reader, _) = replay_each(path, opts, |_, _, r, c| match r.kind {
        RecordKind::RangePush | RecordKind::RangeStart | RecordKind::Mark => {
            let e = names
                .entry(r.ptr)
                .or_insert((0, r.kind != RecordKind::Mark));
            e.0 += 1;
        }
        RecordKind::StackRef => {
            if let Some(t) = pending.remove(&r.thread) {
                let v = by_stack.entry(r.ptr).or_default();
                if v.len() < 100_000 {
                    v.push(t);
                }
            }
        }
        _ => {
            if !r.kind.is_definition() {
                pending.remove(&r.thread);
            }
            if let Change::Alloc { .. } = c {
                allocations += 1;
                pending.insert(r.thread, allocations);
                let key = (1 << 63) | ((r.api as u64) << 48) | (r.size & ((1 << 48) - 1));
                let v = by_size.entry(key).or_default();
                if v.len() < 100_000 {
                    v.push(allocations);
                }
            }
        }
    })?;
    // By stack where stacks were recorded; by API and size where they were not, or sampled
    // too sparsely to show a period.
    let period = || detect_period(&by_stack).or_else(|| detect_period(&by_size));
    // Choose the boundary.
    // (description, NVTX string id, or the site key of a detected period)
    type Boundary = (String, Option<u64>, Option<u64>);
    let chosen: Option<Boundary> = match boundary {
        Some(name) => names
            .keys()
            .find(|&&id| reader.string(id) == Some(name))
            .map(|&id| (format!("NVTX '{name}'"), Some(id), None)),
        None => names
            .iter()
            .filter(|(_, (n, _))| *n >= 3)
            .max_by_key(|(id, (n, push))| (*push, *n, std::cmp::Reverse(**id)))
            .map(|(&id, _)| {
                (
                    format!("NVTX '{}'", reader.string(id).unwrap_or("?")),
                    Some(id),
                    None,
                )
            })
            .or_else(|| {
                period().map(|key| {
                    (
                        format!(
                            "detected period: each allocation from {} (no NVTX ranges in the trace)",
                            site_label(&reader, key)
                        ),
                        None,
                        Some(key),
                    )
                })
            }),
    };
    let chosen_missing = chosen.is_none();
    let name_ids: Vec<u64> = names.keys().copied().collect();
    // Pass 2: live bytes per call site at each boundary, from the live set (the stacks of
    // earlier allocations are all in by then).
    let mut series: Vec<HashMap<u64, u64>> = Vec::new();
    let mut totals: Vec<u64> = Vec::new();
    let mut times: Vec<u64> = Vec::new();
    let mut seen = 0u64;
    let (reader, rp) = replay_each(path, opts, |_, rp, r, c| {
        let is_boundary = match &chosen {
            Some((_, Some(id), _)) => {
                matches!(
                    r.kind,
                    RecordKind::RangePush | RecordKind::RangeStart | RecordKind::Mark
                ) && r.ptr == *id
            }
            Some((_, None, Some(key))) if key >> 63 == 1 => {
                matches!(c, Change::Alloc { .. })
                    && ((1 << 63) | ((r.api as u64) << 48) | (r.size & ((1 << 48) - 1))) == *key
            }
            Some((_, None, Some(key))) => r.kind == RecordKind::StackRef && r.ptr == *key,
            _ => false,
        };
        if is_boundary {
            seen += 1;
            if series.len() < MAX_BOUNDARIES {
                let mut by: HashMap<u64, u64> = HashMap::new();
                for l in rp.all_live() {
                    {
                        let v = by.entry(site_key(l)).or_default();
                        *v = v.saturating_add(l.size);
                    }
                }
                series.push(by);
                totals.push(rp.total_live());
                times.push(r.time_ns);
            }
        }
    })?;
    let iterations = chosen.map(|(boundary, _, _)| {
        let mut growing = Vec::new();
        if series.len() >= 3 {
            let keys: std::collections::HashSet<u64> =
                series.iter().flat_map(|m| m.keys().copied()).collect();
            for k in keys {
                let s: Vec<u64> = series
                    .iter()
                    .map(|m| m.get(&k).copied().unwrap_or(0))
                    .collect();
                let mut diffs: Vec<i128> =
                    s.windows(2).map(|w| w[1] as i128 - w[0] as i128).collect();
                let rising = diffs.iter().filter(|&&d| d >= 0).count();
                diffs.sort_unstable();
                let median = diffs[diffs.len() / 2];
                if median > 0 && rising * 4 >= diffs.len() * 3 && s[s.len() - 1] > s[0] {
                    growing.push(Growth {
                        call_site: site_label(&reader, k),
                        bytes_per_iteration: median as u64,
                        live_at_first_boundary: s[0],
                        live_at_last_boundary: s[s.len() - 1],
                    });
                }
            }
            growing.sort_by_key(|g| std::cmp::Reverse(g.bytes_per_iteration));
        }
        Iterations {
            boundary,
            count: seen,
            live_at_boundaries: totals.clone(),
            boundary_times_ns: times.clone(),
            growing,
        }
    });
    let boundary_not_found = boundary.filter(|_| chosen_missing).map(|_| {
        let mut seen: Vec<String> = name_ids
            .iter()
            .filter_map(|&id| reader.string(id).map(str::to_string))
            .collect();
        seen.sort();
        seen.dedup();
        seen
    });
    Ok(Leaks {
        boundary_not_found,
        live_at_exit_bytes: rp.total_live(),
        live_at_exit: holders(rp.all_live(), None, site_key, |k| site_label(&reader, k)),
        iterations,
        clean_exit: reader.info().clean_exit,
        trace_cut: reader.stats().cut(),
    })
}

/// The call site that recurs most often at a regular place in the sequence of allocations (at
/// least 3 times): once per iteration, in a loop. `sites` holds each site's positions in that
/// sequence. Regular means the gaps between its occurrences stay within 1.5x of each other (the
/// 10th and 90th percentiles, so a first or last iteration that differs does not count): a
/// site allocated several times per iteration comes in bursts and fails. Ties go to the site
/// seen first, so the same trace always gives the same answer.
fn detect_period(sites: &HashMap<u64, Vec<u64>>) -> Option<u64> {
    sites
        .iter()
        .filter(|(_, t)| t.len() >= 3)
        .filter(|(_, t)| {
            let mut gaps: Vec<u64> = t.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
            gaps.sort_unstable();
            let lo = gaps[gaps.len() / 10];
            let hi = gaps[(gaps.len() * 9 / 10).min(gaps.len() - 1)];
            lo > 0 && hi.saturating_mul(2) <= lo.saturating_mul(3)
        })
        .max_by_key(|(k, t)| (t.len(), std::cmp::Reverse(t[0]), std::cmp::Reverse(**k)))
        .map(|(k, _)| *k)
}

/// A call site growing in one or more ranks of a job.
#[derive(Clone, Debug, Serialize)]
pub struct JobGrowth {
    pub call_site: String,
    /// How many traces it grows in.
    pub traces: usize,
    /// Its growth per iteration, added up over those traces.
    pub bytes_per_iteration: u64,
}

/// The leaks of a job's traces together.
#[derive(Clone, Debug, Serialize)]
pub struct JobLeaks {
    pub traces: usize,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    /// Traces that did not exit cleanly.
    pub unclean: Vec<String>,
    pub growing: Vec<JobGrowth>,
}

pub fn combine_leaks(all: &[(String, Leaks)]) -> JobLeaks {
    let mut growing: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for g in all
        .iter()
        .filter_map(|(_, l)| l.iterations.as_ref())
        .flat_map(|it| &it.growing)
    {
        let e = growing.entry(g.call_site.as_str()).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(g.bytes_per_iteration);
    }
    let mut growing: Vec<JobGrowth> = growing
        .into_iter()
        .map(|(call_site, (traces, bytes))| JobGrowth {
            call_site: call_site.to_string(),
            traces,
            bytes_per_iteration: bytes,
        })
        .collect();
    growing.sort_by_key(|g| std::cmp::Reverse(g.bytes_per_iteration));
    JobLeaks {
        traces: all.len(),
        live_at_exit_bytes: all.iter().map(|(_, l)| l.live_at_exit_bytes).sum(),
        live_at_exit: merge_holders(all.iter().flat_map(|(_, l)| &l.live_at_exit)),
        unclean: all
            .iter()
            .filter(|(_, l)| !l.clean_exit)
            .map(|(t, _)| t.clone())
            .collect(),
        growing,
    }
}

/// The text `gpushim leaks` prints for each trace and, with several, for the job.
pub fn render_leaks(
    all: &[(String, Leaks)],
    combined: &JobLeaks,
    boundary: Option<&str>,
) -> String {
    let mut o = String::new();
    for (i, (t, l)) in all.iter().enumerate() {
        if i > 0 {
            let _ = writeln!(o);
        }
        let _ = writeln!(o, "{t}");
        let _ = writeln!(
            o,
            "live at exit: {}{}",
            human_bytes(l.live_at_exit_bytes),
            if l.clean_exit {
                ""
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
        o.push_str(&holders_text(&l.live_at_exit, 10, "  "));
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
                let _ = writeln!(o, "iterations: {} boundaries, by {}", it.count, it.boundary);
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
                for g in &it.growing {
                    let _ = writeln!(
                        o,
                        "  grows {} per iteration ({} -> {})  {}",
                        human_bytes(g.bytes_per_iteration),
                        human_bytes(g.live_at_first_boundary),
                        human_bytes(g.live_at_last_boundary),
                        g.call_site
                    );
                }
            }
        }
    }
    if all.len() > 1 {
        let c = &combined;
        let _ = writeln!(o);
        let _ = writeln!(o, "all {} traces together", c.traces);
        let _ = writeln!(o, "live at exit: {}", human_bytes(c.live_at_exit_bytes));
        o.push_str(&holders_text(&c.live_at_exit, 10, "  "));
        if !c.unclean.is_empty() {
            let _ = writeln!(o, "did not exit cleanly: {}", c.unclean.join(", "));
        }
        if c.growing.is_empty() {
            let _ = writeln!(o, "no call site grows steadily in any trace");
        }
        for g in &c.growing {
            let _ = writeln!(
                o,
                "  grows {} per iteration in {} of {} traces  {}",
                human_bytes(g.bytes_per_iteration),
                g.traces,
                c.traces,
                g.call_site
            );
        }
    }
    o
}
