//! Blocks: PyTorch's best fit in a pool's free set, splits, merges with free neighbours,
//! and where a new segment's addresses come from.

use super::*;

/// The most blocks freed since a look kept one by one (see [`FreedSince`]).
const FRESH_MOST: usize = 1 << 16;

/// The blocks put in a free set since a look through all of it found every block it looks
/// for, while one did (see `Model::fresh`). Past [`FRESH_MOST`] it forgets the look: the next
/// one goes through the whole set, as costly as these.
#[derive(Clone, Debug, Default)]
pub(super) struct FreedSince {
    looked: bool,
    blocks: Vec<u64>,
}

impl FreedSince {
    pub(super) fn note(&mut self, ptr: u64) {
        if !self.looked {
            return;
        }
        if self.blocks.len() < FRESH_MOST {
            self.blocks.push(ptr);
        } else {
            *self = FreedSince::default();
        }
    }

    /// The blocks freed since the last look, if there was one.
    pub(super) fn take(&mut self) -> Option<Vec<u64>> {
        self.looked.then(|| std::mem::take(&mut self.blocks))
    }

    /// A look has found every block it looks for.
    pub(super) fn looked(&mut self) {
        self.looked = true;
        self.blocks.clear();
    }
}

impl Model {
    pub(super) fn next_of(&self, ptr: u64) -> Option<(u64, Block)> {
        let b = self.blocks.get(&ptr)?;
        let n = ptr.checked_add(b.size)?;
        self.blocks
            .get(&n)
            .filter(|x| x.seg == b.seg)
            .map(|x| (n, *x))
    }

    pub(super) fn prev_of(&self, ptr: u64) -> Option<(u64, Block)> {
        let b = self.blocks.get(&ptr)?;
        self.blocks
            .range(..ptr)
            .next_back()
            .filter(|(_, x)| x.seg == b.seg)
            .map(|(p, x)| (*p, *x))
    }

    pub(super) fn get_free_block(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        let p = pool(small);
        if self.limits.allowed.is_some() && self.conf.gc_threshold > 0.0 {
            self.searches[p] += 1;
        }
        let first = *self.free[p].range((stream, size, 0)..).next()?;
        if first.0 != stream {
            return None;
        }
        let mut chosen = first;
        if self.expandable(first.2) {
            if self.conf.expandable_segments {
                while let Some(&next) = self.free[p].range((Excluded(chosen), Unbounded)).next() {
                    if !self.expandable(chosen.2)
                        || next.0 != stream
                        || self.expandable_size(next.2, next.1)
                            >= self.expandable_size(chosen.2, chosen.1)
                    {
                        break;
                    }
                    chosen = next;
                }
            } else {
                // Expandable segments were turned off: only plain blocks serve.
                let mut it = self.free[p].range((Excluded(chosen), Unbounded));
                loop {
                    let &n = it.next()?;
                    if n.0 != stream {
                        return None;
                    }
                    if !self.expandable(n.2) {
                        chosen = n;
                        break;
                    }
                }
            }
        }
        let max_split = self.conf.max_split_size;
        if size < max_split && chosen.1 >= max_split {
            return None;
        }
        if size >= max_split && chosen.1 >= size.saturating_add(self.conf.max_non_split_rounding) {
            return None;
        }
        self.free[p].remove(&chosen);
        Some(chosen.2)
    }

