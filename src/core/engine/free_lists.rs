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
    pub(super) fn take_cached(&mut self, key: PoolKey, need: u64) -> Option<Ix> {
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
        let (_, i) = best?;
        self.remove_free(i);
        Some(i)
    }

    /// Best fit over the device's pools of this size class: the smallest free block of at
    /// least `need` bytes that `key.stream` may use now (its own stream-ordered frees at once,
    /// others once their fences passed), newest first among blocks of one size, the first pool
    /// in key order among equal sizes. Also says whether a fenced block would fit better. At
    /// most `FENCED_SCAN` fenced blocks are looked at per pool. Allocates nothing.
    pub(super) fn search(&mut self, key: PoolKey, need: u64) -> (Option<(u64, Ix)>, bool) {
        let Engine {
            free,
            slab,
            backend,
            ..
        } = self;
        // (size, block).
        let mut best: Option<(u64, Ix)> = None;
        let mut best_fenced = u64::MAX;
        let first = bins::class_of(need);
        for (_, pool) in free.group(key.device, key.small) {
            let mut fenced_seen = 0;
            // This pool's best: (size, stamp, block); stamps are unique.
            let mut mine: Option<(u64, u64, Ix)> = None;
            let mut class = pool.next_class(first);
            'classes: while let Some(c) = class {
                // Every block of this class and above is at least this big.
                let floor = bins::class_floor(c);
                if best.is_some_and(|(bs, _)| bs <= floor) {
                    break;
                }
                let mut i = pool.head(c);
                while i != 0 {
                    let b = &slab[i as usize];
                    let (size, stamp, next) = (b.size, b.stamp, b.link.1);
                    let better = size >= need
                        && best.is_none_or(|(bs, _)| bs > size)
                        && mine.is_none_or(|m| (m.0, m.1) > (size, stamp));
                    if better {
                        match Self::fit(slab, backend, i, key.stream) {
                            Fit::Usable => {
                                mine = Some((size, stamp, i));
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
                    i = next;
                }
                if mine.is_some() {
                    // Classes above hold only bigger blocks.
                    break;
                }
                class = pool.next_class(c + 1);
            }
            if let Some((size, _, i)) = mine
                && best.is_none_or(|(bs, _)| bs > size)
            {
                best = Some((size, i));
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
        for (i, p) in waiting {
            let Some(i) = self.still_apart(i, p) else {
                // Handed out, or merged into a neighbour.
                continue;
            };
            if !self.fence_clear(i) {
                self.kept_apart.push((i, p));
                continue;
            }
            let exported = self.exported_segments > 0
                && self
                    .segments
                    .at(self.slab[i as usize].seg)
                    .is_none_or(|s| s.exported);
            if exported {
                // Out of the pending count; a exported segment hands nothing out again.
                self.unpend(i);
                continue;
            }
            self.remove_free(i);
            let m = self.coalesce(i);
            self.insert_free(m);
        }
    }

    /// Whether free block `i` may be handed to `stream` now; clears fences that passed.
    pub(super) fn fit(slab: &mut [Block<B::Fence>], backend: &mut B, i: Ix, stream: u64) -> Fit {
        let State::Free { fence, owner } = &mut slab[i as usize].state else {
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

    /// Lists free block `i` (ending its wait out of the lists, if it waited).
    pub(super) fn insert_free(&mut self, i: Ix) {
        let exported = self.exported_segments > 0
            && self
                .segments
                .at(self.slab[i as usize].seg)
                .is_some_and(|s| s.exported);
        let b = &mut self.slab[i as usize];
        let (pool, size) = (b.pool, b.size);
        end_wait(b, &mut self.pending_per_device);
        if exported || b.stamp != 0 {
            // A exported segment hands nothing out again; a listed block is listed.
            return;
        }
        // Newest first among blocks of one size: counting down, so the order depends on the
        // order of frees alone (the shim and a replay agree whatever addresses they got), and
        // the block freed last, warm in the caches, is reused first.
        self.stamps -= 1;
        b.stamp = self.stamps;
        // At the head of its class's list: the lists are newest first.
        let bins = self.free.make(pool);
        let c = bins::class_of(size);
        let old = bins.head(c);
        bins.set_head(c, i);
        b.link = (0, old);
        if old != 0 {
            self.slab[old as usize].link.0 = i;
        }
        self.idle_per_device[pool.device as usize] += size;
    }

    /// Takes free block `i` out of the free lists, or out of the pending ones.
    pub(super) fn remove_free(&mut self, i: Ix) {
        let b = &mut self.slab[i as usize];
        let (pool, size) = (b.pool, b.size);
        if end_wait(b, &mut self.pending_per_device) {
            return;
        }
        if b.stamp != 0 {
            self.unlink(pool, size, i);
        }
    }

    /// Ends block `i`'s wait out of the lists, if it was waiting (see `Block::pending`).
    fn unpend(&mut self, i: Ix) -> bool {
        end_wait(&mut self.slab[i as usize], &mut self.pending_per_device)
    }

    /// Takes listed block `i` (of `size` bytes, in `pool`) out of its class's list.
    fn unlink(&mut self, pool: PoolKey, size: u64, i: Ix) {
        let b = &mut self.slab[i as usize];
        let (before, after) = core::mem::take(&mut b.link);
        b.stamp = 0;
        if before != 0 {
            self.slab[before as usize].link.1 = after;
        } else if let Some(bins) = self.free.get_mut(pool) {
            bins.set_head(bins::class_of(size), after);
        }
        if after != 0 {
            self.slab[after as usize].link.0 = before;
        }
        self.idle_per_device[pool.device as usize] -= size;
    }

    /// Merges free block `i` with free neighbours of its segment and pool. A block freed
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
    /// the wait apart). Returns the merged block (not yet in a pool).
    pub(super) fn coalesce(&mut self, mut i: Ix) -> Ix {
        let (pool, owner, prev) = {
            let b = &self.slab[i as usize];
            let owner = match b.state {
                State::Free { owner, .. } => owner,
                State::Allocated { .. } => None,
            };
            (b.pool, owner, b.prev)
        };
        let separate = owner.is_none();
        let clear = separate.then(|| self.fence_clear(i));
        // The block before (the links stay within the segment): it takes the freed block's
        // state.
        if self.joins(prev, pool, owner, clear) {
            self.absorb(prev, i, true);
            i = prev;
        }
        // The block after.
        let next = self.slab[i as usize].next;
        if self.joins(next, pool, owner, clear) {
            self.absorb(i, next, false);
        }
        if clear == Some(false) {
            self.keep_apart(i);
        }
        i
    }

    /// Whether neighbour `j` (0: none) of a block of `pool` freed by `owner` merges with it.
    fn joins(&mut self, j: Ix, pool: PoolKey, owner: Option<u64>, clear: Option<bool>) -> bool {
        j != 0
            && self.slab[j as usize].pool == pool
            && matches!(self.slab[j as usize].state, State::Free { .. })
            && self.mergeable(j, owner, clear)
    }

    /// Block `hi`, just above free block `lo` in its segment, becomes part of `lo`, which takes
    /// `hi`'s state when `hi` is the block being freed (`hi_state`). The neighbour (`lo` then,
    /// else `hi`) leaves its free list first; the freed block is in none.
    fn absorb(&mut self, lo: Ix, hi: Ix, hi_state: bool) {
        self.remove_free(if hi_state { lo } else { hi });
        let h = self.drop_block(hi);
        let l = &mut self.slab[lo as usize];
        l.size += h.size;
        l.next = h.next;
        if hi_state {
            l.state = h.state;
        }
        self.link_below(h.next, lo, h.seg);
    }

    /// Puts fenced free block `i` on `kept_apart`. Entries of blocks handed out or merged since
    /// are dropped whenever the list doubled, so it stays within twice the fenced free blocks
    /// however long fences take to pass.
    pub(super) fn keep_apart(&mut self, i: Ix) {
        self.kept_apart.push((i, self.slab[i as usize].addr));
        if self.kept_apart.len() >= KEPT_APART_MIN.max(2 * self.kept_apart_pruned) {
            let mut list = core::mem::take(&mut self.kept_apart);
            // In order (see `merge_if_passed`); a block listed twice is merged at its first
            // entry, and its second finds nothing more to merge.
            list.retain(|&(i, p)| {
                self.resolve(i, p).is_some_and(|i| {
                    let b = &self.slab[i as usize];
                    b.pending || matches!(b.state, State::Free { fence: Some(_), .. })
                })
            });
            self.kept_apart_pruned = list.len();
            self.kept_apart = list;
        }
    }

    /// The block at address `p`, looked for first in slot `i` (where it was when listed in
    /// `kept_apart`) and by address only when that slot holds another block now.
    fn resolve(&self, i: Ix, p: u64) -> Option<Ix> {
        if self.slab[i as usize].addr == p {
            Some(i)
        } else {
            self.ix(p)
        }
    }

    /// Entry (`i`, `p`) of `kept_apart`'s block, if it is free and still waits apart (pending
    /// or listed).
    fn still_apart(&self, i: Ix, p: u64) -> Option<Ix> {
        self.resolve(i, p).filter(|&i| {
            let b = &self.slab[i as usize];
            matches!(b.state, State::Free { .. }) && (b.pending || b.stamp != 0)
        })
    }

    /// Whether free block `i` may merge into a block freed by `owner` (see `coalesce`):
    /// `clear` is `None` in a plain segment (any passed or implied fence merges), else whether
    /// the freed block's own fence passed (like merges with like).
    pub(super) fn mergeable(&mut self, i: Ix, owner: Option<u64>, clear: Option<bool>) -> bool {
        if clear == Some(true) {
            return self.fence_clear(i);
        }
        let same_owner = matches!(
            self.slab[i as usize].state,
            State::Free { fence: Some(_), owner: o } if o == owner
        );
        match clear {
            None => same_owner || self.fence_clear(i),
            _ => same_owner && !self.fence_clear(i),
        }
    }

    /// Whether a free block has no fence left (clearing one that passed).
    pub(super) fn fence_clear(&mut self, i: Ix) -> bool {
        match &mut self.slab[i as usize].state {
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
