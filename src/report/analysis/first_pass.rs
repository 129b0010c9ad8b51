//! The first pass: its trackers, each only when asked for, fed every record after one replay
//! of the live set applied it and one tracker of the kinds observed it; on a machine with the
//! cores, in groups (up to one a report), each on a thread of its own reading the batches one
//! decoder shares; and where its time went (`GPUSHIM_READS=1`).

use super::Wants;
use super::early_leaks::EarlyLeaks;
use crate::report::early::EarlyMoments;
use crate::report::kinds::KindTracker;
use crate::report::leaks::LeaksFinder;
use crate::report::live::Replay;
use crate::report::oom::OomPass;
use crate::report::pass::{Said, Seen, Tracker};
use crate::report::peak::PeakFinder;
use crate::report::summary::SummaryPass;
use crate::report::timeline::PicturePass;
use crate::trace::reader::ReadCounts;
use crate::trace::reader::{ReadError, TraceReader};

/// The first pass's trackers, each only when asked for.
pub(super) struct RunPass {
    pub(super) summary: Option<SummaryPass>,
    pub(super) peak: Option<PeakFinder>,
    pub(super) oom: Option<OomPass>,
    pub(super) leaks: Option<LeaksFinder>,
    /// The picture's columns, and its bands where they are taken in this pass.
    pub(super) picture: Option<PicturePass>,
    /// The replay and the kinds, each kept only when a tracker reads it.
    pub(super) rp: Replay,
    pub(super) kinds: KindTracker,
    with_replay: bool,
    with_kinds: bool,
    /// The moments taken as the trackers find them, and what the trackers said of them at
    /// the record being read.
    pub(super) early: Option<EarlyMoments>,
    said: Vec<Said>,
    /// The leaks' sampler begun in this pass.
    pub(super) early_leaks: Option<EarlyLeaks>,
    /// The moments a group on a thread of its own took (its `early` finished there).
    pub(super) taken: Vec<crate::report::moments::Moment>,
    /// The requests of PyTorch's allocator, for a replay.
    pub(super) requests: Option<crate::report::torch_allocator::Requests>,
}

impl RunPass {
    /// The trackers `wants` asks for, and what they read.
    fn new(reader: &TraceReader, wants: &Wants) -> RunPass {
        // The moments of the summary and the peaks are taken in this pass where they can be
        // (`early`): with the shared replay and the kinds, read whatever else is asked.
        // Else every moment in the second pass (the tests compare the two).
        let early_off = !reader.mode().early;
        let early =
            (!early_off && (wants.summary || wants.peak)).then(|| EarlyMoments::new(reader));
        let (with_replay, with_kinds) = reads(wants, early.is_some());
        RunPass {
            summary: wants.summary.then(|| SummaryPass::reading(reader)),
            peak: wants.peak.then(PeakFinder::default),
            oom: wants.oom.then(OomPass::default),
            leaks: wants.leaks.is_some().then(LeaksFinder::default),
            picture: wants
                .timeline
                .is_some()
                .then(|| PicturePass::new(!early_off)),
            rp: Replay::default(),
            kinds: KindTracker::default(),
            with_replay,
            with_kinds,
            early,
            said: Vec::new(),
            early_leaks: wants
                .leaks
                .as_ref()
                .filter(|_| !early_off)
                .map(|b| EarlyLeaks::new(reader, b.clone())),
            taken: Vec::new(),
            requests: wants
                .requests
                .then(|| crate::report::torch_allocator::Requests::new(reader)),
        }
    }

