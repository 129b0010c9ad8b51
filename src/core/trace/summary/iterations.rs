//! What marks the iterations of a run: where each call site allocated in the sequence of
//! allocations (the period a step repeats with), NVTX names, and the boundaries the summarizer
//! keeps once it has chosen.

use super::Thinned;
use crate::fasthash::FastMap;
use crate::trace::format::{Record, RecordKind};
use crate::trace::live::{Boundary, BoundaryMark, Change, Replay, size_key};

/// Where one call site occurred in the sequence of allocations: how often, first and last,
/// and its first [`KEPT_POSITIONS`] positions (for the regularity of its gaps).
#[derive(Clone, Debug, Default)]
pub struct Occurrences {
    pub count: u64,
    pub first: u64,
    pub last: u64,
    pub positions: Vec<u64>,
}

/// Positions kept per call site.
pub const KEPT_POSITIONS: usize = 4096;

impl Occurrences {
    pub(in crate::trace) fn add(&mut self, at: u64) {
        if self.count == 0 {
            self.first = at;
        }
        self.count += 1;
        self.last = at;
        if self.positions.len() < KEPT_POSITIONS {
            self.positions.push(at);
        }
    }
}

/// The call site that marks the program's repeating unit (its step), from where each site
/// occurred in the sequence of allocations (`total` allocations in all).
///
/// A training step allocates from most of its lines once; a line that allocates many times a
/// step (a loop inside the step) or only at start (an optimizer's state, made at its first
/// step) is not the step. So each candidate site (3 occurrences or more, spread over at least
/// half of the run after its first, its 10th and 90th percentile gaps within 4x of its mean
/// gap) is scored by how many sites occur about as often as it does (within 10%, or 1). Of
/// the sites scored about the best (within 10% of it, or 1), those about as often as the
/// fewest (within 10% of it, or 1) tie, and of those the site seen first wins. Each "about"
/// is there for a trace cut mid-step (a crash, an OOM, or a first look at a sixteenth of it):
/// the lines after the cut have one occurrence fewer than those before it, which moves their
/// scores by one and made the fewest alone pick the first line after the cut, so the choice
/// moved with where the trace ended. Ties resolve the same way every time.
pub fn detect_period<'a, I>(sites: I, total: u64) -> Option<u64>
where
    I: IntoIterator<Item = (&'a u64, &'a Occurrences)> + Copy,
{
    let mut counts: Vec<u64> = sites
        .into_iter()
        .map(|(_, o)| o.count)
        .filter(|&n| n >= 3)
        .collect();
    counts.sort_unstable();
    let mut scored: Vec<(usize, u64, u64, u64)> = sites
        .into_iter()
        .filter(|(_, o)| o.count >= 3 && o.positions.len() >= 3)
        .filter(|(_, o)| {
            let span = o.last.saturating_sub(o.first);
            span.saturating_mul(2) >= total.saturating_sub(o.first)
        })
        .filter(|(_, o)| {
            // Steady: no long absence and no burst against its mean gap (a step's count of
            // allocations changes with its shapes, so gaps vary by some factor, not by 4).
            let t = &o.positions;
            let mut gaps: Vec<u64> = t.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
            gaps.sort_unstable();
            let lo = gaps[gaps.len() / 10];
            let hi = gaps[(gaps.len() * 9 / 10).min(gaps.len() - 1)];
            let mean = (t[t.len() - 1] - t[0]) / (t.len() as u64 - 1);
            lo > 0 && lo.saturating_mul(4) >= mean && hi <= mean.saturating_mul(4)
        })
        .map(|(&k, o)| (about_as_often(&counts, o.count), o.count, o.first, k))
        .collect();
    let best = scored.iter().map(|s| s.0).max()?;
    scored.retain(|s| s.0.saturating_add((best / 10).max(1)) >= best);
    let fewest = scored.iter().map(|s| s.1).min()?;
    scored
        .iter()
        .filter(|s| s.1 <= fewest.saturating_add((fewest / 10).max(1)))
        .min_by_key(|s| (s.2, s.3))
        .map(|s| s.3)
}

