//! The engine's blocks: one slab of them, named by index and linked to their neighbours (see
//! [`Block`]), the index from address to slot for the pointer a call names, the lookups of
//! live blocks by address (interior pointers included), and the check of it all for tests.

use super::*;

/// A block's place in `Engine::slab`; 0 names no block (slot 0 is never used).
pub(super) type Ix = u32;

/// One block. Blocks live in one array (`Engine::slab`) and name each other by index: in a
/// real process the program evicts the engine from the caches between two requests, and a
/// request visits a handful of blocks (the one it takes, its neighbours in the segment and in
/// its size class's list); each such visit is then one cold cache line pair at a known place,
/// where a hash map keyed by address cost a probe of its control bytes and an entry of two
/// lines (measured: ~20 probes per allocation and free). The fields a search reads
/// (size, stamp, links) come first, in the first 64 bytes.
#[derive(Clone, Debug)]
#[repr(C, align(128))]
pub(super) struct Block<F> {
    /// Its device address (0 while its slot is vacant).
    pub(super) addr: u64,
    pub(super) size: u64,
    /// The base of its segment.
    pub(super) segment: u64,
    /// While in a free list, its place among blocks of its size there; 0 otherwise.
    pub(super) stamp: u64,
    /// While in a free list: the blocks before (newer) and after (older) it in its size
    /// class's list (`bins`), 0 at either end.
    pub(super) link: (Ix, Ix),
    /// The blocks just below and just above it in its segment (0: none).
    pub(super) prev: Ix,
    pub(super) next: Ix,
    pub(super) pool: PoolKey,
    /// Freed with a synchronous free and still fenced: out of the free lists (so no search
    /// looks at it and no neighbour's merge fences free space with it) until its fence
    /// passes; counted in `pending_per_device`.
    pub(super) pending: bool,
    /// Its segment's slot in `Engine::segments`.
    pub(super) seg: Ix,
    pub(super) state: State<F>,
}

impl<F> Block<F> {
    /// A free, unlisted, unlinked block of the segment at `segment` (in slot `seg`).
    pub(super) fn free(addr: u64, size: u64, (segment, seg): (u64, Ix), pool: PoolKey) -> Block<F> {
        Block {
            addr,
            size,
            segment,
            seg,
            stamp: 0,
            link: (0, 0),
            prev: 0,
            next: 0,
            pool,
            pending: false,
            state: State::Free {
                fence: None,
                owner: None,
            },
        }
    }
}

/// Interior-pointer lookups keep one hint per 2^16 bytes of address: a walk from the hint
/// crosses at most 128 blocks (of 512 bytes).
const HINT_SHIFT: u32 = 16;
/// Hints kept at most (4 GiB of address looked up in); past that they start again.
const MAX_HINTS: usize = 1 << 16;

/// The pool key of vacant slots.
pub(super) const NO_POOL: PoolKey = PoolKey {
    device: 0,
    small: false,
    stream: 0,
};

impl<B: Backend> Engine<B> {
    /// The block starting at `addr`, if any.
    pub(super) fn ix(&self, addr: u64) -> Option<Ix> {
        self.index.get(&addr).copied()
    }

    /// Puts a new block in a slot (a vacant one if any) and indexes it by address.
    pub(super) fn add_block(&mut self, b: Block<B::Fence>) -> Ix {
        let addr = b.addr;
        let i = match self.vacant.pop() {
            Some(i) => {
                self.slab[i as usize] = b;
                i
            }
            None => {
                // Past 2^32 - 1 blocks (terabytes of 512-byte blocks) slots would wrap: no
                // device holds that many.
                self.slab.push(b);
                (self.slab.len() - 1) as Ix
            }
        };
        self.index.insert(addr, i);
        i
    }

    /// Takes block `i` out of the slab and the index (its neighbours' links are the caller's).
    pub(super) fn drop_block(&mut self, i: Ix) -> Block<B::Fence> {
        let b = core::mem::replace(
            &mut self.slab[i as usize],
            Block::free(0, 0, (0, 0), NO_POOL),
        );
        self.index.remove(&b.addr);
        self.vacant.push(i);
        b
    }

    /// The live block that contains `ptr`, if any (pointer queries, IPC).
    pub fn lookup(&self, ptr: u64) -> Option<BlockInfo> {
        if let Some(i) = self.ix(ptr) {
            return self.info(i);
        }
        let (base, seg) = self.segments.at_or_before(ptr)?;
        if ptr >= base + seg.size {
            return None;
        }
        // Walk up from a block start at or below `ptr` in this segment: the hint for its
        // 64 KiB, if that is still a block start, else the segment's base. The walk then
        // leaves as the hint the block that covers the start of those 64 KiB.
        let granule = ptr >> HINT_SHIFT;
        let granule_start = granule << HINT_SHIFT;
        let hint = self
            .hints
            .try_borrow()
            .ok()
            .and_then(|h| h.get(&granule).copied());
        let mut i = hint
            .filter(|&h| h <= ptr)
            .and_then(|h| self.ix(h))
            .filter(|&i| self.slab[i as usize].segment == base)
            .or_else(|| self.ix(base))?;
        let mut cover = self.slab[i as usize].addr;
        loop {
            let b = &self.slab[i as usize];
            if b.addr <= granule_start {
                cover = b.addr;
            }
            if ptr < b.addr + b.size {
                break;
            }
            if b.next == 0 {
                return None;
            }
            i = b.next;
        }
        if let Ok(mut hints) = self.hints.try_borrow_mut() {
            // Bounded: hints are only a shortcut, and a lookup that finds none walks from the
            // segment's base.
            if hints.len() >= MAX_HINTS {
                hints.clear();
            }
            hints.insert(granule, cover);
        }
        self.info(i)
    }

