//! Segments given back: a block's whole segment, the cached ones, what a failed request
//! frees before it tries again, and the garbage collection threshold's.

use super::*;

impl Model {
    pub(super) fn whole_segment(&self, ptr: u64) -> bool {
        self.blocks.get(&ptr).is_some_and(|b| {
            b.seg == ptr && self.segments.get(&ptr).is_some_and(|s| s.size == b.size)
        })
    }

    /// `cudaFree` of a plain segment that is one free block.
    pub(super) fn release_block(&mut self, ptr: u64) {
        let Some(b) = self.blocks.remove(&ptr) else {
            return;
        };
        self.free[pool(b.small)].remove(&(b.stream, b.size, ptr));
        self.segments.remove(&ptr);
        self.stats.reserved -= b.size;
        self.stats.device_frees += 1;
        self.logged(SegmentEvent::Release { ptr, size: b.size });
    }

    pub(super) fn release_blocks(&mut self, p: usize) {
        // After a release, only the blocks freed since can go back (see `fresh`), looked at in
        // the free set's order as the whole set would be.
        let keys: Vec<(u64, u64, u64)> = if let Some(fresh) = self.fresh[p].take() {
            let mut keys: Vec<_> = fresh
                .into_iter()
                .filter_map(|ptr| {
                    let b = self.blocks.get(&ptr).filter(|b| b.state == State::Free)?;
                    let k = (b.stream, b.size, ptr);
                    self.free[p].contains(&k).then_some(k)
                })
                .collect();
            keys.sort_unstable();
            keys.dedup();
            keys
        } else {
            self.free[p].iter().copied().collect()
        };
        let mut to_unmap = Vec::new();
        for (_, _, ptr) in keys {
            if self.expandable(ptr) {
                to_unmap.push(ptr);
            } else if self.whole_segment(ptr) {
                self.release_block(ptr);
            }
        }
        for ptr in to_unmap {
            if let Some(start) = self.unmap_block(ptr)
                && self.whole_segment(start)
            {
                // The whole reservation is unmapped: PyTorch gives the address range back.
                let b = self.blocks.remove(&start).map(|b| (b.stream, b.small));
                if let Some((stream, small)) = b {
                    self.unmapped[pool(small)].remove(&(stream, start));
                }
                self.segments.remove(&start);
            }
        }
        // What the unmapping left free (the part pages of a block) goes back only once it
        // joins a block freed later.
        self.fresh[p].looked();
    }

    /// The next release and the next collection look through every free block, as before
    /// any (the tests compare the two).
    #[cfg(test)]
    pub fn forget_releases(&mut self) {
        self.fresh = Default::default();
        self.gc_fresh = Default::default();
    }

    /// Every pending free completes, then every wholly free cached segment goes back.
    pub(super) fn release_cached(&mut self) {
        let pending: Vec<u64> = std::mem::take(&mut self.pending).into_iter().collect();
        for ptr in pending {
            self.free_block(ptr);
        }
        self.release_blocks(0);
        self.release_blocks(1);
    }

    /// With `max_split_size` set: the smallest oversize cached block that covers the request,
    /// or oversize blocks from the largest down until they add up to it, go back.
    pub(super) fn release_available(&mut self, size: u64, stream: u64, small: bool) -> bool {
        let max_split = self.conf.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let p = pool(small);
        let key = size.max(max_split);
        let first = self.free[p].range((stream, key, 0)..).next().copied();
        if let Some(f) = first
            && f.0 == stream
            && !self.expandable(f.2)
        {
            self.release_block(f.2);
            return true;
        }
        let below: Vec<(u64, u64, u64)> = self.free[p]
            .range(..(stream, key, 0))
            .rev()
            .take_while(|k| k.1 >= max_split && k.0 == stream)
            .copied()
            .collect();
        let mut released = 0u64;
        for k in below {
            if released >= key {
                break;
            }
            if !self.expandable(k.2) {
                self.release_block(k.2);
                released += k.1;
            }
        }
        released >= key
    }

    /// With a memory fraction and `garbage_collection_threshold`: above the threshold, cached
    /// whole segments of the large pool that waited longer than average go back, until enough
    /// did.
    pub(super) fn garbage_collect(&mut self) {
        let Some(allowed) = self.limits.allowed else {
            return;
        };
        let threshold = (self.conf.gc_threshold * allowed as f64) as u64;
        // PyTorch's collector weighs all it holds, its private pools' too.
        let held = self.held();
        if held <= threshold {
            return;
        }
        let target = held - threshold;
        let clock = self.searches[0];
        let age = |b: &Block| clock.saturating_sub(b.gc_base);
        let whole_free = |m: &Model, ptr: u64| -> Option<(u64, u64, u64)> {
            let b = m.blocks.get(&ptr).filter(|b| b.state == State::Free)?;
            let k = (b.stream, b.size, ptr);
            let whole = m.prev_of(ptr).is_none() && m.next_of(ptr).is_none();
            (whole && m.free[0].contains(&k)).then_some(k)
        };
        // The whole free segments of the large pool, in the free set's order (see `gc_whole`).
        let mut keys: Vec<(u64, u64, u64)> = match self.gc_fresh.take() {
            Some(fresh) => {
                let mut keys: Vec<_> = std::mem::take(&mut self.gc_whole)
                    .into_iter()
                    .chain(fresh)
                    .filter_map(|p| whole_free(self, p))
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                keys
            }
            None => {
                let all: Vec<u64> = self.free[0].iter().map(|k| k.2).collect();
                all.into_iter()
                    .filter_map(|p| whole_free(self, p))
                    .collect()
            }
        };
        let mut total_age: u64 = keys.iter().map(|k| age(&self.blocks[&k.2])).sum();
        let mut count = keys.len() as u64;
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let mean = total_age as f64 / count as f64;
            freed = false;
            for &(_, size, ptr) in &keys {
                let Some(b) = self.blocks.get(&ptr).copied() else {
                    continue;
                };
                if self.whole_segment(ptr) && !self.expandable(ptr) && age(&b) as f64 >= mean {
                    freed = true;
                    reclaimed += size;
                    total_age = total_age.saturating_sub(age(&b));
                    count = count.saturating_sub(1);
                    self.release_block(ptr);
                }
            }
        }
        keys.retain(|k| self.blocks.contains_key(&k.2));
        self.gc_whole = keys.into_iter().map(|k| k.2).collect();
        self.gc_fresh.looked();
    }
}
