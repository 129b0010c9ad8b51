//! A model that starts where a run stood: PyTorch's cache put back from what a ring's
//! checkpoint kept (its segments and the tensors live in them), so that a replay of the ring's
//! records goes on as the run did.
//!
//! A plain segment's state is its tensors: PyTorch merges a freed block with its free
//! neighbours at once, so the free blocks are exactly the gaps between tensors, each one
//! block. What the gaps cannot say is a block that holds more than its tensor (the rest too
//! small to split off: under 512 bytes in the small pool, 1 MiB or less in the large one, or
//! the whole block past `max_split_size`); the seed gives such a tensor the whole gap when
//! PyTorch would not have split it, which is what PyTorch did when the gap was there at the
//! tensor's allocation.

use super::{Block, Model, SMALL_BUFFER, Segment, State, round_size};

impl Model {
    /// Puts back a plain segment of `size` bytes at `base` that PyTorch held, with the tensors
    /// live in it as (address, bytes asked, stream), on `stream` (the stream of its tensors;
    /// a segment serves one). Refused, the model unchanged, when the tensors do not fit the
    /// segment as PyTorch would have cut them, or the segment overlaps one the model holds.
    pub fn seed_segment(
        &mut self,
        base: u64,
        size: u64,
        stream: u64,
        tensors: &[(u64, u64)],
    ) -> Result<(), String> {
        let end = base
            .checked_add(size)
            .ok_or_else(|| format!("a segment at {base:#x} runs past the address space"))?;
        if size == 0 || self.overlaps(base, size) {
            return Err(format!(
                "a segment at {base:#x} overlaps another or is empty"
            ));
        }
        // A 2 MiB segment is the small pool's: the large pool's are 20 MiB, or 10 MiB and up.
        let small = size == SMALL_BUFFER;
        // A block of this segment (its state set where it goes in).
        let block = |size: u64, requested: u64| Block {
            size,
            stream,
            seg: base,
            small,
            state: State::Allocated,
            requested,
            gc_base: 0,
        };
        let mut sorted = tensors.to_vec();
        sorted.sort_unstable();
        // The blocks, checked before anything changes: (address, size, requested or 0 free).
        let mut blocks: Vec<(u64, u64, u64)> = Vec::new();
        let mut at = base;
        for (i, &(ptr, requested)) in sorted.iter().enumerate() {
            let next = sorted.get(i + 1).map_or(end, |n| n.0);
            // Another setting may round the run's requests up further than the run could
            // place them: the seed keeps the run's places (that replay is not the run's anyway).
            let rounded = round_size(&self.conf, requested).min(next.saturating_sub(ptr));
            if ptr < at || requested == 0 || ptr.checked_add(requested).is_none_or(|e| e > next) {
                return Err(format!(
                    "a tensor of {requested} bytes at {ptr:#x} does not fit the segment at \
                     {base:#x} between its neighbours"
                ));
            }
            if ptr > at {
                blocks.push((at, ptr - at, 0));
            }
            let whole = block(next - ptr, requested);
            let taken = if self.should_split(&whole, rounded) {
                rounded
            } else {
                whole.size
            };
            blocks.push((ptr, taken, requested));
            at = ptr + taken;
        }
        if at < end {
            blocks.push((at, end - at, 0));
        }
        self.segments.insert(base, Segment { size, page: 0 });
        for (ptr, len, requested) in blocks {
            let b = block(len, requested);
            if requested == 0 {
                self.insert_free(ptr, b);
            } else {
                self.blocks.insert(ptr, b);
                self.stats.allocated += len;
            }
        }
        self.stats.reserved += size;
        self.note_reserved();
        self.note_allocated();
        Ok(())
    }
}
