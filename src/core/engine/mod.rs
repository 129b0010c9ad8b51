//! The caching allocator: plain Rust over a [`Backend`] (no CUDA in here).
//!
//! Device memory is reserved from the backend in segments and handed out in blocks. Requests
//! up to 1 MiB come from 2 MiB "small" segments split down to 512-byte granules; larger ones from
//! segments rounded up to 2 MiB, split only while the block is at most `max_split` and the rest
//! is more than 1 MiB. Free blocks live in pools, one per (device, stream, small or large), each
//! a set of lists by size class (`bins`), and a request takes the smallest block that fits
//! (best fit; the newest among blocks of one size). Neighbouring free blocks of one segment and
//! pool coalesce.
//!
//! Safe reuse (contract 3 of docs/design.md): a block freed stream-ordered on stream S carries a
//! fence on S; it is reusable at once on S (stream order protects it) and on another stream
//! only once the fence passed. A block freed synchronously (`cudaFree`) carries a fence on the
//! whole device and is reusable on no stream before it passed: real `cudaFree` waits for the
//! device, and programs rely on it. When nothing else fits, the engine waits for the device
//! once (`synchronize`), which passes every fence, before reserving more memory.
//!
//! `device` in the engine is the index of memory it keeps apart, whatever its user means by it:
//! the shim passes the slot of a CUDA context (one per device and primary or created context;
//! the shim maps it back to the device in what it records), a replay the trace's device.
//!
//! Out of memory: the engine returns idle cached segments to the device and tries once more
//! before failing. `limit` caps the memory reserved per device; `release` caps idle cached
//! memory (the excess goes back to the device at each free).

pub mod backend;
mod bins;
mod blocks;
mod free_lists;
pub mod front;
mod policy;
mod segments;
mod slab;
mod stats;
mod trim;

use slab::{Block, Ix};

use crate::fasthash::AddressMap;
pub use backend::{Backend, Event, MemoryBackend, OutOfMemory};
pub use policy::{
    GRANULE, LARGE_SEGMENT_ROUND, MAX_REQUEST, MEDIUM_REQUEST, Policy, SMALL_REQUEST,
    SMALL_SEGMENT, SYNC_KEY, round_size,
};
pub use stats::{Counter, DEVICE_STATS_LEN, DeviceStats, Stats};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct PoolKey {
    device: u8,
    small: bool,
    stream: u64,
}

#[derive(Clone, Debug)]
enum State<F> {
    Allocated {
        stream: u64,
        requested: u64,
    },
    /// `fence`: work that may still use the block; `owner`: the stream whose own later work is
    /// ordered after that fence anyway (stream-ordered frees), if any.
    Free {
        fence: Option<F>,
        owner: Option<u64>,
    },
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    /// Bytes backed by memory (for an expandable segment, the mapped prefix of its range).
    size: u64,
    device: u8,
    allocated_blocks: u32,
    /// The reserved address range of an expandable segment; 0 for a plain one.
    range: u64,
    /// When its last allocated block was freed (the backend's clock), for `trim`.
    idle_since: u64,
    /// Its highest block (0 while it has none: an expandable segment not mapped yet).
    last: Ix,
    /// Hands out no more blocks (its memory was exported through IPC): it goes back to the
    /// device once nothing in it is allocated, so a stale handle never reaches a new block.
    exported: bool,
}

/// The address range reserved for one expandable segment; past it, plain segments serve.
pub const EXPANDABLE_RANGE: u64 = 256 << 30;
/// Expandable segments are mapped in pages of this size.
pub const PAGE: u64 = 2 << 20;

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The device has no room, even after the cache was released.
    OutOfMemory,
    /// The request would take the device past `limit`.
    LimitReached,
}

/// A live allocation, as pointer queries need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    pub ptr: u64,
    pub size: u64,
    pub requested: u64,
    pub device: u8,
    pub stream: u64,
    pub segment: u64,
    pub segment_size: u64,
}

