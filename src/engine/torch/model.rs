//! One device of PyTorch's caching allocator, over memory: the same pools, rounding, best fit,
//! splits, merges, segment sizes, expandable segments and release order as
//! `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp), so that a recorded sequence
//! of tensor requests and frees, replayed here under a setting, takes the segments PyTorch
//! would take. docs/torch-allocator.md states each rule in words.
//!
//! Blocks are kept by address; a block's neighbours are the blocks just below and above it in
//! the same segment. Free blocks of each pool (small: requests up to 1 MiB; large: the rest)
//! sit in a set ordered as PyTorch orders them (stream, size, address), so the first entry at
//! or after `(stream, size)` is PyTorch's best fit. Unmapped address ranges of expandable
//! segments sit in a second set per pool, ordered by (stream, address).
//!
//! What the model cannot know it takes from its caller: when a freed tensor's memory came back
//! (PyTorch frees a block used on other streams only once their work passed; the trace says
//! when, so the caller calls [`Model::free_completed`] there), and the addresses CUDA handed
//! out (`place` takes a recorded address of the right size when the caller offers one, so a
//! replay of the recorded setting puts every block where PyTorch put it).

use super::conf::TorchConf;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

/// Every request is rounded up to a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// The largest request of the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// The small pool's segments (and its expandable segments' page).
pub const SMALL_BUFFER: u64 = 2 << 20;
/// A request above 1 MiB and below 10 MiB takes a segment of this size (and the large pool's
/// expandable segments map pages of this size).
pub const LARGE_BUFFER: u64 = 20 << 20;
/// Requests from this size on get a segment of their own size, rounded up to 2 MiB.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
pub const ROUND_LARGE: u64 = 2 << 20;

/// The size PyTorch serves a request of `size` bytes with.
pub fn round_size(conf: &TorchConf, size: u64) -> u64 {
    if size < MIN_BLOCK {
        return MIN_BLOCK;
    }
    let divisions = conf.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK.saturating_mul(divisions) {
        return next_division(size, divisions);
    }
    size.div_ceil(MIN_BLOCK).saturating_mul(MIN_BLOCK)
}

/// `size` rounded up to the next of `divisions` equal steps between the powers of two around
/// it (a power of two stays as it is).
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size { size } else { down + step }
}

/// The segment PyTorch asks CUDA for when no cached block serves a (rounded) request.
pub fn allocation_size(size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        size.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Handed out.
    Allocated,
    /// Freed by the program, still in use on another stream until the caller says it came back.
    Pending,
    /// Cached: mapped and in its pool's free set.
    Free,
    /// Address space of an expandable segment with no memory behind it.
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    stream: u64,
    /// Base of the segment it belongs to.
    seg: u64,
    small: bool,
    state: State,
    requested: u64,
    /// The pool's count of searches when the block entered the free set (for the collector).
    gc_base: u64,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    /// Bytes of address range (an expandable segment's whole reservation).
    size: u64,
    /// The page an expandable segment maps by; 0 for a plain segment.
    page: u64,
}

/// A device allocation or release the model made, in order: a segment from `cudaMalloc` and
/// its `cudaFree`, or pages of an expandable segment mapped and unmapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentEvent {
    Reserve { ptr: u64, size: u64 },
    Release { ptr: u64, size: u64 },
}

/// What the model counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of device memory held (PyTorch's `memory_reserved`).
    pub reserved: u64,
    /// Bytes of blocks handed out (PyTorch's `memory_allocated`: block sizes, not requests).
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// The most allocated while reserved stood at its peak.
    pub allocated_at_peak_reserved: u64,
    /// `cudaMalloc` calls (or page maps of expandable segments).
    pub device_allocs: u64,
    /// `cudaFree` calls (or page unmaps).
    pub device_frees: u64,
    /// Times every cached block went back to CUDA before a retry (PyTorch's `num_alloc_retries`).
    pub retries: u64,
    /// Requests that failed even after the cache went back.
    pub failures: u64,
}