    /// One record of the first pass: applied to the replay (when a tracker reads it) and
    /// observed by the kinds (when asked), then handed to each tracker; what it changed.
    #[inline]
    fn see(
        &mut self,
        reader: &TraceReader,
        r: &crate::trace::format::Record,
    ) -> crate::trace::live::Change {
        let (rp, kinds, early) = (&mut self.rp, &mut self.kinds, &mut self.early);
        let c = if self.with_replay {
            rp.apply(r)
        } else {
            crate::trace::live::Change::Other
        };
        let run_before = kinds.run();
        let decided = if self.with_kinds {
            kinds.observe(reader, r)
        } else {
            None
        };
        let seen = Seen {
            reader,
            rp,
            kinds,
            record: r,
            change: c,
            decided,
            run_before,
        };
        let said = &mut self.said;
        if let Some(q) = &mut self.requests {
            q.see(&seen, said);
        }
        if let Some(p) = &mut self.summary {
            p.see(&seen, said);
        }
        if let Some(p) = &mut self.peak {
            p.see(&seen, said);
        }
        if let Some(p) = &mut self.oom {
            p.see(&seen, said);
        }
        if let Some(p) = &mut self.leaks {
            p.see(&seen, said);
            if let Some(e) = &mut self.early_leaks {
                if rp.index > e.at {
                    e.see(&seen, said);
                } else if rp.index == e.at {
                    e.begin(reader, p, rp);
                }
            }
        }
        if let Some(p) = &mut self.picture {
            p.see(&seen, said);
        }
        match early {
            Some(e) => e.see(&seen, said),
            None => said.clear(),
        }
        c
    }
}

/// A caller's own look at every record of the first pass, after the replay applied it (what
/// `plot --by total` draws): on the first group's thread, whose replay is kept.
pub type Each<'a> = &'a mut dyn FnMut(
    &TraceReader,
    &Replay,
    &crate::trace::format::Record,
    crate::trace::live::Change,
);

/// Whether the trackers `wants` asks for read the replay, and the kinds (`early`: with the
/// moments taken in the first pass).
fn reads(wants: &Wants, early: bool) -> (bool, bool) {
    let iterations = wants.oom || wants.leaks.is_some() || wants.timeline.is_some();
    let reports = wants.summary || iterations || early;
    // PyTorch's requests read the kinds, not the replay.
    (
        reports || wants.peak || wants.live_at_end,
        reports || wants.requests,
    )
}

/// Every record of `reader` to `run`'s trackers, and to `each` after them.
fn read_all(reader: &mut TraceReader, run: &mut RunPass, mut each: Option<Each<'_>>) {
    let cpu = crate::trace::reader::thread_cpu_ns();
    run.with_replay |= each.is_some();
    // Read where the decoder left each batch: the groups of a page share one.
    let mut held = crate::trace::reader::Held::default();
    while reader.next_held(&mut held) {
        let records = held.records();
        for (i, r) in records.iter().enumerate() {
            crate::prefetch::ahead(records, i);
            let c = run.see(reader, r);
            if let Some(f) = each.as_mut() {
                f(reader, &run.rp, r, c);
            }
        }
    }
    let cpu = crate::trace::reader::thread_cpu_ns().saturating_sub(cpu);
    let counts = &reader.mode().counts;
    ReadCounts::add(&counts.tracking_ns, cpu);
    ReadCounts::most(&counts.tracking_most_ns, cpu);
}

/// The first pass. Where `wants` asks for several reports (the page, `analyze`, `oom` with
/// what grew until it), they are groups, each on a thread with a replay and kinds of its own,
/// reading the same batches (decoded once and shared: [`TraceReader::pairs`]): as many as
/// there are cores beside the decoder's, up to one a report (the summary, the peaks, the
/// failures, the iterations, the picture), the lighter reports together first (see
/// [`groups_of`]). Their replays and kinds end the same (the same records applied the same
/// way), so the first group's serve all after the pass; a group's moments are taken on its own
/// thread. Groups pay where a second replay costs less than the reports it takes off the
/// first thread: with three cores or more, one a core beside the decoder's; on two, where the
/// threads take turns, only the page's and `analyze`'s five reports (in two groups) and
/// PyTorch's requests beside `fit`'s summary (they read the kinds but no replay). The figures
/// that chose this are in `docs/changelog.md` and `docs/gpu-checks.md` (`scripts/bench.sh
/// readonce` and `scaling` measure it). `ReadMode::groups`: at most N groups whatever the
/// cores (`0`: one; the tests compare them).
pub(super) fn first_pass(
    reader: &mut TraceReader,
    wants: &Wants,
    cores: usize,
    each: Option<Each<'_>>,
) -> Result<RunPass, ReadError> {
    let started = std::time::Instant::now();
    let run = first_pass_on(reader, wants, cores, each);
    let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    ReadCounts::add(&reader.mode().counts.first_pass_ns, took);
    run
}

