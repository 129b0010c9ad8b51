//! Expandable segments: the pages mapped into one growing reservation per pool and
//! stream, and given back from its end.

use super::*;

impl Model {
    // ---- the search -------------------------------------------------------------------

    pub(super) fn expandable(&self, ptr: u64) -> bool {
        self.blocks
            .get(&ptr)
            .and_then(|b| self.segments.get(&b.seg))
            .is_some_and(|s| s.page > 0)
    }

    /// For best fit among expandable blocks: the block with the unmapped range after it.
    pub(super) fn expandable_size(&self, ptr: u64, size: u64) -> u64 {
        size + self
            .next_of(ptr)
            .filter(|(_, n)| n.state == State::Unmapped)
            .map_or(0, |(_, n)| n.size)
    }

    /// Free or unmapped room from `ptr` on, up to `size` bytes.
    pub(super) fn room_from(&self, mut ptr: u64, size: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < size {
            let Some(b) = self.blocks.get(&ptr) else {
                break;
            };
            if !matches!(b.state, State::Free | State::Unmapped) {
                break;
            }
            bytes += b.size;
            let Some((n, _)) = self.next_of(ptr) else {
                break;
            };
            ptr = n;
        }
        bytes >= size
    }

    /// The lowest address of an expandable segment of this stream and pool with room for
    /// `size` (a free block and the unmapped range after it count together), or a new segment;
    /// `None` where a new one could not hold `size` either.
    pub(super) fn find_expandable(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        let p = pool(small);
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let total = self.limits.total_memory;
        let device_reach = total
            .saturating_add(total / 8)
            .div_ceil(page)
            .saturating_mul(page);
        // A request larger than a reservation can be is served only by a replay going on as
        // if the memory were there, in a reservation of its own: no hole of a device-sized one
        // holds it, and the holes such reservations leave are not PyTorch's (walking them all
        // at every such request was the requests squared).
        if size <= device_reach {
            let candidates: Vec<u64> = self.unmapped[p]
                .range((stream, 0)..)
                .take_while(|(s, _)| *s == stream)
                .map(|&(_, a)| a)
                .collect();
            for c in candidates {
                let mut start = c;
                if let Some((pp, prev)) = self.prev_of(c)
                    && prev.state == State::Free
                {
                    start = pp;
                }
                if self.room_from(start, size) {
                    return Some(start);
                }
            }
        }
        let mut reach = device_reach;
        if self.limits.capacity == u64::MAX {
            // A replay going on as if the memory were there: a reservation that holds it.
            reach = reach.max(size.div_ceil(page).saturating_mul(page));
        }
        let (base, reach) = self.place(reach, page);
        if reach < size {
            // More than the device and an eighth (or the run's own reservation): PyTorch's
            // mapping of it fails. A segment made for it would hold nothing, ever, and each
            // such request would add one that every later search walks: none is made.
            return None;
        }
        self.segments.insert(base, Segment { size: reach, page });
        self.blocks.insert(
            base,
            Block {
                size: reach,
                stream,
                seg: base,
                small,
                state: State::Unmapped,
                requested: 0,
                gc_base: 0,
            },
        );
        self.unmapped[p].insert((stream, base));
        Some(base)
    }

    pub(super) fn allocate_expandable(
        &mut self,
        size: u64,
        stream: u64,
        small: bool,
    ) -> Option<u64> {
        let mut cand = self.find_expandable(size, stream, small)?;
        let b = self.blocks[&cand];
        if b.state == State::Unmapped {
            cand = self.map_block(cand, b.size.min(size))?;
        }
        loop {
            let have = self.blocks[&cand].size;
            if have >= size {
                break;
            }
            let (next, nb) = self.next_of(cand)?;
            cand = self.map_block(next, (size - have).min(nb.size))?;
        }
        let b = self.blocks[&cand];
        self.free[pool(small)].remove(&(b.stream, b.size, cand));
        Some(cand)
    }

    /// Maps pages over the unmapped block at `ptr` for at least `size` bytes; the free block
    /// they join (its address), or None when the device is full.
    pub(super) fn map_block(&mut self, ptr: u64, size: u64) -> Option<u64> {
        let b = self.blocks[&ptr];
        let page = self.segments[&b.seg].page;
        let begin = (ptr - b.seg) / page;
        let end = (ptr - b.seg + size).div_ceil(page);
        let mapped = (end - begin) * page;
        if self.held().saturating_add(mapped) > self.limits.capacity {
            return None;
        }
        self.unmapped[pool(b.small)].remove(&(b.stream, ptr));
        if mapped < b.size {
            let rest = Block {
                size: b.size - mapped,
                ..b
            };
            self.blocks.insert(ptr + mapped, rest);
            self.unmapped[pool(b.small)].insert((b.stream, ptr + mapped));
        }
        let mut joined = Block {
            size: mapped,
            state: State::Free,
            ..b
        };
        self.blocks.insert(ptr, joined);
        let mut at = ptr;
        if let Some((pp, prev)) = self.prev_of(at)
            && prev.state == State::Free
        {
            self.free[pool(prev.small)].remove(&(prev.stream, prev.size, pp));
            self.blocks.remove(&at);
            joined.size += prev.size;
            at = pp;
            self.blocks.insert(at, joined);
        }
        if let Some((np, next)) = self.next_of(at)
            && next.state == State::Free
        {
            self.free[pool(next.small)].remove(&(next.stream, next.size, np));
            self.blocks.remove(&np);
            joined.size += next.size;
            self.blocks.insert(at, joined);
        }
        self.insert_free(at, joined);
        self.stats.reserved += mapped;
        self.stats.device_allocs += 1;
        self.note_reserved();
        self.logged(SegmentEvent::Reserve { ptr, size: mapped });
        Some(at)
    }

    /// Unmaps the whole pages inside the free block at `ptr` of an expandable segment; the
    /// unmapped block's address, if any page was.
    pub(super) fn unmap_block(&mut self, ptr: u64) -> Option<u64> {
        let b = self.blocks[&ptr];
        let page = self.segments[&b.seg].page;
        let begin = (ptr - b.seg).div_ceil(page);
        let end = (ptr - b.seg + b.size) / page;
        if begin >= end {
            return None;
        }
        self.free[pool(b.small)].remove(&(b.stream, b.size, ptr));
        let at = b.seg + begin * page;
        let len = (end - begin) * page;
        self.blocks.remove(&ptr);
        if at > ptr {
            self.insert_free(
                ptr,
                Block {
                    size: at - ptr,
                    ..b
                },
            );
        }
        let after = ptr + b.size - (at + len);
        if after > 0 {
            self.insert_free(at + len, Block { size: after, ..b });
        }
        let mut un = Block {
            size: len,
            state: State::Unmapped,
            ..b
        };
        let mut start = at;
        self.blocks.insert(start, un);
        if let Some((pp, prev)) = self.prev_of(start)
            && prev.state == State::Unmapped
        {
            self.unmapped[pool(b.small)].remove(&(prev.stream, pp));
            self.blocks.remove(&start);
            un.size += prev.size;
            start = pp;
            self.blocks.insert(start, un);
        }
        if let Some((np, next)) = self.next_of(start)
            && next.state == State::Unmapped
        {
            self.unmapped[pool(b.small)].remove(&(next.stream, np));
            self.blocks.remove(&np);
            un.size += next.size;
            self.blocks.insert(start, un);
        }
        self.unmapped[pool(b.small)].insert((b.stream, start));
        self.stats.reserved -= len;
        self.stats.device_frees += 1;
        self.logged(SegmentEvent::Release { ptr: at, size: len });
        Some(start)
    }
}
