//! `leaks`: what is still held at the end, and what grows every iteration, by call site.

use super::live::{replay_each, site_key};
use super::sites::holders_text_all;
use super::sites::{Holder, holders, merge_holders, site_label};
use crate::report::units::human_bytes;
use crate::trace::format::RecordKind;
use crate::trace::live::{Boundary, BoundaryMark};
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use crate::trace::summary::{MarkFinder, Thinned};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct Growth {
    pub call_site: String,
    /// What the line's tensors are (PyTorch's tensors only): an activation kept alive by a
    /// metric reads differently from a cache of inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<super::kinds::Kind>,
    /// Median growth between consecutive iteration boundaries.
    pub bytes_per_iteration: u64,
    pub live_at_first_boundary: u64,
    pub live_at_last_boundary: u64,
    /// Other growing call sites whose allocations, once they had outlived an iteration, were
    /// freed right next to this one's: what keeps one alive keeps the other (a metric and the
    /// activation its autograd graph saved). Empty when the trace shows no such frees.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_with: Vec<KeptWith>,
}

/// A call site whose allocations live and die with another's.
#[derive(Clone, Debug, Serialize)]
pub struct KeptWith {
    pub call_site: String,
    /// How many times a free of one came right after a free of the other on the same thread
    /// (within a millisecond, both allocations older than the iteration before); 0 when the two
    /// are joined only through other sites freed in the same chains.
    pub freed_together: u64,
}

/// Two frees on one thread closer than this are next to each other (a destructor releasing
/// what it held takes microseconds).
const NEXT_FREE_NS: u64 = 1_000_000;
/// Pairs of call sites counted at most; past it, only the pairs already counted go on.
const MAX_PAIRS: usize = 1 << 16;
/// Lines kept alive with a growing line that the text shows (the JSON has them all).
const KEPT_WITH_SHOWN: usize = 4;

/// Which call sites' long-lived allocations are freed next to each other. When the value that
/// keeps a leak alive is finally released (a list cleared, a function's locals at its return,
/// the interpreter's exit), everything it kept goes with it in one chain of frees: a metric,
/// then the activation its autograd graph saved, then the next metric. Only allocations that
/// outlived an iteration count, so the frees of every step's temporaries pair nothing.
#[derive(Default)]
struct FreedTogether {
    /// The times of the two latest iteration boundaries (older first) and how many were seen.
    boundaries: [u64; 2],
    seen: u64,
    /// Per thread: the call site and time of its latest free of a long-lived allocation.
    last: HashMap<u16, (u64, u64)>,
    /// Per call site: its long-lived allocations freed.
    freed: HashMap<u64, u64>,
    /// Per pair of call sites (smaller key first): frees of one right after the other's.
    pairs: HashMap<(u64, u64), u64>,
}

impl FreedTogether {
    fn boundary(&mut self, time_ns: u64) {
        self.boundaries = [self.boundaries[1], time_ns];
        self.seen = self.seen.saturating_add(1);
    }

    fn free(&mut self, thread: u16, live: &crate::trace::live::Live, time_ns: u64) {
        // Long-lived: made before the boundary before the latest.
        if self.seen < 2 || live.time_ns >= self.boundaries[0] {
            return;
        }
        let site = site_key(live);
        if self.freed.len() < MAX_PAIRS || self.freed.contains_key(&site) {
            *self.freed.entry(site).or_default() += 1;
        }
        let Some((prev, at)) = self.last.insert(thread, (site, time_ns)) else {
            return;
        };
        if prev == site || time_ns.saturating_sub(at) > NEXT_FREE_NS {
            return;
        }
        let key = (prev.min(site), prev.max(site));
        if self.pairs.len() < MAX_PAIRS || self.pairs.contains_key(&key) {
            *self.pairs.entry(key).or_default() += 1;
        }
    }

    /// The same frees counted by line: `line` names each call site's line (sites of one line
    /// are one; a site without a line drops out). Pairs within one line count nothing.
    fn by_line(&self, line: impl Fn(u64) -> Option<u64>) -> FreedTogether {
        let mut out = FreedTogether::default();
        for (&k, &n) in &self.freed {
            if let Some(l) = line(k) {
                *out.freed.entry(l).or_default() += n;
            }
        }
        for (&(a, b), &n) in &self.pairs {
            if let (Some(a), Some(b)) = (line(a), line(b))
                && a != b
            {
                *out.pairs.entry((a.min(b), a.max(b))).or_default() += n;
            }
        }
        out
    }

