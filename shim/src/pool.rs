//! The caching allocator in the shim: the engine of `gpushim_core::engine` over real CUDA.
//!
//! Pools are kept per CUDA context (the runtime works in the device's primary context, a driver
//! program in whatever context it made current), so a block is only ever handed to code running
//! in the context that owns its memory. Segments come from the real `cuMemAlloc_v2` in that
//! context and go back with `cuMemFree_v2`.
//!
//! Safe reuse (contract 3) costs nothing on a free. A free takes a fence that names the next
//! *checkpoint* of its context; the checkpoint is only made when the engine wants a fenced block
//! back: events recorded on the legacy stream (which waits for all work on every blocking stream,
//! the per-thread default streams included) and on each non-blocking stream the process created
//! (tracked through the stream hooks). A checkpoint whose events completed lets every block
//! freed before it be reused. A program's own `cudaDeviceSynchronize`/`cuCtxSynchronize` passes
//! every fence made before it at no cost. When nothing else fits, the engine waits for the
//! newest checkpoint, never for work enqueued after it.
//!
//! One lock guards the engine. It is never held while calling into the CUDA runtime (only the
//! driver), so a runtime call holding the runtime's own lock that reaches our driver hooks can
//! never wait for a thread that waits for the runtime. In a forked child the pool is off.

use crate::ffi::{
    CU_EVENT_DISABLE_TIMING, CU_STREAM_NON_BLOCKING, ERROR_OUT_OF_MEMORY, STREAM_LEGACY,
    STREAM_PER_THREAD,
};
use crate::real;
use crate::state;
use crate::symbols::Sym;
use crate::trace;
use core::cell::{Cell, UnsafeCell};
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use gpushim_core::config::Pool as PoolMode;
use gpushim_core::engine::front::Front;
use gpushim_core::engine::{AllocError, Backend, BlockInfo, Event, FreeKind, OutOfMemory, Policy};
use gpushim_core::format::{Api, DEVICE_UNKNOWN, RecordKind};
use std::collections::VecDeque;

/// Contexts the pool serves; allocations in further contexts pass through.
pub const MAX_CONTEXTS: usize = 64;
/// Non-blocking streams tracked per context; past this, fences wait for the whole context.
const MAX_STREAMS: usize = 4096;
pub use gpushim_core::engine::SYNC_KEY;

static CONTEXTS: [AtomicUsize; MAX_CONTEXTS] = [const { AtomicUsize::new(0) }; MAX_CONTEXTS];
static DEVICES: [AtomicU8; MAX_CONTEXTS] = [const { AtomicU8::new(DEVICE_UNKNOWN) }; MAX_CONTEXTS];
static REGISTERING: SpinLock = SpinLock::new();

/// A lock that spins briefly, then yields. Never held across a call into the CUDA runtime.
pub(crate) struct SpinLock(AtomicBool);

impl SpinLock {
    pub(crate) const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    pub(crate) fn lock(&self) {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.0.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
        }
    }

    pub(crate) fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The current context of the calling thread, if any.
pub fn current_context() -> Option<usize> {
    type F = unsafe extern "C" fn(*mut usize) -> i32;
    // SAFETY: cuCtxGetCurrent has the ABI F: `CUresult f(CUcontext *)`.
    let f = unsafe { real::as_fn::<F>(real::exported(Sym::CuCtxGetCurrent)) }?;
    let mut c = 0usize;
    // SAFETY: `c` is a valid out-pointer.
    if unsafe { f(&mut c) } == 0 && c != 0 {
        Some(c)
    } else {
        None
    }
}

/// The pool slot of the calling thread's current context, registering it on first sight.
pub fn current_slot() -> Option<u8> {
    slot_of(current_context()?)
}

fn slot_of(ctx: usize) -> Option<u8> {
    for (i, c) in CONTEXTS.iter().enumerate() {
        match c.load(Ordering::Acquire) {
            x if x == ctx => return Some(i as u8),
            0 => return register(ctx),
            _ => {}
        }
    }
    None
}

#[cold]
fn register(ctx: usize) -> Option<u8> {
    // The context is current on this thread, so it names its device.
    let device = trace::driver_device();
    REGISTERING.lock();
    let mut found = None;
    for (i, c) in CONTEXTS.iter().enumerate() {
        let x = c.load(Ordering::Acquire);
        if x == ctx {
            found = Some(i as u8);
            break;
        }
        if x == 0 {
            DEVICES[i].store(device, Ordering::Relaxed);
            c.store(ctx, Ordering::Release);
            found = Some(i as u8);
            break;
        }
    }
    REGISTERING.unlock();
    found
}

