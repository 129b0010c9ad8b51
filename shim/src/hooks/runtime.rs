//! Hooks for the CUDA runtime API (`libcudart`) beyond what it shares with the driver
//! ([`super::memory`]): pinned host memory, pitched and 3D allocations. Each forwards to the
//! real function and records one event; results and out-pointers are exactly the real
//! function's.

use crate::cuda::ffi::{CUDA_ERROR_INSUFFICIENT_DRIVER as MISSING, CudaExtent, CudaPitchedPtr};
use crate::cuda::symbols::sig;
use crate::hooks::{Real, out_ptr, out_usize, recorded};
use crate::trace::Event;
use crate::trace::runtime_device;
use core::ffi::c_void;

pub(crate) unsafe fn malloc_host(
    real: Real<sig::CudaMallocHost>,
    p: *mut *mut c_void,
    size: usize,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            Event::host_alloc(api, rc, ptr, size as u64)
        })
    })
}

pub(crate) unsafe fn malloc_pitch(
    real: Real<sig::CudaMallocPitch>,
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, pitch, width, height) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: both out-pointers were written by the successful call.
            let (ptr, pitch) = unsafe { (out_ptr(p, rc), out_usize(pitch, rc)) };
            let size = pitch.saturating_mul(height as u64);
            Event::alloc(api, rc, ptr, size, runtime_device())
        })
    })
}

pub(crate) unsafe fn malloc_3d(
    real: Real<sig::CudaMalloc3D>,
    p: *mut CudaPitchedPtr,
    extent: CudaExtent,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, extent) }
        };
        recorded(rec, call, |rc| {
            let (ptr, size) = if rc == 0 && !p.is_null() {
                // SAFETY: the successful call filled `*p`.
                let pp = unsafe { &*p };
                let size = (pp.pitch as u64)
                    .saturating_mul(extent.height as u64)
                    .saturating_mul(extent.depth as u64);
                (pp.ptr as u64, size)
            } else {
                (0, 0)
            };
            Event::alloc(api, rc, ptr, size, runtime_device())
        })
    })
}
