//! Segments: reserving them from the backend (whole, or as pages of an expandable segment that
//! grow and shrink), and giving them back.

use super::*;

impl<B: Backend> Engine<B> {
    /// A request of `size` on `device` refused (past `limit`, or out of memory): counted and
    /// noted; the error to answer.
    pub(super) fn refused(&mut self, device: u8, size: u64, why: AllocError) -> AllocError {
        self.per_device[device as usize].ooms += 1;
        if why == AllocError::LimitReached {
            self.stats.limit_hits += 1;
            self.backend.note(Event::LimitHit { device, size });
        } else {
            self.stats.ooms += 1;
            self.backend.note(Event::OutOfMemory { device, size });
        }
        why
    }

    /// `size` bytes at `ptr` came from `device` (a segment, or pages of an expandable one):
    /// noted and counted; `whole` when a segment starts counting with them.
    fn counted_reserve(&mut self, device: u8, ptr: u64, size: u64, whole: bool) {
        self.backend
            .note(Event::SegmentReserve { device, ptr, size });
        self.stats.segment_reserves += 1;
        self.stats.reserved_bytes += size;
        self.stats.peak_reserved_bytes = self
            .stats
            .peak_reserved_bytes
            .max(self.stats.reserved_bytes);
        let d = &mut self.per_device[device as usize];
        d.reserved_bytes.add(size);
        if whole {
            d.segments.add(1);
        }
        self.reserved_at[device as usize] = self.backend.now();
    }

    /// `size` bytes at `ptr` went back to `device`: noted and counted; `whole` when a segment
    /// stops counting with them.
    fn counted_release(&mut self, device: u8, ptr: u64, size: u64, whole: bool) {
        self.backend
            .note(Event::SegmentRelease { device, ptr, size });
        self.stats.segment_releases += 1;
        self.stats.reserved_bytes -= size;
        let d = &mut self.per_device[device as usize];
        d.reserved_bytes.sub(size);
        if whole {
            d.segments.sub(1);
        }
    }

    /// Memory found for `size` on `device` once the idle cache was given back: counted, noted.
    fn retried(&mut self, device: u8, size: u64) {
        self.stats.oom_retries += 1;
        self.per_device[device as usize].oom_retries += 1;
        self.backend.note(Event::OomRetry { device, size });
    }

    pub(super) fn new_segment(&mut self, key: PoolKey, size: u64) -> Result<Ix, AllocError> {
        let limit = self.policy.limit;
        let over = |e: &Self| e.reserved(key.device).saturating_add(size) > limit;
        if limit > 0 && over(self) {
            // Room may be made by giving idle cache back.
            self.make_room(key.device);
            if over(self) {
                return Err(self.refused(key.device, size, AllocError::LimitReached));
            }
        }
        let ptr = match self.backend.reserve(key.device, size) {
            Ok(p) => p,
            Err(OutOfMemory) => {
                // Free every idle cached segment and retry once.
                self.make_room(key.device);
                match self.backend.reserve(key.device, size) {
                    Ok(p) => {
                        self.retried(key.device, size);
                        p
                    }
                    Err(OutOfMemory) => {
                        return Err(self.refused(key.device, size, AllocError::OutOfMemory));
                    }
                }
            }
        };
        self.counted_reserve(key.device, ptr, size, true);
        let seg = self.segments.insert(
            ptr,
            Segment {
                size,
                device: key.device,
                allocated_blocks: 0,
                range: 0,
                idle_since: 0,
                last: 0,
                exported: false,
            },
        );
        let i = self.add_block(Block::free(ptr, size, (ptr, seg), key));
        self.link_below(0, i, seg);
        Ok(i)
    }

