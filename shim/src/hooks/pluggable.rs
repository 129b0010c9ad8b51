//! PyTorch's pluggable-allocator entry points (`gpushim_alloc`, `gpushim_free`) and the pool's
//! figures for `torch.cuda.memory_stats` under `gpushim run --pluggable`.

use crate::costs::Cost;
use crate::cuda::ffi::ERROR_INVALID_VALUE;
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::guard::Guard;
use crate::hooks::serve;
use crate::os::say;
use crate::pool::{self};
use crate::state;
use core::ffi::{c_int, c_void};
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN};

use crate::cuda::symbols::sig::Stream;

/// PyTorch's pluggable allocator, allocation side:
/// `torch.cuda.memory.CUDAPluggableAllocator("libgpushim.so", "gpushim_alloc", "gpushim_free")`.
/// Serves `size` bytes on the current device for use on `stream`; null on failure (PyTorch
/// then reports out of memory).
///
/// # Safety
/// Called by PyTorch with the device current.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushim_alloc(size: isize, device: c_int, stream: Stream) -> *mut c_void {
    let _ = device;
    if size <= 0 {
        return core::ptr::null_mut();
    }
    if !state::enabled() {
        // The off switch: CUDA's own allocation, nothing pooled or written.
        return plain_alloc(size as usize);
    }
    let guard = Guard::enter();
    let t0 = crate::costs::start();
    pool::plug();
    // Without a context (made here, as cudaMalloc would) the pool passes, answered below as
    // out of memory: PyTorch then reports it.
    let key = pool::stream_key(stream, false, Api::Pluggable);
    let (rc, ptr, dev) = serve::allocated(pool::alloc(size as u64, key, true)).unwrap_or((
        crate::cuda::ffi::ERROR_OUT_OF_MEMORY,
        0,
        DEVICE_UNKNOWN,
    ));
    let (api, size) = (Api::Pluggable, size as u64);
    let e = crate::trace::Event::alloc_async(api, rc, ptr, size, dev, stream as u64);
    serve::answered(Cost::Malloc, t0, guard.records(), e);
    ptr as *mut c_void
}

/// PyTorch's pluggable allocator, free side (the four-argument C++ signature): the block is
/// reusable at once on `stream` and elsewhere once `stream` caught up.
///
/// # Safety
/// `ptr` must come from `gpushim_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushim_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: Stream,
) {
    let _ = (size, device);
    if ptr.is_null() {
        return;
    }
    if !state::enabled() {
        plain_free(ptr);
        return;
    }
    let guard = Guard::enter();
    let t0 = crate::costs::start();
    let key = pool::stream_key(stream, false, Api::Pluggable);
    // Not the pool's, or not live: refused as an invalid value.
    let (rc, dev) = serve::freed(pool::free(ptr as u64, FreeKind::OnStream(key)))
        .filter(|&(rc, _)| rc == 0)
        .unwrap_or((ERROR_INVALID_VALUE, DEVICE_UNKNOWN));
    let api = Api::Pluggable;
    let e = crate::trace::Event::free_async(api, rc, ptr as u64, dev, stream as u64);
    serve::answered(Cost::Free, t0, guard.records(), e);
    if rc != 0 && state::enabled() {
        say(format_args!(
            "gpushim_free: {ptr:p} is not a live block of the pool; ignored"
        ));
    }
}

/// The pool's figures for CUDA device `device`, for `gpushim run --pluggable`, which shows them
/// through `torch.cuda.memory_stats` (PyTorch's pluggable allocator keeps none): writes up to
/// `len` of the 22 numbers `DeviceStats::to_array` lists into `out` and returns how many; -1
/// without a pool, for a device number outside 0..=255, or a null `out`.
///
/// # Safety
/// `out` must be valid for writing `len` u64 values.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpushim_device_stats(device: c_int, out: *mut u64, len: usize) -> c_int {
    let Ok(device) = u8::try_from(device) else {
        return -1;
    };
    if out.is_null() || !state::enabled() {
        return -1;
    }
    let _guard = Guard::enter();
    let Some(stats) = pool::device_stats(device) else {
        return -1;
    };
    let figures = stats.to_array();
    let n = len.min(figures.len());
    // SAFETY: the caller gave `out` room for `len` values and `n <= len`.
    unsafe { core::ptr::copy_nonoverlapping(figures.as_ptr(), out, n) };
    n as c_int
}

/// Resets device `device`'s figures: their peaks to their values now (`what` 1, as
/// `torch.cuda.reset_peak_memory_stats`) or their totals and refusal counts to 0 (`what` 2, as
/// `torch.cuda.reset_accumulated_memory_stats`). 0 when done, -1 without a pool or for another
/// `what` or device number.
#[unsafe(no_mangle)]
pub extern "C" fn gpushim_reset_device_stats(device: c_int, what: c_int) -> c_int {
    let Ok(device) = u8::try_from(device) else {
        return -1;
    };
    if !(1..=2).contains(&what) || !state::enabled() {
        return -1;
    }
    let _guard = Guard::enter();
    if pool::reset_device_stats(device, what == 1) {
        0
    } else {
        -1
    }
}

/// `cudaMalloc` itself, for the pluggable route under `GPUSHIM_DISABLE=1`; null on failure.
fn plain_alloc(size: usize) -> *mut c_void {
    let _guard = Guard::enter();
    let Some(f) = real::function::<of::CudaMalloc>() else {
        return core::ptr::null_mut();
    };
    let mut p = core::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    if unsafe { f(&mut p, size) } == 0 {
        p
    } else {
        core::ptr::null_mut()
    }
}

/// `cudaFree` itself, for the pluggable route under `GPUSHIM_DISABLE=1`.
fn plain_free(p: *mut c_void) {
    let _guard = Guard::enter();
    if let Some(f) = real::function::<of::CudaFree>() {
        // SAFETY: `p` came from `plain_alloc`.
        unsafe { f(p) };
    }
}

/// Gives every idle cached segment of the current device back (what `empty_cache` does).
#[unsafe(no_mangle)]
pub extern "C" fn gpushim_empty_cache() {
    let _guard = Guard::enter();
    pool::empty_cache();
}
