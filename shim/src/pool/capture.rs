//! Stream captures under way in the process (contract 7): counted from the capture hooks, asked
//! of CUDA where the pool must know, and the relaxed interaction mode for the pool's own calls.

use super::streams::stream_identity;
use crate::cuda::ffi::{STREAM_LEGACY, STREAM_PER_THREAD};
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

static CAPTURES: AtomicBool = AtomicBool::new(false);

/// A stream capture is about to begin (the hooks on `cuStreamBeginCapture_v2` and
/// `cuStreamBeginCaptureToGraph`, which the runtime's capture functions reach too): from now on
/// stream-ordered calls ask whether their stream is being captured.
pub fn captures_begun() {
    CAPTURES.store(true, Ordering::Relaxed);
}

/// Runs `job` (questions to CUDA of the shim's own) only while no stream capture is under way
/// or a device reset, and keeps a capture from beginning meanwhile: the capture hooks wait for
/// the sweep lock, as for the sealer's checkpoints.
fn outside_captures(job: &mut dyn FnMut()) {
    let _sweep = super::sealer::SWEEP.lock();
    if !pool_quiet() {
        job();
    }
}

static POOL_QUESTIONS: AtomicBool = AtomicBool::new(false);

/// The program allocates stream-ordered: the device-memory sampler may ask CUDA's pools what
/// they hold, outside captures (a load per call once done).
pub fn allow_pool_questions() {
    if !POOL_QUESTIONS.load(Ordering::Relaxed) && !POOL_QUESTIONS.swap(true, Ordering::AcqRel) {
        crate::trace::device_memory::ask_pools_through(outside_captures);
    }
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
/// Captures begun while the table was full: counted in `CAPTURE_COUNT`, and taken off when a
/// capture CUDA ended is not in the table, so a 65th capture never leaves the pool quiet.
static OVERFLOW: AtomicUsize = AtomicUsize::new(0);
/// Device resets under way: the device's memory, streams and events go away, so the pool stays
/// quiet (records, queries and frees nothing) until it has forgotten them.
static RESETS: AtomicUsize = AtomicUsize::new(0);

/// Whether a stream capture is under way anywhere in the process (contract 7). While one is,
/// the pool records no event, queries or waits for none, frees no device memory and
/// synchronizes nothing; its own allocations run in relaxed capture mode.
pub fn capture_active() -> bool {
    CAPTURE_COUNT.load(Ordering::Acquire) > 0
}

/// Whether the pool must make no call of its own now: a capture is under way, or a device
/// reset is taking the memory, streams and events away.
pub(super) fn pool_quiet() -> bool {
    capture_active() || RESETS.load(Ordering::Acquire) > 0
}

/// Whether the pool, though quiet, may give a whole segment back to make room: only for a
/// capture, never during a device reset (the memory is going away under it).
pub(super) fn release_while_quiet() -> bool {
    RESETS.load(Ordering::Acquire) == 0
}

/// A device reset begins (`true`) or is over (`false`).
pub(super) fn resetting(begins: bool) {
    if begins {
        RESETS.fetch_add(1, Ordering::AcqRel);
    } else {
        let _ = RESETS.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
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
    OVERFLOW.fetch_add(1, Ordering::AcqRel);
}

/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: an invalidated capture ends with it.
const ERROR_STREAM_CAPTURE_INVALIDATED: i32 = 901;

/// The program's end of the capture on `stream` answered `rc`. CUDA ended the capture with 0
/// (a graph) or 901 (invalidated); any other answer (908, the wrong thread; 401, no capture)
/// leaves a capture that was under way going, unless CUDA says the stream no longer captures.
pub fn capture_ended(stream: *mut c_void, per_thread_default: bool, rc: i32) {
    let ended = rc == 0 || rc == ERROR_STREAM_CAPTURE_INVALIDATED;
    if !ended && stream_capturing(capture_handle(stream, per_thread_default)) != Some(false) {
        return;
    }
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
    // Not in the table, yet CUDA ended a capture on it: one begun while the table was full.
    if ended
        && OVERFLOW
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    {
        let _ =
            CAPTURE_COUNT.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// The handle to ask CUDA about for a stream a call named: stream 0 of a per-thread entry point
/// (`_ptsz`) is the calling thread's default stream; the legacy stream (`None`) is never
/// captured.
fn capture_handle(stream: *mut c_void, per_thread_default: bool) -> Option<u64> {
    match stream as u64 {
        0 if per_thread_default => Some(STREAM_PER_THREAD),
        0 | STREAM_LEGACY => None,
        s => Some(s),
    }
}

/// What `cuStreamIsCapturing` says of `handle` (the per-thread handle names the calling
/// thread's stream): `None` when it cannot say.
fn stream_capturing(handle: Option<u64>) -> Option<bool> {
    let Some(handle) = handle else {
        return Some(false);
    };
    let f = real::function::<of::CuStreamIsCapturing>()?;
    let mut status = 0i32;
    // SAFETY: a stream handle the program passed to a stream call; a valid out-pointer.
    (unsafe { f(handle as usize, &mut status) } == 0).then_some(status != 0)
}

/// Drops captures that CUDA no longer reports (a capturing stream destroyed, say), so the pool
/// is never left quiet for good. Only tracked streams are asked; an untracked capture keeps the
/// pool quiet.
pub(super) fn forget_finished_captures() {
    if !capture_active() {
        return;
    }
    let Some(f) = real::function::<of::CuStreamIsCapturing>() else {
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
pub(super) fn set_relaxed_capture_mode() -> Option<i32> {
    let f = real::function::<of::CuThreadExchangeStreamCaptureMode>()?;
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: a valid in/out pointer; the exchange is legal at any time (checked on the GPU).
    (unsafe { f(&mut mode) } == 0).then_some(mode)
}

/// Runs `f` (the pool's own allocation calls) in relaxed capture mode while a capture is under
/// way, so CUDA never takes them for the program's and invalidates its graph.
pub(super) fn relaxed_if_capturing<R>(f: impl FnOnce() -> R) -> R {
    if !capture_active() {
        return f();
    }
    in_relaxed_mode(f)
}

/// Runs `f` in relaxed capture mode whatever is under way now: for the pool's frees, which a
/// capture another thread begins while one is on its way would otherwise refuse (900, and that
/// capture invalidated). In relaxed mode CUDA allows them during any capture (measured on the
/// GPU, `docs/cuda-facts.md`).
pub(super) fn in_relaxed_mode<R>(f: impl FnOnce() -> R) -> R {
    let old = set_relaxed_capture_mode();
    let r = f();
    if let Some(mut m) = old {
        if let Some(x) = real::function::<of::CuThreadExchangeStreamCaptureMode>() {
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
        let f = real::function::<of::CudaFree>()?;
        // SAFETY: as above.
        unsafe { f(core::ptr::null_mut()) }
    } else {
        let f = real::function::<of::CuMemFreeV2>()?;
        // SAFETY: freeing address 0 frees nothing.
        unsafe { f(0) }
    };
    (rc == crate::cuda::ffi::ERROR_STREAM_CAPTURE_UNSUPPORTED).then_some(rc)
}

/// Whether `stream` is being captured into a CUDA graph: stream-ordered calls on it become
/// graph memory nodes, owned by the graph, and must reach CUDA (a pool block handed to a graph
/// would be handed out again while every replay writes it). The per-thread default stream
/// (`cudaStreamPerThread`, or stream 0 of a `_ptsz` entry point) is asked as the calling
/// thread's; the legacy stream cannot be captured. Free until the process begins a capture.
/// When CUDA cannot say, the stream counts as captured: CUDA then answers the call itself.
pub fn capturing(stream: *mut c_void, per_thread_default: bool) -> bool {
    if !CAPTURES.load(Ordering::Relaxed) {
        return false;
    }
    let handle = capture_handle(stream, per_thread_default);
    handle.is_some() && stream_capturing(handle) != Some(false)
}

/// In a forked child: no capture or reset of the parent's is under way here.
pub(super) fn forget_after_fork() {
    for c in &CAPTURING {
        c.store(0, Ordering::Relaxed);
    }
    CAPTURE_COUNT.store(0, Ordering::Relaxed);
    OVERFLOW.store(0, Ordering::Relaxed);
    RESETS.store(0, Ordering::Relaxed);
}