/// A request the device could not serve: PyTorch raises `OutOfMemoryError` here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oom {
    pub requested: u64,
    pub rounded: u64,
    pub reserved: u64,
    pub allocated: u64,
}

/// Where the memory comes from: how much CUDA will give, and the program's memory fraction.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLimits {
    /// Bytes the allocator may hold before CUDA refuses (u64::MAX: no limit).
    pub capacity: u64,
    /// `torch.cuda.set_per_process_memory_fraction`, as bytes, if the program set one; the
    /// garbage collector runs only then (as in PyTorch).
    pub allowed: Option<u64>,
    /// The device's total memory: an expandable segment reserves 9/8 of it in address space.
    pub total_memory: u64,
}

/// An address the recorded run got from CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    pub ptr: u64,
    pub bytes: u64,
    /// An address range reserved (`cuMemAddressReserve`: an expandable segment's whole range)
    /// rather than memory (`cudaMalloc`, or pages mapped).
    pub reservation: bool,
}

/// Addresses for segments the recorded run never had start here, above any real address.
const SYNTHETIC_BASE: u64 = 1 << 52;

pub struct Model {
    conf: TorchConf,
    limits: DeviceLimits,
    blocks: BTreeMap<u64, Block>,
    /// Per pool (0 large, 1 small): free mapped blocks as (stream, size, address).
    free: [BTreeSet<(u64, u64, u64)>; 2],
    /// Per pool: unmapped ranges of expandable segments as (stream, address).
    unmapped: [BTreeSet<(u64, u64)>; 2],
    segments: BTreeMap<u64, Segment>,
    pending: BTreeSet<u64>,
    /// Per pool: searches of the free set (the collector's clock).
    searches: [u64; 2],
    stats: Stats,
    /// Recorded addresses the caller offers for the next segment.
    hints: Vec<Hint>,
    next_synthetic: u64,
    log: Option<Vec<SegmentEvent>>,
}

fn pool(small: bool) -> usize {
    usize::from(small)
}

impl Model {
    pub fn new(conf: TorchConf, limits: DeviceLimits) -> Model {
        Model {
            conf,
            limits,
            blocks: BTreeMap::new(),
            free: [BTreeSet::new(), BTreeSet::new()],
            unmapped: [BTreeSet::new(), BTreeSet::new()],
            segments: BTreeMap::new(),
            pending: BTreeSet::new(),
            searches: [0; 2],
            stats: Stats::default(),
            hints: Vec::new(),
            next_synthetic: SYNTHETIC_BASE,
            log: None,
        }
    }

    /// Runs `f` with no limit on what the device gives (a replay going on past a failure).
    pub fn unlimited<T>(&mut self, f: impl FnOnce(&mut Model) -> T) -> T {
        let keep = self.limits;
        self.limits.capacity = u64::MAX;
        self.limits.allowed = None;
        let out = f(self);
        self.limits = keep;
        out
    }

    /// Keep every segment event from here on (for comparing with a recorded run).
    pub fn keep_log(&mut self) {
        self.log = Some(Vec::new());
    }

