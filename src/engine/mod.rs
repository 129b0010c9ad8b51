//! The caching allocator: plain Rust over a [`Backend`] (no CUDA in here).
//!
//! Device memory is reserved from the backend in segments and handed out in blocks. Requests
//! up to 1 MiB come from 2 MiB "small" segments split down to 512-byte granules; larger ones from
//! segments rounded up to 2 MiB, split only while the block is at most `max_split` and the rest
//! is more than 1 MiB. Free blocks live in pools, one per (device, stream, small or large), and
//! a request takes the smallest block that fits (best fit). Neighbouring free blocks of one
//! segment and pool coalesce.
//!
//! Safe reuse (contract 3 of docs/design.md): a block freed stream-ordered on stream S carries a
//! fence on S; it is reusable at once on S (stream order protects it) and on another stream
//! only once the fence passed. A block freed synchronously (`cudaFree`) carries a fence on the
//! whole device and is reusable on no stream before it passed: real `cudaFree` waits for the
//! device, and programs rely on it. When nothing else fits, the engine waits for the device
//! once (`synchronize`), which passes every fence, before reserving more memory.
//!
//! Out of memory: the engine returns idle cached segments to the device and tries once more
//! before failing. `limit` caps the memory reserved per device; `release` caps idle cached
//! memory (the excess goes back to the device at each free).

pub mod backend;
pub mod front;

use crate::config::Conf;
pub use backend::{Backend, Event, MemoryBackend, OutOfMemory};
use std::collections::{BTreeMap, BTreeSet};

/// The pool key of allocations that are not stream-ordered (`cudaMalloc`, `cuMemAlloc`): no
/// stream has it, so no stream may reuse a block freed into it before its fence passed.
pub const SYNC_KEY: u64 = u64::MAX;

/// The smallest block; every size is a multiple of it.
pub const GRANULE: u64 = 512;
/// Requests up to this size are "small" and come from small segments.
pub const SMALL_REQUEST: u64 = 1 << 20;
/// The size of a small segment.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Large segments are multiples of this.
pub const LARGE_SEGMENT_ROUND: u64 = 2 << 20;

/// The knobs of `GPUSHIM_CONF` that shape the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub round_divisions: u32,
    pub max_split: u64,
    pub release: u64,
    /// Per device, 0 for none.
    pub limit: u64,
    /// Large blocks come from one segment per device and stream that grows in place (mapped
    /// page by page behind a reserved address range) instead of new segments.
    pub expandable: bool,
    /// A synchronous free (`cudaFree`) that leaves a segment with nothing allocated gives it
    /// back at once, as CUDA would (`trim:0`).
    pub release_on_free: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Policy::from(&Conf::default())
    }
}

impl From<&Conf> for Policy {
    fn from(c: &Conf) -> Self {
        Policy {
            round_divisions: c.round_divisions,
            max_split: c.max_split,
            release: c.release,
            limit: c.limit,
            expandable: c.pool == crate::config::Pool::Expandable,
            release_on_free: c.trim_ns == 0 && !c.trim_auto,
        }
    }
}

/// The largest request the engine serves (64 PiB, far past any device). Larger ones fail as
/// out of memory, as CUDA answers them, before any rounding could wrap around 2^64.
pub const MAX_REQUEST: u64 = 1 << 56;