/// How a block is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeKind {
    /// `cudaFree`, `cuMemFree`: reusable only once all earlier work on the device is done.
    Sync,
    /// `cudaFreeAsync` on this stream: reusable at once on it, elsewhere once it caught up.
    OnStream(u64),
}

pub struct Engine<B: Backend> {
    backend: B,
    policy: Policy,
    /// Every block, by index (see [`Block`]); slot 0 is never a block. A block's neighbours
    /// are its links, a segment's blocks a walk from its base, an interior pointer's block a
    /// walk from a hint (`hints`). It never shrinks (a block's slot is left vacant and reused),
    /// so every index the engine ever made stays in bounds: indexing it cannot panic, and a
    /// vacant slot reads as a free block of no size at address 0.
    slab: Vec<Block<B::Fence>>,
    /// Slots of blocks merged away or given back, reused newest first (still warm).
    vacant: Vec<Ix>,
    /// Blocks by address: only for the pointer a call names (a free, a lookup).
    index: AddressMap<u64, Ix>,
    /// For interior-pointer lookups: per 64 KiB of address (`HINT_SHIFT`), the block start
    /// that covered its beginning when an earlier lookup walked there (checked before use:
    /// the block may have been merged away since).
    hints: core::cell::RefCell<AddressMap<u64, u64>>,
    /// Segments by base address: a hash lookup per request, and an ordered set of bases for
    /// the segment holding an interior pointer.
    segments: blocks::BlockMap<Segment>,
    /// Free blocks per pool, by size class (`bins`).
    free: bins::Pools,
    /// The next free block's stamp, counting down (see `insert_free`).
    stamps: u64,
    stats: Stats,
    /// Each device's figures, by device number (256 of them).
    per_device: Vec<DeviceStats>,
    /// Bytes of free blocks in the free lists, per device.
    idle_per_device: [u64; 256],
    /// Bytes of free blocks waiting out of the lists for their fences (`Block::pending`).
    pending_per_device: [u64; 256],
    /// When each device last needed fresh memory (a segment reserved or grown): `trim` gives
    /// nothing back while that was less than its age ago.
    reserved_at: [u64; 256],
    /// The expandable segment of each large pool, by its base.
    expandable: BTreeMap<PoolKey, u64>,
    /// Segments ever exported (IPC exports); 0 spares every free a lookup.
    exported_segments: u64,
    /// The backend's `progress` when `merge_if_passed` last merged.
    merged_at: u64,
    /// Free blocks kept apart from their neighbours while fenced, by slot and address: the
    /// pending ones (see `Block::pending`) and fenced remainders in expandable segments (see
    /// `coalesce`).
    kept_apart: Vec<(Ix, u64)>,
    /// Its length after the last pruning (see `keep_apart`).
    kept_apart_pruned: usize,
    /// Requests since the backend was last polled (see `take_cached`).
    unpolled: u32,
}

/// Whether a free block may be handed to a stream now.
enum Fit {
    Usable,
    Fenced,
}

/// At most this many fenced blocks are looked at per pool and request, so a backlog of frees
/// the GPU has not caught up with never makes a request slow.
const FENCED_SCAN: usize = 16;