/// [`first_pass`], untimed.
fn first_pass_on(
    reader: &mut TraceReader,
    wants: &Wants,
    cores: usize,
    each: Option<Each<'_>>,
) -> Result<RunPass, ReadError> {
    let split = reader.mode().groups;
    let groups = groups_of(wants, most_groups(cores, wants, split));
    let mut others = reader.pairs(groups.len().saturating_sub(1));
    let Some(first) = groups.first().filter(|_| !others.is_empty()) else {
        let mut run = RunPass::new(reader, wants);
        read_all(reader, &mut run, each);
        return Ok(run);
    };
    let (mut run, theirs) = std::thread::scope(|s| {
        let threads: Vec<_> = others
            .drain(..)
            .zip(groups.iter().skip(1))
            .map(|(mut other, group)| {
                s.spawn(move || {
                    let mut run = RunPass::new(&other, group);
                    read_all(&mut other, &mut run, None);
                    if let Some(e) = run.early.take() {
                        run.taken = e.finish(&other, &run.kinds);
                    }
                    // Dropped on this thread, so the decoder's thread ends before the first
                    // reader is rewound.
                    drop(other);
                    run
                })
            })
            .collect();
        let mut run = RunPass::new(reader, first);
        // The first group's replay and kinds serve every report after the pass.
        let (replay, kinds) = reads(wants, run.early.is_some());
        (run.with_replay, run.with_kinds) = (run.with_replay || replay, run.with_kinds || kinds);
        read_all(reader, &mut run, each);
        let theirs: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
        (run, theirs)
    });
    for t in theirs {
        let mut t = t.map_err(|_| {
            let why = std::io::Error::other("a reading thread failed");
            ReadError::Io(reader.info().path.clone(), why)
        })?;
        run.summary = run.summary.or(t.summary);
        run.peak = run.peak.or(t.peak);
        run.oom = run.oom.or(t.oom);
        if t.leaks.is_some() {
            (run.leaks, run.early_leaks) = (t.leaks, t.early_leaks);
        }
        if t.picture.is_some() {
            run.picture = t.picture;
        }
        run.requests = run.requests.or(t.requests);
        run.taken.append(&mut t.taken);
    }
    Ok(run)
}

/// How many groups of trackers the first pass may have on `cores` cores (`split`:
/// `ReadMode::groups`): one a core beside the decoder's from three cores; on two, two for
/// the page's and `analyze`'s five reports (see [`first_pass`]), one for fewer.
fn most_groups(cores: usize, wants: &Wants, split: Option<usize>) -> usize {
    match split {
        Some(n) => n.max(1),
        None if cores >= 3 => cores - 1,
        // One group a report asked for, as many as there are; PyTorch's requests beside
        // another report in a group of their own (see [`groups_of`]).
        None if cores == 2 && groups_of(wants, usize::MAX).len() >= 4 => 2,
        None if cores == 2 && wants.requests && groups_of(wants, usize::MAX).len() >= 2 => 2,
        None => 1,
    }
}