    /// Checks the engine's own bookkeeping, for tests: each segment's blocks tile it from its
    /// base, each links to the ones below and above it, the segment names its highest; the
    /// index names every block and nothing else; each listed block is in its size class's
    /// list of its pool, and the lists hold nothing else.
    #[doc(hidden)]
    pub fn check_links(&self) -> Result<(), String> {
        let mut listed = 0usize;
        let mut tiled = 0usize;
        for (&base, seg) in self.segments.range(..) {
            let blocks = self.segment_blocks(base);
            let slot = self.segments.slot(&base);
            let mut expect = base;
            let mut below = 0;
            for &i in &blocks {
                let b = &self.slab[i as usize];
                if b.addr != expect || b.prev != below || b.segment != base || Some(b.seg) != slot {
                    return Err(format!(
                        "segment {base:#x}: block {i} at {:#x} (size {:#x}, below {}, segment \
                         {:#x}) after {below} (expected at {expect:#x})",
                        b.addr, b.size, b.prev, b.segment
                    ));
                }
                if below != 0 && self.slab[below as usize].next != i {
                    return Err(format!(
                        "segment {base:#x}: block {below} not linked up to {i}"
                    ));
                }
                expect = b.addr + b.size;
                below = i;
                listed += usize::from(b.stamp != 0);
            }
            tiled += blocks.len();
            let top = (below != 0).then(|| self.slab[below as usize].next);
            if expect != base + seg.size || seg.last != below || top.is_some_and(|n| n != 0) {
                return Err(format!(
                    "segment {base:#x} of {:#x}: blocks end at {expect:#x}, last {} not {below}",
                    seg.size, seg.last
                ));
            }
        }
        let live = self.slab.len() - 1 - self.vacant.len();
        if self.index.len() != live || live != tiled {
            return Err(format!(
                "{} indexed, {live} in the slab, {tiled} in segments",
                self.index.len()
            ));
        }
        if let Some((a, i)) = self
            .index
            .iter()
            .find(|&(&a, &i)| self.slab.get(i as usize).is_none_or(|b| b.addr != a))
        {
            return Err(format!("{a:#x} indexed as {i}, which is not it"));
        }
        let in_lists = self.listed_blocks()?;
        if in_lists != listed {
            return Err(format!("{listed} blocks listed, {in_lists} in the lists"));
        }
        Ok(())
    }

    /// The blocks in every pool's size-class lists, each checked against its pool, its class
    /// and the link of the block before it.
    fn listed_blocks(&self) -> Result<usize, String> {
        let mut n = 0;
        for (key, bins) in self.free.iter() {
            let mut c = bins.next_class(0);
            while let Some(class) = c {
                let (mut i, mut newer) = (bins.head(class), 0);
                while i != 0 {
                    let Some(b) = self.slab.get(i as usize).filter(|b| b.addr != 0) else {
                        return Err(format!("class {class}: {i} is not a block"));
                    };
                    if b.pool != key
                        || bins::class_of(b.size) != class
                        || b.link.0 != newer
                        || b.stamp == 0
                    {
                        return Err(format!(
                            "class {class}: {i} (size {:#x}, links {:?}) after {newer}",
                            b.size, b.link
                        ));
                    }
                    n += 1;
                    newer = i;
                    i = b.link.1;
                }
                c = bins.next_class(class + 1);
            }
        }
        Ok(n)
    }

    /// The blocks of segment `base`, in address order.
    pub(super) fn segment_blocks(&self, base: u64) -> Vec<Ix> {
        let mut out = Vec::new();
        if self.segments.get(&base).is_none_or(|s| s.last == 0) {
            return out;
        }
        let mut i = self.ix(base).unwrap_or(0);
        while i != 0 {
            out.push(i);
            i = self.slab[i as usize].next;
        }
        out
    }

    /// The live block that starts at `ptr`, if any: one hash lookup, where [`Engine::lookup`]
    /// also finds interior pointers (by walking the segment's blocks).
    pub fn block_at(&self, ptr: u64) -> Option<BlockInfo> {
        self.info(self.ix(ptr)?)
    }

    /// Block `i`, if allocated, as pointer queries see it.
    pub(super) fn info(&self, i: Ix) -> Option<BlockInfo> {
        let b = &self.slab[i as usize];
        let State::Allocated { stream, requested } = b.state else {
            return None;
        };
        let seg = self.segments.at(b.seg)?;
        Some(BlockInfo {
            ptr: b.addr,
            size: b.size,
            requested,
            device: b.pool.device,
            stream,
            segment: b.segment,
            segment_size: seg.size,
        })
    }

    /// Block `i` of the segment in slot `seg` now lies just below block `above` (0: `i` is the
    /// segment's highest).
    pub(super) fn link_below(&mut self, above: Ix, i: Ix, seg: Ix) {
        if above != 0 {
            self.slab[above as usize].prev = i;
        } else if let Some(s) = self.segments.at_mut(seg) {
            s.last = i;
        }
    }
}
