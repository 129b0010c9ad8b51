//! The CUDA contexts the pool serves: each gets a slot on first sight, named by the device it
//! is on; and how the pool calls the driver in a slot's context.

use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::os::SpinLock;
use crate::trace;
use core::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use gpushim_core::trace::format::DEVICE_UNKNOWN;

/// Contexts the pool serves; allocations in further contexts pass through.
pub const MAX_CONTEXTS: usize = 64;

pub(super) static CONTEXTS: [AtomicUsize; MAX_CONTEXTS] =
    [const { AtomicUsize::new(0) }; MAX_CONTEXTS];
static DEVICES: [AtomicU8; MAX_CONTEXTS] = [const { AtomicU8::new(DEVICE_UNKNOWN) }; MAX_CONTEXTS];
static REGISTERING: SpinLock = SpinLock::new();

/// The current context of the calling thread, if any.
pub fn current_context() -> Option<usize> {
    let f = real::function::<of::CuCtxGetCurrent>()?;
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

pub(super) fn slot_of(ctx: usize) -> Option<u8> {
    for (i, c) in CONTEXTS.iter().enumerate() {
        match c.load(Ordering::Acquire) {
            x if x == ctx => return Some(i as u8),
            0 => return register(ctx),
            _ => {}
        }
    }
    None
}

/// The slot of `ctx` if it has one (never registers).
pub(super) fn registered_slot(ctx: usize) -> Option<u8> {
    CONTEXTS
        .iter()
        .take_while(|c| c.load(Ordering::Acquire) != 0)
        .position(|c| c.load(Ordering::Acquire) == ctx)
        .map(|i| i as u8)
}

#[cold]
fn register(ctx: usize) -> Option<u8> {
    // The context is current on this thread, so it names its device.
    let device = trace::driver_device();
    let held = REGISTERING.lock();
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
    drop(held);
    found
}

/// The device ordinal of a slot, for the trace.
pub fn device_of(slot: u8) -> u8 {
    DEVICES[slot as usize].load(Ordering::Relaxed)
}

/// The context handle of `slot`.
pub(super) fn context_handle(slot: u8) -> usize {
    CONTEXTS[slot as usize].load(Ordering::Acquire)
}

/// Runs `f` with `slot`'s context current.
pub(super) fn in_context<R>(slot: u8, f: impl FnOnce() -> R) -> R {
    let target = CONTEXTS[slot as usize].load(Ordering::Acquire);
    if current_context() == Some(target) {
        return f();
    }
    let push = real::function::<of::CuCtxPushCurrentV2>();
    let pop = real::function::<of::CuCtxPopCurrentV2>();
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

/// In a forked child: a registration the fork interrupted is over.
pub(super) fn forget_after_fork() {
    REGISTERING.reset_after_fork();
}

/// Frees segments the engine gave back (outside the pool's lock, or while retrying under it),
/// in relaxed capture mode: a capture that another thread begins while a free is on its way
/// can neither refuse it nor be invalidated by it. Returns the segments whose free failed for a
/// capture under way (the pool keeps them and tries again); CUDA shutting down at exit is no
/// failure; any other means CUDA no longer has the memory (its context was reset or destroyed),
/// said once.
pub fn free_segments(segments: &[(u8, u64)]) -> Vec<(u8, u64)> {
    let mut kept = Vec::new();
    let Some(free) = real::function::<of::CuMemFreeV2>() else {
        return kept;
    };
    super::capture::in_relaxed_mode(|| {
        for &(slot, ptr) in segments {
            let rc = crate::costs::measure(crate::costs::Cost::Release, || {
                // SAFETY: a segment the pool reserved with cuMemAlloc_v2 and no longer hands
                // out; freed once, in its context.
                in_context(slot, || unsafe { free(ptr) })
            });
            match rc {
                0 => {}
                // The capture family (900 to 909): the memory is still ours; later.
                900..=909 => kept.push((slot, ptr)),
                // CUDA_ERROR_DEINITIALIZED: CUDA is shutting down at the process's exit (a
                // free from an exit handler or a static destructor that runs after CUDA's own
                // teardown) and takes every segment with it: nothing to say.
                4 => {}
                _ => said_release_failed(rc),
            }
        }
    });
    kept
}

#[cold]
fn said_release_failed(rc: i32) {
    static SAID: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::os::say(format_args!(
            "cuMemFree of a segment the pool gave back answered {rc}: CUDA no longer holds it \
             (its context was reset or destroyed)"
        ));
    }
}
