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

mod blocks;
mod expandable;
mod release;
mod repeat;
mod seed;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
pub struct Refused {
    pub requested: u64,
    pub rounded: u64,
    pub reserved: u64,
    pub allocated: u64,
}

/// Where the memory comes from: how much CUDA will give, and the program's memory fraction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

#[derive(Clone)]
pub struct Model {
    conf: TorchConf,
    limits: DeviceLimits,
    blocks: BTreeMap<u64, Block>,
    /// Per pool (0 large, 1 small): free mapped blocks as (stream, size, address).
    free: [BTreeSet<(u64, u64, u64)>; 2],
    /// Per pool: the blocks put in `free` since a release found every block there that could
    /// go back. Only a block put in the free set can be one that goes back (a whole segment,
    /// or an expandable segment's whole pages): one left there by a release changes only by
    /// being taken out (joined to a neighbour freed, or allocated). So the next release looks
    /// at these alone: a run that fails allocation after allocation, as a what-if at a batch
    /// far past the device does, looked through every free block at each (200 s of `fit` on
    /// a 4 MiB ring of many small tensors).
    fresh: [blocks::FreedSince; 2],
    /// The collector's like: the whole segments of the large pool it left after its last look,
    /// and the blocks put in that pool's free set since. A block becomes a whole free segment
    /// only by being put in the free set, so these are every whole free segment the collector
    /// can find, where it looked through every free block at every search that missed.
    gc_whole: Vec<u64>,
    gc_fresh: blocks::FreedSince,
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
    /// Bytes PyTorch holds in its private pools (CUDA graphs' pools, `torch.cuda.MemPool`s),
    /// as the run held them: the default pools modelled here cannot use them, yet they count
    /// against the device and the memory fraction, as PyTorch counts them.
    outside: u64,
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
            fresh: Default::default(),
            gc_whole: Vec::new(),
            gc_fresh: Default::default(),
            unmapped: [BTreeSet::new(), BTreeSet::new()],
            segments: BTreeMap::new(),
            pending: BTreeSet::new(),
            searches: [0; 2],
            stats: Stats::default(),
            hints: Vec::new(),
            next_synthetic: SYNTHETIC_BASE,
            log: None,
            outside: 0,
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

    /// What PyTorch's private pools hold now (the run's figure: they are not modelled).
    pub fn set_outside(&mut self, bytes: u64) {
        self.outside = bytes;
    }

    /// Bytes held against the device and the fraction: the default pools' and the private.
    pub(super) fn held(&self) -> u64 {
        self.stats.reserved.saturating_add(self.outside)
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
    pub fn malloc(&mut self, requested: u64, stream: u64) -> Result<u64, Refused> {
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
            return Err(Refused {
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

    /// How many segments (plain, or expandable reservations) the model holds.
    #[cfg(test)]
    pub fn segment_count(&self) -> usize {
        self.segments.len()
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