/// The size a request is served with: a multiple of [`GRANULE`], and with `divisions` > 0
/// rounded up to one of `divisions` steps of its power-of-two interval (PyTorch's
/// `roundup_power2_divisions`), which makes sizes that vary a little share blocks. `None` when
/// the rounded size does not fit in 64 bits (every size above [`MAX_REQUEST`] is refused
/// before this is asked).
pub fn round_size(size: u64, divisions: u32) -> Option<u64> {
    let size = size.max(1);
    let base = size.checked_next_multiple_of(GRANULE)?;
    if divisions <= 1 || size <= GRANULE * u64::from(divisions) {
        return if divisions == 1 {
            base.checked_next_power_of_two()
        } else {
            Some(base)
        };
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = (floor / u64::from(divisions)).max(GRANULE);
    size.checked_next_multiple_of(step)
}

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

#[derive(Clone, Debug)]
struct Block<F> {
    size: u64,
    segment: u64,
    pool: PoolKey,
    state: State<F>,
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
    /// Hands out no more blocks (its memory was exported through IPC): it goes back to the
    /// device once nothing in it is allocated, so a stale handle never reaches a new block.
    sealed: bool,
}

/// The address range reserved for one expandable segment; past it, plain segments serve.
pub const EXPANDABLE_RANGE: u64 = 256 << 30;
/// Expandable segments are mapped in pages of this size.
pub const PAGE: u64 = 2 << 20;

/// What the engine counts. Bytes are block sizes (after rounding) unless named `requested`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub live_bytes: u64,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub live_blocks: u64,
    /// Segments obtained from the device (cudaMalloc-like calls) and given back.
    pub segment_reserves: u64,
    pub segment_releases: u64,
    /// Requests served from cached memory.
    pub cache_hits: u64,
    pub splits: u64,
    /// Waits for the device to make fenced blocks reusable.
    pub synchronizations: u64,
    /// Out-of-memory answers that a retry after releasing the cache turned into success.
    pub oom_retries: u64,
    pub ooms: u64,
    pub limit_hits: u64,
}

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
    blocks: BTreeMap<u64, Block<B::Fence>>,
    segments: BTreeMap<u64, Segment>,
    /// Free blocks per pool, by (size, address).
    free: BTreeMap<PoolKey, BTreeSet<(u64, u64)>>,
    stats: Stats,
    reserved_per_device: [u64; 256],
    idle_per_device: [u64; 256],
    /// The expandable segment of each large pool, by its base.
    expandable: BTreeMap<PoolKey, u64>,
    /// Segments ever sealed (IPC exports); 0 spares every free a lookup.
    sealed_segments: u64,
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
            blocks: BTreeMap::new(),
            segments: BTreeMap::new(),
            free: BTreeMap::new(),
            stats: Stats::default(),
            reserved_per_device: [0; 256],
            idle_per_device: [0; 256],
            expandable: BTreeMap::new(),
            sealed_segments: 0,
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
        self.reserved_per_device[device as usize]
    }

    /// Cached bytes on `device` that are free (fenced or not).
    pub fn idle(&self, device: u8) -> u64 {
        self.idle_per_device[device as usize]
    }

    /// Stream `stream` is gone: its handle may come back for a new stream, which must not
    /// inherit the right to reuse its blocks at once. They keep their fences.
    pub fn retire_stream(&mut self, stream: u64) {
        for b in self.blocks.values_mut() {
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
                    self.stats.ooms += 1;
                    self.backend.note(Event::OutOfMemory { device, size });
                    return Err(AllocError::OutOfMemory);
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
            let ptr = e.take_cached(key, need)?;
            e.stats.cache_hits += 1;
            Some(e.hand_out(ptr, need, size, stream))
        };
        if let Some(b) = cached(self) {
            return Ok(b);
        }
        // Nothing usable now. While the device has room, fresh memory: waiting for the GPU to
        // release a fenced block would stall the host for nothing (contract 6). Only when the
        // device (or `limit`) says no has the engine waited for the device (inside
        // `empty_cache`), and a block whose fence has passed since serves the request.
        let segment = if small {
            SMALL_SEGMENT
        } else {
            need.div_ceil(LARGE_SEGMENT_ROUND) * LARGE_SEGMENT_ROUND
        };
        let limit = self.policy.limit;
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
            Ok(ptr) => Ok(self.hand_out(ptr, need, size, stream)),
            Err(e) => cached(self).ok_or(e),
        }
    }

    /// A block of at least `need` bytes from new device memory: the expandable segment grown,
    /// or a new segment of `segment` bytes.
    fn fresh(&mut self, key: PoolKey, need: u64, segment: u64) -> Result<u64, AllocError> {
        if !key.small && self.policy.expandable && need <= EXPANDABLE_RANGE / 2 {
            match self.grow(key, need) {
                Ok(ptr) => return Ok(ptr),
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
        let (size, device, segment) = match self.blocks.get(&ptr) {
            Some(b) if matches!(b.state, State::Allocated { .. }) => {
                (b.size, b.pool.device, b.segment)
            }
            _ => return Err(()),
        };
        let requested = match self.blocks[&ptr].state {
            State::Allocated { requested, .. } => requested,
            State::Free { .. } => 0,
        };
        let (fence, owner) = match kind {
            FreeKind::Sync => (self.backend.fence_device(device), None),
            FreeKind::OnStream(s) => (self.backend.fence_stream(device, s), Some(s)),
        };
        if let Some(b) = self.blocks.get_mut(&ptr) {
            b.state = State::Free {
                fence: Some(fence),
                owner,
            };
        }
        let release_now = self.policy.release_on_free && kind == FreeKind::Sync;
        let mut sealed_empty = false;
        let mut emptied = false;
        if let Some(seg) = self.segments.get_mut(&segment) {
            seg.allocated_blocks -= 1;
            if seg.allocated_blocks == 0 {
                emptied = true;
                sealed_empty = seg.sealed || (release_now && seg.range == 0);
            }
        }
        if emptied {
            // The clock is read only when a segment empties, not on every free.
            let now = self.backend.now();
            if let Some(seg) = self.segments.get_mut(&segment) {
                seg.idle_since = now;
            }
        }
        self.stats.live_bytes -= size;
        self.stats.requested_bytes -= requested;
        self.stats.live_blocks -= 1;
        let merged = self.coalesce(ptr);
        self.insert_free(merged);
        if sealed_empty {
            self.release_segment(segment);
        } else if release_now
            && !self.backend.quiet()
            && self.segments.get(&segment).is_some_and(|s| s.range > 0)
        {
            // An expandable segment: its free pages go back as CUDA's free would, after the
            // device caught up (CUDA's own free waits for it too).
            self.backend.synchronize(device);
            self.stats.synchronizations += 1;
            self.shrink(segment, 0);
        }
        if self.idle(device) > self.policy.release {
            self.release_idle(device, self.policy.release);
        }
        Ok(size)
    }

    /// Seals the segment holding live block `ptr` (its memory was exported): it hands out no
    /// more blocks, and goes back to the device once nothing in it is allocated, so an IPC
    /// handle of a freed block can never open memory given to someone else. Its free blocks
    /// leave the pools now. Returns whether `ptr` is a live block.
    pub fn seal_segment(&mut self, ptr: u64) -> bool {
        let Some(info) = self.lookup(ptr) else {
            return false;
        };
        let Some(seg) = self.segments.get_mut(&info.segment) else {
            return false;
        };
        if seg.sealed {
            return true;
        }
        seg.sealed = true;
        self.sealed_segments += 1;
        let end = info.segment + seg.size;
        let free: Vec<u64> = self
            .blocks
            .range(info.segment..end)
            .filter(|(_, b)| matches!(b.state, State::Free { .. }))
            .map(|(&p, _)| p)
            .collect();
        for p in free {
            self.remove_free(p);
        }
        self.expandable.retain(|_, &mut base| base != info.segment);
        true
    }

    /// Whether the segment holding live block `ptr` is sealed (see `seal_segment`). Free of any
    /// lookup until some segment was sealed (the common case: no IPC).
    pub fn sealed(&self, ptr: u64) -> bool {
        self.sealed_segments > 0
            && self
                .lookup(ptr)
                .and_then(|b| self.segments.get(&b.segment))
                .is_some_and(|s| s.sealed)
    }

    /// Gives a segment with nothing allocated back, whatever its fences (the device's own free
    /// waits for the device). Deferred while the backend is quiet.
    fn release_segment(&mut self, base: u64) {
        if self.backend.quiet() {
            return;
        }
        let Some(seg) = self.segments.get(&base).copied() else {
            return;
        };
        let blocks: Vec<u64> = self
            .blocks
            .range(base..base + seg.size.max(1))
            .map(|(&p, _)| p)
            .collect();
        for p in blocks {
            self.remove_free(p);
            self.blocks.remove(&p);
        }
        self.segments.remove(&base);
        if seg.range > 0 {
            if seg.size > 0 {
                self.backend.unmap(seg.device, base, seg.size);
            }
        } else {
            self.backend.release(seg.device, base, seg.size);
        }
        self.backend.note(Event::SegmentRelease {
            device: seg.device,
            ptr: base,
            size: seg.size,
        });
        self.stats.segment_releases += 1;
        self.stats.reserved_bytes -= seg.size;
        self.reserved_per_device[seg.device as usize] -= seg.size;
    }

    /// Gives back every segment of `device` with nothing allocated for at least `age` (the
    /// backend's clock) whose fences passed, and sealed segments left empty while the backend
    /// was quiet: memory a program returned to CUDA goes back to the device in bounded time
    /// (contract 8), without waiting for the GPU. Nothing while the backend is quiet.
    pub fn trim(&mut self, device: u8, age: u64) {
        if self.backend.quiet() {
            return;
        }
        self.backend.poll(device);
        let now = self.backend.now();
        let old: Vec<(u64, bool)> = self
            .segments
            .iter()
            .filter(|(_, s)| {
                s.device == device
                    && s.allocated_blocks == 0
                    && s.size > 0
                    && (s.sealed
                        || now.saturating_sub(s.idle_since) >= age
                        || (self.policy.release_on_free && s.range == 0))
            })
            .map(|(&p, s)| (p, s.sealed))
            .collect();
        for (base, sealed) in old {
            if sealed {
                self.release_segment(base);
                continue;
            }
            let seg = self.segments[&base];
            let blocks: Vec<u64> = self
                .blocks
                .range(base..base + seg.size)
                .map(|(&p, _)| p)
                .collect();
            if !blocks.iter().all(|&p| self.fence_clear(p)) {
                continue;
            }
            if seg.range > 0 {
                self.shrink(base, 0);
            } else {
                self.release_segment(base);
            }
        }
    }

    /// The live block that contains `ptr`, if any (pointer queries, IPC).
    pub fn lookup(&self, ptr: u64) -> Option<BlockInfo> {
        let (&base, b) = self.blocks.range(..=ptr).next_back()?;
        if ptr >= base + b.size {
            return None;
        }
        let State::Allocated { stream, requested } = b.state else {
            return None;
        };
        let seg = self.segments.get(&b.segment)?;
        Some(BlockInfo {
            ptr: base,
            size: b.size,
            requested,
            device: b.pool.device,
            stream,
            segment: b.segment,
            segment_size: seg.size,
        })
    }

    /// Whether `ptr` lies in a segment of the pool (allocated or not).
    pub fn in_segment(&self, ptr: u64) -> bool {
        self.segments
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, s)| ptr < base + s.size)
    }

    /// Waits for the device and returns every idle segment to it (`torch.cuda.empty_cache()`).
    /// Nothing while the backend is quiet (a stream capture is under way: no wait, no free).
    pub fn empty_cache(&mut self, device: u8) {
        if self.backend.quiet() {
            return;
        }
        self.backend.synchronize(device);
        self.stats.synchronizations += 1;
        self.release_idle(device, 0);
    }

    fn hand_out(&mut self, ptr: u64, need: u64, requested: u64, stream: u64) -> BlockInfo {
        let policy = self.policy;
        let b = self
            .blocks
            .get(&ptr)
            .expect("a block taken from a pool exists")
            .clone();
        let remainder = b.size - need;
        let expandable = self.segments.get(&b.segment).is_some_and(|s| s.range > 0);
        let split = if b.pool.small || expandable {
            // An expandable segment's rest stays at hand: the next growth merges into it.
            remainder >= GRANULE
        } else {
            remainder > SMALL_REQUEST && b.size <= policy.max_split
        };
        let size = if split { need } else { b.size };
        if split {
            self.stats.splits += 1;
            self.backend.note(Event::Split {
                device: b.pool.device,
                ptr: ptr + need,
                size: remainder,
            });
            // The rest keeps the block's fence: a block reusable here only because its owner
            // stream asked must not become reusable by every stream by being split.
            let rest = Block {
                size: remainder,
                segment: b.segment,
                pool: b.pool,
                state: b.state.clone(),
            };
            self.blocks.insert(ptr + need, rest);
            self.insert_free(ptr + need);
        }
        let pool = PoolKey { stream, ..b.pool };
        self.blocks.insert(
            ptr,
            Block {
                size,
                segment: b.segment,
                pool,
                state: State::Allocated { stream, requested },
            },
        );
        let seg = self
            .segments
            .get_mut(&b.segment)
            .expect("its segment exists");
        seg.allocated_blocks += 1;
        let segment_size = seg.size;
        self.stats.live_bytes += size;
        self.stats.requested_bytes += requested;
        self.stats.live_blocks += 1;
        self.stats.peak_live_bytes = self.stats.peak_live_bytes.max(self.stats.live_bytes);
        BlockInfo {
            ptr,
            size,
            requested,
            device: pool.device,
            stream,
            segment: b.segment,
            segment_size,
        }
    }

    /// Finds a cached block for `key` of at least `need` bytes and removes it from its pool.
    /// Never waits for the device: a better block behind a fence is polled for (no waiting),
    /// and otherwise left for later.
    fn take_cached(&mut self, key: PoolKey, need: u64) -> Option<u64> {
        let (mut best, fenced_fits) = self.search(key, need);
        // While the backend is quiet (a stream capture), fences cannot even be polled.
        if fenced_fits && !self.backend.quiet() && self.backend.poll(key.device) {
            best = self.search(key, need).0;
        }
        let (size, p, k) = best?;
        self.remove_free_entry(k, size, p);
        Some(p)
    }

    /// Best fit over the device's pools of this size class: the smallest free block of at
    /// least `need` bytes that `key.stream` may use now (its own stream-ordered frees at once,
    /// others once their fences passed). Also says whether a fenced block would fit better.
    /// Allocates nothing.
    fn search(&mut self, key: PoolKey, need: u64) -> (Option<(u64, u64, PoolKey)>, bool) {
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
        let mut best: Option<(u64, u64, PoolKey)> = None;
        let mut best_fenced = u64::MAX;
        for (k, set) in free.range(lo..=hi) {
            let mut fenced_seen = 0;
            for &(size, p) in set.range((need, 0)..) {
                if best.is_some_and(|(bs, _, _)| bs <= size) {
                    break;
                }
                match Self::fit(blocks, backend, p, key.stream) {
                    Fit::Usable => {
                        best = Some((size, p, *k));
                        break;
                    }
                    Fit::Fenced => {
                        best_fenced = best_fenced.min(size);
                        fenced_seen += 1;
                        if fenced_seen == FENCED_SCAN {
                            break;
                        }
                    }
                }
            }
        }
        let fenced_fits = best_fenced < best.map_or(u64::MAX, |(s, _, _)| s);
        (best, fenced_fits)
    }

    /// Whether free block `p` may be handed to `stream` now; clears fences that passed.
    fn fit(
        blocks: &mut BTreeMap<u64, Block<B::Fence>>,
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

    fn new_segment(&mut self, key: PoolKey, size: u64) -> Result<u64, AllocError> {
        let limit = self.policy.limit;
        let over = |e: &Self| e.reserved(key.device).saturating_add(size) > limit;
        if limit > 0 && over(self) {
            // Room may be made by giving idle cache back.
            self.empty_cache(key.device);
            if over(self) {
                self.stats.limit_hits += 1;
                self.backend.note(Event::LimitHit {
                    device: key.device,
                    size,
                });
                return Err(AllocError::LimitReached);
            }
        }
        let ptr = match self.backend.reserve(key.device, size) {
            Ok(p) => p,
            Err(OutOfMemory) => {
                // Free every idle cached segment and retry once.
                self.empty_cache(key.device);
                match self.backend.reserve(key.device, size) {
                    Ok(p) => {
                        self.stats.oom_retries += 1;
                        self.backend.note(Event::OomRetry {
                            device: key.device,
                            size,
                        });
                        p
                    }
                    Err(OutOfMemory) => {
                        self.stats.ooms += 1;
                        self.backend.note(Event::OutOfMemory {
                            device: key.device,
                            size,
                        });
                        return Err(AllocError::OutOfMemory);
                    }
                }
            }
        };
        self.backend.note(Event::SegmentReserve {
            device: key.device,
            ptr,
            size,
        });
        self.stats.segment_reserves += 1;
        self.stats.reserved_bytes += size;
        self.stats.peak_reserved_bytes = self
            .stats
            .peak_reserved_bytes
            .max(self.stats.reserved_bytes);
        self.reserved_per_device[key.device as usize] += size;
        self.segments.insert(
            ptr,
            Segment {
                size,
                device: key.device,
                allocated_blocks: 0,
                range: 0,
                idle_since: 0,
                sealed: false,
            },
        );
        self.blocks.insert(
            ptr,
            Block {
                size,
                segment: ptr,
                pool: key,
                state: State::Free {
                    fence: None,
                    owner: None,
                },
            },
        );
        Ok(ptr)
    }

    /// Grows the expandable segment of `key` until a free block at its end holds `need` bytes,
    /// and returns that block (taken out of its pool). `Err(None)`: the backend has no address
    /// ranges to offer.
    fn grow(&mut self, key: PoolKey, need: u64) -> Result<u64, Option<AllocError>> {
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
                        sealed: false,
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
            let tail = self
                .blocks
                .range(base..end)
                .next_back()
                .filter(|&(&p, b)| p + b.size == end && matches!(b.state, State::Free { .. }))
                .map(|(&p, b)| (p, b.size));
            let tail = tail.filter(|&(p, _)| {
                matches!(
                    Self::fit(&mut self.blocks, &mut self.backend, p, key.stream),
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
                self.stats.limit_hits += 1;
                self.backend.note(Event::LimitHit {
                    device: key.device,
                    size: add,
                });
                return Err(Some(AllocError::LimitReached));
            }
            if self.backend.map(key.device, end, add).is_err() {
                if attempt == 0 {
                    // Give the idle cache back (this may shrink this very segment) and retry.
                    self.empty_cache(key.device);
                    continue;
                }
                self.stats.ooms += 1;
                self.backend.note(Event::OutOfMemory {
                    device: key.device,
                    size: add,
                });
                return Err(Some(AllocError::OutOfMemory));
            }
            if attempt == 1 {
                self.stats.oom_retries += 1;
                self.backend.note(Event::OomRetry {
                    device: key.device,
                    size: add,
                });
            }
            self.backend.note(Event::SegmentReserve {
                device: key.device,
                ptr: end,
                size: add,
            });
            self.stats.segment_reserves += 1;
            self.stats.reserved_bytes += add;
            self.stats.peak_reserved_bytes = self
                .stats
                .peak_reserved_bytes
                .max(self.stats.reserved_bytes);
            self.reserved_per_device[key.device as usize] += add;
            if let Some(s) = self.segments.get_mut(&base) {
                s.size += add;
            }
            return Ok(match tail {
                Some((p, size)) => {
                    self.remove_free_entry(self.blocks[&p].pool, size, p);
                    if let Some(b) = self.blocks.get_mut(&p) {
                        b.size += add;
                    }
                    p
                }
                None => {
                    self.blocks.insert(
                        end,
                        Block {
                            size: add,
                            segment: base,
                            pool: key,
                            state: State::Free {
                                fence: None,
                                owner: None,
                            },
                        },
                    );
                    end
                }
            });
        }
        Err(Some(AllocError::OutOfMemory))
    }

    /// Unmaps the whole pages of a free block at the end of expandable segment `base`, once
    /// its fence passed, until at most `keep` idle bytes remain on the device.
    fn shrink(&mut self, base: u64, keep: u64) {
        let seg = self.segments[&base];
        let end = base + seg.size;
        if seg.allocated_blocks == 0 && seg.size > 0 && keep == 0 {
            // Nothing live in it: all of it goes back (its free blocks may sit in the pools of
            // several streams, which never coalesce).
            let blocks: Vec<u64> = self.blocks.range(base..end).map(|(&p, _)| p).collect();
            if blocks.iter().all(|&p| self.fence_clear(p)) {
                for p in blocks {
                    self.remove_free(p);
                    self.blocks.remove(&p);
                }
                self.backend.unmap(seg.device, base, seg.size);
                self.backend.note(Event::SegmentRelease {
                    device: seg.device,
                    ptr: base,
                    size: seg.size,
                });
                self.stats.segment_releases += 1;
                self.stats.reserved_bytes -= seg.size;
                self.reserved_per_device[seg.device as usize] -= seg.size;
                if let Some(s) = self.segments.get_mut(&base) {
                    s.size = 0;
                }
                return;
            }
        }
        let Some((&p, b)) = self.blocks.range(base..end).next_back() else {
            return;
        };
        if p + b.size != end || !matches!(b.state, State::Free { .. }) || !self.fence_clear(p) {
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
        self.remove_free(p);
        if new_end > p {
            if let Some(b) = self.blocks.get_mut(&p) {
                b.size = new_end - p;
            }
            self.insert_free(p);
        } else {
            self.blocks.remove(&p);
        }
        self.backend.unmap(seg.device, new_end, cut);
        self.backend.note(Event::SegmentRelease {
            device: seg.device,
            ptr: new_end,
            size: cut,
        });
        self.stats.segment_releases += 1;
        self.stats.reserved_bytes -= cut;
        self.reserved_per_device[seg.device as usize] -= cut;
        if let Some(s) = self.segments.get_mut(&base) {
            s.size -= cut;
        }
    }

    fn insert_free(&mut self, p: u64) {
        let b = &self.blocks[&p];
        if self.segments.get(&b.segment).is_some_and(|s| s.sealed) {
            // A sealed segment hands nothing out again.
            return;
        }
        if self.free.entry(b.pool).or_default().insert((b.size, p)) {
            self.idle_per_device[b.pool.device as usize] += b.size;
        }
    }

    fn remove_free(&mut self, p: u64) {
        let b = &self.blocks[&p];
        let (pool, size) = (b.pool, b.size);
        self.remove_free_entry(pool, size, p);
    }

    fn remove_free_entry(&mut self, pool: PoolKey, size: u64, p: u64) {
        if let Some(set) = self.free.get_mut(&pool)
            && set.remove(&(size, p))
        {
            self.idle_per_device[pool.device as usize] -= size;
        }
    }

    /// Merges the just-freed block at `p` with free neighbours of its segment and pool whose
    /// fences passed or are implied by its own (an older fence of the same owner: a later fence
    /// on a stream, or a later device-wide fence, covers everything an earlier one did). The
    /// merged block keeps the new block's fence. Returns its address (not yet in a pool).
    fn coalesce(&mut self, mut p: u64) -> u64 {
        let (segment, pool, owner) = {
            let b = &self.blocks[&p];
            let owner = match b.state {
                State::Free { owner, .. } => owner,
                State::Allocated { .. } => None,
            };
            (b.segment, b.pool, owner)
        };
        // The block before.
        if let Some((&q, prev)) = self.blocks.range(..p).next_back()
            && prev.segment == segment
            && prev.pool == pool
            && q + prev.size == p
            && matches!(prev.state, State::Free { .. })
            && self.mergeable(q, owner)
        {
            self.remove_free(q);
            let b = self.blocks.remove(&p).expect("the freed block");
            if let Some(prev) = self.blocks.get_mut(&q) {
                prev.size += b.size;
                prev.state = b.state;
            }
            p = q;
        }
        // The block after.
        let end = p + self.blocks[&p].size;
        if let Some(next) = self.blocks.get(&end)
            && next.segment == segment
            && next.pool == pool
            && matches!(next.state, State::Free { .. })
            && self.mergeable(end, owner)
        {
            self.remove_free(end);
            let n = self.blocks.remove(&end).expect("the next block");
            if let Some(b) = self.blocks.get_mut(&p) {
                b.size += n.size;
            }
        }
        p
    }

    /// Whether free block `p` may merge into a block freed by `owner` (see `coalesce`).
    fn mergeable(&mut self, p: u64, owner: Option<u64>) -> bool {
        let same_owner = matches!(
            self.blocks.get(&p),
            Some(Block { state: State::Free { fence: Some(_), owner: o }, .. }) if *o == owner
        );
        same_owner || self.fence_clear(p)
    }

    /// Whether a free block has no fence left (clearing one that passed).
    fn fence_clear(&mut self, p: u64) -> bool {
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

    /// Gives idle segments of `device` back until at most `keep` idle bytes remain, largest
    /// first. A segment is idle when none of its blocks is allocated and every fence passed.
    fn release_idle(&mut self, device: u8, keep: u64) {
        if self.backend.quiet() {
            return;
        }
        let growing: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, s)| s.device == device && s.range > 0 && !s.sealed)
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
            .iter()
            .filter(|(_, s)| {
                s.device == device && s.allocated_blocks == 0 && s.range == 0 && !s.sealed
            })
            .map(|(&p, s)| (s.size, p))
            .collect();
        idle.sort_unstable_by(|a, b| b.cmp(a));
        for (size, seg) in idle {
            if self.idle(device) <= keep {
                break;
            }
            let blocks: Vec<u64> = self
                .blocks
                .range(seg..seg + size)
                .map(|(&p, _)| p)
                .collect();
            if !blocks.iter().all(|&p| self.fence_clear(p)) {
                continue;
            }
            for p in blocks {
                self.remove_free(p);
                self.blocks.remove(&p);
            }
            self.segments.remove(&seg);
            self.backend.release(device, seg, size);
            self.backend.note(Event::SegmentRelease {
                device,
                ptr: seg,
                size,
            });
            self.stats.segment_releases += 1;
            self.stats.reserved_bytes -= size;
            self.reserved_per_device[device as usize] -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(capacity: u64) -> Engine<MemoryBackend> {
        Engine::new(MemoryBackend::new(capacity), Policy::default())
    }

    #[test]
    fn sizes_round_to_granules_and_to_power_of_two_divisions() {
        assert_eq!(round_size(1, 0), Some(512));
        assert_eq!(round_size(1000, 0), Some(1024));
        assert_eq!(round_size(1 << 20, 0), Some(1 << 20));
        // 4 divisions of [1 GiB, 2 GiB): steps of 256 MiB.
        assert_eq!(round_size((1 << 30) + 1, 4), Some((1 << 30) + (256 << 20)));
        assert_eq!(round_size(1200 << 20, 4), Some(1280 << 20));
        assert_eq!(round_size(1200 << 20, 1), Some(2048 << 20));
        // Near 2^64 nothing wraps.
        assert_eq!(round_size(u64::MAX - 100, 0), None);
        assert_eq!(round_size((1 << 63) + 1, 1), None);
        assert_eq!(round_size(u64::MAX - (1 << 59), 4), None);
    }

    #[test]
    fn sizes_near_two_to_the_64_are_out_of_memory_and_never_a_cached_block() {
        for round in [0, 1, 4] {
            let mut e = Engine::new(
                MemoryBackend::new(1 << 40),
                Policy {
                    round_divisions: round,
                    ..Policy::default()
                },
            );
            // An 8 MiB block in the cache, which a wrapped size would fit.
            let a = e.alloc(0, 8 << 20, 0).unwrap();
            e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
            for size in [u64::MAX, u64::MAX - 511, (1 << 63) + 1, MAX_REQUEST + 1] {
                assert_eq!(
                    e.alloc(0, size, 0),
                    Err(AllocError::OutOfMemory),
                    "size {size:#x}, round {round}"
                );
            }
            assert_eq!(e.stats().live_blocks, 0);
            assert_eq!(e.idle(0), 8 << 20, "the cached block is still there");
        }
    }

    #[test]
    fn a_quiet_backend_is_neither_waited_for_nor_given_memory_back() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().quiet = true;
        // The only cached block is fenced: a fresh segment instead of a wait (the backend
        // panics on synchronize or release while quiet).
        let b = e.alloc(0, 8 << 20, 0).unwrap();
        assert_ne!(b.ptr, a.ptr);
        assert_eq!(e.stats().segment_reserves, 2);
        e.empty_cache(0);
        e.trim(0, 0);
        assert_eq!(e.backend().release_calls, 0);
        // Past the capture, the idle segment goes back.
        e.backend_mut().quiet = false;
        e.empty_cache(0);
        assert_eq!(e.backend().release_calls, 1);
        assert_eq!(e.reserved(0), 8 << 20);
    }

    #[test]
    fn trim_gives_back_segments_idle_for_the_age_asked_and_keeps_younger_ones() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        let b = e.alloc(0, 16 << 20, 0).unwrap();
        e.backend_mut().clock = 1_000;
        e.free(a.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().clock = 5_000;
        e.free(b.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().complete_all();
        e.backend_mut().clock = 6_000;
        e.trim(0, 3_000);
        assert_eq!(
            e.reserved(0),
            16 << 20,
            "only the segment idle since 1000 went back"
        );
        e.backend_mut().clock = 9_000;
        e.trim(0, 3_000);
        assert_eq!(e.reserved(0), 0);
        assert_eq!(e.backend().synchronize_calls, 0, "trimming never waits");
    }

    #[test]
    fn trim_leaves_segments_whose_fences_have_not_passed() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        e.backend_mut().clock = 10_000;
        e.trim(0, 0);
        assert_eq!(e.reserved(0), 8 << 20, "GPU work may still use it");
        e.backend_mut().complete_all();
        e.trim(0, 0);
        assert_eq!(e.reserved(0), 0);
    }

    #[test]
    fn with_release_on_free_a_cuda_free_that_empties_a_segment_gives_it_back_at_once() {
        let mut e = Engine::new(
            MemoryBackend::new(1 << 30),
            Policy {
                release_on_free: true,
                ..Policy::default()
            },
        );
        let a = e.alloc(0, 512 << 20, 0).unwrap();
        let b = e.alloc(0, 1000, 0).unwrap();
        let c = e.alloc(0, 1000, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        assert_eq!(e.reserved(0), 2 << 20, "the 512 MiB segment went back");
        e.free(b.ptr, FreeKind::Sync).unwrap();
        assert_eq!(e.reserved(0), 2 << 20, "c still lives in the small segment");
        e.free(c.ptr, FreeKind::OnStream(0)).unwrap();
        assert_eq!(
            e.reserved(0),
            2 << 20,
            "a stream-ordered free keeps it cached"
        );
        assert_eq!(e.backend().synchronize_calls, 0);
    }

    #[test]
    fn a_sealed_segment_hands_out_nothing_and_goes_back_once_empty() {
        let mut e = engine(1 << 30);
        // 32 MiB segment, then two 4 MiB blocks cut from it: the second is exported.
        let big = e.alloc(0, 32 << 20, 0).unwrap();
        e.free(big.ptr, FreeKind::OnStream(0)).unwrap();
        let x = e.alloc(0, 4 << 20, 0).unwrap();
        let y = e.alloc(0, 4 << 20, 0).unwrap();
        assert_eq!(y.segment, x.segment);
        assert!(e.seal_segment(y.ptr));
        e.free(y.ptr, FreeKind::OnStream(0)).unwrap();
        let z = e.alloc(0, 4 << 20, 0).unwrap();
        assert_ne!(z.segment, y.segment, "nothing more from the sealed segment");
        let releases = e.backend().release_calls;
        e.free(x.ptr, FreeKind::OnStream(0)).unwrap();
        assert_eq!(e.backend().release_calls, releases + 1, "empty: given back");
        assert!(e.lookup(y.ptr).is_none() && !e.in_segment(y.ptr));
    }

    #[test]
    fn a_block_freed_on_a_stream_is_reused_at_once_on_that_stream() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 4096, 7).unwrap();
        e.free(a.ptr, FreeKind::OnStream(7)).unwrap();
        let b = e.alloc(0, 4096, 7).unwrap();
        assert_eq!(b.ptr, a.ptr);
        assert_eq!(e.stats().segment_reserves, 1);
        assert_eq!(e.backend().synchronize_calls, 0);
    }

    #[test]
    fn a_block_freed_on_a_stream_is_not_given_to_another_stream_before_its_fence_passed() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 4096, 7).unwrap();
        // Keep the segment busy so the only free memory is a's block plus the rest.
        let _keep = e.alloc(0, SMALL_SEGMENT - 4096, 7).unwrap();
        e.free(a.ptr, FreeKind::OnStream(7)).unwrap();
        // Stream 8 may not take it before stream 7 caught up; the device has room, so it gets
        // fresh memory and nobody waits.
        let b = e.alloc(0, 4096, 8).unwrap();
        assert_ne!(b.ptr, a.ptr);
        assert_eq!(
            e.backend().synchronize_calls,
            0,
            "no wait while there is room"
        );
    }

    #[test]
    fn a_synchronously_freed_block_is_not_reused_before_the_device_caught_up() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        // Same stream, same size: not before the fence passed. With room: fresh memory.
        let b = e.alloc(0, 8 << 20, 0).unwrap();
        assert_ne!(b.ptr, a.ptr);
        assert_eq!(e.backend().synchronize_calls, 0);
        // Once the GPU caught up, the cached block serves, still without a wait.
        e.backend_mut().complete_all();
        let c = e.alloc(0, 8 << 20, 0).unwrap();
        assert_eq!(c.ptr, a.ptr);
        assert_eq!(e.backend().synchronize_calls, 0);
    }

    #[test]
    fn under_memory_pressure_the_engine_waits_once_and_reuses_the_fenced_block() {
        // Room for one 32 MiB segment, cut in two 16 MiB blocks; one is freed and its fence
        // has not passed; another 16 MiB must come from it.
        let mut e = engine(32 << 20);
        let big = e.alloc(0, 32 << 20, 0).unwrap();
        e.free(big.ptr, FreeKind::OnStream(0)).unwrap();
        let x = e.alloc(0, 16 << 20, 0).unwrap();
        let _y = e.alloc(0, 16 << 20, 0).unwrap();
        e.free(x.ptr, FreeKind::Sync).unwrap();
        let c = e.alloc(0, 16 << 20, 0).unwrap();
        assert_eq!(c.ptr, x.ptr, "the fenced block, once the device caught up");
        assert_eq!(
            e.backend().synchronize_calls,
            1,
            "one wait, under pressure only"
        );
        assert_eq!(e.reserved(0), 32 << 20);
        // An idle segment under pressure goes back and its memory comes again.
        let mut e = engine(16 << 20);
        let a = e.alloc(0, 8 << 20, 0).unwrap();
        let _b = e.alloc(0, 8 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        e.alloc(0, 8 << 20, 0).unwrap();
        assert_eq!(e.reserved(0), 16 << 20);
        assert_eq!(e.backend().synchronize_calls, 1);
    }

    #[test]
    fn large_blocks_split_and_coalesce_back_into_one() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 64 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
        let b = e.alloc(0, 16 << 20, 0).unwrap();
        let c = e.alloc(0, 16 << 20, 0).unwrap();
        assert_eq!(
            (b.ptr, c.ptr),
            (a.ptr, a.ptr + (16 << 20)),
            "split from the same segment"
        );
        assert_eq!(e.stats().segment_reserves, 1);
        e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
        e.free(c.ptr, FreeKind::OnStream(0)).unwrap();
        e.backend_mut().complete_all();
        let d = e.alloc(0, 64 << 20, 0).unwrap();
        assert_eq!(d.ptr, a.ptr, "coalesced back into the whole segment");
        assert_eq!(e.stats().segment_reserves, 1);
    }

    #[test]
    fn blocks_above_max_split_are_handed_out_whole() {
        let mut e = Engine::new(
            MemoryBackend::new(1 << 30),
            Policy {
                max_split: 32 << 20,
                ..Policy::default()
            },
        );
        let a = e.alloc(0, 64 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
        let b = e.alloc(0, 16 << 20, 0).unwrap();
        assert_eq!((b.ptr, b.size), (a.ptr, 64 << 20));
    }

    #[test]
    fn out_of_memory_releases_the_cache_and_retries_once() {
        let mut e = engine(100 << 20);
        let a = e.alloc(0, 60 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        // 60 MiB cached and idle; 80 MiB more does not fit beside it.
        let b = e.alloc(0, 80 << 20, 0).unwrap();
        assert_eq!(e.stats().oom_retries, 1);
        assert_eq!(e.stats().reserved_bytes, 80 << 20);
        assert!(e.alloc(0, 80 << 20, 0).is_err());
        assert_eq!(e.stats().ooms, 1);
        e.free(b.ptr, FreeKind::Sync).unwrap();
    }

    #[test]
    fn the_limit_caps_reserved_memory_per_device() {
        let mut e = Engine::new(
            MemoryBackend::new(1 << 40),
            Policy {
                limit: 100 << 20,
                ..Policy::default()
            },
        );
        let a = e.alloc(0, 60 << 20, 0).unwrap();
        assert_eq!(e.alloc(0, 60 << 20, 0), Err(AllocError::LimitReached));
        assert_eq!(e.stats().limit_hits, 1);
        // The other device has its own limit.
        e.alloc(1, 60 << 20, 0).unwrap();
        e.free(a.ptr, FreeKind::Sync).unwrap();
        e.alloc(0, 90 << 20, 0).unwrap();
    }

    #[test]
    fn idle_memory_above_the_release_threshold_goes_back_to_the_device() {
        let mut e = Engine::new(
            MemoryBackend::new(1 << 40),
            Policy {
                release: 32 << 20,
                ..Policy::default()
            },
        );
        let a = e.alloc(0, 64 << 20, 0).unwrap();
        let b = e.alloc(0, 16 << 20, 0).unwrap();
        e.backend_mut().complete_all();
        e.free(a.ptr, FreeKind::OnStream(0)).unwrap();
        e.backend_mut().complete_all();
        e.free(b.ptr, FreeKind::OnStream(0)).unwrap();
        assert!(e.idle(0) <= 32 << 20, "idle {} MiB", e.idle(0) >> 20);
        assert_eq!(e.stats().segment_releases, 1);
    }

    #[test]
    fn pointer_lookups_find_the_block_containing_an_address() {
        let mut e = engine(1 << 30);
        let a = e.alloc(0, 1000, 3).unwrap();
        let info = e.lookup(a.ptr + 999).unwrap();
        assert_eq!((info.ptr, info.requested, info.stream), (a.ptr, 1000, 3));
        assert_eq!(e.lookup(a.ptr + info.size), None);
        assert_eq!(
            e.free(a.ptr + 16, FreeKind::Sync),
            Err(()),
            "interior pointers are not ours"
        );
        e.free(a.ptr, FreeKind::Sync).unwrap();
        assert_eq!(
            e.free(a.ptr, FreeKind::Sync),
            Err(()),
            "double free is not ours either"
        );
    }
}
