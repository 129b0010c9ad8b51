//! `CudaBackend`: what the engine needs from the device, over the real driver: segments from
//! `cuMemAlloc_v2` or mapped pages (`cuMemCreate`/`cuMemMap`), fences as events recorded at
//! checkpoints, and the pool's notes in the trace.

mod fences;

use fences::note_checkpoint;

use super::capture::{pool_quiet, relaxed_if_capturing, release_while_quiet};
use super::context::free_segments;
use super::context::{MAX_CONTEXTS, device_of, in_context};
use super::sealer::{Request, Sealer, make_events};
use super::splits::{self, SPLITS_PER_RECORD};
use super::streams::OTHER_STREAMS;
use crate::costs::{self, Cost};
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::trace;
use core::ffi::c_void;
use core::sync::atomic::Ordering;
use gpushim_core::engine::{Backend, Event, OutOfMemory};
use gpushim_core::trace::format::DEVICE_UNKNOWN;
use std::collections::VecDeque;

/// One checkpoint: events recorded after every fence it covers.
pub(super) struct Checkpoint {
    pub(super) id: u64,
    pub(super) events: Vec<usize>,
    /// Some event could not be made or recorded, or streams went untracked: only a
    /// synchronization of the whole context passes it.
    pub(super) broken: bool,
}

/// Fences of one context.
pub(super) struct SlotFences {
    /// Fences made now name this checkpoint.
    pub(super) next_id: u64,
    /// Whether any fence names `next_id`.
    pub(super) pending_used: bool,
    /// Every checkpoint up to this one has passed.
    pub(super) passed_id: u64,
    pub(super) sealed: VecDeque<Checkpoint>,
    pub(super) spare: Vec<usize>,
    /// Non-blocking streams of this context.
    pub(super) streams: Vec<u64>,
    pub(super) untracked: bool,
    /// When `poll` last made a checkpoint (CLOCK_MONOTONIC, ns).
    pub(super) sealed_at: u64,
    /// How long the last checkpoint took to make (ns).
    pub(super) seal_ns: u64,
    /// Checkpoints numbered below this one were made before the context was reset: their
    /// events are gone with it, and a late answer of the helper's naming one is dropped.
    pub(super) forgot_below: u64,
}

/// A checkpoint the engine could do without (see `poll`) is made at most once per this many
/// times the last one took to make, which keeps their cost near 1.5% of the host's time
/// however many streams the process made (with PyTorch's 64, a checkpoint took 57 µs on an
/// H100, most of it one `cuStreamQuery` per stream). One with the legacy stream's event
/// alone (no non-blocking stream) is made whenever asked: throttling it saved nothing and
/// cost memory (the demo's peak reserved 238 -> 272 MiB, blocks waiting for a checkpoint
/// not made). Spaced 256 apart (GPT-2 and ResNet-50 per-tensor on an H100), half as
/// many were made, but more because nothing fitted, 46% more segments were reserved and GPT-2's
/// device memory peaked 30% higher, for no host time saved. Spaced 8 and 1 apart (
/// `GPUSHIM_SEAL_SPACING`), three and five times as many were made on the helper: ResNet-50's
/// device memory fell 15% (5,437 -> 4,636 and 4,547 MiB) but its steps took 10% and 30% longer
/// (the helper's driver calls contend with the program's launches), GPT-2's memory moved by
/// no more than run-to-run noise.
const SEAL_SPACING: u64 = 64;

/// `GPUSHIM_SEAL_SPACING=N` (1 to 1024) replaces [`SEAL_SPACING`], for measuring
/// (`state::settings`).
fn seal_spacing() -> u64 {
    crate::state::settings()
        .seal_spacing
        .unwrap_or(SEAL_SPACING)
}

