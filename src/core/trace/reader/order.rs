//! The reorder window's sort: records by time, where they come nearly in order.

use crate::trace::format::Record;

/// Sorts records by time, stably (records of one time stay in the order read). Records come
/// nearly in order: each out of place by a few places, where a writer's clock read and its
/// claim of a slot were apart. Moved back one by one, that costs the records and their
/// displacements; past a budget (records far out of place, or a trace that lies), a merge
/// sort finishes it in O(n log n).
pub(super) fn sort_by_time(records: &mut [Record]) {
    let mut budget = records.len().saturating_mul(8);
    for i in 1..records.len() {
        let t = records[i].time_ns;
        if records[i - 1].time_ns <= t {
            continue;
        }
        let mut j = i - 1;
        while j > 0 && records[j - 1].time_ns > t {
            j -= 1;
        }
        let moved = i - j;
        if moved > budget {
            records.sort_by_key(|r| r.time_ns);
            return;
        }
        budget -= moved;
        records[j..=i].rotate_right(1);
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

    fn order(rs: &[Record]) -> Vec<(u64, u64)> {
        rs.iter().map(|r| (r.time_ns, r.ptr)).collect()
    }

    proptest! {
        /// Nearly in order (each time a few places out) and in no order at all (past the
        /// budget): the same order as a stable sort, ties in the order read.
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
                let mut got = records(&times);
                sort_by_time(&mut got);
                let mut want = records(&times);
                want.sort_by_key(|r| r.time_ns);
                prop_assert_eq!(order(&got), order(&want));
            }
        }
    }

    #[test]
    fn records_far_out_of_place_fall_back_to_the_merge_sort() {
        // Descending: every record moves all the way back, far past the budget.
        let times: Vec<u64> = (0..5000u64).rev().collect();
        let mut got = records(&times);
        sort_by_time(&mut got);
        assert!(got.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
        assert_eq!(got[0].ptr, 4999);
    }
}