    /// How often allocations of `a` and `b` were freed next to each other, when that makes them
    /// live and die together: at least twice, and next to at least half of the long-lived
    /// allocations freed of each.
    fn together(&self, a: u64, b: u64) -> Option<u64> {
        let n = *self.pairs.get(&(a.min(b), a.max(b)))?;
        let freed = |k| self.freed.get(&k).copied().unwrap_or(0);
        (a != b && n >= 2 && n.saturating_mul(2) >= freed(a).max(freed(b))).then_some(n)
    }

    /// For each of `growing`, the others freed in one chain with it: joined by frees next to
    /// each other, directly or through other sites of the list (an autograd graph kept by a
    /// metric frees the metric and each activation it saved one after another), each with how
    /// often the two were freed next to each other (0: only through others).
    fn chains(&self, growing: &[u64]) -> Vec<Vec<(usize, u64)>> {
        // Union-find over the list's indices.
        let mut parent: Vec<usize> = (0..growing.len()).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        for i in 0..growing.len() {
            for j in i + 1..growing.len() {
                if self.together(growing[i], growing[j]).is_some() {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
            }
        }
        let roots: Vec<usize> = (0..growing.len()).map(|i| root(&mut parent, i)).collect();
        (0..growing.len())
            .map(|i| {
                (0..growing.len())
                    .filter(|&j| j != i && roots[j] == roots[i])
                    .map(|j| (j, self.together(growing[i], growing[j]).unwrap_or(0)))
                    .collect()
            })
            .collect()
    }
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
    /// PyTorch's tensors live at exit by kind, each kind's call sites under it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub live_at_exit_by_kind: Vec<super::kinds::KindHolders>,
    pub iterations: Option<Iterations>,
    pub clean_exit: bool,
    /// The process still runs: what is live is what is live now, not at exit.
    pub running: bool,
    /// What the trace is missing, when it was cut or damaged: the report covers the rest.
    pub trace_cut: Option<String>,
}

/// Keeps at most this many boundaries (evenly thinned past it).
const MAX_BOUNDARIES: usize = 1000;

/// What was live at exit, by call site; and, with iteration boundaries (an NVTX range or mark
/// that repeats, `boundary` if given, else a detected period), the call sites whose live bytes
/// grow steadily from one iteration to the next.
/// The boundary chosen: (description, NVTX string id, or the site key of a detected period).
type Chosen = (String, Option<u64>, Option<u64>);

/// The iterations' boundary: the NVTX range named `boundary`, else what the checkpoint of a
/// ring trace marked them with, else what `finder` saw repeat most.
fn choose(
    reader: &TraceReader,
    finder: &MarkFinder,
    restored_mark: Option<BoundaryMark>,
    boundary: Option<&str>,
) -> Option<Chosen> {
    let from_mark = |m: BoundaryMark| -> Chosen {
        match m {
            BoundaryMark::Nvtx(id) => (
                format!("NVTX '{}'", reader.string(id).unwrap_or("?")),
                Some(id),
                None,
            ),
            BoundaryMark::Site(key) => (
                format!(
                    "detected period: each allocation from {} (no NVTX ranges in the trace)",
                    site_label(reader, key)
                ),
                None,
                Some(key),
            ),
        }
    };
    match boundary {
        None if restored_mark.is_some() => restored_mark.map(from_mark),
        Some(name) => finder
            .names
            .keys()
            .find(|&&id| reader.string(id) == Some(name))
            .map(|&id| (format!("NVTX '{name}'"), Some(id), None)),
        None => finder.choose().map(from_mark),
    }
}

/// The call sites whose live bytes grow steadily over the boundaries (`series`, one map of
/// live bytes by site each, at iteration `ordinals`), the fastest first.
fn growing_sites(
    reader: &TraceReader,
    series: &[HashMap<u64, u64>],
    ordinals: &[u64],
    together: &FreedTogether,
    tensors: bool,
) -> Vec<Growth> {
    let mut growing = Vec::new();
    if series.len() < 3 {
        return growing;
    }
    // Stacks that read the same (frames past the fourth differ, or only the program's own
    // frames are shown) are one line, as in the rows of what is live: the line's growth is
    // theirs together.
    let mut lines: Vec<(String, Vec<u64>)> = Vec::new();
    let mut line_of: HashMap<u64, usize> = HashMap::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for k in series.iter().flat_map(|m| m.keys().copied()) {
        if line_of.contains_key(&k) {
            continue;
        }
        let label = site_label(reader, k);
        let i = *index.entry(label.clone()).or_insert_with(|| {
            lines.push((label, Vec::new()));
            lines.len() - 1
        });
        lines[i].1.push(k);
        line_of.insert(k, i);
    }
    let mut ids = Vec::new();
    for (i, (label, keys)) in lines.iter().enumerate() {
        let s: Vec<u64> = series
            .iter()
            .map(|m| {
                keys.iter()
                    .filter_map(|k| m.get(k))
                    .fold(0, |a: u64, &b| a.saturating_add(b))
            })
            .collect();
        if let Some(per_iteration) = steady_growth(&s, ordinals) {
            ids.push(i as u64);
            // A tensor that grows a line outlived the run that made it: its phase's kind.
            let kind = keys
                .iter()
                .find(|&&k| crate::trace::live::size_key_parts(k).is_none())
                .filter(|_| tensors)
                .map(|&k| super::kinds::phase_of_stack(reader, k))
                .map(super::kinds::Phase::lasting)
                .filter(|&k| k != super::kinds::Kind::Unknown);
            growing.push(Growth {
                call_site: label.clone(),
                kind,
                bytes_per_iteration: per_iteration,
                live_at_first_boundary: s[0],
                live_at_last_boundary: s[s.len() - 1],
                kept_with: Vec::new(),
            });
        }
    }
    let chains = together
        .by_line(|k| line_of.get(&k).map(|&i| i as u64))
        .chains(&ids);
    let labels: Vec<String> = growing.iter().map(|g| g.call_site.clone()).collect();
    for (g, mut with) in growing.iter_mut().zip(chains) {
        // Direct neighbours first, the most often freed together first.
        with.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| labels[a.0].cmp(&labels[b.0])));
        g.kept_with = with
            .into_iter()
            .map(|(j, n)| KeptWith {
                call_site: labels[j].clone(),
                freed_together: n,
            })
            .collect();
    }
    growing.sort_by(|a, b| {
        b.bytes_per_iteration
            .cmp(&a.bytes_per_iteration)
            .then_with(|| a.call_site.cmp(&b.call_site))
    });
    growing
}

