//! Batches handed back by the reader once read, for the decoder to fill again.

use super::decode::{AHEAD, BATCH};
use crate::trace::format::Record;

/// Batches handed back by the reader once read, filled again by the decoder: a fresh batch
/// each time would be fresh pages each time (a batch is larger than what the allocator keeps
/// for reuse), and faulting them in cost more than decoding their records.
#[derive(Default)]
pub struct Spares(std::sync::Mutex<Vec<Vec<Record>>>);

/// Spare batches kept at most: those on their way to up to four readers, and one or two being
/// read by each.
const SPARES: usize = 4 * (AHEAD + 2);
/// Records a spare batch may have room for: a few full batches.
const SPARE_MAX: usize = 4 * BATCH;

impl Spares {
    /// An empty batch with room for `n` records.
    pub(super) fn take(&self, n: usize) -> Vec<Record> {
        let spare = self.0.lock().ok().and_then(|mut s| s.pop());
        let mut v = spare.unwrap_or_default();
        v.clear();
        v.reserve(n);
        v
    }

    /// A batch read, kept for a refill while there is room: not one grown past a few batches
    /// (a reorder window that a trace's times filled), which goes back to the allocator.
    pub fn give(&self, v: Vec<Record>) {
        if v.capacity() == 0 || v.capacity() > SPARE_MAX {
            return;
        }
        if let Ok(mut s) = self.0.lock()
            && s.len() < SPARES
        {
            s.push(v);
        }
    }
}