pub struct CudaBackend {
    pub(super) slots: Vec<SlotFences>,
    /// The code of the last failed `cuMemAlloc_v2` or `cuMemCreate`.
    pub(super) last_error: i32,
    /// The physical allocation behind each mapped page of the expandable segments.
    pub(super) pages: std::collections::BTreeMap<u64, u64>,
    /// Segments given back by the engine, freed once the pool's lock is released.
    pub(super) released: Vec<(u8, u64)>,
    /// How many times fences passed, in any context (the engine's `progress`).
    passes: u64,
    /// The helper thread that makes checkpoints ahead of need (started at the first).
    sealer: Option<Sealer>,
    sealer_failed: bool,
    /// The checkpoint (context, id) the helper is making (one at a time); `None` also once a
    /// wait for it ran out of patience.
    in_flight: Option<(u8, u64)>,
    /// Requests handed to the helper whose answers were not taken yet: a checkpoint given up
    /// for lateness still answers, and that answer must be taken (the helper blocks until it
    /// is) and not mistaken for a later request's.
    unanswered: u32,
}

/// `CUmemAllocationProp` (32 bytes): pinned device memory on one device.
#[repr(C)]
struct AllocationProp {
    type_: i32,
    requested_handle_types: i32,
    location_type: i32,
    location_id: i32,
    win32_metadata: *mut c_void,
    alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`: read-write access for one device.
#[repr(C)]
struct AccessDesc {
    location_type: i32,
    location_id: i32,
    flags: i32,
}

const PAGE: u64 = gpushim_core::engine::PAGE;

impl CudaBackend {
    pub(super) fn new() -> CudaBackend {
        CudaBackend {
            slots: (0..MAX_CONTEXTS)
                .map(|_| SlotFences {
                    next_id: 1,
                    pending_used: false,
                    passed_id: 0,
                    sealed: VecDeque::new(),
                    spare: Vec::new(),
                    streams: Vec::new(),
                    untracked: false,
                    sealed_at: 0,
                    seal_ns: 0,
                    forgot_below: 0,
                })
                .collect(),
            last_error: 0,
            pages: std::collections::BTreeMap::new(),
            released: Vec::new(),
            passes: 0,
            sealer: None,
            sealer_failed: false,
            in_flight: None,
            unanswered: 0,
        }
    }

    /// Unmaps and releases the pages of `[ptr, ptr + size)` that this backend mapped.
    fn unmap_pages(&mut self, ptr: u64, size: u64) {
        let unmap = real::function::<of::CuMemUnmap>();
        let release = real::function::<of::CuMemRelease>();
        let mut page = ptr;
        while page < ptr + size {
            if let Some(h) = self.pages.remove(&page) {
                // SAFETY: a page this backend mapped, and its physical allocation.
                unsafe {
                    if let Some(f) = unmap {
                        f(page, PAGE as usize);
                    }
                    if let Some(f) = release {
                        f(h);
                    }
                }
            }
            page += PAGE;
        }
    }

    /// Makes the pending checkpoint of `slot` on the calling thread (see
    /// [`super::sealer::make_events`]). Never called during a capture (the pool is quiet then),
    /// when the context's event would be refused and invalidate it.
    pub(super) fn seal(&mut self, slot: u8) {
        let t0 = costs::start();
        let s = &mut self.slots[slot as usize];
        let (events, broken) = make_events(slot, &s.streams, &mut s.spare, s.untracked);
        s.sealed.push_back(Checkpoint {
            id: s.next_id,
            events,
            broken,
        });
        note_checkpoint(slot, s.next_id, false);
        s.next_id += 1;
        s.pending_used = false;
        costs::end(Cost::Seal, t0);
    }
}

impl Backend for CudaBackend {
    type Fence = (u8, u64);

    fn reserve(&mut self, slot: u8, size: u64) -> Result<u64, OutOfMemory> {
        if !self.released.is_empty() {
            // Out of memory and retrying: what was given back must really be free first.
            let kept = free_segments(&core::mem::take(&mut self.released));
            self.released.extend(kept);
        }
        let Some(alloc) = real::function::<of::CuMemAllocV2>() else {
            self.last_error = crate::cuda::ffi::CU_ERROR_NOT_INITIALIZED;
            return Err(OutOfMemory);
        };
        let mut p = 0u64;
        let rc = costs::measure(Cost::Reserve, || {
            // SAFETY: a valid out-pointer, in the slot's context.
            relaxed_if_capturing(|| in_context(slot, || unsafe { alloc(&mut p, size as usize) }))
        });
        if rc == 0 {
            self.last_error = 0;
            Ok(p)
        } else {
            self.last_error = rc;
            Err(OutOfMemory)
        }
    }

    fn release(&mut self, slot: u8, ptr: u64, _size: u64) {
        self.released.push((slot, ptr));
    }

    fn quiet(&mut self) -> bool {
        pool_quiet()
    }

    fn release_while_quiet(&mut self) -> bool {
        // A capture, not a reset: the segments are freed in relaxed capture mode
        // (`free_segments`), which no capture refuses (docs/cuda-facts.md).
        release_while_quiet()
    }

    fn now(&mut self) -> u64 {
        gpushim_core::trace::recorder::clock_ns(libc::CLOCK_MONOTONIC)
    }

    fn fence_device(&mut self, slot: u8) -> (u8, u64) {
        let s = &mut self.slots[slot as usize];
        s.pending_used = true;
        (slot, s.next_id)
    }

    fn fence_stream(&mut self, slot: u8, _stream: u64) -> (u8, u64) {
        // The checkpoint covers every stream; the engine lets the freeing stream itself reuse
        // the block at once.
        self.fence_device(slot)
    }

    fn passed(&mut self, &(slot, id): &(u8, u64)) -> bool {
        // All work on the legacy stream: issue order protects the block (see OTHER_STREAMS).
        !OTHER_STREAMS.load(Ordering::Acquire) || id <= self.slots[slot as usize].passed_id
    }

    fn progress(&mut self) -> u64 {
        self.passes
    }

    /// Passes what completed; makes a new checkpoint only when none is outstanding (one made
    /// while an older one still runs could not pass before it: events on the same streams,
    /// recorded later). Unless the engine would otherwise take fresh memory (`wanted`), with
    /// the spacing of [`SEAL_SPACING`]: a checkpoint costs a query per tracked stream and an
    /// event per busy one, and a search that found a better block behind a fence, or that
    /// looks ahead, can do without it. When nothing fits, a checkpoint is cheaper than the
    /// `cuMemAlloc` (about 100 µs) it may save: in a program bound by the host, the GPU has
    /// caught up and the checkpoint passes at once.
    fn poll(&mut self, slot: u8, wanted: bool) -> bool {
        let before = self.slots[slot as usize].passed_id;
        if wanted {
            // Nothing fits: the checkpoint the helper is making serves, once made.
            self.take_answer(true);
        }
        self.query(slot);
        let s = &self.slots[slot as usize];
        if s.pending_used && s.sealed.is_empty() && self.in_flight.is_none() {
            let now = self.now();
            let s = &mut self.slots[slot as usize];
            let interval = if wanted || s.streams.is_empty() {
                0
            } else {
                s.seal_ns.saturating_mul(seal_spacing())
            };
            if s.sealed_at == 0 || now.saturating_sub(s.sealed_at) >= interval {
                s.sealed_at = now;
                // Ahead of need, on the helper thread; needed now, here.
                if wanted || !self.seal_ahead(slot) {
                    let t0 = costs::start();
                    self.seal(slot);
                    if wanted {
                        costs::end(Cost::SealWanted, t0);
                    }
                    let took = self.now().saturating_sub(now);
                    self.slots[slot as usize].seal_ns = took;
                    self.query(slot);
                }
            }
        }
        self.slots[slot as usize].passed_id > before
    }

    fn synchronize(&mut self, slot: u8) {
        // The checkpoint in flight is waited for like the others.
        self.take_answer(true);
        if self.slots[slot as usize].pending_used {
            self.seal(slot);
        }
        let s = &mut self.slots[slot as usize];
        let Some(last) = s.sealed.back().map(|cp| cp.id) else {
            return;
        };
        let broken = s.sealed.iter().any(|cp| cp.broken);
        let wait = real::function::<of::CuEventSynchronize>();
        let ctx_sync = real::function::<of::CuCtxSynchronize>();
        in_context(slot, || {
            if broken {
                if let Some(f) = ctx_sync {
                    // SAFETY: no arguments.
                    unsafe { f() };
                }
            } else if let Some(wait) = wait {
                for cp in &s.sealed {
                    for &ev in &cp.events {
                        // SAFETY: an event this backend recorded.
                        unsafe { wait(ev) };
                    }
                }
            }
        });
        self.passed_up_to(slot, last);
    }

    fn reserve_address(&mut self, slot: u8, size: u64) -> Result<u64, OutOfMemory> {
        let f = real::function::<of::CuMemAddressReserve>().ok_or(OutOfMemory)?;
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; no fixed address asked for.
        let rc = in_context(slot, || unsafe {
            f(&mut p, size as usize, PAGE as usize, 0, 0)
        });
        if rc == 0 { Ok(p) } else { Err(OutOfMemory) }
    }

    fn map(&mut self, slot: u8, ptr: u64, size: u64) -> Result<(), OutOfMemory> {
        let device = device_of(slot);
        let (Some(create), Some(map), Some(access), Some(release)) = (
            real::function::<of::CuMemCreate>(),
            real::function::<of::CuMemMap>(),
            real::function::<of::CuMemSetAccess>(),
            real::function::<of::CuMemRelease>(),
        ) else {
            return Err(OutOfMemory);
        };
        if device == DEVICE_UNKNOWN {
            return Err(OutOfMemory);
        }
        let prop = AllocationProp {
            type_: 1, // CU_MEM_ALLOCATION_TYPE_PINNED
            requested_handle_types: 0,
            location_type: 1, // CU_MEM_LOCATION_TYPE_DEVICE
            location_id: i32::from(device),
            win32_metadata: core::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        let desc = AccessDesc {
            location_type: 1,
            location_id: i32::from(device),
            flags: 3, // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        };
        let mut rc = 0;
        let mut done = 0u64;
        let t0 = costs::start();
        relaxed_if_capturing(|| {
            in_context(slot, || {
                while done < size {
                    let mut h = 0u64;
                    // SAFETY: valid out-pointer and property struct of the CUDA layout.
                    rc = unsafe { create(&mut h, PAGE as usize, (&raw const prop).cast(), 0) };
                    if rc != 0 {
                        break;
                    }
                    // SAFETY: a page of our reserved range, not mapped yet, and a fresh handle.
                    rc = unsafe { map(ptr + done, PAGE as usize, 0, h, 0) };
                    if rc != 0 {
                        // SAFETY: the handle just created, never mapped.
                        unsafe { release(h) };
                        break;
                    }
                    self.pages.insert(ptr + done, h);
                    done += PAGE;
                }
                if rc == 0 {
                    // SAFETY: the range just mapped; one access descriptor.
                    rc = unsafe { access(ptr, size as usize, (&raw const desc).cast(), 1) };
                }
            })
        });
        costs::end(Cost::Map, t0);
        if rc == 0 {
            self.last_error = 0;
            return Ok(());
        }
        self.last_error = rc;
        in_context(slot, || self.unmap_pages(ptr, done));
        Err(OutOfMemory)
    }

    fn unmap(&mut self, slot: u8, ptr: u64, size: u64) {
        in_context(slot, || self.unmap_pages(ptr, size));
    }

    fn note(&mut self, event: Event) {
        use trace::Event as E;
        let e = match event {
            Event::SegmentReserve { device, ptr, size } => {
                E::pool_segment_reserve(ptr, size, device_of(device))
            }
            Event::SegmentRelease { device, ptr, size } => {
                E::pool_segment_release(ptr, size, device_of(device))
            }
            Event::Split { device, .. } => match splits::take(device, SPLITS_PER_RECORD) {
                Some(n) => E::splits(n, device_of(device)),
                None => return,
            },
            Event::OomRetry { device, size } => E::oom_retry(size, device_of(device)),
            Event::OutOfMemory { device, size } => E::out_of_memory(size, device_of(device)),
            Event::LimitHit { device, size } => E::limit_hit(size, device_of(device)),
            Event::Synchronize { device } => E::pool_sync(device_of(device)),
        };
        trace::record(e);
    }
}