pub fn leaks(path: &Path, boundary: Option<&str>, opts: &ReadOptions) -> Result<Leaks, ReadError> {
    // Pass 1: candidate boundaries (NVTX names) and allocation sites for period detection.
    let mut finder = MarkFinder::default();
    let (reader, first_pass) = replay_each(path, opts, |_, rp, r, c| {
        // A checkpoint's records restore state; the boundaries it kept come with it.
        if !(rp.restoring || r.kind == RecordKind::Restore) {
            finder.learn(r, c);
        }
    })?;
    // A trace of any length: what marked the iterations before the ring, as the summarizer
    // chose it from the run's first allocations.
    let restored_mark = first_pass.boundary_mark;
    let chosen = choose(&reader, &finder, restored_mark, boundary);
    let chosen_missing = chosen.is_none();
    let name_ids: Vec<u64> = finder.names.keys().copied().collect();
    // The boundaries the checkpoint of a ring trace kept come first, when it marked them as
    // this report does; the ring's boundaries are numbered on from its count.
    let restored_matches = matches!(
        (&chosen, restored_mark),
        (Some((_, Some(id), None)), Some(BoundaryMark::Nvtx(m))) if *id == m
    ) || matches!(
        (&chosen, restored_mark),
        (Some((_, None, Some(key))), Some(BoundaryMark::Site(m))) if *key == m
    );
    // Pass 2: live bytes per call site at each boundary, from the live set (the stacks of
    // earlier allocations are all in by then); past MAX_BOUNDARIES, every other one is let go
    // and then only every `stride`-th kept, so the samples stay spread over the whole run.
    let mut samples: Thinned<Boundary> = Thinned::new(MAX_BOUNDARIES);
    let mut seen = 0u64;
    let mut together = FreedTogether::default();
    let mut kinds = super::kinds::Kinds::default();
    // Per call site: the bytes of its tensors by the kind each turned out to be, freed or live
    // at the end (for the kind of a growing line).
    let mut decided: HashMap<u64, super::kinds::Kind> = HashMap::new();
    let mut site_kinds: HashMap<u64, BTreeMap<super::kinds::Kind, u64>> = HashMap::new();
    let (reader, rp) = replay_each(path, opts, |reader, rp, r, c| {
        if let Some((ptr, k)) = kinds.observe(reader, r) {
            decided.insert(ptr, k);
        }
        if let crate::trace::live::Change::Free { ptr, live } = &c
            && let Some(k) = decided.remove(ptr)
        {
            let e = site_kinds
                .entry(site_key(live))
                .or_default()
                .entry(k)
                .or_default();
            *e = e.saturating_add(live.size);
        }
        if rp.restoring || r.kind == RecordKind::Restore {
            return;
        }
        if let crate::trace::live::Change::Free { live, .. } = &c {
            together.free(r.thread, live, r.time_ns);
        }
        let is_boundary = match &chosen {
            Some((_, Some(id), _)) => BoundaryMark::Nvtx(*id).is_boundary(r, c),
            Some((_, None, Some(key))) => BoundaryMark::Site(*key).is_boundary(r, c),
            _ => false,
        };
        if is_boundary {
            seen += 1;
            together.boundary(r.time_ns);
            if samples.wants() {
                let base = if restored_matches {
                    rp.boundary_count
                } else {
                    0
                };
                samples.push(Boundary {
                    ordinal: base + seen,
                    time_ns: r.time_ns,
                    total: rp.total_live(),
                    by_site: rp.live_by_site(),
                });
            }
        }
    })?;
    let kept: Vec<Boundary> = if restored_matches && !rp.boundaries.is_empty() {
        // The checkpoint's boundaries, then the ring's, thinned together.
        let mut all: Thinned<Boundary> = Thinned::new(MAX_BOUNDARIES);
        for b in rp.boundaries.iter().cloned().chain(samples.into_items()) {
            if all.wants() {
                all.push(b);
            }
        }
        seen = seen.saturating_add(rp.boundary_count);
        all.into_items()
    } else {
        samples.into_items()
    };
    let ordinals: Vec<u64> = kept.iter().map(|b| b.ordinal).collect();
    let totals: Vec<u64> = kept.iter().map(|b| b.total).collect();
    let times: Vec<u64> = kept.iter().map(|b| b.time_ns).collect();
    let series: Vec<HashMap<u64, u64>> = kept.into_iter().map(|b| b.by_site).collect();
    let mut iterations = chosen.map(|(boundary, _, _)| Iterations {
        boundary,
        count: seen,
        live_at_boundaries: totals.clone(),
        boundary_times_ns: times.clone(),
        growing: growing_sites(
            &reader,
            &series,
            &ordinals,
            &together,
            rp.tensors.recorded(),
        ),
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
    let tensors: Vec<(super::kinds::Kind, &crate::trace::live::Live)> = rp
        .live
        .iter()
        .filter(|(_, l)| l.api == crate::trace::format::Api::Torch as u8)
        .map(|(&p, l)| (kinds.lasting(&reader, p, l.stack), l))
        .collect();
    let live_at_exit_by_kind = super::kinds::by_kind_and_site(&tensors, |k| site_label(&reader, k));
    // A growing line's kind is what its tensors still live at the end are, as the kinds'
    // tracker tells them (a metric computed between a forward and its backward keeps the
    // forward's graph: an activation), where its phase alone would say less.
    if let Some(it) = iterations.as_mut().filter(|it| !it.growing.is_empty()) {
        for (k, l) in &tensors {
            let e = site_kinds
                .entry(site_key(l))
                .or_default()
                .entry(*k)
                .or_default();
            *e = e.saturating_add(l.size);
        }
        let mut by_line: HashMap<String, BTreeMap<super::kinds::Kind, u64>> = HashMap::new();
        for (site, kinds) in site_kinds {
            let line = by_line.entry(site_label(&reader, site)).or_default();
            for (k, b) in kinds {
                let e = line.entry(k).or_default();
                *e = e.saturating_add(b);
            }
        }
        // What grows is kept: a temporary of the same line (made and freed within its phase)
        // does not name it.
        for g in &mut it.growing {
            if let Some(kinds) = by_line.get(&g.call_site)
                && let Some((&k, _)) = kinds
                    .iter()
                    .filter(|&(k, _)| *k != super::kinds::Kind::Temporary)
                    .max_by_key(|&(k, b)| (*b, std::cmp::Reverse(*k)))
            {
                g.kind = Some(k);
            }
        }
    }
    Ok(Leaks {
        boundary_not_found,
        live_at_exit_bytes: rp.total_live(),
        live_at_exit_by_kind,
        live_at_exit: holders(rp.all_live(), None, site_key, |k| site_label(&reader, k)),
        iterations,
        clean_exit: reader.info().clean_exit,
        running: reader.info().running_here(),
        trace_cut: reader.stats().cut(),
    })
}

/// How much a call site's live bytes grow per iteration, when they grow steadily: `s` its live
/// bytes at the boundaries kept, `ordinals` which boundary of the run each was (samples kept
/// further apart count as that many iterations). Steadily: the median growth per iteration is
/// positive, three in four samples rise or hold, and what it gained from the first sample to
/// the last is at least half what the median says, which a sawtooth (a batch whose shape cycles,
/// rising most steps and falling back) never gains.
fn steady_growth(s: &[u64], ordinals: &[u64]) -> Option<u64> {
    if s.len() < 3 || s.len() != ordinals.len() {
        return None;
    }
    let mut diffs: Vec<i128> = s
        .windows(2)
        .zip(ordinals.windows(2))
        .map(|(w, o)| (w[1] as i128 - w[0] as i128) / i128::from(o[1].saturating_sub(o[0]).max(1)))
        .collect();
    let rising = diffs.iter().filter(|&&d| d >= 0).count();
    diffs.sort_unstable();
    let median = diffs[diffs.len() / 2];
    let span = i128::from(ordinals[ordinals.len() - 1].saturating_sub(ordinals[0]));
    let overall = s[s.len() - 1] as i128 - s[0] as i128;
    (median > 0 && rising * 4 >= diffs.len() * 3 && overall > 0 && overall * 2 >= median * span)
        .then_some(median as u64)
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
            "{}: {}{}",
            if l.running {
                "live now"
            } else {
                "live at exit"
            },
            human_bytes(l.live_at_exit_bytes),
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
                for g in &it.growing {
                    render_growth(&mut o, g);
                }
            }
        }
    }
    if all.len() > 1 {
        let c = &combined;
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

#[cfg(test)]
mod tests {
    use super::{FreedTogether, steady_growth};
    use crate::trace::live::Live;

    fn live(stack: u64, time_ns: u64) -> Live {
        Live {
            size: 4,
            device: 0,
            stack,
            range: 0,
            time_ns,
            thread: 0,
            stream: 0,
            api: 0,
            kind: 0,
            caller: [0; 2],
        }
    }

    /// Long-lived allocations of two sites freed in turn on one thread pair up; a young one, one
    /// on another thread, or one freed more than a millisecond later pairs nothing.
    #[test]
    fn only_long_lived_frees_next_to_each_other_on_one_thread_pair_up() {
        let mut t = FreedTogether::default();
        for b in [1_000, 2_000, 3_000] {
            t.boundary(b);
        }
        let mut now = 10_000;
        for _ in 0..4 {
            for site in [7, 9] {
                now += 10;
                t.free(0, &live(site, 500), now);
            }
            // Young (made after the boundary before the latest), and another thread's.
            t.free(0, &live(11, 2_500), now + 1);
            t.free(1, &live(13, 500), now + 2);
        }
        assert_eq!(t.together(7, 9), Some(7));
        assert_eq!(
            t.chains(&[7, 9, 11, 13]),
            vec![vec![(1, 7)], vec![(0, 7)], vec![], vec![]]
        );
        // A free two milliseconds after the last pairs nothing.
        t.free(0, &live(21, 500), now + 2_000_000);
        t.free(0, &live(23, 500), now + 4_000_000);
        assert_eq!(t.together(21, 23), None);
    }

    /// A metric kept with its graph frees the metric and then each activation the graph saved,
    /// every iteration's in turn: all of them are one chain, each joined to the metric, directly
    /// or through the others.
    #[test]
    fn a_chain_of_frees_joins_every_site_in_it() {
        let mut t = FreedTogether::default();
        for b in [1_000, 2_000, 3_000] {
            t.boundary(b);
        }
        let mut now = 10_000;
        for _ in 0..10 {
            for site in [1, 2, 3, 4] {
                now += 10;
                t.free(0, &live(site, 500), now);
            }
        }
        let chains = t.chains(&[4, 3, 2, 1, 99]);
        // Site 1 (index 3) next to 2 (10 times) and, across iterations, to 4 (9 times); 3 only
        // through them.
        assert_eq!(chains[3], vec![(0, 9), (1, 0), (2, 10)]);
        assert!(chains[4].is_empty());
    }

    #[test]
    fn a_leak_grows_and_a_cycling_batch_does_not() {
        let ordinals: Vec<u64> = (1..=60).collect();
        let leak: Vec<u64> = ordinals.iter().map(|i| 1000 + i * 4096).collect();
        assert_eq!(steady_growth(&leak, &ordinals), Some(4096));
        // A batch whose size cycles through six shapes: up five steps, down one.
        let cycle: Vec<u64> = ordinals.iter().map(|i| 64 + (i % 6) * 89 * 64).collect();
        assert_eq!(steady_growth(&cycle, &ordinals), None);
        // Samples thinned to every 4th boundary: the same leak, per iteration.
        let thinned: Vec<u64> = (0..20).map(|k| 1 + 4 * k).collect();
        let leak: Vec<u64> = thinned.iter().map(|i| i * 4096).collect();
        assert_eq!(steady_growth(&leak, &thinned), Some(4096));
    }
}