/// What each group of trackers of the first pass reads (see [`first_pass`]), `most` groups at
/// most: one a report asked for, then, while there are too many, the lighter ones together
/// (the failures with the peaks, then with the summary; the picture with the iterations last),
/// so that two groups are the summary's, the peaks' and the failures' against the iterations'
/// and the picture's, and three the same with the last two apart.
fn groups_of(wants: &Wants, most: usize) -> Vec<Wants> {
    let none = Wants {
        summary: false,
        peak: false,
        oom: false,
        leaks: None,
        timeline: None,
        requests: false,
        ..wants.clone()
    };
    let mut moments: Vec<Wants> = Vec::new();
    if wants.summary {
        moments.push(Wants {
            summary: true,
            ..none.clone()
        });
    }
    if wants.peak {
        moments.push(Wants {
            peak: true,
            ..none.clone()
        });
    }
    if wants.oom {
        moments.push(Wants {
            oom: true,
            ..none.clone()
        });
    }
    let mut iterations: Vec<Wants> = Vec::new();
    if wants.leaks.is_some() {
        iterations.push(Wants {
            leaks: wants.leaks.clone(),
            ..none.clone()
        });
    }
    if wants.timeline.is_some() {
        iterations.push(Wants {
            timeline: wants.timeline.clone(),
            ..none.clone()
        });
    }
    let together = |a: Wants, b: Wants| Wants {
        summary: a.summary || b.summary,
        peak: a.peak || b.peak,
        oom: a.oom || b.oom,
        leaks: a.leaks.or(b.leaks),
        timeline: a.timeline.or(b.timeline),
        ..a
    };
    // PyTorch's requests (`fit`'s, what fits beside `summary --at` and the page) in a group of
    // their own where every report has one and there is room for one more: they read the
    // kinds and gather every tensor event, but no replay. Else with the first group, whose
    // kinds serve every report after the pass (a group's kinds end as every other's: the
    // same records, the same decisions).
    let reports = moments.len() + iterations.len();
    // `fit`'s (the summary, its leak check and the requests): the leak check shares the
    // summary's group, so that the requests, the most work, keep a core of their own.
    let fits = wants.requests
        && wants.summary
        && wants.leaks.is_some()
        && !wants.peak
        && !wants.oom
        && wants.timeline.is_none()
        && most >= 2;
    let own = wants.requests && reports >= 1 && (most > reports || fits);
    let most = if fits { most - 1 } else { most.max(1) };
    while moments.len() + iterations.len() > most {
        let side = if moments.len() > 1 {
            &mut moments
        } else {
            &mut iterations
        };
        match (side.pop(), side.pop()) {
            (Some(b), Some(a)) => side.push(together(a, b)),
            (Some(b), None) => {
                // One of each side left, and one group wanted.
                let a = moments.pop().unwrap_or_else(|| none.clone());
                moments.push(together(a, b));
            }
            _ => break,
        }
    }
    moments.append(&mut iterations);
    match moments.first_mut() {
        Some(_) if own => moments.push(Wants {
            requests: true,
            ..none
        }),
        Some(first) => first.requests = wants.requests,
        None => moments.push(wants.clone()),
    }
    moments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_cores_read_the_pages_five_reports_in_two_groups_and_fewer_in_one() {
        let page = Wants::page();
        let oom = Wants {
            oom: true,
            leaks: Some(None),
            ..Wants::default()
        };
        let summary = Wants::summary();
        assert_eq!(most_groups(2, &page, None), 2);
        assert_eq!(groups_of(&page, 2).len(), 2);
        assert_eq!(most_groups(2, &oom, None), 1);
        assert_eq!(most_groups(2, &summary, None), 1);
        assert_eq!(most_groups(1, &page, None), 1);
        assert_eq!(most_groups(16, &page, None), 15);
        assert_eq!(groups_of(&page, 15).len(), 5);
        // `ReadMode::groups` decides wherever there is a second core (0: one group).
        assert_eq!(most_groups(2, &page, Some(0)), 1);
        assert_eq!(most_groups(16, &oom, Some(3)), 3);
    }

    #[test]
    fn pytorchs_requests_are_a_group_of_their_own_where_every_report_has_one() {
        let fit = Wants::fit();
        // `fit` on two cores: the summary's group (with its leak check), and the requests'
        // alone, which reads the kinds but no replay.
        assert_eq!(most_groups(2, &fit, None), 2);
        let groups = groups_of(&fit, 2);
        assert_eq!(groups.len(), 2);
        assert!(groups[0].summary && groups[0].leaks.is_some() && !groups[0].requests);
        assert!(groups[1].requests && !groups[1].summary);
        assert_eq!(reads(&groups[1], false), (false, true));
        // One group: all in it.
        let one = groups_of(&fit, 1);
        assert!(one.len() == 1 && one[0].summary && one[0].requests);
        // The page with what fits: on two cores its five reports keep their two groups, the
        // requests with the first; on sixteen, six groups.
        let page = Wants {
            requests: true,
            ..Wants::page()
        };
        assert_eq!(most_groups(2, &page, None), 2);
        let two = groups_of(&page, 2);
        assert!(two.len() == 2 && two[0].requests && !two[1].requests);
        let sixteen = groups_of(&page, most_groups(16, &page, None));
        assert_eq!(sixteen.len(), 6);
        assert_eq!(sixteen.iter().filter(|g| g.requests).count(), 1);
        assert!(sixteen.last().is_some_and(|g| g.requests && !g.summary));
    }
}