    pub(super) fn should_split(&self, b: &Block, size: u64) -> bool {
        let remaining = b.size - size;
        if b.small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    pub(super) fn insert_free(&mut self, ptr: u64, mut b: Block) {
        b.state = State::Free;
        b.gc_base = self.searches[pool(b.small)];
        let p = pool(b.small);
        self.fresh[p].note(ptr);
        if p == 0 {
            self.gc_fresh.note(ptr);
        }
        self.free[p].insert((b.stream, b.size, ptr));
        self.blocks.insert(ptr, b);
    }

    pub(super) fn note_reserved(&mut self) {
        let s = &mut self.stats;
        if s.reserved > s.peak_reserved {
            s.peak_reserved = s.reserved;
            s.allocated_at_peak_reserved = s.allocated;
        }
    }

    pub(super) fn note_allocated(&mut self) {
        let s = &mut self.stats;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        if s.reserved == s.peak_reserved {
            s.allocated_at_peak_reserved = s.allocated_at_peak_reserved.max(s.allocated);
        }
    }

    pub(super) fn logged(&mut self, e: SegmentEvent) {
        if let Some(l) = self.log.as_mut() {
            l.push(e);
        }
    }

    // ---- segments ---------------------------------------------------------------------

    /// Whether [ptr, ptr + len) overlaps a segment the model holds.
    pub(super) fn overlaps(&self, ptr: u64, len: u64) -> bool {
        let end = ptr.saturating_add(len);
        self.segments
            .range(..end)
            .next_back()
            .is_some_and(|(b, s)| b + s.size > ptr)
    }

    /// Where a new segment of `len` bytes lands: the recorded address offered for it, or one
    /// of the model's own. An expandable segment takes a recorded reservation (with its
    /// length, when it is a whole number of `page`s), else the first page mapped in a range
    /// the model does not hold.
    pub(super) fn place(&mut self, len: u64, page: u64) -> (u64, u64) {
        let free = |m: &Model, h: &Hint, n: u64| !m.overlaps(h.ptr, n);
        let pick = if page == 0 {
            self.hints
                .iter()
                .position(|h| !h.reservation && h.bytes == len && free(self, h, len))
        } else {
            self.hints
                .iter()
                .position(|h| h.reservation && h.bytes % page == 0 && free(self, h, h.bytes))
                .or_else(|| {
                    self.hints
                        .iter()
                        .position(|h| !h.reservation && free(self, h, len))
                })
        };
        if let Some(i) = pick {
            let h = self.hints.remove(i);
            let n = if h.reservation && h.bytes > 0 {
                h.bytes
            } else {
                len
            };
            return (h.ptr, n);
        }
        let p = self.next_synthetic;
        self.next_synthetic = p
            .saturating_add(len.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE))
            .saturating_add(ROUND_LARGE);
        (p, len)
    }

    pub(super) fn alloc_block(
        &mut self,
        size: u64,
        alloc_size: u64,
        stream: u64,
        small: bool,
    ) -> Option<u64> {
        if let Some(max) = self.limits.allowed
            && self.held().saturating_add(alloc_size) > max
        {
            return None;
        }
        if self.conf.expandable_segments {
            return self.allocate_expandable(size, stream, small);
        }
        if self.held().saturating_add(alloc_size) > self.limits.capacity {
            return None;
        }
        let (base, _) = self.place(alloc_size, 0);
        self.segments.insert(
            base,
            Segment {
                size: alloc_size,
                page: 0,
            },
        );
        self.blocks.insert(
            base,
            Block {
                size: alloc_size,
                stream,
                seg: base,
                small,
                state: State::Free,
                requested: 0,
                gc_base: 0,
            },
        );
        self.stats.reserved += alloc_size;
        self.stats.device_allocs += 1;
        self.note_reserved();
        self.logged(SegmentEvent::Reserve {
            ptr: base,
            size: alloc_size,
        });
        Some(base)
    }

    /// A block back in its pool, merged with free neighbours.
    pub(super) fn free_block(&mut self, ptr: u64) {
        self.pending.remove(&ptr);
        let Some(mut b) = self.blocks.get(&ptr).copied() else {
            return;
        };
        b.state = State::Free;
        let mut at = ptr;
        if let Some((pp, prev)) = self.prev_of(ptr)
            && prev.state == State::Free
        {
            self.free[pool(prev.small)].remove(&(prev.stream, prev.size, pp));
            self.blocks.remove(&ptr);
            b.size += prev.size;
            at = pp;
            self.blocks.insert(at, b);
        }
        if let Some((np, next)) = self.next_of(at)
            && next.state == State::Free
        {
            self.free[pool(next.small)].remove(&(next.stream, next.size, np));
            self.blocks.remove(&np);
            b.size += next.size;
        }
        self.insert_free(at, b);
    }
}