/// The device ordinal of a slot, for the trace.
pub fn device_of(slot: u8) -> u8 {
    DEVICES[slot as usize].load(Ordering::Relaxed)
}

thread_local! {
    static PER_THREAD_KEY: Cell<u64> = const { Cell::new(0) };
}

/// The pool key of a stream handle: the legacy stream is one stream per context; a
/// per-thread default stream is one per thread. `per_thread_default` says how the caller's
/// stream 0 is meant (the `_ptsz` entry points).
pub fn stream_key(stream: *mut c_void, per_thread_default: bool) -> u64 {
    let key = stream_identity(stream, per_thread_default);
    if key != 0 && pooling() {
        note_other_streams();
    }
    key
}

/// The pool key of a stream handle, with no side effect (for the capture bookkeeping, which
/// runs while a capture begins and must call nothing).
fn stream_identity(stream: *mut c_void, per_thread_default: bool) -> u64 {
    match stream as u64 {
        0 if per_thread_default => per_thread_key(),
        0 | STREAM_LEGACY => 0,
        STREAM_PER_THREAD => per_thread_key(),
        s => s,
    }
}

/// Whether the process has run work anywhere but the legacy stream (a stream created, a
/// per-thread default stream used). Until it has, every piece of GPU work runs in the order it
/// was issued, so a block freed with `cudaFree` may serve the next request at once: the new
/// owner's work comes after the old owner's on the same stream (issue 12).
static OTHER_STREAMS: AtomicBool = AtomicBool::new(false);

/// The process uses a stream other than the legacy one. The first time, the device catches up
/// once (outside any capture: a capture needs such a stream, so it cannot be under way yet),
/// so blocks reused under the single-stream rule are truly free before other streams run.
fn note_other_streams() {
    if OTHER_STREAMS.load(Ordering::Relaxed) || OTHER_STREAMS.swap(true, Ordering::AcqRel) {
        return;
    }
    if !capture_active()
        && let Some(sync) = drv::<unsafe extern "C" fn() -> i32>(Sym::CuCtxSynchronize)
    {
        // SAFETY: no arguments; waits for the current context's work.
        unsafe { sync() };
    }
}

fn per_thread_key() -> u64 {
    PER_THREAD_KEY
        .try_with(|k| {
            if k.get() == 0 {
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u64;
                k.set((1 << 63) | tid);
            }
            k.get()
        })
        .unwrap_or(1 << 63)
}

const UNKNOWN: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether `GPUSHIM_CONF` asked for a pool (and the shim is on, and this is not a forked child).
pub fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = state::enabled() && state::conf().pool != PoolMode::Off;
            let _ = STATE.compare_exchange(
                UNKNOWN,
                if on { ON } else { OFF },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            STATE.load(Ordering::Relaxed) == ON
        }
    }
}

type Pool = Front<CudaBackend>;

struct PoolCell(UnsafeCell<Option<Pool>>);
// SAFETY: only touched with LOCK held.
unsafe impl Sync for PoolCell {}

static LOCK: SpinLock = SpinLock::new();
static POOL: PoolCell = PoolCell(UnsafeCell::new(None));

static ATFORK: AtomicBool = AtomicBool::new(false);

extern "C" fn in_child() {
    forget_after_fork();
}

/// Runs `f` on the pool, creating it on first use, with the lock held. Segments the engine
/// gave back meanwhile are freed after the lock is released: `cuMemFree` waits for the whole
/// device, and no other thread's allocation should wait behind it.
fn with<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    if !ATFORK.swap(true, Ordering::Relaxed) {
        // SAFETY: a plain function that lives as long as the process (-z nodelete).
        unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        start_trimmer();
    }
    LOCK.lock();
    // SAFETY: LOCK is held, so this is the only reference.
    let cell = unsafe { &mut *POOL.0.get() };
    let p = cell.get_or_insert_with(|| {
        let conf = state::conf();
        let mut front = Front::new(CudaBackend::new(), Policy::from(&conf));
        if conf.trim_auto {
            front.set_release_on_free(crate::frameworks::caching_allocator_loaded());
        }
        front
    });
    let r = f(p);
    let released = core::mem::take(&mut p.engine.backend_mut().released);
    LOCK.unlock();
    free_segments(&released);
    r
}

