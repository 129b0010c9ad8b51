//! The pool's side of the allocation and free hooks, shared by the runtime and the driver: a
//! request the pool serves is answered and recorded here; one it passes goes to the real
//! function in the hook.

use crate::costs::{self, Cost};
use crate::cuda::ffi::ERROR_INVALID_VALUE;
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::os::say;
use crate::pool::{self, Freed, Served};
use crate::trace;
use core::sync::atomic::{AtomicBool, Ordering};
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN};

/// Which API asks. The runtime keeps a last error that a failed call sets (and
/// `cudaGetLastError` reports); the driver keeps none.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Runtime,
    Driver,
}

/// Serves an allocation from the pool: `Some((code, address))` when the pool answered (the
/// address is 0 unless the code is 0), `None` when the pool passes it to the real function.
/// A synchronous request (`key` is [`pool::SYNC_KEY`]) that CUDA would refuse during a capture
/// under way is refused the same way. For the runtime, a failure sets the last error as the
/// real call would. The re-entrancy guard must be held. Not inlined: the hooks' cost is
/// measured as this function's (`scripts/bench.sh cache`).
#[inline(never)]
pub fn alloc(family: Family, api: Api, size: usize, key: u64, stream: u64) -> Option<(i32, u64)> {
    let t0 = costs::start();
    let runtime = family == Family::Runtime;
    // What the answer is recorded as: a synchronous allocation, or one in stream order.
    let event = |rc: i32, ptr: u64, d: u8| {
        if key == pool::SYNC_KEY {
            trace::Event::alloc(api, rc, ptr, size as u64, d)
        } else {
            trace::Event::alloc_async(api, rc, ptr, size as u64, d, stream)
        }
    };
    if !runtime && pool::current_context().is_none() {
        // No context on this thread: CUDA's own answer (201), which no capture elsewhere
        // changes; asking CUDA about captures first would have been refused for them.
        return None;
    }
    if key == pool::SYNC_KEY
        && let Some(rc) = pool::capture_forbids(runtime)
    {
        // CUDA refused it for a capture under way (and invalidated that capture), as it
        // would have refused the program's own call.
        trace::record(event(rc, 0, DEVICE_UNKNOWN));
        explain_capture_refusal(api);
        return Some((rc, 0));
    }
    let (rc, ptr, d) = allocated(pool::alloc(size as u64, key, runtime))?;
    if rc != 0 && runtime {
        set_last_error_out_of_memory();
    }
    let e = event(rc, ptr, d);
    answered(Cost::Malloc, t0, true, e);
    Some((rc, ptr))
}

/// The pool's answer to an allocation as (code, address, device); `None` when it passes.
pub fn allocated(served: Served) -> Option<(i32, u64, u8)> {
    match served {
        Served::Granted(ptr, d) => Some((0, ptr, d)),
        Served::Failed(code, d) => Some((code, 0, d)),
        Served::Pass => None,
    }
}

/// The pool answered a request: recorded (when `record`, the guard's say), its cost counted
/// from `t0`. Every answer the pool gives, to the hooks and to PyTorch's pluggable entry
/// points, ends here.
pub fn answered(cost: Cost, t0: u64, record: bool, e: trace::Event) {
    if record {
        trace::record(e);
    }
    costs::end(cost, t0);
}

/// Says once per process why an allocation made during a capture failed: the program (often a
/// framework with its cache off, as under `gpushim run --per-tensor`) allocated synchronously
/// inside a capture, which CUDA refuses without the shim too.
#[cold]
fn explain_capture_refusal(api: Api) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        say(format_args!(
            "a {} during a CUDA graph capture was refused, as CUDA refuses it without the \
             shim (error 900; the capture is invalidated). PyTorch with its cache off \
             (PYTORCH_NO_CUDA_MEMORY_CACHING=1, gpushim run --per-tensor) does this when it \
             captures graphs: use gpushim run --pluggable for such programs",
            api.name()
        ));
    }
}

/// Gives a block back to the pool; `None` when `p` is not pooled memory (the real function
/// answers). An interior or already freed pooled pointer fails with the invalid-value code
/// (and, for the runtime, sets the last error), as CUDA does. The re-entrancy guard must be
/// held. Not inlined, as `alloc`.
#[inline(never)]
pub fn free(family: Family, api: Api, p: u64, how: FreeKind, stream: u64) -> Option<i32> {
    let t0 = costs::start();
    // What the answer is recorded as: a synchronous free, or one in stream order.
    let event = |rc: i32, d: u8| {
        if how == FreeKind::Sync {
            trace::Event::free(api, rc, p, d)
        } else {
            trace::Event::free_async(api, rc, p, d, stream)
        }
    };
    let runtime = family == Family::Runtime;
    if !runtime && pool::current_context().is_none() {
        return None;
    }
    if how == FreeKind::Sync
        && let Some(rc) = pool::capture_forbids(runtime)
    {
        trace::record(event(rc, DEVICE_UNKNOWN));
        return Some(rc);
    }
    let (rc, d) = freed(pool::free(p, how))?;
    if rc != 0 && runtime {
        set_last_error_invalid_value();
    }
    let e = event(rc, d);
    answered(Cost::Free, t0, true, e);
    Some(rc)
}

/// The pool's answer to a free as (code, device); `None` when the pointer is not the pool's.
pub fn freed(f: Freed) -> Option<(i32, u8)> {
    match f {
        Freed::Done(d) => Some((0, d)),
        Freed::Invalid => Some((ERROR_INVALID_VALUE, DEVICE_UNKNOWN)),
        Freed::NotOurs => None,
    }
}

/// Makes `cudaGetLastError` report `cudaErrorInvalidValue` once, as after a real `cudaFree`
/// of a pointer CUDA does not know: by making one, with a host address.
fn set_last_error_invalid_value() {
    if let Some(g) = real::function::<of::CudaFree>() {
        let mut host = 0u64;
        // SAFETY: a host address is never device memory; CUDA answers 1 and frees nothing.
        unsafe { g((&raw mut host).cast()) };
    }
}

/// Makes `cudaGetLastError` report `cudaErrorMemoryAllocation` once, exactly as after a real
/// failed `cudaMalloc`: by making one (1 PiB, which no device has). The re-entrancy guard is
/// held, so the call is neither pooled nor recorded.
fn set_last_error_out_of_memory() {
    if let Some(f) = real::function::<of::CudaMalloc>() {
        let mut q = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; the call fails and allocates nothing.
        let rc = unsafe { f(&mut q, 1 << 50) };
        if rc == 0 && !q.is_null() {
            if let Some(g) = real::function::<of::CudaFree>() {
                // SAFETY: `q` is the block the call above returned.
                unsafe { g(q) };
            }
        }
    }
}
