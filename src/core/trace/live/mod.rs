//! The one replay of what is live that every report shares: allocations by address, VMM
//! physical memory, the pool's segments, pinned host memory, peaks per device. The shim's
//! summarizer (`trace::summary`) runs the same replay over the ring, and a checkpoint's
//! `Restore` records put its state back (`Replay::restore`).
//!
//! Here: what is live and the queries on it; `apply.rs` a record applied (what a checkpoint's
//! records put back: `trace::checkpoint::restore`), `walk.rs` a trace replayed from its start.

mod apply;
mod copy;
mod index;
mod set;
mod snapshot;
mod walk;

pub use set::LiveSet;
pub use snapshot::{Holding, Snapshot};

pub use walk::{in_range, replay_each, replay_until, replay_until_seeing};

use crate::fasthash::FastMap;
use crate::trace::facts::DeviceFacts;
pub use crate::trace::facts::NvmlFigure;
use crate::trace::format::{Api, DEVICE_UNKNOWN, Record, RecordKind};
pub use crate::trace::ranges::OpenRanges;
use crate::trace::ranges::Ranges;
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use crate::trace::tensors::Tensors;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A live allocation as the replay knows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub size: u64,
    pub device: u8,
    /// Stack id (0: none recorded).
    pub stack: u64,
    /// String id of the innermost NVTX push/pop range of the allocating thread, else of the
    /// latest start/end range open (0: none).
    pub range: u64,
    pub time_ns: u64,
    pub thread: u16,
    pub stream: u16,
    pub api: u8,
    /// The record kind that made it (so a checkpoint can write it again).
    pub kind: u8,
    /// Who called the shim for it (a `Caller` record: the first return address outside the
    /// shim, and the next one), 0 when not recorded.
    pub caller: [u64; 2],
}

/// The call-site key of an allocation: its stack id, or without a stack its API and size
/// (flagged in the top bit).
pub fn site_key(l: &Live) -> u64 {
    if l.stack != 0 {
        l.stack
    } else {
        size_key(l.api, l.size)
    }
}

/// Live bytes on one device.
#[derive(Clone, Copy, Default)]
pub(in crate::trace) struct DeviceLive {
    pub(in crate::trace) seen: bool,
    bytes: u64,
    pub(in crate::trace) peak: u64,
    pub(in crate::trace) peak_time_ns: u64,
}

/// The allocation that set the latest peak, and the peak before it.
#[derive(Clone, Copy, Debug)]
struct PeakBy {
    device: u8,
    key: u64,
    physical: bool,
    before: (u64, u64),
}

/// The allocation state of a trace at one moment, updated record by record.
#[derive(Clone, Default)]
pub struct Replay {
    /// By address, in slots (the hot path of every report: `set.rs`; [`Replay::live_in_order`]
    /// sorts).
    pub live: LiveSet,
    /// VMM physical allocations (`cuMemCreate`: NCCL's buffers, say) by handle: device memory
    /// held, though not at an address of its own.
    pub physical: FastMap<u64, Live>,
    /// Per device (by ordinal): live bytes, physical allocations included; the most live at
    /// once and the time it was first reached; whether the device was ever seen.
    pub(in crate::trace) devices: Vec<DeviceLive>,
    /// VMM physical bytes live per device (device memory the pool does not serve).
    pub physical_bytes: BTreeMap<u8, u64>,
    /// Pinned host memory (`cudaMallocHost`, `cudaHostAlloc`).
    pub pinned: Pinned,
    /// Frees of addresses (or releases of handles) this trace never saw allocated: made before
    /// tracing began, or by a route the trace missed.
    pub unmatched_frees: u64,
    /// The pool's segments and the framework's, by base.
    pub segments: BTreeMap<u64, Segment>,
    pub reserved: BTreeMap<u8, u64>,
    /// The framework's tensors: whether recorded, why not, their bytes per device.
    pub tensors: Tensors,
    /// The devices whose allocation calls the shim's pool serves (it reserved a segment there):
    /// their live memory lies inside its segments.
    pooled: BTreeSet<u8>,
    /// Per thread: what a record to come on it may still refer to.
    pub(in crate::trace) threads: Threads,
    /// Physical allocations that back the framework's expandable segments: reserved, not live.
    pub(in crate::trace) framework_physical: FastMap<u64, (u64, u8)>,
    /// What the device said of itself: NVML's figure, CUDA's pools, `cudaMemGetInfo`.
    pub facts: DeviceFacts,
    /// The program's allocation that set the latest peak (a raw `cudaMalloc` or VMM handle the
    /// framework's segment record may yet claim).
    peak_by: Option<PeakBy>,
    /// The NVTX ranges open, which name the allocations made in them.
    pub(in crate::trace) ranges: Ranges,
    /// The allocation the latest [`Change::Free`] took out of `live`.
    pub freed: Live,
    /// Records applied.
    pub index: u64,
    pub time_ns: u64,
    /// What a ring's checkpoint carried, and whether its records are being read.
    pub restored: Restored,
}