/// Frees segments the engine gave back (outside the pool's lock).
fn free_segments(segments: &[(u8, u64)]) {
    let Some(free) = drv::<unsafe extern "C" fn(u64) -> i32>(Sym::CuMemFreeV2) else {
        return;
    };
    for &(slot, ptr) in segments {
        // SAFETY: a segment the pool reserved with cuMemAlloc_v2 and no longer hands out;
        // freed once, in its context.
        in_context(slot, || unsafe { free(ptr) });
    }
}

/// How often the trimmer looks for memory to give back.
const TRIM_TICK_MS: u64 = 100;

/// Starts the thread that gives idle memory back to the device once it has been idle for the
/// configured `trim` age (contract 8), so memory a program returned is usable by other
/// processes without the program calling CUDA again. Its own CUDA calls run in relaxed capture
/// mode, so they can never invalidate another thread's capture.
fn start_trimmer() {
    let age = state::conf().trim_ns;
    if age == u64::MAX {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("gpushim-trim".into())
        .spawn(move || {
            let _guard = crate::guard::Guard::enter();
            let mut relaxed = false;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(TRIM_TICK_MS));
                if STATE.load(Ordering::Relaxed) == OFF {
                    return;
                }
                if !relaxed {
                    relaxed = set_relaxed_capture_mode().is_some();
                }
                with(|p| {
                    for (slot, ctx) in CONTEXTS.iter().enumerate() {
                        if ctx.load(Ordering::Acquire) == 0 {
                            break;
                        }
                        p.trim(slot as u8, age);
                    }
                });
                forget_finished_captures();
            }
        });
}

/// In a forked child: the parent's pool belongs to the parent's CUDA contexts, which the child
/// cannot use. Every call passes through from now on.
pub fn forget_after_fork() {
    STATE.store(OFF, Ordering::Relaxed);
    for c in &CAPTURING {
        c.store(0, Ordering::Relaxed);
    }
    CAPTURE_COUNT.store(0, Ordering::Relaxed);
    LOCK.unlock();
    REGISTERING.unlock();
    crate::ipc::forget_after_fork();
}

/// What the pool did with a request.
pub enum Served {
    /// The block's address and the device it is on.
    Granted(u64, u8),
    /// The request failed with this CUDA code (out of memory, or the device's own error) on
    /// this device.
    Failed(i32, u8),
    /// Not for the pool (no current context, or too many contexts): call the real function.
    Pass,
}

/// Serves `size` bytes (more than 0) in the current context for use on stream `key`.
/// `runtime`: the caller is a runtime function, which would create the device's context on
/// first use; the pool has it do so.
pub fn alloc(size: u64, key: u64, runtime: bool) -> Served {
    let ctx = match current_context() {
        Some(c) => Some(c),
        None if runtime && runtime_context_ready() => current_context(),
        None => None,
    };
    let Some(slot) = ctx.and_then(slot_of) else {
        return Served::Pass;
    };
    let device = device_of(slot);
    with(|p| match p.alloc(slot, size, key) {
        Ok(b) => Served::Granted(b.ptr, device),
        Err(AllocError::LimitReached) => Served::Failed(ERROR_OUT_OF_MEMORY, device),
        Err(AllocError::OutOfMemory) => match p.engine.backend().last_error {
            0 | ERROR_OUT_OF_MEMORY => Served::Failed(ERROR_OUT_OF_MEMORY, device),
            // Not a matter of room (a broken context, say): the real function answers.
            _ => Served::Pass,
        },
    })
}

pub use gpushim_core::engine::front::Freed;

/// Returns a block to the pool. An interior or already freed pooled pointer is `Invalid`: the
/// real function must not see it (it would free our segment), and the caller fails the call
/// with `cudaErrorInvalidValue`, as CUDA does. `Done` carries the block's device ordinal.
pub fn free(ptr: u64, kind: FreeKind) -> Freed {
    if ptr == 0 {
        return Freed::NotOurs;
    }
    match with(|p| p.free(ptr, kind)) {
        Freed::Done(slot) => {
            // Its IPC tickets stop opening now.
            crate::ipc::revoke(ptr);
            Freed::Done(device_of(slot))
        }
        other => other,
    }
}

/// Seals the segment of live pooled block `ptr` before its memory leaves the process through
/// IPC: the pool hands nothing more out of it and gives it back to CUDA once it is empty, so
/// a handle kept after a free never reaches memory given to someone else.
pub fn seal(ptr: u64) -> bool {
    pooling() && with(|p| p.seal(ptr))
}

