//! Pinned host memory, the same hooks for the runtime and the driver: `cudaHostAlloc` and
//! `cuMemHostAlloc` take the same arguments, as do `cudaFreeHost` and `cuMemFreeHost`; only the
//! code answered when the real function is missing differs, and `sym` says which library it is.

use crate::cuda::ffi::{CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_INSUFFICIENT_DRIVER};
use crate::cuda::symbols::{Lib, Sym, sig};
use crate::hooks::{Real, out_ptr, recorded};
use crate::trace::Event;
use core::ffi::c_void;

/// What a hook answers when its library has no such function: what the runtime answers without
/// a driver, or what the driver answers before `cuInit`.
fn missing(sym: Sym) -> i32 {
    match sym.lib() {
        Lib::Runtime => CUDA_ERROR_INSUFFICIENT_DRIVER,
        Lib::Driver => CU_ERROR_NOT_INITIALIZED,
    }
}

/// `cudaHostAlloc` / `cuMemHostAlloc`.
///
/// # Safety
/// `real` was resolved for `sym` (either function: one ABI); the caller's arguments.
pub(crate) unsafe fn host_alloc(
    real: Real<sig::CudaHostAlloc>,
    p: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> i32 {
    let Real { sym, api, .. } = real;
    real.forward(missing(sym), |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, flags) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            Event::host_alloc(api, rc, ptr, size as u64)
        })
    })
}

/// `cudaFreeHost` / `cuMemFreeHost`.
///
/// # Safety
/// As [`host_alloc`].
pub(crate) unsafe fn free_host(real: Real<sig::CudaFreeHost>, p: *mut c_void) -> i32 {
    let Real { sym, api, .. } = real;
    real.forward(missing(sym), |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p) }
        };
        recorded(rec, call, |rc| Event::host_free(api, rc, p as u64))
    })
}
