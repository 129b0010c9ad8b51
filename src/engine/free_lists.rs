//! The free lists: best fit by pool and size, splitting and coalescing neighbours, and the
//! fences that say when a freed block may be reused.

use super::*;

/// While blocks wait for their fences, the backend is polled at least once in this many
/// requests.
const POLL_EVERY: u32 = 16;

/// `kept_apart` is pruned once it holds this many entries (or twice what was left last time).
pub(super) const KEPT_APART_MIN: usize = 4096;

impl<B: Backend> Engine<B> {
    /// Finds a cached block for `key` of at least `need` bytes and removes it from its pool.
    /// Never waits for the device: a better block behind a fence is polled for (no waiting),
    /// and otherwise left for later.
    pub(super) fn take_cached(&mut self, key: PoolKey, need: u64) -> Option<u64> {
        self.merge_if_passed();
        let (mut best, fenced_fits) = self.search(key, need);
        // Polled when a fenced block would fit better; when nothing fits while blocks wait for
        // their fences out of the lists (fresh memory is the alternative); and every
        // POLL_EVERY requests while blocks wait, so that their fences are checked before the
        // cache runs dry (a checkpoint made only then cannot pass in time for that request,
        // which takes fresh memory). While the backend is quiet (a stream capture), fences
        // cannot even be polled.
        let pending = self.pending_per_device[key.device as usize] > 0;
        let early = pending && {
            self.unpolled += 1;
            self.unpolled >= POLL_EVERY
        };
        if (fenced_fits || early || (best.is_none() && pending)) && !self.backend.quiet() && {
            self.unpolled = 0;
            self.backend.poll(key.device, best.is_none())
        } {
            self.merge_if_passed();
            best = self.search(key, need).0;
        }
        let (_, p) = best?;
        self.remove_free(p);
        Some(p)
    }