/// Pinned host allocations by address (`cudaMallocHost`, `cudaHostAlloc`): their sizes, the
/// bytes live and the most live at once.
#[derive(Clone, Default)]
pub struct Pinned {
    pub by_address: crate::fasthash::FastMap<u64, u64>,
    pub live: u64,
    pub peak: u64,
}

/// Per thread (by the trace's thread index), what a record still to come on that thread may
/// refer to.
#[derive(Clone, Default)]
pub(in crate::trace) struct Threads {
    /// VMM physical allocations made since its last framework record, which a framework
    /// segment mapped next claims as reserved memory.
    pub(in crate::trace) pending_physical: Vec<Vec<u64>>,
    /// Its latest device allocation (whether a VMM handle, and its key) until the `Caller`
    /// record that names who made it.
    pub(in crate::trace) awaiting_caller: Vec<Option<(bool, u64)>>,
    /// The address of its latest allocation while a stack reference may still follow it (0:
    /// none).
    pub(in crate::trace) last_alloc: Vec<u64>,
    /// A device allocation made through CUDA whose stack counted as its call site's own (made
    /// before the framework's tensors were known), then, once the framework's segment claims
    /// it, its stack (see [`Change::StackOfRaw`]).
    pub(in crate::trace) counted_raw: Vec<Option<CountedRaw>>,
}

/// What a ring's checkpoint carried (the summary of the records before the ring), and whether
/// the records being applied restore it.
#[derive(Clone, Default)]
pub struct Restored {
    /// Between a checkpoint's `BEGIN` and `END`: the records restore state, they are not calls.
    pub active: bool,
    /// The call site the restored allocations take (stack, range, caller).
    pub(in crate::trace) site: (u64, u64, [u64; 2]),
    /// Summaries the checkpoint carried: per API (calls, bytes, failures).
    pub api_totals: BTreeMap<u8, (u64, u64, u64)>,
    /// What was live at each moment the checkpoint kept (each device's peak, each failure).
    pub snapshots: Vec<Snapshot>,
    /// Iteration boundaries the checkpoint kept, in time order, and what marks them.
    pub boundaries: Vec<Boundary>,
    pub boundary_mark: Option<BoundaryMark>,
    /// Boundaries seen before the checkpoint (more than it kept, when it thinned them).
    pub boundary_count: u64,
    /// Live and reserved memory over the time before the ring, coarse: (time, device, live,
    /// reserved).
    pub series: Vec<(u64, u8, u64, u64)>,
    /// Frees of addresses never seen allocated that the checkpoint counted.
    pub unmatched_frees: u64,
}

/// A segment of the shim's pool or of the framework's allocator (PyTorch's cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub size: u64,
    pub device: u8,
    /// PyTorch's (its `SegmentReserve` records), not the pool's.
    pub framework: bool,
    /// Pages of an expandable segment mapped at this address (PyTorch's
    /// `expandable_segments:True`), not a segment of its own.
    pub pages: bool,
}

/// A device allocation through CUDA whose stack counted as a call site's allocation, before
/// the framework's tensors were known: made, or claimed by the framework's segment (its stack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::trace) enum CountedRaw {
    Made(u64),
    Claimed(u64),
}

