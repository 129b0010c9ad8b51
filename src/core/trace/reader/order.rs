//! The reorder window's sort: records by time, where they come nearly in order.

use crate::trace::format::Record;

/// Records put in time order as they come, stably (records of one time stay in the order
/// read). Records come nearly in order: a writer claims a block of slots and fills it, so where
/// threads run together the file holds one thread's block and then another's, and the second's
/// records are each a block's length or so behind the first's (the kinds program's trace on the
/// stand-in: 17% of its records out of place, by 32 places on average). Each such record moved
/// back on its own cost its displacement in moves, a sixth of the reader's time there. So the
/// records that come out of place, in order among themselves (a block's), are held together at
/// the end as they come, and merged into the records before them once the run ends: the later
/// records before them move once a run, not once a record. Each record is still touched while
/// it is in the cache. Past a budget of moves (records far out of place, or a trace that lies),
/// the rest are left where they come and [`TimeOrder::finish`] sorts the whole once, stably:
/// the same order, in O(n log n).
pub(super) struct TimeOrder {
    budget: usize,
    /// The budget is spent: the records are to be sorted.
    unsorted: bool,
    /// Where the run of records out of place begins ([`NO_RUN`]: none). The records from there
    /// to the end are in order among themselves, each earlier than some record before the run.
    run: usize,
    /// The run, copied out while it is merged.
    scratch: Vec<Record>,
}

/// No run of records out of place is held.
const NO_RUN: usize = usize::MAX;

impl TimeOrder {
    /// For a vector that will hold about `n` records, in order so far.
    pub fn new(n: usize) -> TimeOrder {
        TimeOrder {
            budget: n.saturating_mul(8),
            unsorted: false,
            run: NO_RUN,
            scratch: Vec::new(),
        }
    }

    /// `r` put behind `out`'s records, in its place once [`TimeOrder::finish`] is called.
    /// `latest`: the latest time of `out`'s records (of any record read before `r`), which
    /// this keeps.
    #[inline]
    pub fn add(&mut self, out: &mut Vec<Record>, r: Record, latest: &mut u64) {
        let t = r.time_ns;
        if t >= *latest {
            // In order: after every record so far.
            *latest = t;
            if self.run != NO_RUN {
                self.merge_run(out);
            }
        } else if self.run == NO_RUN {
            self.run = out.len();
        } else if out.last().is_some_and(|l| l.time_ns > t) {
            // Out of place, and out of the run's order too: the run so far goes in, and this
            // record begins the next.
            self.merge_run(out);
            self.run = out.len();
        }
        out.push(r);
    }

    /// The run held at the end of `out` merged into the records before it, stably (a record
    /// of the run goes after the records of its time before it, as it came after them).
    fn merge_run(&mut self, out: &mut [Record]) {
        let run = std::mem::replace(&mut self.run, NO_RUN);
        if self.unsorted || run >= out.len() {
            return;
        }
        // The records before the run later than its first move: how many.
        let first = out[run].time_ns;
        let mut from = run;
        while from > 0 && out[from - 1].time_ns > first {
            from -= 1;
        }
        let moved = run - from;
        if moved > self.budget {
            self.unsorted = true;
            return;
        }
        self.budget -= moved;
        if moved == 0 {
            return;
        }
        // From the end back: the later of the last record before the run not yet placed and
        // the run's last not yet placed (the run's on a tie), until the run is all placed.
        self.scratch.clear();
        self.scratch.extend_from_slice(&out[run..]);
        let (mut before, mut at) = (run, out.len());
        while let Some(&r) = self.scratch.last() {
            at -= 1;
            match before.checked_sub(1).map(|b| (b, out[b])) {
                Some((b, e)) if e.time_ns > r.time_ns => {
                    out[at] = e;
                    before = b;
                }
                _ => {
                    out[at] = r;
                    self.scratch.pop();
                }
            }
        }
    }

    /// `out` in order, once every record is in.
    pub fn finish(mut self, out: &mut [Record]) {
        self.merge_run(out);
        if self.unsorted {
            out.sort_by_key(|r| r.time_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::format::{self, RecordKind};
    use proptest::prelude::*;

    fn records(times: &[u64]) -> Vec<Record> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| Record {
                kind: RecordKind::Alloc,
                api: format::Api::CudaMalloc,
                device: 0,
                status: 0,
                thread: 0,
                time_ns: t,
                // The order read, to check that ties keep it.
                ptr: i as u64,
                size: 0,
                stream: 0,
            })
            .collect()
    }

    /// `times` pushed one by one, with the budget of a vector of `n` records.
    fn ordered(times: &[u64], n: usize) -> Vec<Record> {
        let mut o = TimeOrder::new(n);
        let mut out = Vec::new();
        let mut latest = 0;
        for r in records(times) {
            o.add(&mut out, r, &mut latest);
        }
        o.finish(&mut out);
        out
    }

    fn order(rs: &[Record]) -> Vec<(u64, u64)> {
        rs.iter().map(|r| (r.time_ns, r.ptr)).collect()
    }

    proptest! {
        /// Nearly in order (each time a few places out) and in no order at all (past the
        /// budget), and with budgets spent part way: the same order as a stable sort, ties in
        /// the order read.
        #[test]
        fn sorts_as_a_stable_sort_does(
            steps in proptest::collection::vec((0u64..4, 0u64..50), 0..400),
            shuffled in proptest::collection::vec(0u64..20, 0..300),
        ) {
            let mut t = 1000u64;
            let nearly: Vec<u64> = steps
                .iter()
                .map(|&(up, back)| {
                    t += up;
                    t.saturating_sub(back)
                })
                .collect();
            for times in [nearly, shuffled] {
                let mut want = records(&times);
                want.sort_by_key(|r| r.time_ns);
                for n in [times.len(), times.len() / 8, 1, 0] {
                    let got = ordered(&times, n);
                    prop_assert_eq!(order(&got), order(&want));
                }
            }
        }
    }

    #[test]
    fn a_threads_block_behind_anothers_moves_the_later_records_once() {
        // Two writers' blocks of 64 slots, one after the other in the file; the second's
        // records are 32 ns behind the first's, with ties between them.
        let mut times = Vec::new();
        for block in 0..50u64 {
            let base = block * 128;
            times.extend((0..64).map(|i| base + 2 * i));
            times.extend((0..64).map(|i| (base + 2 * i).saturating_sub(32)));
        }
        let mut want = records(&times);
        want.sort_by_key(|r| r.time_ns);
        let mut o = TimeOrder::new(times.len());
        let budget = o.budget;
        let (mut out, mut latest) = (Vec::new(), 0);
        for r in records(&times) {
            o.add(&mut out, r, &mut latest);
        }
        // The last run, merged as `finish` would.
        o.merge_run(&mut out);
        let spent = budget - o.budget;
        o.finish(&mut out);
        assert_eq!(order(&out), order(&want));
        // Each second block is one run, which moves the records later than its first once:
        // the first block's 64 and the 15 of the pair before it later than 32 ns before it
        // (79; 63 for the first pair, whose times stop at 0, a tie staying first). Moving
        // each record back on its own moves some 3,000 a pair.
        assert_eq!(spent, 63 + 49 * 79);
    }

    #[test]
    fn records_far_out_of_place_fall_back_to_the_merge_sort() {
        // Descending: every record moves all the way back, far past the budget.
        let times: Vec<u64> = (0..5000u64).rev().collect();
        let got = ordered(&times, times.len());
        assert!(got.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        assert_eq!(got[0].ptr, 4999);
    }
}
