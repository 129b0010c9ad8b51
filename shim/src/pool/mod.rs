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

mod backend;
mod capture;
mod context;
mod figures;
pub mod frameworks;
pub mod ipc;
mod sealer;
mod splits;
mod streams;

use crate::cuda::symbols::sig::of;
use backend::CudaBackend;
pub use capture::{allow_pool_questions, capture_active, capture_forbids, capturing};
use capture::{
    capture_ended, capture_started, captures_begun, forget_finished_captures, resetting,
    set_relaxed_capture_mode,
};
use context::{CONTEXTS, MAX_CONTEXTS, free_segments, registered_slot, slot_of};
pub use context::{current_context, current_slot, device_of};
pub use figures::{device_stats, mem_info, reset_device_stats};
use streams::{OTHER_STREAMS, stream_identity};

use crate::cuda::ffi::{CU_STREAM_NON_BLOCKING, ERROR_OUT_OF_MEMORY};
use crate::cuda::real;
use crate::os::SpinLock;
use crate::state;
use core::cell::UnsafeCell;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};
use gpushim_core::config::{Pool as PoolMode, Trim};
use gpushim_core::engine::front::Front;
use gpushim_core::engine::{AllocError, BlockInfo, DeviceStats, FreeKind, Policy};
use gpushim_core::trace::format::Api;
/// Non-blocking streams tracked per context; past this, fences wait for the whole context.
const MAX_STREAMS: usize = 4096;
pub use gpushim_core::engine::SYNC_KEY;

/// The pool key of a stream handle: the legacy stream is one stream per context; a
/// per-thread default stream is one per thread. `per_thread_default` says how the caller's
/// stream 0 is meant (the `_ptsz` entry points).
pub fn stream_key(stream: *mut c_void, per_thread_default: bool, api: Api) -> u64 {
    let key = stream_identity(stream, per_thread_default);
    if key != 0 && holds_blocks() {
        note_other_streams(api, stream as u64);
    }
    key
}

/// The process uses a stream other than the legacy one. The first time, the device catches up
/// once (outside any capture: a capture needs such a stream, so it cannot be under way yet),
/// so blocks reused under the single-stream rule are truly free before other streams run.
/// The trace says when and by which call (`pool_streams`, with the caller's stack): from then
/// on a block freed with `cudaFree` waits for the device before reuse, which is what a
/// per-tensor trace's reserved memory shows.
fn note_other_streams(api: Api, stream: u64) {
    if OTHER_STREAMS.load(Ordering::Relaxed) || OTHER_STREAMS.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::trace::record(crate::trace::Event::pool_streams(api, stream));
    if !capture_active()
        && let Some(sync) = real::function::<of::CuCtxSynchronize>()
    {
        // The fences made so far pass with it, as with the program's own synchronization.
        let token = synchronizing();
        // SAFETY: no arguments; waits for the current context's work.
        if unsafe { sync() } == 0
            && let Some(t) = token
        {
            synchronized(t);
        }
    }
}

static STATE: crate::os::LazyFlag = crate::os::LazyFlag::new();

/// What the pool runs with, taken from the settings once: its mode, the engine's policy and
/// when idle memory goes back. The pool's code reads these, never the settings themselves.
#[derive(Clone, Copy)]
struct Settings {
    mode: PoolMode,
    policy: Policy,
    trim: Trim,
}

fn settings() -> Settings {
    let conf = state::conf();
    Settings {
        mode: conf.pool,
        policy: Policy::from(&conf),
        trim: conf.trim,
    }
}

/// Whether the pool serves the program's allocation calls: `GPUSHIM_CONF` asked for one (and
/// the shim is on, and this is not a forked child).
pub fn serves_calls() -> bool {
    STATE.get(|| state::enabled() && settings().mode != PoolMode::Off)
}

/// Whether the pool's segments grow in place through the VMM functions (`pool:expandable`):
/// their mappings cannot be exported through `cuIpcGetMemHandle`.
pub fn expandable() -> bool {
    settings().policy.expandable
}

type Pool = Front<CudaBackend>;

struct PoolCell(UnsafeCell<Option<Pool>>);
// SAFETY: only touched with LOCK held.
unsafe impl Sync for PoolCell {}

static LOCK: SpinLock = SpinLock::new();
static POOL: PoolCell = PoolCell(UnsafeCell::new(None));

