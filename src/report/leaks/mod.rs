//! `leaks`: what is still held at the end, and what grows every iteration, by call site.

use super::live::{Change, Replay, site_key};
use super::pass::{Said, Seen, Tracker};
use super::sites::{Holder, holders, site_label};
use crate::trace::format::Record;
use crate::trace::format::RecordKind;
use crate::trace::live::{Boundary, BoundaryMark};
use crate::trace::reader::{TraceReader, TraceTables};
use crate::trace::summary::{MarkFinder, Thinned};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use together::FreedTogether;

mod job;
mod sampler;
mod together;

pub use job::{JobGrowth, JobLeaks, combine_leaks};
pub use sampler::LeaksSampler;

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_with: Vec<KeptWith>,
}

/// A call site whose allocations live and die with another's.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct KeptWith {
    pub call_site: String,
    /// How many times a free of one came right after a free of the other on the same thread
    /// (within a millisecond, both allocations older than the iteration before); 0 when the two
    /// are joined only through other sites freed in the same chains.
    pub freed_together: u64,
}

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
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

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Leaks {
    /// `--boundary NAME` named no NVTX range or mark of the trace: the names it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary_not_found: Option<Vec<String>>,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    /// PyTorch's tensors live at exit by kind, each kind's call sites under it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_at_exit_by_kind: Vec<super::kinds::KindHolders>,
    pub iterations: Option<Iterations>,
    pub clean_exit: bool,
    /// The process still runs: what is live is what is live now, not at exit.
    pub running: bool,
    /// What the trace is missing, when it was cut or damaged: the report covers the rest.
    pub trace_cut: Option<String>,
    /// How far the live figures hold when the trace is missing records (`None`: exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_figures: Option<String>,
}

/// Keeps at most this many boundaries (evenly thinned past it).
const MAX_BOUNDARIES: usize = 1000;

/// What was live at exit, by call site; and, with iteration boundaries (an NVTX range or mark
/// that repeats, `boundary` if given, else a detected period), the call sites whose live bytes
/// grow steadily from one iteration to the next.
/// The boundary chosen: (description, NVTX string id, or the site key of a detected period).
/// What marks the iterations, and how the report names it.
type Chosen = (String, BoundaryMark);

/// The iterations' boundary: the NVTX range named `boundary`, else what the checkpoint of a
/// ring trace marked them with, else what `finder` saw repeat most.
fn choose(
    tables: &TraceTables,
    finder: &MarkFinder,
    restored_mark: Option<BoundaryMark>,
    boundary: Option<&str>,
) -> Option<Chosen> {
    let from_mark = |m: BoundaryMark| -> Chosen {
        match m {
            BoundaryMark::Nvtx(id) => (format!("NVTX '{}'", tables.string(id).unwrap_or("?")), m),
            BoundaryMark::Site(key) => (
                format!(
                    "detected period: each allocation from {} (no NVTX ranges in the trace)",
                    site_label(tables, key)
                ),
                m,
            ),
        }
    };
    match boundary {
        None if restored_mark.is_some() => restored_mark.map(from_mark),
        Some(name) => finder
            .names
            .keys()
            .find(|&&id| tables.string(id) == Some(name))
            .map(|&id| (format!("NVTX '{name}'"), BoundaryMark::Nvtx(id))),
        None => finder.choose().map(from_mark),
    }
}

