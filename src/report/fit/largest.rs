//! The largest batch that fits: a doubling, then a bisection, the replays of each step of
//! either made at once where there are cores for them.

use super::Row;

/// The largest batch in `1..=max` whose replay has no failure, and its peak reserved: the
/// failures rise with the batch, so a doubling then a bisection finds it. With `threads`
/// replays at once, the next steps' batches are replayed together, as far ahead as they
/// reach: the batches a search one replay at a time asks for are among them, and the answer is
/// that search's (its steps are taken from their results, the others let go).
pub(super) fn largest(
    at_batch: &(dyn Fn(u64) -> Row + Sync),
    max: u64,
    threads: usize,
) -> (u64, u64) {
    let fits = |b: u64| {
        let r = at_batch(b);
        (r.failures == 0).then_some(r.peak_reserved_bytes)
    };
    let threads = threads.max(1);
    // The doubling: 1, 2, 4, ... up to `max`, `threads` of them at a time.
    let mut doubling = vec![1u64];
    while let Some(&last) = doubling.last() {
        let next = last.saturating_mul(2).min(max);
        if next <= last {
            break;
        }
        doubling.push(next);
    }
    let (mut lo, mut best, mut hi) = (0u64, 0u64, None::<u64>);
    'doubling: for chunk in doubling.chunks(threads) {
        for (&b, fit) in chunk.iter().zip(in_parallel(chunk, threads, &fits)) {
            match fit {
                Some(p) => (lo, best) = (b, p),
                None => {
                    hi = Some(b);
                    break 'doubling;
                }
            }
        }
    }
    // Batch 1 does not fit; or every batch up to `max` fits.
    let Some(mut hi) = hi.filter(|_| lo > 0) else {
        return (lo, best);
    };
    // The bisection, as many levels at once as the threads cover (2^levels - 1 replays).
    let levels = usize::BITS - (threads + 1).leading_zeros() - 1;
    while hi - lo > 1 {
        let mut probes = Vec::new();
        bisections(lo, hi, levels.max(1), &mut probes);
        let found = in_parallel(&probes, threads, &fits);
        let result = |b: u64| probes.iter().position(|&p| p == b).and_then(|i| found[i]);
        for _ in 0..levels.max(1) {
            if hi - lo <= 1 {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            match result(mid) {
                Some(p) => (lo, best) = (mid, p),
                None => hi = mid,
            }
        }
    }
    (lo, best)
}

/// The batches a bisection of `lo..hi` asks for in its next `levels` steps, whichever way
/// each goes.
fn bisections(lo: u64, hi: u64, levels: u32, out: &mut Vec<u64>) {
    if levels == 0 || hi - lo <= 1 {
        return;
    }
    let mid = lo + (hi - lo) / 2;
    out.push(mid);
    bisections(lo, mid, levels - 1, out);
    bisections(mid, hi, levels - 1, out);
}

/// `f` of each of `items`, in their order, `threads` at a time.
pub(super) fn in_parallel<T: Send>(
    items: &[u64],
    threads: usize,
    f: &(dyn Fn(u64) -> T + Sync),
) -> Vec<T> {
    if threads <= 1 || items.len() <= 1 {
        return items.iter().map(|&b| f(b)).collect();
    }
    let mut out = Vec::with_capacity(items.len());
    for chunk in items.chunks(threads) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|&b| s.spawn(move || f(b))).collect();
            // A replay's thread that failed is replayed here, on this one.
            for (h, &b) in handles.into_iter().zip(chunk) {
                out.push(h.join().unwrap_or_else(|_| f(b)));
            }
        });
    }
    out
}

/// Replays one setting's search may make at once: the machine's cores shared by the two
/// settings a fit replays side by side.
pub(super) fn threads_per_setting() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).max(1)
}
