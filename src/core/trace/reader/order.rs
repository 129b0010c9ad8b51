//! The reorder window's sort: records by time, where they come nearly in order.

use crate::trace::format::Record;

/// Records put in time order as they come, stably (records of one time stay in the order
/// read): each moved back past the later records before it. Records come nearly in order,
/// each out of place by a few places, where a writer's clock read and its claim of a slot were
/// apart, so that costs the records and their displacements, and each record is touched while
/// it is still in the cache (a sort after the batch was read went through it again). Past a
/// budget of moves (records far out of place, or a trace that lies), the rest are left where
/// they come and [`TimeOrder::finish`] sorts the whole once, stably: the same order, in
/// O(n log n).
pub(super) struct TimeOrder {
    budget: usize,
    /// The budget is spent: the records are to be sorted.
    unsorted: bool,
}

impl TimeOrder {
    /// For a vector that will hold about `n` records, in order so far.
    pub fn new(n: usize) -> TimeOrder {
        TimeOrder {
            budget: n.saturating_mul(8),
            unsorted: false,
        }
    }

    /// `r` put behind `out`'s records, in its place.
    #[inline]
    pub fn push(&mut self, out: &mut Vec<Record>, r: Record) {
        out.push(r);
        self.place_last(out);
    }

    /// The last of `out`'s records moved back to its place.
    #[inline]
    pub fn place_last(&mut self, out: &mut [Record]) {
        if self.unsorted || out.is_empty() {
            return;
        }
        let last = out.len() - 1;
        let t = out[last].time_ns;
        let mut j = last;
        while j > 0 && out[j - 1].time_ns > t {
            j -= 1;
        }
        let moved = last - j;
        if moved > self.budget {
            self.unsorted = true;
            return;
        }
        self.budget -= moved;
        out[j..].rotate_right(1);
    }

    /// `out` in order, once every record is in.
    pub fn finish(self, out: &mut [Record]) {
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
        for r in records(times) {
            o.push(&mut out, r);
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
    fn records_far_out_of_place_fall_back_to_the_merge_sort() {
        // Descending: every record moves all the way back, far past the budget.
        let times: Vec<u64> = (0..5000u64).rev().collect();
        let got = ordered(&times, times.len());
        assert!(got.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        assert_eq!(got[0].ptr, 4999);
    }
}