/// The live pooled block containing `ptr`, if any.
pub fn lookup(ptr: u64) -> Option<BlockInfo> {
    if !pooling() {
        return None;
    }
    with(|p| p.lookup(ptr))
}

/// Whether the pool holds any memory (so pointer queries need to look).
static PLUGGED: AtomicBool = AtomicBool::new(false);

/// Marks that the PyTorch pluggable-allocator route is in use (the pool serves it even when
/// `GPUSHIM_CONF` has no pool).
pub fn plug() {
    PLUGGED.store(true, Ordering::Relaxed);
}

pub fn is_plugged() -> bool {
    PLUGGED.load(Ordering::Relaxed)
}

/// What `cudaMemGetInfo` shows the process: idle cached memory counts as free (the process can
/// allocate it), and with `limit` the total is capped and the free figure kept under it.
pub fn mem_info(real_free: u64, real_total: u64) -> (u64, u64) {
    let Some(slot) = current_slot() else {
        return (real_free, real_total);
    };
    let (reserved, idle, limit) = with(|p| {
        (
            p.engine.reserved(slot),
            p.idle(slot),
            p.engine.policy().limit,
        )
    });
    let mut total = real_total;
    let mut free = real_free.saturating_add(idle);
    if limit > 0 {
        total = total.min(limit);
        free = free.min(limit.saturating_sub(reserved - idle));
    }
    (free.min(total), total)
}

/// A stream was created in the current context; non-blocking ones get checkpoint events.
pub fn stream_created(stream: u64, flags: u32) {
    if stream != 0 {
        note_other_streams();
    }
    if flags & CU_STREAM_NON_BLOCKING == 0 || stream == 0 {
        return;
    }
    let Some(slot) = current_slot() else {
        return;
    };
    with(|p| {
        let s = &mut p.engine.backend_mut().slots[slot as usize];
        if s.streams.len() < MAX_STREAMS {
            s.streams.push(stream);
        } else {
            s.untracked = true;
        }
    });
}

/// A stream is about to be destroyed: work already on it stays covered by the pending
/// checkpoint (made now if any fence waits for it), and its handle loses its blocks' right to
/// immediate reuse (a new stream may get the same handle).
pub fn stream_destroying(stream: u64) {
    with(|p| {
        let b = p.engine.backend_mut();
        for slot in 0..MAX_CONTEXTS {
            let Some(i) = b.slots[slot].streams.iter().position(|&s| s == stream) else {
                continue;
            };
            if b.slots[slot].pending_used {
                if capture_active() {
                    // No event may be recorded now: only a synchronization passes the
                    // pending fences.
                    b.slots[slot].untracked = true;
                } else {
                    b.seal(slot as u8);
                }
            }
            b.slots[slot].streams.swap_remove(i);
        }
        p.retire_stream(stream);
    });
}

/// Before a context-wide synchronization: the fences made so far are the ones it will pass.
/// Returns the token for `synchronized`.
pub fn synchronizing() -> Option<(u8, u64)> {
    let slot = current_slot()?;
    Some(with(|p| {
        let s = &mut p.engine.backend_mut().slots[slot as usize];
        let id = s.next_id;
        if s.pending_used {
            s.next_id += 1;
            s.pending_used = false;
        }
        (slot, id)
    }))
}

/// After the synchronization succeeded: every fence made before it has passed.
pub fn synchronized((slot, id): (u8, u64)) {
    with(|p| p.engine.backend_mut().passed_up_to(slot, id));
}

/// Empties the cache of the current context (`torch.cuda.empty_cache()` through the
/// pluggable allocator, or `gpushim_empty_cache()`).
pub fn empty_cache() {
    if let Some(slot) = current_slot() {
        with(|p| p.empty_cache(slot));
    }
}

/// One checkpoint: events recorded after every fence it covers.
struct Checkpoint {
    id: u64,
    events: Vec<usize>,
    /// Some event could not be made or recorded, or streams went untracked: only a
    /// synchronization of the whole context passes it.
    broken: bool,
}

/// Fences of one context.
struct SlotFences {
    /// Fences made now name this checkpoint.
    next_id: u64,
    /// Whether any fence names `next_id`.
    pending_used: bool,
    /// Every checkpoint up to this one has passed.
    passed_id: u64,
    sealed: VecDeque<Checkpoint>,
    spare: Vec<usize>,
    /// Non-blocking streams of this context.
    streams: Vec<u64>,
    untracked: bool,
}