/// What a record to come may still refer to on one thread (see [`Replay::thread_pending`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadPending {
    pub thread: u16,
    /// The allocation a `StackRef` would name (0: none).
    pub last_alloc: u64,
    /// The allocation a `Caller` would name, and whether it is a VMM handle.
    pub awaiting_caller: Option<(bool, u64)>,
    /// The VMM handles a framework segment would claim.
    pub pending_physical: Vec<u64>,
}

/// An iteration boundary a checkpoint kept: when, live bytes then, and by call-site key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Boundary {
    /// Which boundary of the run it was (1 the first the summarizer counted).
    pub ordinal: u64,
    pub time_ns: u64,
    pub total: u64,
    pub by_site: FastMap<u64, u64>,
}

/// What marks the boundaries a checkpoint kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundaryMark {
    /// An NVTX range or mark, by string id.
    Nvtx(u64),
    /// Each allocation from one call site (a detected period), by call-site key.
    Site(u64),
}

impl BoundaryMark {
    /// Whether record `r` (whose replay made change `c`) is one of these boundaries; a call
    /// site by stack comes with the `StackRef` after its allocation (not one naming a segment
    /// the framework takes for its tensor, which would count the tensor's call twice).
    pub fn is_boundary(self, r: &Record, c: Change) -> bool {
        match self {
            BoundaryMark::Nvtx(id) => {
                matches!(
                    r.kind,
                    RecordKind::RangePush | RecordKind::RangeStart | RecordKind::Mark
                ) && r.ptr == id
            }
            BoundaryMark::Site(key) if size_key_parts(key).is_some() => {
                matches!(c, Change::Alloc { .. }) && size_key(r.api as u8, r.size) == key
            }
            BoundaryMark::Site(key) => {
                r.kind == RecordKind::StackRef && r.ptr == key && c != Change::StackOfRaw
            }
        }
    }
}

/// The call-site key of an allocation without a stack: its API and size.
pub fn size_key(api: u8, size: u64) -> u64 {
    (1 << 63) | (u64::from(api) << 48) | (size & ((1 << 48) - 1))
}

/// The API and size a [`size_key`] holds; `None` for a stack id.
pub fn size_key_parts(key: u64) -> Option<(u8, u64)> {
    (key >> 63 == 1).then_some(((key >> 48) as u8 & 0x7f, key & ((1 << 48) - 1)))
}

/// What a record changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Alloc {
        ptr: u64,
        device: u8,
    },
    /// A VMM physical allocation on `device` was created or released.
    Physical {
        device: u8,
    },
    /// The allocation at `ptr` was freed (or claimed by the framework's segment): what it was
    /// is [`Replay::freed`] until the next record applied. (Carried by value, the 56 bytes were
    /// copied through the stack at every free and every tracker's call, piecewise, and reading
    /// them back whole stalled the replay on store forwarding.)
    Free {
        ptr: u64,
    },
    /// A stack named a device allocation made through CUDA itself while the framework records
    /// its tensors: most likely a segment the framework takes for the tensor whose own stack
    /// (the same) follows, so it marks no call site's allocation of its own. Also the stack of
    /// a tensor whose segment was taken before the framework's tensors were known (the
    /// program's first allocation, whose segment precedes the record that says the framework
    /// records tensors): that segment's stack, the same, already counted the call.
    StackOfRaw,
    Other,
}

impl Replay {
    /// What an allocation record makes live (an unknown device counts as device 0).
    fn live_of(&self, r: &Record) -> Live {
        if self.restored.active {
            let (stack, range, caller) = self.restored.site;
            return Live {
                size: r.size,
                device: device_or_0(r.device),
                stack,
                range,
                time_ns: r.time_ns,
                thread: r.thread,
                stream: r.stream,
                api: r.api as u8,
                kind: r.kind as u8,
                caller,
            };
        }
        Live {
            size: r.size,
            device: if r.device == DEVICE_UNKNOWN {
                0
            } else {
                r.device
            },
            stack: 0,
            range: self.ranges.naming(r.thread).unwrap_or(0),
            time_ns: r.time_ns,
            thread: r.thread,
            stream: r.stream,
            api: r.api as u8,
            kind: r.kind as u8,
            caller: [0; 2],
        }
    }

