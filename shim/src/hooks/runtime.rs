//! Hooks for the CUDA runtime API (`libcudart`). Each forwards to the real function and records
//! one event; results and out-pointers are exactly the real function's.

use crate::cuda::ffi::{CUDA_ERROR_INSUFFICIENT_DRIVER as MISSING, CudaExtent, CudaPitchedPtr};
use crate::cuda::symbols::{Sym, sig};
use crate::hooks::serve::{self, Family::Runtime as RUNTIME};
use crate::hooks::torch;
use crate::hooks::{forward, out_ptr, out_usize, recorded};
use crate::pool;
use crate::trace::runtime_device;
use core::ffi::c_void;
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN, RecordKind};

use crate::cuda::symbols::sig::Stream;

pub(crate) unsafe fn malloc(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
) -> i32 {
    type F = sig::CudaMalloc;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && !p.is_null() && size > 0 && pool::active() {
            if let Some((rc, ptr)) = serve::alloc(RUNTIME, api, size, pool::SYNC_KEY, 0) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = ptr as *mut c_void };
                if rc == 0 {
                    torch::after_device_alloc(ptr, size as u64);
                }
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        let rc = recorded(rec, RecordKind::Alloc, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            (ptr, size as u64, runtime_device())
        });
        if rec && rc == 0 {
            // SAFETY: `p` was written by the successful call.
            torch::after_device_alloc(unsafe { out_ptr(p, rc) }, size as u64);
        }
        rc
    })
}

pub(crate) unsafe fn free(sym: Sym, real: usize, api: Api, p: *mut c_void) -> i32 {
    type F = sig::CudaFree;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && pool::pooling() && !p.is_null() {
            if let Some(rc) =
                serve::free(RUNTIME, RecordKind::Free, api, p as u64, FreeKind::Sync, 0)
            {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p) }
        };
        recorded(rec, RecordKind::Free, api, 0, call, |_| {
            (p as u64, 0, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn malloc_async(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    s: Stream,
) -> i32 {
    type F = sig::CudaMallocAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec
            && !p.is_null()
            && size > 0
            && pool::active()
            && !pool::capturing(s, sym == Sym::CudaMallocAsyncPtsz)
        {
            let key = pool::stream_key(s, sym == Sym::CudaMallocAsyncPtsz, api);
            if let Some((rc, ptr)) = serve::alloc(RUNTIME, api, size, key, s as u64) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = ptr as *mut c_void };
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, s) }
        };
        recorded(rec, RecordKind::AllocAsync, api, s as u64, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            (ptr, size as u64, d)
        })
    })
}

pub(crate) unsafe fn free_async(sym: Sym, real: usize, api: Api, p: *mut c_void, s: Stream) -> i32 {
    type F = sig::CudaFreeAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec
            && pool::pooling()
            && !p.is_null()
            && !pool::capturing(s, sym == Sym::CudaFreeAsyncPtsz)
        {
            let key = pool::stream_key(s, sym == Sym::CudaFreeAsyncPtsz, api);
            let kind = FreeKind::OnStream(key);
            if let Some(rc) = serve::free(
                RUNTIME,
                RecordKind::FreeAsync,
                api,
                p as u64,
                kind,
                s as u64,
            ) {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, s) }
        };
        recorded(rec, RecordKind::FreeAsync, api, s as u64, call, |_| {
            (p as u64, 0, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn malloc_from_pool(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    s: Stream,
) -> i32 {
    type F = sig::CudaMallocFromPoolAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, pool, s) }
        };
        recorded(rec, RecordKind::AllocAsync, api, s as u64, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            (ptr, size as u64, d)
        })
    })
}

pub(crate) unsafe fn malloc_managed(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> i32 {
    type F = sig::CudaMallocManaged;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, flags) }
        };
        recorded(rec, RecordKind::ManagedAlloc, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            (ptr, size as u64, d)
        })
    })
}

pub(crate) unsafe fn malloc_host(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
) -> i32 {
    type F = sig::CudaMallocHost;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::HostAlloc, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            (ptr, size as u64, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn malloc_pitch(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> i32 {
    type F = sig::CudaMallocPitch;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, pitch, width, height) }
        };
        recorded(rec, RecordKind::Alloc, api, 0, call, |rc| {
            // SAFETY: both out-pointers were written by the successful call.
            let (ptr, pitch) = unsafe { (out_ptr(p, rc), out_usize(pitch, rc)) };
            let size = pitch.saturating_mul(height as u64);
            (ptr, size, runtime_device())
        })
    })
}

pub(crate) unsafe fn malloc_3d(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut CudaPitchedPtr,
    extent: CudaExtent,
) -> i32 {
    type F = sig::CudaMalloc3D;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, extent) }
        };
        recorded(rec, RecordKind::Alloc, api, 0, call, |rc| {
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
            (ptr, size, runtime_device())
        })
    })
}

pub(crate) unsafe fn mem_get_info(
    sym: Sym,
    real: usize,
    api: Api,
    free: *mut usize,
    total: *mut usize,
) -> i32 {
    type F = sig::CudaMemGetInfo;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(free, total) };
        if rec {
            // SAFETY: both out-pointers were written by the successful call.
            unsafe { crate::hooks::show_mem_info(api, rc, free, total, runtime_device()) };
        }
        rc
    })
}