pub struct CudaBackend {
    slots: Vec<SlotFences>,
    /// The code of the last failed `cuMemAlloc_v2` or `cuMemCreate`.
    last_error: i32,
    /// The physical allocation behind each mapped page of the expandable segments.
    pages: std::collections::BTreeMap<u64, u64>,
    /// Segments given back by the engine, freed once the pool's lock is released.
    released: Vec<(u8, u64)>,
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

type CuFn1 = unsafe extern "C" fn(usize) -> i32;
type CuFn2 = unsafe extern "C" fn(usize, usize) -> i32;

/// The real driver function `sym` with ABI `F`.
fn drv<F: Copy>(sym: Sym) -> Option<F> {
    // SAFETY: callers name the ABI of `sym` as F.
    unsafe { real::as_fn::<F>(real::exported(sym)) }
}

/// Runs `f` with `slot`'s context current.
fn in_context<R>(slot: u8, f: impl FnOnce() -> R) -> R {
    let target = CONTEXTS[slot as usize].load(Ordering::Acquire);
    if current_context() == Some(target) {
        return f();
    }
    let push = drv::<CuFn1>(Sym::CuCtxPushCurrentV2);
    let pop = drv::<unsafe extern "C" fn(*mut usize) -> i32>(Sym::CuCtxPopCurrentV2);
    // SAFETY: pushing a context this process made; popped below.
    let pushed = push.is_some_and(|p| unsafe { p(target) } == 0);
    let r = f();
    if pushed && let Some(pop) = pop {
        let mut old = 0usize;
        // SAFETY: pops the context pushed above; `old` is a valid out-pointer.
        unsafe { pop(&mut old) };
    }
    r
}

impl CudaBackend {
    fn new() -> CudaBackend {
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
                })
                .collect(),
            last_error: 0,
            pages: std::collections::BTreeMap::new(),
            released: Vec::new(),
        }
    }

    /// Unmaps and releases the pages of `[ptr, ptr + size)` that this backend mapped.
    fn unmap_pages(&mut self, ptr: u64, size: u64) {
        let unmap = drv::<unsafe extern "C" fn(u64, usize) -> i32>(Sym::CuMemUnmap);
        let release = drv::<unsafe extern "C" fn(u64) -> i32>(Sym::CuMemRelease);
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

    /// Makes the pending checkpoint of `slot`: an event on the legacy stream and on each
    /// non-blocking stream.
    fn seal(&mut self, slot: u8) {
        let s = &mut self.slots[slot as usize];
        let create = drv::<unsafe extern "C" fn(*mut usize, u32) -> i32>(Sym::CuEventCreate);
        let record = drv::<CuFn2>(Sym::CuEventRecord);
        let mut events = Vec::with_capacity(1 + s.streams.len());
        let mut broken = s.untracked;
        in_context(slot, || {
            for &stream in core::iter::once(&0u64).chain(s.streams.iter()) {
                let ev = match s.spare.pop() {
                    Some(ev) => ev,
                    None => {
                        let mut ev = 0usize;
                        // SAFETY: `ev` is a valid out-pointer.
                        let ok = create
                            .is_some_and(|c| unsafe { c(&mut ev, CU_EVENT_DISABLE_TIMING) } == 0);
                        if !ok {
                            broken = true;
                            continue;
                        }
                        ev
                    }
                };
                // SAFETY: an event of this context recorded on a stream of this context.
                if record.is_some_and(|r| unsafe { r(ev, stream as usize) } == 0) {
                    events.push(ev);
                } else {
                    s.spare.push(ev);
                    broken = true;
                }
            }
        });
        s.sealed.push_back(Checkpoint {
            id: s.next_id,
            events,
            broken,
        });
        s.next_id += 1;
        s.pending_used = false;
    }

    /// Passes the checkpoints whose events all completed, oldest first.
    fn query(&mut self, slot: u8) {
        let query = drv::<CuFn1>(Sym::CuEventQuery);
        let s = &mut self.slots[slot as usize];
        in_context(slot, || {
            while let Some(cp) = s.sealed.front() {
                if cp.broken {
                    break;
                }
                // Not ready, or an error: not passed (a synchronization settles it).
                let done = cp.events.iter().all(|&ev| {
                    query.is_some_and(|q| {
                        // SAFETY: an event this backend recorded.
                        let rc = unsafe { q(ev) };
                        rc == 0
                    })
                });
                if !done {
                    break;
                }
                let cp = s.sealed.pop_front().expect("front exists");
                s.passed_id = s.passed_id.max(cp.id);
                s.spare.extend(cp.events);
            }
        });
    }

    fn passed_up_to(&mut self, slot: u8, id: u64) {
        let s = &mut self.slots[slot as usize];
        s.passed_id = s.passed_id.max(id);
        while s.sealed.front().is_some_and(|cp| cp.id <= id) {
            if let Some(cp) = s.sealed.pop_front() {
                s.spare.extend(cp.events);
            }
        }
    }
}

