//! A device's memory over time for `plot --by total`, and the spans of its NVTX ranges, kept in
//! bounded memory however long the trace: the picture draws at most two points a pixel column
//! (the first and the highest, [`thin`]), so the changes are kept in buckets of time, at most
//! [`KEPT`] of them, each as its first change with the most live and reserved memory within
//! it; when there would be more, the buckets double in width and neighbours merge. With the
//! picture's 900 columns a bucket is then under a quarter of a column, and the last change is
//! kept as it was.

/// (time, live, reserved) at one change.
pub(super) type Point = (u64, u64, u64);

/// Buckets kept at most: past this many, their width doubles until half as many are left.
const KEPT: usize = 8192;

/// The changes of one device of one trace, in time order, bucketed.
#[derive(Default)]
pub(super) struct Series {
    /// Per bucket: its first change's time, with the most live and reserved memory in it.
    kept: Vec<Point>,
    /// A bucket is `1 << shift` nanoseconds wide.
    shift: u32,
    /// The last change.
    last: Option<Point>,
}

impl Series {
    /// A change at `p.0` (no earlier than the changes before it).
    pub(super) fn push(&mut self, p: Point) {
        let shift = self.shift;
        match self.kept.last_mut() {
            Some(k) if k.0 >> shift == p.0 >> shift => {
                k.1 = k.1.max(p.1);
                k.2 = k.2.max(p.2);
            }
            _ => {
                self.kept.push(p);
                if self.kept.len() > KEPT {
                    self.coarsen();
                }
            }
        }
        self.last = Some(p);
    }

    /// Doubles the buckets' width until at most half of [`KEPT`] are left (each doubling at
    /// least halves the span's buckets, so a few do), merging neighbours.
    fn coarsen(&mut self) {
        while self.kept.len() > KEPT / 2 && self.shift < 63 {
            self.shift += 1;
            let shift = self.shift;
            let mut merged: Vec<Point> = Vec::with_capacity(self.kept.len() / 2 + 1);
            for p in self.kept.drain(..) {
                match merged.last_mut() {
                    Some(k) if k.0 >> shift == p.0 >> shift => {
                        k.1 = k.1.max(p.1);
                        k.2 = k.2.max(p.2);
                    }
                    _ => merged.push(p),
                }
            }
            self.kept = merged;
        }
        if self.kept.len() > KEPT / 2 {
            // Times out of order (a damaged or made-up trace): neighbours merged in pairs,
            // whatever their times, so the memory stays bounded.
            self.kept = self
                .kept
                .chunks(2)
                .map(|c| {
                    c.iter()
                        .fold(c[0], |k, p| (k.0, k.1.max(p.1), k.2.max(p.2)))
                })
                .collect();
        }
    }

    /// The points to draw: each bucket's, then the last change where it is not already one.
    pub(super) fn finish(self) -> Vec<Point> {
        let mut pts = self.kept;
        if let Some(l) = self.last
            && pts.last() != Some(&l)
        {
            pts.push(l);
        }
        pts
    }
}

/// Spans kept of one NVTX range's name at most: past this many, every other is dropped and
/// then one in twice as many kept (the picture shades every other one a pixel or more wide).
const SPANS: usize = 8192;

/// The spans (start, end) of one NVTX range's name, in the order they end, bounded.
#[derive(Default)]
pub(super) struct Spans {
    /// One in every `stride` of them, the first kept.
    pub(super) kept: Vec<(u64, u64)>,
    /// How many there were.
    pub(super) count: u64,
    pub(super) stride: u64,
}

impl Spans {
    pub(super) fn push(&mut self, span: (u64, u64)) {
        let stride = self.stride.max(1);
        if self.count % stride == 0 {
            self.kept.push(span);
            if self.kept.len() > SPANS {
                self.kept = self.kept.iter().step_by(2).copied().collect();
                self.stride = stride.saturating_mul(2);
            }
        }
        self.count += 1;
    }
}

/// At most two points per pixel column: the first and the highest, so peaks survive.
pub(super) fn thin(pts: &[(u64, u64, u64)], columns: usize, end: u64) -> Vec<(u64, u64, u64)> {
    if pts.len() <= columns * 2 {
        return pts.to_vec();
    }
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    let mut col = usize::MAX;
    for &p in pts {
        let c = (p.0 as f64 / end as f64 * columns as f64) as usize;
        if c != col {
            out.push(p);
            col = c;
        } else if let Some(last) = out.last_mut()
            && (p.1 > last.1 || p.2 > last.2)
        {
            *last = (last.0, last.1.max(p.1), last.2.max(p.2));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// However many changes, at most `KEPT` + 1 points are kept; the highest live and
        /// reserved memory, the first change and the last survive; and every point kept is one
        /// of the changes' times.
        #[test]
        fn keeps_the_peaks_the_ends_and_bounded_memory(
            steps in prop::collection::vec((0u64..1 << 40, 0u64..1 << 34, 0u64..1 << 34), 1..24_000),
        ) {
            let mut t = 0u64;
            let mut s = Series::default();
            let mut all = Vec::new();
            for (dt, live, reserved) in steps {
                t += dt % (1 << 20);
                s.push((t, live, reserved));
                all.push((t, live, reserved));
            }
            let kept = s.finish();
            prop_assert!(kept.len() <= KEPT + 1);
            let most = |f: fn(&Point) -> u64, v: &[Point]| v.iter().map(f).max();
            prop_assert_eq!(most(|p| p.1, &kept), most(|p| p.1, &all));
            prop_assert_eq!(most(|p| p.2, &kept), most(|p| p.2, &all));
            prop_assert_eq!(kept.first().map(|p| p.0), all.first().map(|p| p.0));
            prop_assert_eq!(kept.last(), all.last());
            let times: std::collections::BTreeSet<u64> = all.iter().map(|p| p.0).collect();
            prop_assert!(kept.iter().all(|p| times.contains(&p.0)));
            prop_assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// Times in no order (a trace's times are its writer's): still bounded, still the
        /// highest kept.
        #[test]
        fn times_out_of_order_stay_bounded(
            steps in prop::collection::vec((any::<u64>(), 0u64..1 << 34), 9000..20_000),
        ) {
            let mut s = Series::default();
            for &(t, live) in &steps {
                s.push((t, live, live));
            }
            let kept = s.finish();
            prop_assert!(kept.len() <= KEPT + 1);
            let most = steps.iter().map(|p| p.1).max();
            prop_assert_eq!(kept.iter().map(|p| p.1).max(), most);
        }
    }

    #[test]
    fn spans_are_thinned_evenly_past_their_bound() {
        let mut s = Spans::default();
        for i in 0..(SPANS as u64 * 5) {
            s.push((i * 10, i * 10 + 5));
        }
        assert_eq!(s.count, SPANS as u64 * 5);
        assert!(s.kept.len() <= SPANS);
        // One in every `stride`, from the first.
        assert!(
            s.kept
                .iter()
                .enumerate()
                .all(|(k, &(a, _))| a == k as u64 * s.stride * 10)
        );
        assert_eq!(s.stride, 8);
        let mut few = Spans::default();
        for i in 0..100u64 {
            few.push((i, i + 1));
        }
        assert_eq!((few.kept.len(), few.stride.max(1)), (100, 1));
    }

    #[test]
    fn a_short_series_is_kept_whole() {
        let mut s = Series::default();
        let all: Vec<Point> = (0..1000u64).map(|i| (i * 7, i % 13, i % 17)).collect();
        for &p in &all {
            s.push(p);
        }
        assert_eq!(s.finish(), all);
    }
}