static STARTED: AtomicBool = AtomicBool::new(false);

/// Runs `f` on the pool, creating it on first use, with the lock held. Segments the engine
/// gave back meanwhile are freed after the lock is released: `cuMemFree` waits for the whole
/// device, and no other thread's allocation should wait behind it.
pub(super) fn with<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    // Read first: a swap on every call would take the cache line from every other thread.
    if !STARTED.load(Ordering::Relaxed) && !STARTED.swap(true, Ordering::Relaxed) {
        prime_functions();
        crate::lifecycle::in_forked_child(forget_after_fork);
        crate::lifecycle::on_exit(|| splits::flush(false));
        start_trimmer();
    }
    // The pool may reserve or release device memory in here: no NVML sample until its records
    // are written (trace::device_memory).
    let _under_way = crate::trace::device_memory::InCall::begin();
    let held = crate::costs::measure(crate::costs::Cost::Lock, || LOCK.lock());
    // SAFETY: LOCK is held, so this is the only reference.
    let cell = unsafe { &mut *POOL.0.get() };
    let p = cell.get_or_insert_with(|| {
        let s = settings();
        let mut front = Front::new(CudaBackend::new(), s.policy);
        if s.trim == Trim::Auto {
            front.set_release_on_free(crate::pool::frameworks::caching_allocator_loaded());
        }
        front
    });
    let r = f(p);
    let released = core::mem::take(&mut p.engine.backend_mut().released);
    drop(held);
    if !released.is_empty() {
        let kept = free_segments(&released);
        if !kept.is_empty() {
            // Still the pool's memory: tried again at the next release (a release that fails
            // never drops a segment).
            let _held = LOCK.lock();
            // SAFETY: LOCK is held, so this is the only reference.
            if let Some(p) = unsafe { &mut *POOL.0.get() } {
                p.engine.backend_mut().released.extend(kept);
            }
        }
    }
    r
}

/// Finds every real function the pool calls under its lock, once, before the lock is first
/// taken: a lookup takes the loader's lock, and a thread in `dlopen` whose library's
/// constructor allocates through the pool would otherwise wait for the pool's lock while the
/// pool's holder waits for the loader's.
fn prime_functions() {
    use crate::cuda::symbols::sig::of::*;
    let _ = (
        real::function::<CuCtxGetCurrent>(),
        real::function::<CuCtxPopCurrentV2>(),
        real::function::<CuCtxPushCurrentV2>(),
        real::function::<CuCtxSynchronize>(),
        real::function::<CuDevicePrimaryCtxGetState>(),
        real::function::<CuDevicePrimaryCtxReleaseV2>(),
        real::function::<CuDevicePrimaryCtxRetain>(),
        real::function::<CuEventCreate>(),
        real::function::<CuEventQuery>(),
        real::function::<CuEventRecord>(),
        real::function::<CuEventSynchronize>(),
        real::function::<CuMemAddressReserve>(),
        real::function::<CuMemAllocV2>(),
        real::function::<CuMemCreate>(),
        real::function::<CuMemFreeV2>(),
        real::function::<CuMemMap>(),
        real::function::<CuMemRelease>(),
        real::function::<CuMemSetAccess>(),
        real::function::<CuMemUnmap>(),
        real::function::<CuStreamIsCapturing>(),
        real::function::<CuStreamQuery>(),
        real::function::<CuThreadExchangeStreamCaptureMode>(),
        real::function::<CudaFree>(),
    );
    if sealer::context_events() {
        let _ = real::function::<CuCtxRecordEvent>();
    }
}

/// Makes the program's capture-begin call (`begin`, the real function) with the pool's lock
/// held, and counts the capture before letting go (contract 7). Every pool operation then
/// either finished before the capture began or sees it under way. Without the lock, a
/// checkpoint made by another thread (or the trimmer) in that instant recorded its event on the
/// stream just being captured: the event joined the graph and the pool's query of it
/// invalidated the capture (907); PyTorch's `test_cuda_graph_error_options` failed so in one
/// full run of the suite in five, and the pool's next queries never saw that checkpoint pass.
pub fn begin_capture(
    stream: *mut c_void,
    per_thread_default: bool,
    begin: impl FnOnce() -> i32,
) -> i32 {
    captures_begun();
    let _held = LOCK.lock();
    // The helper that makes checkpoints ahead (`sealer`) finishes or has not started: it
    // works under this lock and gives up once a capture is under way.
    let _sweep = sealer::SWEEP.lock();
    let rc = begin();
    if rc == 0 {
        capture_started(stream, per_thread_default);
    }
    rc
}