impl Backend for CudaBackend {
    type Fence = (u8, u64);

    fn reserve(&mut self, slot: u8, size: u64) -> Result<u64, OutOfMemory> {
        if !self.released.is_empty() {
            // Out of memory and retrying: what was given back must really be free first.
            free_segments(&core::mem::take(&mut self.released));
        }
        let Some(alloc) = drv::<unsafe extern "C" fn(*mut u64, usize) -> i32>(Sym::CuMemAllocV2)
        else {
            self.last_error = crate::ffi::CU_ERROR_NOT_INITIALIZED;
            return Err(OutOfMemory);
        };
        let mut p = 0u64;
        // SAFETY: a valid out-pointer, in the slot's context.
        let rc =
            relaxed_if_capturing(|| in_context(slot, || unsafe { alloc(&mut p, size as usize) }));
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
        capture_active()
    }

    fn now(&mut self) -> u64 {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
        (t.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec as u64)
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

    fn poll(&mut self, slot: u8) -> bool {
        let before = self.slots[slot as usize].passed_id;
        if self.slots[slot as usize].pending_used {
            self.seal(slot);
        }
        self.query(slot);
        self.slots[slot as usize].passed_id > before
    }

    fn synchronize(&mut self, slot: u8) {
        if self.slots[slot as usize].pending_used {
            self.seal(slot);
        }
        let s = &mut self.slots[slot as usize];
        let Some(last) = s.sealed.back().map(|cp| cp.id) else {
            return;
        };
        let broken = s.sealed.iter().any(|cp| cp.broken);
        let wait = drv::<CuFn1>(Sym::CuEventSynchronize);
        let ctx_sync = drv::<unsafe extern "C" fn() -> i32>(Sym::CuCtxSynchronize);
        in_context(slot, || {
            if broken {
                // SAFETY: no arguments.
                if let Some(f) = ctx_sync {
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
        type F = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> i32;
        let f = drv::<F>(Sym::CuMemAddressReserve).ok_or(OutOfMemory)?;
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; no fixed address asked for.
        let rc = in_context(slot, || unsafe {
            f(&mut p, size as usize, PAGE as usize, 0, 0)
        });
        if rc == 0 { Ok(p) } else { Err(OutOfMemory) }
    }

    fn map(&mut self, slot: u8, ptr: u64, size: u64) -> Result<(), OutOfMemory> {
        type Create = unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, u64) -> i32;
        type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> i32;
        type Access = unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> i32;
        let device = device_of(slot);
        let (Some(create), Some(map), Some(access), Some(release)) = (
            drv::<Create>(Sym::CuMemCreate),
            drv::<Map>(Sym::CuMemMap),
            drv::<Access>(Sym::CuMemSetAccess),
            drv::<unsafe extern "C" fn(u64) -> i32>(Sym::CuMemRelease),
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
        relaxed_if_capturing(|| {
            in_context(slot, || {
                while done < size {
                    let mut h = 0u64;
                    // SAFETY: valid out-pointer and property struct of the CUDA layout.
                    rc = unsafe { create(&mut h, PAGE as usize, &prop, 0) };
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
                    rc = unsafe { access(ptr, size as usize, &desc, 1) };
                }
            })
        });
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
        let (kind, slot, ptr, size) = match event {
            Event::SegmentReserve { device, ptr, size } => {
                (RecordKind::SegmentReserve, device, ptr, size)
            }
            Event::SegmentRelease { device, ptr, size } => {
                (RecordKind::SegmentRelease, device, ptr, size)
            }
            Event::Split { device, ptr, size } => (RecordKind::Split, device, ptr, size),
            Event::OomRetry { device, size } => (RecordKind::OomRetry, device, 0, size),
            Event::OutOfMemory { device, size } => (RecordKind::OutOfMemory, device, 0, size),
            Event::LimitHit { device, size } => (RecordKind::LimitHit, device, 0, size),
            Event::Synchronize { device } => (RecordKind::PoolSync, device, 0, 0),
        };
        trace::record(kind, Api::Shim, 0, ptr, size, device_of(slot), 0);
    }
}

/// Whether pooled blocks may exist (a pool from `GPUSHIM_CONF`, or the pluggable route).
pub fn pooling() -> bool {
    active() || is_plugged()
}

static CAPTURES: AtomicBool = AtomicBool::new(false);

/// A stream capture is about to begin (the hooks on `cuStreamBeginCapture_v2` and
/// `cuStreamBeginCaptureToGraph`, which the runtime's capture functions reach too): from now on
/// stream-ordered calls ask whether their stream is being captured.
pub fn captures_begun() {
    CAPTURES.store(true, Ordering::Relaxed);
}

/// Captures can be under way on this many streams at once and be told apart; past it the pool
/// stays quiet until the trimmer sees them end.
const MAX_CAPTURES: usize = 64;
/// The streams being captured, by pool key (a per-thread default stream names its thread).
static CAPTURING: [AtomicU64; MAX_CAPTURES] = [const { AtomicU64::new(0) }; MAX_CAPTURES];
/// Captures under way, counted apart from the table so none is ever missed.
static CAPTURE_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The raw handles of the captured streams, for `cuStreamIsCapturing`.
static CAPTURED_HANDLE: [AtomicU64; MAX_CAPTURES] = [const { AtomicU64::new(0) }; MAX_CAPTURES];

/// Whether a stream capture is under way anywhere in the process (contract 7). While one is,
/// the pool records no event, queries or waits for none, frees no device memory and
/// synchronizes nothing; its own allocations run in relaxed capture mode.
pub fn capture_active() -> bool {
    CAPTURE_COUNT.load(Ordering::Acquire) > 0
}

/// A capture began on `stream`.
pub fn capture_started(stream: *mut c_void, per_thread_default: bool) {
    let key = stream_identity(stream, per_thread_default);
    CAPTURE_COUNT.fetch_add(1, Ordering::AcqRel);
    for (c, h) in CAPTURING.iter().zip(&CAPTURED_HANDLE) {
        if c.compare_exchange(0, key, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            h.store(stream as u64, Ordering::Release);
            return;
        }
    }
}

/// The capture on `stream` ended (successfully or invalidated).
pub fn capture_ended(stream: *mut c_void, per_thread_default: bool) {
    let key = stream_identity(stream, per_thread_default);
    for c in &CAPTURING {
        if c.compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            let _ = CAPTURE_COUNT
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            return;
        }
    }
}

/// Drops captures that CUDA no longer reports (a capturing stream destroyed, say), so the pool
/// is never left quiet for good. Only tracked streams are asked; an untracked capture keeps the
/// pool quiet.
fn forget_finished_captures() {
    if !capture_active() {
        return;
    }
    type F = unsafe extern "C" fn(usize, *mut i32) -> i32;
    let Some(f) = drv::<F>(Sym::CuStreamIsCapturing) else {
        return;
    };
    for (c, h) in CAPTURING.iter().zip(&CAPTURED_HANDLE) {
        let key = c.load(Ordering::Acquire);
        let handle = h.load(Ordering::Acquire);
        // Special handles name another thread's stream here: not asked.
        if key == 0 || handle <= STREAM_PER_THREAD {
            continue;
        }
        let mut status = 0i32;
        // SAFETY: a valid out-pointer; a destroyed stream's handle makes CUDA answer an
        // error, which counts as not capturing.
        let rc = unsafe { f(handle as usize, &mut status) };
        if (rc != 0 || status == 0)
            && c.compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let _ = CAPTURE_COUNT
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: i32 = 2;

/// Puts the calling thread in relaxed capture mode; returns the mode it had.
fn set_relaxed_capture_mode() -> Option<i32> {
    type F = unsafe extern "C" fn(*mut i32) -> i32;
    let f = drv::<F>(Sym::CuThreadExchangeStreamCaptureMode)?;
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: a valid in/out pointer; the exchange is legal at any time (checked on the GPU).
    (unsafe { f(&mut mode) } == 0).then_some(mode)
}

/// Runs `f` (the pool's own allocation calls) in relaxed capture mode while a capture is under
/// way, so CUDA never takes them for the program's and invalidates its graph.
fn relaxed_if_capturing<R>(f: impl FnOnce() -> R) -> R {
    if !capture_active() {
        return f();
    }
    let old = set_relaxed_capture_mode();
    let r = f();
    if let Some(mut m) = old {
        type F = unsafe extern "C" fn(*mut i32) -> i32;
        if let Some(x) = drv::<F>(Sym::CuThreadExchangeStreamCaptureMode) {
            // SAFETY: restores the mode taken above.
            unsafe { x(&mut m) };
        }
    }
    r
}

/// While a capture is under way, asks CUDA whether this thread may make a synchronous
/// allocation or free now, with the one call that is refused exactly when those are and does
/// nothing else: `cudaFree(NULL)` (`runtime`) or `cuMemFree(0)` (measured on the GPU: refused
/// with 900 in global mode from any thread and in thread-local mode from the capturing
/// thread, 0 otherwise). A refusal invalidates the capture, exactly as the program's own call
/// would have: `Some(900)` is then the answer to give. `None`: go on.
pub fn capture_forbids(runtime: bool) -> Option<i32> {
    if !capture_active() {
        return None;
    }
    let rc = if runtime {
        type F = unsafe extern "C" fn(*mut c_void) -> i32;
        // SAFETY: cudaFree has the ABI F; a null pointer frees nothing.
        let f = unsafe { real::as_fn::<F>(real::exported(Sym::CudaFree)) }?;
        // SAFETY: as above.
        unsafe { f(core::ptr::null_mut()) }
    } else {
        let f = drv::<unsafe extern "C" fn(u64) -> i32>(Sym::CuMemFreeV2)?;
        // SAFETY: freeing address 0 frees nothing.
        unsafe { f(0) }
    };
    (rc == crate::ffi::ERROR_STREAM_CAPTURE_UNSUPPORTED).then_some(rc)
}

/// Whether `stream` is being captured into a CUDA graph: stream-ordered calls on it become
/// graph nodes and must reach CUDA. Free until the process begins a capture. The special
/// handles (legacy, per-thread) are not checked.
pub fn capturing(stream: *mut c_void) -> bool {
    let s = stream as u64;
    if s <= STREAM_PER_THREAD || !CAPTURES.load(Ordering::Relaxed) {
        return false;
    }
    type F = unsafe extern "C" fn(usize, *mut i32) -> i32;
    let Some(f) = drv::<F>(Sym::CuStreamIsCapturing) else {
        return false;
    };
    let mut status = 0i32;
    // SAFETY: a stream handle the caller passed to a stream-ordered call; a valid out-pointer.
    unsafe { f(s as usize, &mut status) == 0 && status != 0 }
}

/// Records what `cudaMemGetInfo`/`cuMemGetInfo_v2` returned and, with a pool, replaces it
/// with what the process can use (see `mem_info`), recorded as well.
///
/// # Safety
/// `free` and `total` must be what the caller passed to the call that returned `rc`.
pub unsafe fn show_mem_info(api: Api, rc: i32, free: *mut usize, total: *mut usize, device: u8) {
    // SAFETY: the caller vouches for the out-pointers.
    let (fr, to) = unsafe {
        (
            crate::hook::out_usize(free, rc),
            crate::hook::out_usize(total, rc),
        )
    };
    trace::record(RecordKind::MemInfo, api, rc, fr, to, device, 0);
    if rc != 0 || free.is_null() || total.is_null() || !pooling() {
        return;
    }
    let (f2, t2) = mem_info(fr, to);
    // SAFETY: both out-pointers were written by the successful call.
    unsafe {
        *free = f2 as usize;
        *total = t2 as usize;
    }
    trace::record(RecordKind::MemInfoShown, api, 0, f2, t2, device, 0);
}

/// Makes sure the runtime has made its context current on this thread, as its own allocation
/// functions do on first use (the runtime creates contexts lazily). The guard must be held.
pub fn runtime_context_ready() -> bool {
    if current_context().is_some() {
        return true;
    }
    type F = unsafe extern "C" fn(*mut c_void) -> i32;
    // SAFETY: cudaFree has the ABI F; cudaFree(NULL) only initializes the runtime.
    if let Some(f) = unsafe { real::as_fn::<F>(real::exported(Sym::CudaFree)) } {
        // SAFETY: a null pointer is valid for cudaFree.
        unsafe { f(core::ptr::null_mut()) };
    }
    current_context().is_some()
}