    /// The allocation of `thread` a `StackRef` to come would name (0: none).
    pub fn last_alloc_of(&self, thread: u16) -> u64 {
        self.threads
            .last_alloc
            .get(thread as usize)
            .copied()
            .unwrap_or(0)
    }

    /// The live allocations sorted by address (for walking the blocks of a segment in order).
    pub fn live_in_order(&self) -> Vec<(u64, &Live)> {
        let mut v: Vec<(u64, &Live)> = self.live.iter().map(|(&p, l)| (p, l)).collect();
        v.sort_unstable_by_key(|&(p, _)| p);
        v
    }

    /// Everything live: allocations (in no particular order), then physical allocations.
    pub fn all_live(&self) -> impl Iterator<Item = &Live> {
        self.live.values().chain(self.physical.values())
    }

    /// Counts `size` bytes more live on `device` at time `t` (and the peak).
    /// Adds `size` live bytes on `device` at `t`; the peak and its time before, when this set a
    /// new peak.
    fn add_bytes(&mut self, device: u8, size: u64, t: u64) -> Option<(u64, u64)> {
        if self.devices.len() <= device as usize {
            self.devices
                .resize(device as usize + 1, DeviceLive::default());
        }
        let d = &mut self.devices[device as usize];
        d.seen = true;
        d.bytes = d.bytes.saturating_add(size);
        if d.bytes > d.peak {
            let before = (d.peak, d.peak_time_ns);
            d.peak = d.bytes;
            d.peak_time_ns = t;
            return Some(before);
        }
        None
    }

    /// A new peak was set by the program's allocation `key` (a VMM handle when `physical`):
    /// remembered, so that if the framework's segment record that follows says the allocation
    /// was its segment (reserved memory, never live), the peak goes back to what it was.
    fn note_peak_by(&mut self, before: Option<(u64, u64)>, device: u8, key: u64, physical: bool) {
        if let Some(mut before) = before {
            // Pages of one expandable segment come one after another: the peak before the
            // first of them is the one to go back to.
            if let Some(p) = self.peak_by
                && physical
                && p.physical
                && p.device == device
            {
                before = p.before;
            }
            self.peak_by = (!self.restored.active).then_some(PeakBy {
                device,
                key,
                physical,
                before,
            });
        }
    }

    /// The framework's segment claimed allocation `key`: a peak it alone set is undone.
    fn undo_peak_of(&mut self, key: u64, physical: bool) {
        if let Some(p) = self
            .peak_by
            .take_if(|p| p.key == key && p.physical == physical)
            && let Some(d) = self.devices.get_mut(p.device as usize)
        {
            (d.peak, d.peak_time_ns) = p.before;
        }
    }

    fn sub_bytes(&mut self, device: u8, size: u64) {
        if let Some(d) = self.devices.get_mut(device as usize) {
            d.bytes = d.bytes.saturating_sub(size);
        }
    }