/// The program's end of the capture on `stream` answered `rc` (see `capture_ended`). Counted
/// under the lock, as it was begun.
pub fn end_capture(stream: *mut c_void, per_thread_default: bool, rc: i32) {
    let _held = LOCK.lock();
    capture_ended(stream, per_thread_default, rc);
}

/// A reset of device `device`'s primary context is about to run (`cudaDeviceReset`,
/// `cuDevicePrimaryCtxReset`). CUDA frees every allocation of the context and destroys its
/// streams and events, while the context keeps its handle (`docs/cuda-facts.md`), which is how
/// the pool names it: the pool goes quiet, waits for the checkpoint its helper may be making,
/// and returns the handle for [`device_reset`]. `None`: nothing of the pool's is on it.
pub fn device_resetting(device: i32) -> Option<usize> {
    if !holds_blocks() {
        return None;
    }
    let ctx = primary_context(device).filter(|&c| registered_slot(c).is_some())?;
    resetting(true);
    with(|p| {
        // A sweep under way finishes; later ones see the reset and make nothing.
        drop(sealer::SWEEP.lock());
        p.engine.backend_mut().take_answer(true);
    });
    Some(ctx)
}

/// The reset begun with [`device_resetting`] answered `rc`: on success the pool forgets every
/// block, segment, stream and event of context `ctx` (the addresses may come back from CUDA as
/// new memory); the context's slot serves again.
pub fn device_reset(ctx: usize, rc: i32) {
    if rc == 0 {
        with(|p| {
            if let Some(slot) = registered_slot(ctx) {
                let gone = p.forget_device(slot);
                p.engine.backend_mut().forget_slot(slot, &gone);
            }
        });
    }
    resetting(false);
}

/// The handle of device `device`'s primary context while it is active (never made active here:
/// that would create it).
fn primary_context(device: i32) -> Option<usize> {
    let state = real::function::<of::CuDevicePrimaryCtxGetState>()?;
    let retain = real::function::<of::CuDevicePrimaryCtxRetain>()?;
    let release = real::function::<of::CuDevicePrimaryCtxReleaseV2>()?;
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: valid out-pointers.
    if unsafe { state(device, &mut flags, &mut active) } != 0 || active == 0 {
        return None;
    }
    let mut ctx = 0usize;
    // SAFETY: the context is active, so retaining it creates nothing; released right after,
    // which leaves its count as it was.
    if unsafe { retain(&mut ctx, device) } != 0 {
        return None;
    }
    // SAFETY: releases the reference taken above.
    unsafe { release(device) };
    (ctx != 0).then_some(ctx)
}

/// How often the trimmer looks for memory to give back.
const TRIM_TICK_MS: u64 = 100;

/// Starts the thread that gives idle memory back to the device once it has been idle for the
/// configured `trim` age (contract 8), so memory a program returned is usable by other
/// processes without the program calling CUDA again. Its own CUDA calls run in relaxed capture
/// mode, so they can never invalidate another thread's capture.
fn start_trimmer() {
    let age = settings().trim.age_ns();
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
                if STATE.is_no() {
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
                    // Under the lock, so a capture being counted is never half seen.
                    forget_finished_captures();
                });
            }
        });
}