    /// Grows the expandable segment of `key` until a free block at its end holds `need` bytes,
    /// and returns that block (taken out of its pool). `Err(None)`: the backend has no address
    /// ranges to offer.
    pub(super) fn grow(&mut self, key: PoolKey, need: u64) -> Result<Ix, Option<AllocError>> {
        let base = match self.expandable.get(&key) {
            Some(&b) => b,
            None => {
                let b = self
                    .backend
                    .reserve_address(key.device, EXPANDABLE_RANGE)
                    .map_err(|_| None)?;
                self.segments.insert(
                    b,
                    Segment {
                        size: 0,
                        device: key.device,
                        allocated_blocks: 0,
                        range: EXPANDABLE_RANGE,
                        idle_since: 0,
                        last: 0,
                        exported: false,
                    },
                );
                self.expandable.insert(key, b);
                b
            }
        };
        for attempt in 0..2 {
            let seg = self.segments[&base];
            let end = base + seg.size;
            // A free block at the end that this stream may use grows instead of a new one.
            let tail = (seg.last != 0)
                .then(|| &self.slab[seg.last as usize])
                .filter(|b| b.addr + b.size == end && matches!(b.state, State::Free { .. }))
                .map(|b| (seg.last, b.size));
            let tail = tail.filter(|&(i, _)| {
                matches!(
                    Self::fit(&mut self.slab, &mut self.backend, i, key.stream),
                    Fit::Usable
                )
            });
            let have = tail.map_or(0, |(_, s)| s);
            let add = (need - have).div_ceil(PAGE) * PAGE;
            if end + add > base + seg.range {
                return Err(None);
            }
            let limit = self.policy.limit;
            if limit > 0 && self.reserved(key.device).saturating_add(add) > limit {
                if attempt == 0 {
                    self.empty_cache(key.device);
                    continue;
                }
                return Err(Some(self.refused(
                    key.device,
                    add,
                    AllocError::LimitReached,
                )));
            }
            if self.backend.map(key.device, end, add).is_err() {
                if attempt == 0 {
                    // Give the idle cache back (this may shrink this very segment) and retry.
                    self.empty_cache(key.device);
                    continue;
                }
                return Err(Some(self.refused(key.device, add, AllocError::OutOfMemory)));
            }
            if attempt == 1 {
                self.retried(key.device, add);
            }
            // An expandable segment counts while it holds memory.
            self.counted_reserve(key.device, end, add, seg.size == 0);
            if let Some(s) = self.segments.get_mut(&base) {
                s.size += add;
            }
            return Ok(match tail {
                Some((i, _)) => {
                    self.remove_free(i);
                    self.slab[i as usize].size += add;
                    i
                }
                None => {
                    let slot = self.segments.slot(&base).unwrap_or(0);
                    let mut b = Block::free(end, add, (base, slot), key);
                    b.prev = seg.last;
                    let i = self.add_block(b);
                    if seg.last != 0 {
                        self.slab[seg.last as usize].next = i;
                    }
                    self.link_below(0, i, slot);
                    i
                }
            });
        }
        Err(Some(AllocError::OutOfMemory))
    }

    /// Unmaps the whole pages of a free block at the end of expandable segment `base`, once
    /// its fence passed, until at most `keep` idle bytes remain on the device.
    pub(super) fn shrink(&mut self, base: u64, keep: u64) {
        let seg = self.segments[&base];
        let end = base + seg.size;
        if seg.allocated_blocks == 0 && seg.size > 0 && keep == 0 {
            // Nothing live in it: all of it goes back (its free blocks may sit in the pools of
            // several streams, which never coalesce).
            let blocks = self.segment_blocks(base);
            if blocks.iter().all(|&i| self.fence_clear(i)) {
                for i in blocks {
                    self.remove_free(i);
                    self.drop_block(i);
                }
                self.backend.unmap(seg.device, base, seg.size);
                self.counted_release(seg.device, base, seg.size, true);
                if let Some(s) = self.segments.get_mut(&base) {
                    s.size = 0;
                    s.last = 0;
                }
                return;
            }
        }
        let i = seg.last;
        if i == 0 {
            return;
        }
        let b = &self.slab[i as usize];
        let p = b.addr;
        if p + b.size != end || !matches!(b.state, State::Free { .. }) || !self.fence_clear(i) {
            return;
        }
        let excess = self.idle(seg.device).saturating_sub(keep);
        let first_page = p.div_ceil(PAGE) * PAGE;
        let mut cut = end - first_page;
        // Keep the pages that the idle budget allows.
        if excess < cut {
            cut = excess / PAGE * PAGE;
        }
        if cut == 0 {
            return;
        }
        let new_end = end - cut;
        self.remove_free(i);
        if new_end > p {
            self.slab[i as usize].size = new_end - p;
            self.insert_free(i);
        } else {
            // The block below is the segment's highest now (or none is).
            let gone = self.drop_block(i);
            if gone.prev != 0 {
                self.slab[gone.prev as usize].next = 0;
            }
            if let Some(s) = self.segments.get_mut(&base) {
                s.last = gone.prev;
            }
        }
        self.backend.unmap(seg.device, new_end, cut);
        self.counted_release(seg.device, new_end, cut, cut == seg.size);
        if let Some(s) = self.segments.get_mut(&base) {
            s.size -= cut;
        }
    }

    /// Room for a fresh segment on `device`: the idle cache given back (`empty_cache`), or,
    /// while the backend is quiet but may still release (a capture under way), every plain
    /// segment with nothing allocated, whatever its fences: its free waits for the device,
    /// which is what the program's own frees of its blocks would have done without the pool.
    pub(super) fn make_room(&mut self, device: u8) {
        if !self.backend.quiet() {
            self.empty_cache(device);
            return;
        }
        if !self.backend.release_while_quiet() {
            return;
        }
        let empty: Vec<u64> = self
            .segments
            .range(..)
            .filter(|(_, s)| s.device == device && s.allocated_blocks == 0 && s.range == 0)
            .map(|(&p, _)| p)
            .collect();
        for base in empty {
            self.give_back_segment(base);
        }
    }