impl<B: Backend> Engine<B> {
    pub fn new(backend: B, policy: Policy) -> Engine<B> {
        Engine {
            backend,
            policy,
            slab: vec![Block::free(0, 0, (0, 0), slab::NO_POOL)],
            vacant: Vec::new(),
            index: AddressMap::default(),
            hints: Default::default(),
            segments: blocks::BlockMap::new(),
            free: bins::Pools::default(),
            stamps: u64::MAX,
            stats: Stats::default(),
            per_device: vec![DeviceStats::default(); 256],
            idle_per_device: [0; 256],
            pending_per_device: [0; 256],
            reserved_at: [0; 256],
            expandable: BTreeMap::new(),
            exported_segments: 0,
            merged_at: 0,
            kept_apart: Vec::new(),
            kept_apart_pruned: 0,
            unpolled: 0,
        }
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// See [`Policy::release_on_free`].
    pub fn set_release_on_free(&mut self, on: bool) {
        self.policy.release_on_free = on;
    }

    /// Bytes reserved on one device.
    pub fn reserved(&self, device: u8) -> u64 {
        self.per_device[device as usize].reserved_bytes.current
    }

    /// One device's figures.
    pub fn device_stats(&self, device: u8) -> DeviceStats {
        self.per_device[device as usize]
    }

    /// One device's figures, to reset their peaks or totals.
    pub fn device_stats_mut(&mut self, device: u8) -> &mut DeviceStats {
        &mut self.per_device[device as usize]
    }

    /// Cached bytes on `device` that are free (fenced or not).
    pub fn idle(&self, device: u8) -> u64 {
        self.idle_per_device[device as usize] + self.pending_per_device[device as usize]
    }

    /// Stream `stream` is gone: its handle may come back for a new stream, which must not
    /// inherit the right to reuse its blocks at once. They keep their fences.
    pub fn retire_stream(&mut self, stream: u64) {
        for b in self.slab.iter_mut() {
            if let State::Free { owner, .. } = &mut b.state
                && *owner == Some(stream)
            {
                *owner = None;
            }
        }
    }

    /// Allocates `size` bytes on `device` for use on `stream`.
    pub fn alloc(&mut self, device: u8, size: u64, stream: u64) -> Result<BlockInfo, AllocError> {
        let small = size <= SMALL_REQUEST;
        let need = if small {
            size.max(1).div_ceil(GRANULE) * GRANULE
        } else {
            match round_size(size.min(MAX_REQUEST + 1), self.policy.round_divisions)
                .filter(|_| size <= MAX_REQUEST)
            {
                Some(n) => n,
                None => {
                    // No device has this much: CUDA's answer, without touching the cache.
                    return Err(self.refused(device, size, AllocError::OutOfMemory));
                }
            }
        };
        let key = PoolKey {
            device,
            small,
            stream,
        };
        // A cached block usable now, as the block handed out.
        let cached = |e: &mut Self| {
            let i = e.take_cached(key, need)?;
            e.stats.cache_hits += 1;
            Some(e.hand_out(i, need, size, stream))
        };
        if let Some(b) = cached(self) {
            return Ok(b);
        }
        // Nothing usable now. While the device has room, fresh memory: waiting for the GPU to
        // release a fenced block would stall the host for nothing (contract 6). Only when the
        // device (or `limit`) says no has the engine waited for the device (inside
        // `empty_cache`), and a block whose fence has passed since serves the request.
        // `need` is at most MAX_REQUEST here: rounding up cannot overflow.
        let own = if small {
            SMALL_SEGMENT
        } else {
            need.div_ceil(LARGE_SEGMENT_ROUND) * LARGE_SEGMENT_ROUND
        };
        let medium = self.policy.medium_segment;
        let limit = self.policy.limit;
        let segment = match own
            .max(medium.min(MAX_REQUEST).div_ceil(LARGE_SEGMENT_ROUND) * LARGE_SEGMENT_ROUND)
        {
            // A shared segment only where it fits under `limit`: near the limit, a segment of
            // the request's own size (nothing waits or is given back for the larger one).
            shared
                if !small
                    && medium > 0
                    && need <= MEDIUM_REQUEST
                    && (limit == 0 || self.reserved(device).saturating_add(shared) <= limit) =>
            {
                shared
            }
            _ => own,
        };
        if limit > 0
            && self.reserved(device).saturating_add(segment) > limit
            && !self.backend.quiet()
        {
            // At the limit: wait for the device once, so fenced blocks serve before anything
            // is given back and taken again.
            self.backend.synchronize(device);
            self.backend.note(Event::Synchronize { device });
            self.stats.synchronizations += 1;
            if let Some(b) = cached(self) {
                return Ok(b);
            }
        }
        match self.fresh(key, need, segment) {
            Ok(i) => Ok(self.hand_out(i, need, size, stream)),
            // A shared medium segment did not fit: a segment of the request's own size may.
            Err(_) if segment != own => match self.fresh(key, need, own) {
                Ok(i) => Ok(self.hand_out(i, need, size, stream)),
                Err(e) => cached(self).ok_or(e),
            },
            Err(e) => cached(self).ok_or(e),
        }
    }

    /// A block of at least `need` bytes from new device memory: the expandable segment grown,
    /// or a new segment of `segment` bytes.
    fn fresh(&mut self, key: PoolKey, need: u64, segment: u64) -> Result<Ix, AllocError> {
        if !key.small && self.policy.expandable && need <= EXPANDABLE_RANGE / 2 {
            match self.grow(key, need) {
                Ok(i) => return Ok(i),
                // The backend cannot reserve address ranges: plain segments.
                Err(None) => {}
                Err(Some(e)) => return Err(e),
            }
        }
        self.new_segment(key, segment)
    }

    /// Returns a block. `Err(())` when `ptr` is not a live block of ours (never allocated here,
    /// interior, or already freed): the caller passes it to the real function.
    #[allow(clippy::result_unit_err)]
    pub fn free(&mut self, ptr: u64, kind: FreeKind) -> Result<u64, ()> {
        self.free_on(ptr, kind).map(|(size, _)| size)
    }

    /// [`Engine::free`], also saying the block's device.
    #[allow(clippy::result_unit_err)]
    pub fn free_on(&mut self, ptr: u64, kind: FreeKind) -> Result<(u64, u8), ()> {
        let Some(i) = self.ix(ptr) else {
            return Err(());
        };
        let Engine { slab, backend, .. } = self;
        let b = &mut slab[i as usize];
        let State::Allocated { requested, .. } = b.state else {
            return Err(());
        };
        let (size, device, segment, seg) = (b.size, b.pool.device, b.segment, b.seg);
        let (fence, owner) = match kind {
            FreeKind::Sync => (backend.fence_device(device), None),
            FreeKind::OnStream(s) => (backend.fence_stream(device, s), Some(s)),
        };
        // A synchronous free whose fence has not passed waits out of the free lists: every
        // stream would find it fenced, and merged with free neighbours it would fence them.
        let pending = owner.is_none() && !backend.passed(&fence);
        b.state = State::Free {
            fence: Some(fence),
            owner,
        };
        b.pending = pending;
        let release_now = self.policy.release_on_free && kind == FreeKind::Sync;
        let mut exported_empty = false;
        let mut emptied = false;
        let mut expandable = false;
        if let Some(s) = self.segments.at_mut(seg) {
            s.allocated_blocks -= 1;
            expandable = s.range > 0;
            if s.allocated_blocks == 0 {
                emptied = true;
                exported_empty = s.exported || (release_now && s.range == 0);
            }
        }
        if emptied {
            // The clock is read only when a segment empties, not on every free.
            let now = self.backend.now();
            if let Some(s) = self.segments.at_mut(seg) {
                s.idle_since = now;
            }
        }
        self.stats.live_bytes -= size;
        self.stats.requested_bytes -= requested;
        self.stats.live_blocks -= 1;
        let d = &mut self.per_device[device as usize];
        d.allocated_bytes.sub(size);
        d.requested_bytes.sub(requested);
        d.allocations.sub(1);
        if pending {
            self.pending_per_device[device as usize] += size;
            self.keep_apart(i);
        } else {
            let merged = self.coalesce(i);
            self.insert_free(merged);
        }
        if exported_empty {
            self.release_segment(segment);
        } else if release_now && !self.backend.quiet() && expandable {
            // An expandable segment: its free pages go back as CUDA's free would, after the
            // device caught up (CUDA's own free waits for it too).
            self.backend.synchronize(device);
            self.stats.synchronizations += 1;
            self.shrink(segment, 0);
        }
        if self.idle(device) > self.policy.release {
            self.release_idle(device, self.policy.release);
        }
        Ok((size, device))
    }

    /// Marks the segment holding live block `ptr` (its memory was exported): it hands out no
    /// more blocks, and goes back to the device once nothing in it is allocated, so an IPC
    /// handle of a freed block can never open memory given to someone else. Its free blocks
    /// leave the pools now. Returns whether `ptr` is a live block.
    pub fn mark_exported(&mut self, ptr: u64) -> bool {
        let Some(info) = self.lookup(ptr) else {
            return false;
        };
        let Some(seg) = self.segments.get_mut(&info.segment) else {
            return false;
        };
        if seg.exported {
            return true;
        }
        seg.exported = true;
        self.exported_segments += 1;
        let free: Vec<Ix> = self
            .segment_blocks(info.segment)
            .into_iter()
            .filter(|&i| matches!(self.slab[i as usize].state, State::Free { .. }))
            .collect();
        for i in free {
            self.remove_free(i);
        }
        self.expandable.retain(|_, &mut base| base != info.segment);
        true
    }

    /// Whether the segment holding live block `ptr` is exported (see `mark_exported`). Free of
    /// any lookup until some segment was exported (the common case: no IPC).
    pub fn exported(&self, ptr: u64) -> bool {
        self.exported_segments > 0
            && self
                .lookup(ptr)
                .and_then(|b| self.segments.get(&b.segment))
                .is_some_and(|s| s.exported)
    }

    /// Whether `ptr` lies in a segment of the pool (allocated or not).
    pub fn in_segment(&self, ptr: u64) -> bool {
        self.segments
            .at_or_before(ptr)
            .is_some_and(|(base, s)| ptr < base + s.size)
    }

    fn hand_out(&mut self, i: Ix, need: u64, requested: u64, stream: u64) -> BlockInfo {
        let policy = self.policy;
        let b = &self.slab[i as usize];
        let (ptr, bsize, segment, seg, bpool, next) =
            (b.addr, b.size, b.segment, b.seg, b.pool, b.next);
        let remainder = bsize - need;
        // The segment's count and shape, in one visit.
        let s = self.segments.at_mut(seg).expect("its segment exists");
        s.allocated_blocks += 1;
        let (expandable, segment_size) = (s.range > 0, s.size);
        let split = if bpool.small || expandable {
            // An expandable segment's rest stays at hand: the next growth merges into it.
            remainder >= GRANULE
        } else {
            remainder > SMALL_REQUEST && bsize <= policy.max_split
        };
        let size = if split { need } else { bsize };
        if split {
            self.stats.splits += 1;
            self.backend.note(Event::Split {
                device: bpool.device,
                ptr: ptr + need,
                size: remainder,
            });
            // The rest keeps the block's fence: a block reusable here only because its owner
            // stream asked must not become reusable by every stream by being split.
            let mut rest = Block::free(ptr + need, remainder, (segment, seg), bpool);
            rest.state = self.slab[i as usize].state.clone();
            rest.prev = i;
            rest.next = next;
            let fenced = matches!(rest.state, State::Free { fence: Some(_), .. });
            let r = self.add_block(rest);
            self.slab[i as usize].next = r;
            self.link_below(next, r, seg);
            self.insert_free(r);
            if fenced && expandable {
                // Merged with its neighbours once the fence passes, as a freed block is.
                self.keep_apart(r);
            }
        }
        let pool = PoolKey { stream, ..bpool };
        let block = &mut self.slab[i as usize];
        block.size = size;
        block.pool = pool;
        block.state = State::Allocated { stream, requested };
        self.stats.live_bytes += size;
        self.stats.requested_bytes += requested;
        self.stats.live_blocks += 1;
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        let d = &mut self.per_device[pool.device as usize];
        d.allocated_bytes.add(size);
        d.requested_bytes.add(requested);
        d.allocations.add(1);
        BlockInfo {
            ptr,
            size,
            requested,
            device: pool.device,
            stream,
            segment,
            segment_size,
        }
    }
}

#[cfg(test)]
mod tests;