    /// Per device that ever held memory, in order: (device, peak live bytes, time of the peak).
    pub fn peaks(&self) -> impl Iterator<Item = (u8, u64, u64)> + '_ {
        self.devices
            .iter()
            .enumerate()
            .filter(|(_, d)| d.seen)
            .map(|(i, d)| (i as u8, d.peak, d.peak_time_ns))
    }

    /// Live bytes by call-site key ([`site_key`]), every device together.
    pub fn live_by_site(&self) -> FastMap<u64, u64> {
        let mut by: FastMap<u64, u64> = FastMap::default();
        for l in self.all_live() {
            let v = by.entry(site_key(l)).or_default();
            *v = v.saturating_add(l.size);
        }
        by
    }

    /// Live bytes on every device together.
    pub fn total_live(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.bytes)
            .fold(0, u64::saturating_add)
    }

    fn add_physical(&mut self, device: u8, size: u64, add: bool) {
        let v = self.physical_bytes.entry(device).or_default();
        *v = if add {
            v.saturating_add(size)
        } else {
            v.saturating_sub(size)
        };
    }

    /// The open NVTX ranges: per thread, outermost first; and the start/end ranges open, as
    /// (string id, range id), oldest first.
    pub fn open_ranges(&self) -> OpenRanges {
        self.ranges.open()
    }

    /// Per thread, what a record to come may still refer to: the allocation a `StackRef`
    /// would name, the one a `Caller` would (and whether a VMM handle), the physical
    /// allocations a framework segment would claim.
    pub fn thread_pending(&self) -> Vec<ThreadPending> {
        let n = self
            .threads
            .last_alloc
            .len()
            .max(self.threads.awaiting_caller.len())
            .max(self.threads.pending_physical.len());
        (0..n)
            .map(|t| ThreadPending {
                thread: t as u16,
                last_alloc: self.threads.last_alloc.get(t).copied().unwrap_or(0),
                awaiting_caller: self.threads.awaiting_caller.get(t).copied().flatten(),
                pending_physical: self
                    .threads
                    .pending_physical
                    .get(t)
                    .cloned()
                    .unwrap_or_default(),
            })
            .filter(|p| {
                p.last_alloc != 0 || p.awaiting_caller.is_some() || !p.pending_physical.is_empty()
            })
            .collect()
    }

    /// The physical allocations that back the framework's segments: handle, size, device.
    pub fn framework_physical(&self) -> impl Iterator<Item = (u64, u64, u8)> + '_ {
        self.framework_physical
            .iter()
            .map(|(&h, &(size, d))| (h, size, d))
    }

    /// The pool's and the framework's segments, by base.
    pub fn segments(&self) -> impl Iterator<Item = (u64, Segment)> + '_ {
        self.segments.iter().map(|(&b, &s)| (b, s))
    }

    pub fn live_on(&self, device: u8) -> u64 {
        self.devices.get(device as usize).map_or(0, |d| d.bytes)
    }

    /// Reserved memory on a device: the pool's or the framework's segments, VMM physical memory
    /// (which no pool serves), and what the program's calls hold outside any pool (a library's
    /// workspace beside a framework's cache, a framework's segment until its record comes), so
    /// that what is live never exceeds what is reserved; or (pass-through) what is live.
    pub fn reserved_on(&self, device: u8) -> u64 {
        if self.segments.is_empty() && self.reserved.is_empty() {
            self.live_on(device)
        } else {
            // Kept as the physical allocations come and go: summing them here made every
            // change cost as many steps as handles were live (a trace could make it quadratic).
            let physical = self.physical_bytes.get(&device).copied().unwrap_or(0);
            let outside = if self.pooled.contains(&device) {
                0
            } else {
                self.live_on(device)
                    .saturating_sub(self.tensors.live_on(device))
            };
            self.reserved
                .get(&device)
                .copied()
                .unwrap_or(0)
                .saturating_add(physical)
                .saturating_add(outside)
        }
    }

    /// The largest free range inside the pool's segments of `device` (0 without a pool).
    pub fn largest_free_block(&self, device: u8) -> u64 {
        let sorted = self.live_in_order();
        let mut best = 0;
        for (
            &base,
            &Segment {
                size, device: d, ..
            },
        ) in &self.segments
        {
            if d != device {
                continue;
            }
            // A hostile trace may name a segment that runs past 2^64: saturate.
            let end = base.saturating_add(size);
            let mut at = base;
            for &(p, l) in in_range(&sorted, base, end) {
                best = best.max(p.saturating_sub(at));
                at = at.max(p.saturating_add(l.size));
            }
            best = best.max(end.saturating_sub(at));
        }
        best
    }
}

/// A record's device, an unknown one counted as device 0.
pub(in crate::trace) fn device_or_0(device: u8) -> u8 {
    if device == DEVICE_UNKNOWN { 0 } else { device }
}

/// The entry of `thread` in a per-thread table (or of a device, whose 8-bit number fits), made
/// on first use: a table is at most 65,536 entries long.
pub fn slot<T: Default>(table: &mut Vec<T>, thread: u16) -> &mut T {
    let i = thread as usize;
    if table.len() <= i {
        table.resize_with(i + 1, T::default);
    }
    &mut table[i]
}

/// Takes the latest allocation of `thread` awaiting its stack, if any.
fn take_last(table: &mut [u64], thread: u16) -> Option<u64> {
    match table.get_mut(thread as usize) {
        Some(p) if *p != 0 => Some(core::mem::take(p)),
        _ => None,
    }
}