    /// Gives a segment with nothing allocated back, whatever its fences (the device's own free
    /// waits for the device). Deferred while the backend is quiet.
    pub(super) fn release_segment(&mut self, base: u64) {
        if self.backend.quiet() {
            return;
        }
        self.give_back_segment(base);
    }

    /// [`Engine::release_segment`], quiet or not: the caller decided it may.
    fn give_back_segment(&mut self, base: u64) {
        let Some(seg) = self.segments.get(&base).copied() else {
            return;
        };
        let blocks = self.segment_blocks(base);
        for i in blocks {
            self.remove_free(i);
            self.drop_block(i);
        }
        self.segments.remove(&base);
        if seg.range > 0 {
            if seg.size > 0 {
                self.backend.unmap(seg.device, base, seg.size);
            }
        } else {
            self.backend.release(seg.device, base, seg.size);
        }
        // An expandable segment with nothing mapped no longer counted.
        self.counted_release(seg.device, base, seg.size, seg.size > 0);
    }

    /// Gives idle segments of `device` back until at most `keep` idle bytes remain, largest
    /// first. A segment is idle when none of its blocks is allocated and every fence passed.
    pub(super) fn release_idle(&mut self, device: u8, keep: u64) {
        if self.backend.quiet() {
            return;
        }
        let growing: Vec<u64> = self
            .segments
            .range(..)
            .filter(|(_, s)| s.device == device && s.range > 0 && !s.exported)
            .map(|(&p, _)| p)
            .collect();
        for base in growing {
            if self.idle(device) <= keep {
                return;
            }
            self.shrink(base, keep);
        }
        let mut idle: Vec<(u64, u64)> = self
            .segments
            .range(..)
            .filter(|(_, s)| {
                s.device == device && s.allocated_blocks == 0 && s.range == 0 && !s.exported
            })
            .map(|(&p, s)| (s.size, p))
            .collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        for (size, seg) in idle {
            if self.idle(device) <= keep {
                break;
            }
            let blocks = self.segment_blocks(seg);
            if !blocks.iter().all(|&i| self.fence_clear(i)) {
                continue;
            }
            for i in blocks {
                self.remove_free(i);
                self.drop_block(i);
            }
            self.segments.remove(&seg);
            self.backend.release(device, seg, size);
            self.counted_release(device, seg, size, true);
        }
    }
    /// The device lost all its memory (a device reset: CUDA freed every allocation, see
    /// `docs/cuda-facts.md`): every segment and block of `device` is dropped without being given
    /// back, allocated ones included, and its figures start from nothing. Returns the address
    /// ranges forgotten (an expandable segment's whole reserved range), so the backend can drop
    /// what it kept of them.
    pub fn forget_device(&mut self, device: u8) -> Vec<(u64, u64)> {
        let bases: Vec<(u64, Segment)> = self
            .segments
            .range(..)
            .filter(|(_, s)| s.device == device)
            .map(|(&p, s)| (p, *s))
            .collect();
        let mut gone = Vec::with_capacity(bases.len());
        for (base, seg) in bases {
            for i in self.segment_blocks(base) {
                let b = &self.slab[i as usize];
                if let State::Allocated { requested, .. } = b.state {
                    let size = b.size;
                    self.stats.live_bytes = self.stats.live_bytes.saturating_sub(size);
                    self.stats.requested_bytes =
                        self.stats.requested_bytes.saturating_sub(requested);
                    self.stats.live_blocks = self.stats.live_blocks.saturating_sub(1);
                } else {
                    self.remove_free(i);
                }
                self.drop_block(i);
            }
            self.segments.remove(&base);
            if seg.exported {
                self.exported_segments = self.exported_segments.saturating_sub(1);
            }
            self.stats.reserved_bytes = self.stats.reserved_bytes.saturating_sub(seg.size);
            gone.push((base, seg.size.max(seg.range)));
        }
        self.expandable.retain(|k, _| k.device != device);
        self.kept_apart
            .retain(|&(_, p)| !gone.iter().any(|&(b, n)| b <= p && p < b + n));
        self.hints.borrow_mut().clear();
        self.per_device[device as usize] = DeviceStats::default();
        self.idle_per_device[device as usize] = 0;
        self.pending_per_device[device as usize] = 0;
        self.reserved_at[device as usize] = 0;
        gone
    }
}