/// In a forked child: the parent's pool belongs to the parent's CUDA contexts, which the child
/// cannot use. Every call passes through from now on.
pub fn forget_after_fork() {
    STATE.set(false);
    capture::forget_after_fork();
    LOCK.reset_after_fork();
    // A sweep of the parent's helper the fork interrupted is over too.
    sealer::SWEEP.reset_after_fork();
    context::forget_after_fork();
    ipc::forget_after_fork();
    splits::flush(true);
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
    with(|p| {
        match crate::costs::measure(crate::costs::Cost::PoolAlloc, || p.alloc(slot, size, key)) {
            Ok(b) => Served::Granted(b.ptr, device),
            Err(AllocError::LimitReached) => Served::Failed(ERROR_OUT_OF_MEMORY, device),
            Err(AllocError::OutOfMemory) => match p.engine.backend().last_error {
                0 | ERROR_OUT_OF_MEMORY => Served::Failed(ERROR_OUT_OF_MEMORY, device),
                // Not a matter of room (a broken context, say): the real function answers.
                _ => Served::Pass,
            },
        }
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
    match with(|p| crate::costs::measure(crate::costs::Cost::PoolFree, || p.free(ptr, kind))) {
        Freed::Done(slot) => {
            // Its IPC tickets stop opening now.
            crate::pool::ipc::revoke(ptr);
            Freed::Done(device_of(slot))
        }
        other => other,
    }
}

/// Marks the segment of live pooled block `ptr` as exported before its memory leaves the
/// process through IPC: the pool hands nothing more out of it and gives it back to CUDA once it
/// is empty, so a handle kept after a free never reaches memory given to someone else.
pub fn mark_exported(ptr: u64) -> bool {
    holds_blocks() && with(|p| p.mark_exported(ptr))
}

/// The live pooled block containing `ptr`, if any.
pub fn lookup(ptr: u64) -> Option<BlockInfo> {
    if !holds_blocks() {
        return None;
    }
    with(|p| crate::costs::measure(crate::costs::Cost::Lookup, || p.lookup(ptr)))
}

/// Whether the pool holds any memory (so pointer queries need to look).
static PLUGGED: AtomicBool = AtomicBool::new(false);

/// Marks that the PyTorch pluggable-allocator route is in use (the pool serves it even when
/// `GPUSHIM_CONF` has no pool). PyTorch's caching allocator is then replaced, not above the
/// pool: under `trim:auto` the pool caches (idle memory back after `trim`) instead of giving a
/// segment back the moment it empties, which the loaded library alone would have implied
/// (and which cost a `cuMemFree`, a wait for the whole device, at every trimmer tick).
pub fn plug() {
    if PLUGGED.load(Ordering::Relaxed) || PLUGGED.swap(true, Ordering::AcqRel) {
        return;
    }
    if settings().trim == Trim::Auto {
        with(|p| p.set_release_on_free(false));
    }
}

/// Whether the pool serves PyTorch's pluggable allocator (`gpushim_alloc` was called), whatever
/// `GPUSHIM_CONF` says.
pub fn serves_pluggable() -> bool {
    PLUGGED.load(Ordering::Relaxed)
}

/// A stream was created in the current context; non-blocking ones get checkpoint events.
pub fn stream_created(stream: u64, flags: u32, api: Api) {
    if stream != 0 {
        note_other_streams(api, stream);
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
/// immediate reuse (a new stream may get the same handle). A checkpoint the helper thread is
/// making may name the stream: it is waited for first, so the helper never records on or
/// queries a destroyed stream (the stream leaves the list here, so no later request names it).
pub fn stream_destroying(stream: u64) {
    with(|p| {
        let b = p.engine.backend_mut();
        b.take_answer(true);
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
/// Returns the token for `synchronized`: the newest checkpoint number that only fences made
/// before now name. With fences pending that is the pending number, closed here so later
/// fences name the next; with none pending it is the one before it, which later fences will
/// not name (passing the pending number itself would pass the fences of frees made after the
/// synchronization, while their GPU work may still run).
pub fn synchronizing() -> Option<(u8, u64)> {
    let slot = current_slot()?;
    Some(with(|p| {
        let s = &mut p.engine.backend_mut().slots[slot as usize];
        let id = if s.pending_used {
            let id = s.next_id;
            s.next_id += 1;
            s.pending_used = false;
            id
        } else {
            s.next_id - 1
        };
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

/// Whether pooled blocks may exist, by either route: the pool serves calls or the pluggable
/// allocator (an address may then be a block of the pool's).
pub fn holds_blocks() -> bool {
    serves_calls() || serves_pluggable()
}

/// Makes sure the runtime has made its context current on this thread, as its own allocation
/// functions do on first use (the runtime creates contexts lazily). The guard must be held.
pub fn runtime_context_ready() -> bool {
    if current_context().is_some() {
        return true;
    }
    if let Some(f) = real::function::<of::CudaFree>() {
        // SAFETY: a null pointer is valid for cudaFree.
        unsafe { f(core::ptr::null_mut()) };
    }
    current_context().is_some()
}
