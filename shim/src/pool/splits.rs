//! The pool's splits, counted rather than recorded one by one.

use super::context::{MAX_CONTEXTS, device_of};
use crate::trace;
use core::sync::atomic::{AtomicU64, Ordering};

/// Splits are counted, not recorded one by one: a record costs a few hundred ns inside a
/// real process (the ring's cache lines are cold after the program's own work), and the
/// summary wants only their number. One `Split` record (`ptr` 0, `size` the count) per this
/// many splits of a device, and the rest at exit.
pub(super) const SPLITS_PER_RECORD: u64 = 64;
static SPLITS: [AtomicU64; MAX_CONTEXTS] = [const { AtomicU64::new(0) }; MAX_CONTEXTS];

/// Set in a device's count by the exit flush: from then on each of its splits is written at
/// once, since no later flush will write it (an exit handler of the program's that runs after
/// the shim's, or a thread still allocating, splits blocks after it). In the counter itself,
/// so a split is either taken by the flush's swap or sees the mark in its own add.
const FLUSHED: u64 = 1 << 63;

/// Counts one split of device slot `slot`; `Some(count)` (and the count starts again) once
/// `at_least` splits are counted, or at once after the exit flush.
pub(super) fn take(slot: u8, at_least: u64) -> Option<u64> {
    let counter = SPLITS.get(slot as usize)?;
    let v = counter.fetch_add(1, Ordering::Relaxed) + 1;
    let flushed = v & FLUSHED;
    if flushed == 0 && v < at_least {
        return None;
    }
    Some(counter.swap(flushed, Ordering::Relaxed) & !FLUSHED).filter(|&n| n > 0)
}

/// At exit: the splits counted since each device's last `Split` record, and each count marked
/// so that later splits write themselves. In a forked child, `forget` drops the parent's
/// counts instead (and the child counts in batches again).
pub fn flush(forget: bool) {
    for (slot, counter) in SPLITS.iter().enumerate() {
        let n = counter.swap(if forget { 0 } else { FLUSHED }, Ordering::Relaxed) & !FLUSHED;
        if n > 0 && !forget {
            let slot = slot as u8;
            trace::record(trace::Event::splits(n, device_of(slot)));
        }
    }
}