/// How many of `sorted` (counts of occurrences, in order) are about `count` (within a tenth
/// of it, or 1): two binary searches, so that scoring every site is not quadratic in the sites
/// a trace names.
pub(super) fn about_as_often(sorted: &[u64], count: u64) -> usize {
    let near = (count / 10).max(1);
    let (lo, hi) = (count.saturating_sub(near), count.saturating_add(near));
    sorted
        .partition_point(|&n| n <= hi)
        .saturating_sub(sorted.partition_point(|&n| n < lo))
}

/// Call sites' occurrences by key, the last key's found without hashing: a step's
/// allocations come from a site a line at a time, and a loop that allocates from one line
/// (the bench's) asked the map at every allocation, twice (by stack and by size), an eighth of
/// `oom`'s time.
#[derive(Default)]
struct Sites {
    place: FastMap<u64, usize>,
    all: Vec<(u64, Occurrences)>,
    /// The last key added to, and its place in `all`.
    last: Option<(u64, usize)>,
}

impl Sites {
    #[inline]
    fn add(&mut self, key: u64, at: u64) {
        let i = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let all = &mut self.all;
                let i = *self.place.entry(key).or_insert_with(|| {
                    all.push((key, Occurrences::default()));
                    all.len() - 1
                });
                self.last = Some((key, i));
                i
            }
        };
        if let Some((_, o)) = self.all.get_mut(i) {
            o.add(at);
        }
    }

    fn get(&self, key: u64) -> Option<&Occurrences> {
        let &i = self.place.get(&key)?;
        self.all.get(i).map(|(_, o)| o)
    }
}

impl<'a> IntoIterator for &'a Sites {
    type Item = (&'a u64, &'a Occurrences);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (u64, Occurrences)>,
        fn(&'a (u64, Occurrences)) -> (&'a u64, &'a Occurrences),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.all.iter().map(|(k, o)| (k, o))
    }
}

/// What marks the iterations, learnt from the records: NVTX names and how often each came,
/// and where each call site allocated (by stack where stacks were recorded, else by API and
/// size). Positions in the sequence of allocations, not times: an iteration's allocations come
/// in the same order every time, while their timing varies with the machine.
#[derive(Default)]
pub struct MarkFinder {
    /// By string id: how often, and whether a range (not a mark).
    pub names: FastMap<u64, (u64, bool)>,
    /// By string id: the allocations made while a range of that name was its thread's
    /// outermost pushed range.
    covered: FastMap<u64, u64>,
    /// By thread: the string id of its outermost pushed range now open (0: none), and the
    /// allocations made under it not yet added to `covered` (added when it ends: no hashing
    /// per allocation).
    outermost: Vec<(u64, u64)>,
    by_stack: Sites,
    by_size: Sites,
    /// By thread: the position of its allocation whose stack may come next (0: none). Indexed,
    /// not hashed: every record of a thread reads it.
    pending: Vec<u64>,
    pub allocations: u64,
}

impl MarkFinder {
    /// Learns from one record (whose replay made change `c`).
    pub fn learn(&mut self, r: &Record, c: Change) {
        match r.kind {
            RecordKind::RangePush | RecordKind::RangeStart | RecordKind::Mark => {
                let e = self
                    .names
                    .entry(r.ptr)
                    .or_insert((0, r.kind != RecordKind::Mark));
                e.0 += 1;
                // A push's `size` is its level on its thread: 0 is the outermost.
                if r.kind == RecordKind::RangePush && r.size == 0 {
                    self.end_outermost(r.thread);
                    self.outermost[usize::from(r.thread)].0 = r.ptr;
                }
            }
            RecordKind::RangePop => {
                if r.size == 0 {
                    self.end_outermost(r.thread);
                }
            }
            RecordKind::StackRef => {
                // A segment the framework takes for a tensor has the tensor's stack: it is not
                // an allocation of that call site's own (see `Change::StackOfRaw`).
                if let Some(t) = self.take_pending(r.thread)
                    && c != Change::StackOfRaw
                {
                    self.by_stack.add(r.ptr, t);
                }
            }
            _ => {
                if !r.kind.is_definition() {
                    self.take_pending(r.thread);
                }
                if let Change::Alloc { .. } = c {
                    self.allocations += 1;
                    if let Some(o) = self.outermost.get_mut(usize::from(r.thread)) {
                        o.1 += 1;
                    }
                    let i = usize::from(r.thread);
                    if self.pending.len() <= i {
                        self.pending.resize(i + 1, 0);
                    }
                    self.pending[i] = self.allocations;
                    self.by_size
                        .add(size_key(r.api as u8, r.size), self.allocations);
                }
            }
        }
    }