    /// Best fit over the device's pools of this size class: the smallest free block of at
    /// least `need` bytes that `key.stream` may use now (its own stream-ordered frees at once,
    /// others once their fences passed), newest first among blocks of one size, the first pool
    /// in key order among equal sizes. Also says whether a fenced block would fit better. At
    /// most `FENCED_SCAN` fenced blocks are looked at per pool. Allocates nothing.
    pub(super) fn search(&mut self, key: PoolKey, need: u64) -> (Option<(u64, u64)>, bool) {
        let Engine {
            free,
            blocks,
            backend,
            ..
        } = self;
        let lo = PoolKey {
            device: key.device,
            small: key.small,
            stream: 0,
        };
        let hi = PoolKey {
            stream: u64::MAX,
            ..lo
        };
        // (size, address).
        let mut best: Option<(u64, u64)> = None;
        let mut best_fenced = u64::MAX;
        let first = bins::class_of(need);
        for pool in free.range(lo..=hi).map(|(_, pool)| pool) {
            let mut fenced_seen = 0;
            // This pool's best: (size, stamp, address).
            let mut mine: Option<(u64, u64, u64)> = None;
            let mut class = pool.next_class(first);
            'classes: while let Some(c) = class {
                // Every block of this class and above is at least this big.
                let floor = bins::class_floor(c);
                if best.is_some_and(|(bs, _)| bs <= floor) {
                    break;
                }
                let mut p = pool.head(c);
                while p != 0 {
                    let Some(b) = blocks.get(&p) else {
                        break;
                    };
                    let (size, stamp, next) = (b.size, b.stamp, b.link.1);
                    let better = size >= need
                        && best.is_none_or(|(bs, _)| bs > size)
                        && mine.is_none_or(|m| m > (size, stamp, p));
                    if better {
                        match Self::fit(blocks, backend, p, key.stream) {
                            Fit::Usable => {
                                mine = Some((size, stamp, p));
                                if bins::exact(c) {
                                    // Newest first: nothing later in this list is better.
                                    break;
                                }
                            }
                            Fit::Fenced => {
                                best_fenced = best_fenced.min(size);
                                fenced_seen += 1;
                                if fenced_seen == FENCED_SCAN {
                                    break 'classes;
                                }
                            }
                        }
                    }
                    p = next;
                }
                if mine.is_some() {
                    // Classes above hold only bigger blocks.
                    break;
                }
                class = pool.next_class(c + 1);
            }
            if let Some((size, _, p)) = mine
                && best.is_none_or(|(bs, _)| bs > size)
            {
                best = Some((size, p));
            }
        }
        let fenced_fits = best_fenced < best.map_or(u64::MAX, |(s, _)| s);
        (best, fenced_fits)
    }

    /// When fences passed since it last looked: merges each free block that was kept apart
    /// while fenced (see `coalesce`) and whose fence has now passed with its free neighbours.
    /// Which blocks merge depends only on which fences passed, not on which blocks a search
    /// happened to visit, so a replay that knows when fences passed reproduces it. Only the
    /// blocks kept apart are looked at: those freed while the GPU ran behind.
    fn merge_if_passed(&mut self) {
        let progress = self.backend.progress();
        if progress == self.merged_at || self.kept_apart.is_empty() {
            self.merged_at = progress;
            return;
        }
        self.merged_at = progress;
        // In the order they were freed (never by address, which differs between the shim and
        // a replay): the order they are listed in decides which of equal blocks serves first.
        let waiting = core::mem::take(&mut self.kept_apart);
        for p in waiting {
            let waits = self.blocks.get(&p).is_some_and(|b| {
                matches!(b.state, State::Free { .. }) && (b.pending || b.stamp != 0)
            });
            if !waits {
                // Handed out, or merged into a neighbour.
                continue;
            }
            if !self.fence_clear(p) {
                self.kept_apart.push(p);
                continue;
            }
            let sealed = self.sealed_segments > 0
                && self
                    .segments
                    .get(&self.blocks[&p].segment)
                    .is_none_or(|s| s.sealed);
            if sealed {
                // Out of the pending count; a sealed segment hands nothing out again.
                self.unpend(p);
                continue;
            }
            self.remove_free(p);
            let m = self.coalesce(p);
            self.insert_free(m);
        }
    }

    /// Whether free block `p` may be handed to `stream` now; clears fences that passed.
    pub(super) fn fit(
        blocks: &mut FastMap<u64, Block<B::Fence>>,
        backend: &mut B,
        p: u64,
        stream: u64,
    ) -> Fit {
        let Some(State::Free { fence, owner }) = blocks.get_mut(&p).map(|b| &mut b.state) else {
            return Fit::Fenced;
        };
        let Some(f) = fence.as_ref() else {
            return Fit::Usable;
        };
        if *owner == Some(stream) {
            return Fit::Usable;
        }
        if backend.passed(f) {
            *fence = None;
            *owner = None;
            return Fit::Usable;
        }
        Fit::Fenced
    }

    /// Lists free block `p` (ending its wait out of the lists, if it waited). One lookup of
    /// the block: in a real process every map descent misses the caches (the program ran
    /// between two requests), so each costs hundreds of nanoseconds.
    pub(super) fn insert_free(&mut self, p: u64) {
        let sealed = self.sealed_segments > 0
            && self
                .blocks
                .get(&p)
                .and_then(|b| self.segments.get(&b.segment))
                .is_some_and(|s| s.sealed);
        let Some(b) = self.blocks.get_mut(&p) else {
            return;
        };
        let (pool, size) = (b.pool, b.size);
        end_wait(b, &mut self.pending_per_device);
        if sealed || b.stamp != 0 {
            // A sealed segment hands nothing out again; a listed block is listed.
            return;
        }
        // Newest first among blocks of one size: counting down, so the order depends on the
        // order of frees alone (the shim and a replay agree whatever addresses they got), and
        // the block freed last, warm in the caches, is reused first.
        self.stamps -= 1;
        b.stamp = self.stamps;
        // At the head of its class's list: the lists are newest first.
        let bins = self.free.entry(pool).or_default();
        let c = bins::class_of(size);
        let old = bins.head(c);
        bins.set_head(c, p);
        b.link = (0, old);
        if old != 0
            && let Some(o) = self.blocks.get_mut(&old)
        {
            o.link.0 = p;
        }
        self.idle_per_device[pool.device as usize] += size;
    }

    /// Takes free block `p` out of the free lists, or out of the pending ones.
    pub(super) fn remove_free(&mut self, p: u64) {
        let Some(b) = self.blocks.get_mut(&p) else {
            return;
        };
        let (pool, size) = (b.pool, b.size);
        if end_wait(b, &mut self.pending_per_device) {
            return;
        }
        if b.stamp != 0 {
            self.unlink(pool, size, p);
        }
    }

    /// Ends block `p`'s wait out of the lists, if it was waiting (see `Block::pending`).
    fn unpend(&mut self, p: u64) -> bool {
        self.blocks
            .get_mut(&p)
            .is_some_and(|b| end_wait(b, &mut self.pending_per_device))
    }

    /// Takes listed block `p` (of `size` bytes, in `pool`) out of its class's list.
    fn unlink(&mut self, pool: PoolKey, size: u64, p: u64) {
        let Some(b) = self.blocks.get_mut(&p) else {
            return;
        };
        let (before, after) = core::mem::take(&mut b.link);
        b.stamp = 0;
        if before != 0 {
            if let Some(q) = self.blocks.get_mut(&before) {
                q.link.1 = after;
            }
        } else if let Some(bins) = self.free.get_mut(&pool) {
            bins.set_head(bins::class_of(size), after);
        }
        if after != 0
            && let Some(q) = self.blocks.get_mut(&after)
        {
            q.link.0 = before;
        }
        self.idle_per_device[pool.device as usize] -= size;
    }

    /// Merges free block `p` with free neighbours of its segment and pool. A block freed
    /// stream-ordered merges with neighbours whose fences passed or that the same stream freed
    /// (its later fence covers everything their earlier ones did), and the merged block keeps
    /// its fence: that fence binds only other streams, its own reuses the block at once (kept
    /// apart instead, PyTorch's pluggable route ran 1.148× its default step against 1.007×
    /// merged: GPT-2, H100). A block freed with `cudaFree` (fenced for every stream) comes here
    /// only once its fence passed (until then it waits out of the lists: `Block::pending`), and
    /// merges only with neighbours whose fences passed too: merged while fenced, it fenced the
    /// free space beside it, and the pool took fresh memory while free memory sat there (an
    /// expandable segment grew to 1,053 MiB for 50 MiB live on the simulator; replayed on a
    /// GPT-2 trace from the GPU, plain segments reserved 26.3 GiB for 7.3 GiB live, 13.4 with
    /// the wait apart). Returns the merged block's address (not yet in a pool).
    pub(super) fn coalesce(&mut self, mut p: u64) -> u64 {
        let (segment, pool, owner) = {
            let b = &self.blocks[&p];
            let owner = match b.state {
                State::Free { owner, .. } => owner,
                State::Allocated { .. } => None,
            };
            (b.segment, b.pool, owner)
        };
        let separate = owner.is_none();
        let clear = separate.then(|| self.fence_clear(p));
        // The block before.
        if let Some((q, prev)) = self.below(p)
            && prev.segment == segment
            && prev.pool == pool
            && q + prev.size == p
            && matches!(prev.state, State::Free { .. })
            && self.mergeable(q, owner, clear)
        {
            self.remove_free(q);
            let b = self.blocks.remove(&p).expect("the freed block");
            let end = p + b.size;
            if let Some(prev) = self.blocks.get_mut(&q) {
                prev.size += b.size;
                prev.state = b.state;
            }
            self.relink_above(q, end, segment);
            p = q;
        }
        // The block after.
        let end = p + self.blocks[&p].size;
        if let Some(next) = self.blocks.get(&end)
            && next.segment == segment
            && next.pool == pool
            && matches!(next.state, State::Free { .. })
            && self.mergeable(end, owner, clear)
        {
            self.remove_free(end);
            let n = self.blocks.remove(&end).expect("the next block");
            if let Some(b) = self.blocks.get_mut(&p) {
                b.size += n.size;
            }
            self.relink_above(p, end + n.size, segment);
        }
        if clear == Some(false) {
            self.keep_apart(p);
        }
        p
    }

    /// Puts fenced free block `p` on `kept_apart`. Entries of blocks handed out or merged since
    /// are dropped whenever the list doubled, so it stays within twice the fenced free blocks
    /// however long fences take to pass.
    pub(super) fn keep_apart(&mut self, p: u64) {
        self.kept_apart.push(p);
        if self.kept_apart.len() >= KEPT_APART_MIN.max(2 * self.kept_apart_pruned) {
            let mut list = core::mem::take(&mut self.kept_apart);
            // In order (see `merge_if_passed`); a block listed twice is merged at its first
            // entry, and its second finds nothing more to merge.
            list.retain(|q| {
                self.blocks.get(q).is_some_and(|b| {
                    b.pending || matches!(b.state, State::Free { fence: Some(_), .. })
                })
            });
            self.kept_apart_pruned = list.len();
            self.kept_apart = list;
        }
    }

    /// Whether free block `p` may merge into a block freed by `owner` (see `coalesce`):
    /// `clear` is `None` in a plain segment (any passed or implied fence merges), else whether
    /// the freed block's own fence passed (like merges with like).
    pub(super) fn mergeable(&mut self, p: u64, owner: Option<u64>, clear: Option<bool>) -> bool {
        if clear == Some(true) {
            return self.fence_clear(p);
        }
        let same_owner = matches!(
            self.blocks.get(&p),
            Some(Block { state: State::Free { fence: Some(_), owner: o }, .. }) if *o == owner
        );
        match clear {
            None => same_owner || self.fence_clear(p),
            _ => same_owner && !self.fence_clear(p),
        }
    }

    /// Whether a free block has no fence left (clearing one that passed).
    pub(super) fn fence_clear(&mut self, p: u64) -> bool {
        let Some(b) = self.blocks.get_mut(&p) else {
            return false;
        };
        match &mut b.state {
            State::Free { fence: None, .. } => true,
            State::Free { fence, owner } => {
                let passed = fence.as_ref().is_some_and(|f| self.backend.passed(f));
                if passed {
                    *fence = None;
                    *owner = None;
                }
                passed
            }
            State::Allocated { .. } => false,
        }
    }
}

/// Ends a block's wait out of the lists, if it waited (`Block::pending`), and takes it off the
/// per-device count: whether it waited.
fn end_wait<F>(b: &mut Block<F>, pending_per_device: &mut [u64; 256]) -> bool {
    if !b.pending {
        return false;
    }
    b.pending = false;
    pending_per_device[b.pool.device as usize] -= b.size;
    true
}