/// The call sites whose live bytes grow steadily over the boundaries (`series`, one map of
/// live bytes by site each, at iteration `ordinals`), the fastest first.
fn growing_sites(
    tables: &TraceTables,
    series: &[crate::fasthash::FastMap<u64, u64>],
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
        let label = site_label(tables, k);
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
                .map(|&k| super::kinds::phase_of_stack(tables, k))
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

/// The analysis's first pass for `leaks`: candidate boundaries (NVTX names) and allocation
/// sites for period detection.
#[derive(Default)]
pub struct LeaksFinder {
    finder: MarkFinder,
}

impl LeaksFinder {
    /// One record, after `rp` applied it (making change `c`).
    fn see_parts(&mut self, rp: &Replay, r: &Record, c: Change) {
        // A checkpoint's records restore state; the boundaries it kept come with it.
        if !(rp.restored.active || r.kind == RecordKind::Restore) {
            self.finder.learn(r, c);
        }
    }

    /// What marks the iterations (`boundary`, the user's, or as found), and the second pass that
    /// samples at each: `whole` and `reader` are the first pass's.
    pub fn finish(
        self,
        tables: &TraceTables,
        whole: &Replay,
        boundary: Option<&str>,
    ) -> LeaksSampler {
        self.sampler(tables, whole, boundary)
    }

    /// The sampler [`LeaksFinder::finish`] would give if the trace ended here.
    pub fn sampler(
        &self,
        tables: &TraceTables,
        whole: &Replay,
        boundary: Option<&str>,
    ) -> LeaksSampler {
        let finder = &self.finder;
        // A trace of any length: what marked the iterations before the ring, as the summarizer
        // chose it from the run's first allocations.
        let restored_mark = whole.restored.boundary_mark;
        let chosen = choose(tables, finder, restored_mark, boundary);
        let boundary_not_found = boundary.filter(|_| chosen.is_none()).map(|_| {
            let mut seen: Vec<String> = finder
                .names
                .keys()
                .filter_map(|&id| tables.string(id).map(str::to_string))
                .collect();
            seen.sort();
            seen.dedup();
            seen
        });
        // The boundaries the checkpoint of a ring trace kept come first, when it marked them as
        // this report does; the ring's boundaries are numbered on from its count.
        let restored_matches = chosen.as_ref().is_some_and(|c| Some(c.1) == restored_mark);
        LeaksSampler {
            chosen,
            short: tables.mode().short_roads,
            boundary_not_found,
            restored_matches,
            samples: Thinned::new(MAX_BOUNDARIES),
            seen: 0,
            together: FreedTogether::default(),
            decided: Default::default(),
            site_kinds: Default::default(),
        }
    }
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
    // Memory made once in the first iterations (optimizer state, gradients, a workspace) is
    // one rise, not growth: a line grows where it rises in two intervals or more and still
    // rises in the run's second half.
    let rises = diffs.iter().filter(|&&d| d > 0).count();
    if rises < 2 || s[s.len() - 1] <= s[s.len() / 2] {
        return None;
    }
    diffs.sort_unstable();
    let median = diffs[diffs.len() / 2];
    let span = i128::from(ordinals[ordinals.len() - 1].saturating_sub(ordinals[0]));
    let overall = s[s.len() - 1] as i128 - s[0] as i128;
    (median > 0 && rising * 4 >= diffs.len() * 3 && overall > 0 && overall * 2 >= median * span)
        .then_some(median as u64)
}

impl Tracker for LeaksFinder {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        self.see_parts(seen.rp, seen.record, seen.change);
    }
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
    /// on another thread, or one freed after the thread allocated or an iteration ended pairs
    /// nothing, however close in time; frees far apart in time with nothing between still pair
    /// (a program descheduled in the middle of a chain).
    #[test]
    fn only_long_lived_frees_next_to_each_other_on_one_thread_pair_up() {
        let mut t = FreedTogether::default();
        for b in [1_000, 2_000, 3_000] {
            t.boundary(b);
        }
        for _ in 0..4 {
            for site in [7, 9] {
                t.free(0, &live(site, 500));
            }
            // Young (made after the boundary before the latest), and another thread's.
            t.free(0, &live(11, 2_500));
            t.free(1, &live(13, 500));
        }
        assert_eq!(t.together(7, 9), Some(7));
        assert_eq!(
            t.chains(&[7, 9, 11, 13]),
            vec![vec![(1, 7)], vec![(0, 7)], vec![], vec![]]
        );
        // An allocation of the thread between two frees ends the chain; another thread's does
        // not.
        for _ in 0..3 {
            t.free(0, &live(21, 500));
            t.allocated(0);
            t.free(0, &live(23, 500));
            t.allocated(0);
        }
        assert_eq!(t.together(21, 23), None);
        for _ in 0..3 {
            t.free(0, &live(31, 500));
            t.allocated(1);
            t.free(0, &live(33, 500));
        }
        assert_eq!(t.together(31, 33), Some(5));
        // So does a boundary.
        for _ in 0..3 {
            t.free(0, &live(41, 500));
            t.boundary(4_000);
            t.free(0, &live(43, 500));
            t.allocated(0);
        }
        assert_eq!(t.together(41, 43), None);
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
        for _ in 0..10 {
            for site in [1, 2, 3, 4] {
                t.free(0, &live(site, 500));
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