    /// `thread`'s outermost pushed range ends (or a new one begins): the allocations made
    /// under it counted, and none open.
    fn end_outermost(&mut self, thread: u16) {
        let i = usize::from(thread);
        if self.outermost.len() <= i {
            self.outermost.resize(i + 1, (0, 0));
        }
        let (range, n) = std::mem::take(&mut self.outermost[i]);
        if range != 0 && n > 0 {
            *self.covered.entry(range).or_default() += n;
        }
    }

    /// The allocations made under `range` as its thread's outermost range, those of a range
    /// still open included.
    fn covered(&self, range: u64) -> u64 {
        let open: u64 = self
            .outermost
            .iter()
            .filter(|&&(r, _)| r == range)
            .map(|&(_, n)| n)
            .sum();
        self.covered.get(&range).copied().unwrap_or(0) + open
    }

    /// The position of `thread`'s allocation awaiting its stack, no longer awaiting.
    fn take_pending(&mut self, thread: u16) -> Option<u64> {
        let p = self.pending.get_mut(usize::from(thread))?;
        Some(std::mem::take(p)).filter(|&t| t != 0)
    }

    /// How often `mark` came in the records learnt from.
    pub fn count_of(&self, mark: BoundaryMark) -> u64 {
        match mark {
            BoundaryMark::Nvtx(id) => self.names.get(&id).map_or(0, |n| n.0),
            BoundaryMark::Site(key) => self
                .by_stack
                .get(key)
                .or_else(|| self.by_size.get(key))
                .map_or(0, |o| o.count),
        }
    }

    /// The NVTX range (pushed, else a mark) that came 3 times or more under which the program
    /// allocated most (as its thread's outermost range: a step's, not the many a library
    /// pushes inside it or in its hooks, as DeepSpeed does for each function it instruments),
    /// then the one seen most often; else the call site of the detected period, by stack where
    /// stacks were recorded, else by API and size.
    pub fn choose(&self) -> Option<BoundaryMark> {
        self.names
            .iter()
            .filter(|(_, (n, _))| *n >= 3)
            .max_by_key(|(id, (n, push))| {
                let covered = self.covered(**id);
                (*push, covered, *n, std::cmp::Reverse(**id))
            })
            .map(|(&id, _)| BoundaryMark::Nvtx(id))
            .or_else(|| {
                detect_period(&self.by_stack, self.allocations)
                    .or_else(|| detect_period(&self.by_size, self.allocations))
                    .map(BoundaryMark::Site)
            })
    }
}

/// Allocations the summarizer learns from before it gives up finding what marks an iteration.
const LEARN_AT_MOST: u64 = 1 << 20;

/// Learns what marks an iteration until the first checkpoint (when the ring is half full:
/// most of a ring of records seen), then keeps live bytes by call site at each boundary.
pub(in crate::trace) struct Boundaries {
    pub(in crate::trace) finder: MarkFinder,
    pub(in crate::trace) mark: Option<BoundaryMark>,
    pub(in crate::trace) decided: bool,
    /// Boundaries seen (those before the choice counted too), and the ones kept.
    pub(in crate::trace) seen: u64,
    pub(in crate::trace) kept: Thinned<Boundary>,
}

impl Boundaries {
    /// Chooses the mark from what was learnt, once.
    pub(in crate::trace) fn decide(&mut self) {
        if self.decided {
            return;
        }
        self.mark = self.finder.choose();
        // Nothing repeats yet in what was read (a summarizer lapped at the start reads little
        // before its first checkpoint): it learns on, up to a bound, and tries again at the
        // next checkpoint.
        if self.mark.is_none() && self.finder.allocations < LEARN_AT_MOST {
            return;
        }
        self.decided = true;
        // The boundaries before the choice were seen, not sampled: they count.
        self.seen = self.mark.map_or(0, |m| self.finder.count_of(m));
        self.finder = MarkFinder::default();
    }

    pub(in crate::trace) fn sample(&mut self, rp: &Replay, time_ns: u64) {
        self.seen += 1;
        if self.kept.wants() {
            self.kept.push(Boundary {
                ordinal: self.seen,
                time_ns,
                total: rp.total_live(),
                by_site: rp.live_by_site(),
            });
        }
    }
}

