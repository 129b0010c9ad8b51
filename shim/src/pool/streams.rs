//! How the pool names streams: one key per stream, the legacy stream one per context, a
//! per-thread default stream one per thread; and whether the process ever left the legacy
//! stream.

use crate::cuda::ffi::{STREAM_LEGACY, STREAM_PER_THREAD};
use core::cell::Cell;
use core::ffi::c_void;
use core::sync::atomic::AtomicBool;

thread_local! {
    static PER_THREAD_KEY: Cell<u64> = const { Cell::new(0) };
}

/// The pool key of a stream handle, with no side effect (for the capture bookkeeping, which
/// runs while a capture begins and must call nothing).
pub fn stream_identity(stream: *mut c_void, per_thread_default: bool) -> u64 {
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
/// owner's work comes after the old owner's on the same stream.
pub(super) static OTHER_STREAMS: AtomicBool = AtomicBool::new(false);

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