    pub fn log(&self) -> &[SegmentEvent] {
        self.log.as_deref().unwrap_or(&[])
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn conf(&self) -> &TorchConf {
        &self.conf
    }

    /// Offers an address the recorded run got from CUDA for the next segment that fits it;
    /// [`Model::clear_hints`] drops those not taken.
    pub fn hint(&mut self, h: Hint) {
        self.hints.push(h);
    }

    pub fn clear_hints(&mut self) {
        self.hints.clear();
    }

    /// A tensor of `requested` bytes on `stream`: its address, or the failure PyTorch raises.
    pub fn malloc(&mut self, requested: u64, stream: u64) -> Result<u64, Oom> {
        let size = round_size(&self.conf, requested);
        let small = size <= SMALL_SIZE;
        let alloc_size = allocation_size(size);
        let mut found = self.get_free_block(size, stream, small);
        if found.is_none() {
            if self.limits.allowed.is_some() && self.conf.gc_threshold > 0.0 {
                self.garbage_collect();
            }
            found = self.alloc_block(size, alloc_size, stream, small);
            if found.is_none() && self.release_available(size, stream, small) {
                found = self.alloc_block(size, alloc_size, stream, small);
            }
            if found.is_none() {
                self.release_cached();
                self.stats.retries += 1;
                found = self.alloc_block(size, alloc_size, stream, small);
            }
        }
        let Some(ptr) = found else {
            self.stats.failures += 1;
            return Err(Oom {
                requested,
                rounded: size,
                reserved: self.stats.reserved,
                allocated: self.stats.allocated,
            });
        };
        let mut b = self.blocks[&ptr];
        if self.should_split(&b, size) {
            let rest = Block {
                size: b.size - size,
                state: State::Free,
                requested: 0,
                gc_base: 0,
                ..b
            };
            self.insert_free(ptr + size, rest);
            b.size = size;
        }
        b.state = State::Allocated;
        b.requested = requested;
        self.blocks.insert(ptr, b);
        self.stats.allocated += b.size;
        self.note_allocated();
        Ok(ptr)
    }

    /// The program let go of the tensor at `ptr`; its memory stays in use until
    /// [`Model::free_completed`]. False when no tensor is there.
    pub fn free_requested(&mut self, ptr: u64) -> bool {
        match self.blocks.get_mut(&ptr) {
            Some(b) if b.state == State::Allocated => {
                b.state = State::Pending;
                self.stats.allocated -= b.size;
                self.pending.insert(ptr);
                true
            }
            _ => false,
        }
    }

    /// Whether the tensor at `ptr` was let go and its memory is not back yet.
    pub fn is_pending(&self, ptr: u64) -> bool {
        self.pending.contains(&ptr)
    }

    /// The tensor's memory at `ptr` came back to the cache (requested too, if it was not).
    pub fn free_completed(&mut self, ptr: u64) -> bool {
        match self.blocks.get(&ptr).map(|b| b.state) {
            Some(State::Allocated) => {
                self.free_requested(ptr);
            }
            Some(State::Pending) => {}
            _ => return false,
        }
        self.free_block(ptr);
        true
    }

    /// `torch.cuda.empty_cache()`: pending frees complete, then every cached segment that is
    /// wholly free goes back (and every free page of an expandable segment).
    pub fn empty_cache(&mut self) {
        self.release_cached();
    }

    /// The address and size of the block a tensor at `ptr` holds, if one is allocated there.
    pub fn block_size(&self, ptr: u64) -> Option<u64> {
        self.blocks
            .get(&ptr)
            .filter(|b| b.state == State::Allocated)
            .map(|b| b.size)
    }

    // ---- the search -------------------------------------------------------------------

    fn expandable(&self, ptr: u64) -> bool {
        self.blocks
            .get(&ptr)
            .and_then(|b| self.segments.get(&b.seg))
            .is_some_and(|s| s.page > 0)
    }

    fn next_of(&self, ptr: u64) -> Option<(u64, Block)> {
        let b = self.blocks.get(&ptr)?;
        let n = ptr.checked_add(b.size)?;
        self.blocks
            .get(&n)
            .filter(|x| x.seg == b.seg)
            .map(|x| (n, *x))
    }

    fn prev_of(&self, ptr: u64) -> Option<(u64, Block)> {
        let b = self.blocks.get(&ptr)?;
        self.blocks
            .range(..ptr)
            .next_back()
            .filter(|(_, x)| x.seg == b.seg)
            .map(|(p, x)| (*p, *x))
    }

    /// For best fit among expandable blocks: the block with the unmapped range after it.
    fn expandable_size(&self, ptr: u64, size: u64) -> u64 {
        size + self
            .next_of(ptr)
            .filter(|(_, n)| n.state == State::Unmapped)
            .map_or(0, |(_, n)| n.size)
    }

    fn get_free_block(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
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

    fn should_split(&self, b: &Block, size: u64) -> bool {
        let remaining = b.size - size;
        if b.small || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    fn insert_free(&mut self, ptr: u64, mut b: Block) {
        b.state = State::Free;
        b.gc_base = self.searches[pool(b.small)];
        self.free[pool(b.small)].insert((b.stream, b.size, ptr));
        self.blocks.insert(ptr, b);
    }

    fn note_reserved(&mut self) {
        let s = &mut self.stats;
        if s.reserved > s.peak_reserved {
            s.peak_reserved = s.reserved;
            s.allocated_at_peak_reserved = s.allocated;
        }
    }

    fn note_allocated(&mut self) {
        let s = &mut self.stats;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        if s.reserved == s.peak_reserved {
            s.allocated_at_peak_reserved = s.allocated_at_peak_reserved.max(s.allocated);
        }
    }

    fn logged(&mut self, e: SegmentEvent) {
        if let Some(l) = self.log.as_mut() {
            l.push(e);
        }
    }

    // ---- segments ---------------------------------------------------------------------

    /// Whether [ptr, ptr + len) overlaps a segment the model holds.
    fn overlaps(&self, ptr: u64, len: u64) -> bool {
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
    fn place(&mut self, len: u64, page: u64) -> (u64, u64) {
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

    fn alloc_block(&mut self, size: u64, alloc_size: u64, stream: u64, small: bool) -> Option<u64> {
        if let Some(max) = self.limits.allowed
            && self.stats.reserved.saturating_add(alloc_size) > max
        {
            return None;
        }
        if self.conf.expandable_segments {
            return self.allocate_expandable(size, stream, small);
        }
        if self.stats.reserved.saturating_add(alloc_size) > self.limits.capacity {
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

    /// Free or unmapped room from `ptr` on, up to `size` bytes.
    fn room_from(&self, mut ptr: u64, size: u64) -> bool {
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
    /// `size` (a free block and the unmapped range after it count together), or a new segment.
    fn find_expandable(&mut self, size: u64, stream: u64, small: bool) -> u64 {
        let p = pool(small);
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
                return start;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let total = self.limits.total_memory;
        let reach = total
            .saturating_add(total / 8)
            .div_ceil(page)
            .saturating_mul(page);
        let (base, reach) = self.place(reach, page);
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
        base
    }

    fn allocate_expandable(&mut self, size: u64, stream: u64, small: bool) -> Option<u64> {
        let mut cand = self.find_expandable(size, stream, small);
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
    fn map_block(&mut self, ptr: u64, size: u64) -> Option<u64> {
        let b = self.blocks[&ptr];
        let page = self.segments[&b.seg].page;
        let begin = (ptr - b.seg) / page;
        let end = (ptr - b.seg + size).div_ceil(page);
        let mapped = (end - begin) * page;
        if self.stats.reserved.saturating_add(mapped) > self.limits.capacity {
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
    fn unmap_block(&mut self, ptr: u64) -> Option<u64> {
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

    fn whole_segment(&self, ptr: u64) -> bool {
        self.blocks.get(&ptr).is_some_and(|b| {
            b.seg == ptr && self.segments.get(&ptr).is_some_and(|s| s.size == b.size)
        })
    }

    /// `cudaFree` of a plain segment that is one free block.
    fn release_block(&mut self, ptr: u64) {
        let Some(b) = self.blocks.remove(&ptr) else {
            return;
        };
        self.free[pool(b.small)].remove(&(b.stream, b.size, ptr));
        self.segments.remove(&ptr);
        self.stats.reserved -= b.size;
        self.stats.device_frees += 1;
        self.logged(SegmentEvent::Release { ptr, size: b.size });
    }

    fn release_blocks(&mut self, p: usize) {
        let keys: Vec<(u64, u64, u64)> = self.free[p].iter().copied().collect();
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
    }

    /// Every pending free completes, then every wholly free cached segment goes back.
    fn release_cached(&mut self) {
        let pending: Vec<u64> = std::mem::take(&mut self.pending).into_iter().collect();
        for ptr in pending {
            self.free_block(ptr);
        }
        self.release_blocks(0);
        self.release_blocks(1);
    }

    /// With `max_split_size` set: the smallest oversize cached block that covers the request,
    /// or oversize blocks from the largest down until they add up to it, go back.
    fn release_available(&mut self, size: u64, stream: u64, small: bool) -> bool {
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
    fn garbage_collect(&mut self) {
        let Some(allowed) = self.limits.allowed else {
            return;
        };
        let threshold = (self.conf.gc_threshold * allowed as f64) as u64;
        if self.stats.reserved <= threshold {
            return;
        }
        let target = self.stats.reserved - threshold;
        let clock = self.searches[0];
        let age = |b: &Block| clock.saturating_sub(b.gc_base);
        let whole: Vec<u64> = self.free[0]
            .iter()
            .map(|k| k.2)
            .filter(|&p| self.prev_of(p).is_none() && self.next_of(p).is_none())
            .collect();
        let mut total_age: u64 = whole.iter().map(|p| age(&self.blocks[p])).sum();
        let mut count = whole.len() as u64;
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let mean = total_age as f64 / count as f64;
            freed = false;
            let keys: Vec<(u64, u64, u64)> = self.free[0].iter().copied().collect();
            for (_, size, ptr) in keys {
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
    }

    /// A block back in its pool, merged with free neighbours.
    fn free_block(&mut self, ptr: u64) {
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

    /// The model's own consistency: blocks tile each segment, the sets hold exactly the free
    /// and unmapped blocks, no two free (or unmapped) neighbours stayed apart, and the counts
    /// match. For tests.
    pub fn check(&self) -> Result<(), String> {
        let mut reserved = 0u64;
        let mut allocated = 0u64;
        for (&base, seg) in &self.segments {
            let mut at = base;
            let mut last: Option<State> = None;
            while at < base + seg.size {
                let b = self
                    .blocks
                    .get(&at)
                    .ok_or_else(|| format!("segment {base:#x}: no block at {at:#x}"))?;
                if b.seg != base {
                    return Err(format!("block {at:#x} names segment {:#x}", b.seg));
                }
                if last == Some(b.state) && matches!(b.state, State::Free | State::Unmapped) {
                    return Err(format!(
                        "block {at:#x}: two {:?} neighbours not merged",
                        b.state
                    ));
                }
                let p = pool(b.small);
                let in_free = self.free[p].contains(&(b.stream, b.size, at));
                let in_unmapped = self.unmapped[p].contains(&(b.stream, at));
                if in_free != (b.state == State::Free)
                    || in_unmapped != (b.state == State::Unmapped)
                {
                    return Err(format!("block {at:#x} ({:?}) misfiled", b.state));
                }
                if seg.page == 0 || b.state != State::Unmapped {
                    reserved += b.size;
                }
                if b.state == State::Allocated {
                    allocated += b.size;
                }
                last = Some(b.state);
                at += b.size;
            }
            if at != base + seg.size {
                return Err(format!("segment {base:#x}: blocks run past its end"));
            }
        }
        let filed: usize = self.free.iter().map(BTreeSet::len).sum::<usize>()
            + self.unmapped.iter().map(BTreeSet::len).sum::<usize>();
        let listed = self
            .blocks
            .values()
            .filter(|b| matches!(b.state, State::Free | State::Unmapped))
            .count();
        if filed != listed {
            return Err(format!(
                "{filed} blocks in the sets, {listed} free or unmapped"
            ));
        }
        if reserved != self.stats.reserved || allocated != self.stats.allocated {
            return Err(format!(
                "counted reserved {} allocated {}, blocks add up to {reserved} and {allocated}",
                self.stats.reserved, self.stats.allocated
            ));
        }
        Ok(())
    }
}