#[cfg(test)]
mod sites_tests {
    use super::*;

    #[test]
    fn sites_count_each_key_as_a_map_would_whichever_key_came_last() {
        // Runs of one key (found without hashing) and keys interleaved (hashed each time).
        let keys = [7u64, 7, 7, 9, 7, 9, 9, 3, 7, 3, 3, 3, 9];
        let mut sites = Sites::default();
        let mut map: HashMapOf = HashMapOf::default();
        for (at, &k) in keys.iter().enumerate() {
            sites.add(k, at as u64 + 1);
            map.entry(k).or_default().add(at as u64 + 1);
        }
        for k in [3u64, 7, 9] {
            let (a, b) = (sites.get(k).unwrap(), &map[&k]);
            assert_eq!(
                (a.count, a.first, a.last, &a.positions),
                (b.count, b.first, b.last, &b.positions),
                "key {k}"
            );
        }
        assert!(sites.get(4).is_none());
        assert_eq!((&sites).into_iter().count(), 3);
        // The period found is the same from either.
        let mut sites = Sites::default();
        let mut map: HashMapOf = HashMapOf::default();
        for step in 0..50u64 {
            for (j, k) in [11u64, 12, 12, 13].into_iter().enumerate() {
                let at = step * 4 + j as u64 + 1;
                sites.add(k, at);
                map.entry(k).or_default().add(at);
            }
        }
        assert_eq!(detect_period(&sites, 200), detect_period(&map, 200));
        assert!(detect_period(&sites, 200).is_some());
    }

    type HashMapOf = std::collections::HashMap<u64, Occurrences>;
}

#[cfg(test)]
mod choose_tests {
    use super::*;
    use crate::trace::format::{Api, Record};

    fn rec(kind: RecordKind, thread: u16, ptr: u64, size: u64) -> Record {
        Record {
            kind,
            api: Api::Nvtx,
            device: 0,
            status: 0,
            thread,
            time_ns: 0,
            ptr,
            size,
            stream: 0,
        }
    }

    /// A step's range on the main thread, a library's ranges inside it (ten a step) and in
    /// hooks on another thread (outermost there, five a step, an allocation under each): the
    /// step marks the iterations, as the range under which the program allocated most, where
    /// the most frequent range was taken before (the library's inner one).
    #[test]
    fn the_range_the_program_allocates_most_under_marks_the_iterations() {
        const STEP: u64 = 1;
        const INNER: u64 = 2;
        const HOOK: u64 = 3;
        let mut f = MarkFinder::default();
        let alloc = |f: &mut MarkFinder, thread: u16| {
            f.learn(
                &rec(RecordKind::Alloc, thread, 0x1000, 64),
                Change::Alloc {
                    ptr: 0x1000,
                    device: 0,
                },
            );
        };
        for _ in 0..4 {
            f.learn(&rec(RecordKind::RangePush, 0, STEP, 0), Change::Other);
            for _ in 0..10 {
                f.learn(&rec(RecordKind::RangePush, 0, INNER, 1), Change::Other);
                alloc(&mut f, 0);
                f.learn(&rec(RecordKind::RangePop, 0, 0, 1), Change::Other);
            }
            alloc(&mut f, 0);
            for _ in 0..5 {
                f.learn(&rec(RecordKind::RangePush, 1, HOOK, 0), Change::Other);
                alloc(&mut f, 1);
                f.learn(&rec(RecordKind::RangePop, 1, 0, 0), Change::Other);
            }
            f.learn(&rec(RecordKind::RangePop, 0, 0, 0), Change::Other);
        }
        assert_eq!(f.choose(), Some(BoundaryMark::Nvtx(STEP)));
        // Where nothing is allocated under any range, the most frequent.
        let mut f = MarkFinder::default();
        for id in [STEP, HOOK, HOOK, STEP, HOOK, STEP, HOOK] {
            f.learn(&rec(RecordKind::RangePush, 0, id, 0), Change::Other);
            f.learn(&rec(RecordKind::RangePop, 0, 0, 0), Change::Other);
        }
        assert_eq!(f.choose(), Some(BoundaryMark::Nvtx(HOOK)));
    }
}
