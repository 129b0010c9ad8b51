//! The largest batch that fits: a doubling, then a bisection.

use super::Row;

/// The largest batch in `1..=max` whose replay has no failure, and its peak reserved: the
/// failures rise with the batch, so a doubling then a bisection finds it.
pub(super) fn largest(at_batch: &dyn Fn(u64) -> Row, max: u64) -> (u64, u64) {
    let fits = |b: u64| {
        let r = at_batch(b);
        (r.failures == 0).then_some(r.peak_reserved_bytes)
    };
    let Some(mut best) = fits(1) else {
        return (0, 0);
    };
    let (mut lo, mut hi) = (1u64, None::<u64>);
    // Double until one fails (or the top of the search).
    while hi.is_none() {
        let next = lo.saturating_mul(2).min(max);
        if next == lo {
            return (lo, best);
        }
        match fits(next) {
            Some(p) => {
                lo = next;
                best = p;
            }
            None => hi = Some(next),
        }
    }
    let mut hi = hi.unwrap_or(lo + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid) {
            Some(p) => {
                lo = mid;
                best = p;
            }
            None => hi = mid,
        }
    }
    (lo, best)
}
