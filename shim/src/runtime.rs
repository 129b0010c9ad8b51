//! Hooks for the CUDA runtime API (`libcudart`). Each forwards to the real function and records
//! one event; results and out-pointers are exactly the real function's.

use crate::ffi::ERROR_INVALID_VALUE;
use crate::ffi::{CUDA_ERROR_INSUFFICIENT_DRIVER as MISSING, CudaExtent, CudaPitchedPtr};
use crate::hook::{exported_hook, forward, out_ptr, out_usize};
use crate::pool::{self, Freed, Served};
use crate::symbols::Sym;
use crate::trace::{self, runtime_device};
use core::ffi::c_void;
use gpushim_core::engine::FreeKind;
use gpushim_core::format::{Api, DEVICE_UNKNOWN, RecordKind};

type Stream = *mut c_void;

exported_hook!(cudaMalloc = CudaMalloc, CudaMalloc => malloc(p: *mut *mut c_void, size: usize));
exported_hook!(cudaFree = CudaFree, CudaFree => free(p: *mut c_void));
exported_hook!(cudaMallocAsync = CudaMallocAsync, CudaMallocAsync
    => malloc_async(p: *mut *mut c_void, size: usize, s: Stream));
exported_hook!(cudaMallocAsync_ptsz = CudaMallocAsyncPtsz, CudaMallocAsyncPtsz
    => malloc_async(p: *mut *mut c_void, size: usize, s: Stream));
exported_hook!(cudaFreeAsync = CudaFreeAsync, CudaFreeAsync => free_async(p: *mut c_void, s: Stream));
exported_hook!(cudaFreeAsync_ptsz = CudaFreeAsyncPtsz, CudaFreeAsyncPtsz
    => free_async(p: *mut c_void, s: Stream));
exported_hook!(cudaMallocFromPoolAsync = CudaMallocFromPoolAsync, CudaMallocFromPoolAsync
    => malloc_from_pool(p: *mut *mut c_void, size: usize, pool: *mut c_void, s: Stream));
exported_hook!(cudaMallocFromPoolAsync_ptsz = CudaMallocFromPoolAsyncPtsz, CudaMallocFromPoolAsyncPtsz
    => malloc_from_pool(p: *mut *mut c_void, size: usize, pool: *mut c_void, s: Stream));
exported_hook!(cudaMallocManaged = CudaMallocManaged, CudaMallocManaged
    => malloc_managed(p: *mut *mut c_void, size: usize, flags: u32));
exported_hook!(cudaMallocHost = CudaMallocHost, CudaMallocHost
    => malloc_host(p: *mut *mut c_void, size: usize));
exported_hook!(cudaHostAlloc = CudaHostAlloc, CudaHostAlloc
    => host_alloc(p: *mut *mut c_void, size: usize, flags: u32));
exported_hook!(cudaFreeHost = CudaFreeHost, CudaFreeHost => free_host(p: *mut c_void));
exported_hook!(cudaMallocPitch = CudaMallocPitch, CudaMallocPitch
    => malloc_pitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize));
exported_hook!(cudaMalloc3D = CudaMalloc3D, CudaMalloc3D
    => malloc_3d(p: *mut CudaPitchedPtr, extent: CudaExtent));
exported_hook!(cudaMemGetInfo = CudaMemGetInfo, CudaMemGetInfo
    => mem_get_info(free: *mut usize, total: *mut usize));

unsafe fn malloc(sym: Sym, real: usize, api: Api, p: *mut *mut c_void, size: usize) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && !p.is_null() && size > 0 && pool::active() {
            // SAFETY: `p` is the caller's out-pointer.
            if let Some(rc) = unsafe { pooled_alloc(api, p, size, pool::SYNC_KEY, 0) } {
                return rc;
            }
        }
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            trace::record(
                RecordKind::Alloc,
                api,
                rc,
                ptr,
                size as u64,
                runtime_device(),
                0,
            );
        }
        rc
    })
}

unsafe fn free(sym: Sym, real: usize, api: Api, p: *mut c_void) -> i32 {
    type F = unsafe extern "C" fn(*mut c_void) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && pool::pooling() && !p.is_null() {
            // SAFETY: only reached with the guard held.
            if let Some(rc) = unsafe { pooled_free(RecordKind::Free, api, p, FreeKind::Sync, 0) } {
                return rc;
            }
        }
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p) };
        if rec {
            trace::record(RecordKind::Free, api, rc, p as u64, 0, DEVICE_UNKNOWN, 0);
        }
        rc
    })
}

/// Serves a runtime allocation from the pool; `None` when the pool passes it to the real
/// function. An out-of-memory answer leaves `*p` null and the runtime's last error set, as
/// the real call would.
///
/// # Safety
/// `p` must be valid for writes.
unsafe fn pooled_alloc(
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    key: u64,
    stream: u64,
) -> Option<i32> {
    let kind = if key == pool::SYNC_KEY {
        RecordKind::Alloc
    } else {
        RecordKind::AllocAsync
    };
    if key == pool::SYNC_KEY
        && let Some(rc) = pool::capture_forbids(true)
    {
        // CUDA refused it for a capture under way (and invalidated that capture), as it
        // would have refused the program's own call.
        trace::record(kind, api, rc, 0, size as u64, DEVICE_UNKNOWN, stream);
        return Some(rc);
    }
    match pool::alloc(size as u64, key, true) {
        Served::Granted(ptr, d) => {
            // SAFETY: the caller vouches for `p`.
            unsafe { *p = ptr as *mut c_void };
            trace::record(kind, api, 0, ptr, size as u64, d, stream);
            Some(0)
        }
        Served::Failed(code, d) => {
            // SAFETY: the caller vouches for `p`.
            unsafe { *p = core::ptr::null_mut() };
            set_last_error_out_of_memory();
            trace::record(kind, api, code, 0, size as u64, d, stream);
            Some(code)
        }
        Served::Pass => None,
    }
}

/// Gives a block back to the pool; `None` when `p` is not pooled memory (the real function
/// answers). An interior or already freed pooled pointer fails with `cudaErrorInvalidValue`
/// and sets the last error, as CUDA does.
///
/// # Safety
/// The re-entrancy guard must be held (the last error is set through the real runtime).
unsafe fn pooled_free(
    kind: RecordKind,
    api: Api,
    p: *mut c_void,
    how: FreeKind,
    stream: u64,
) -> Option<i32> {
    if how == FreeKind::Sync
        && let Some(rc) = pool::capture_forbids(true)
    {
        trace::record(kind, api, rc, p as u64, 0, DEVICE_UNKNOWN, stream);
        return Some(rc);
    }
    let rc = match pool::free(p as u64, how) {
        Freed::Done(d) => {
            trace::record(kind, api, 0, p as u64, 0, d, stream);
            return Some(0);
        }
        Freed::Invalid => ERROR_INVALID_VALUE,
        Freed::NotOurs => return None,
    };
    set_last_error_invalid_value();
    trace::record(kind, api, rc, p as u64, 0, DEVICE_UNKNOWN, stream);
    Some(rc)
}

/// Makes `cudaGetLastError` report `cudaErrorInvalidValue` once, as after a real `cudaFree`
/// of a pointer CUDA does not know: by making one, with a host address.
fn set_last_error_invalid_value() {
    type G = unsafe extern "C" fn(*mut c_void) -> i32;
    // SAFETY: cudaFree has the ABI G.
    if let Some(g) = unsafe { crate::real::as_fn::<G>(crate::real::exported(Sym::CudaFree)) } {
        let mut host = 0u64;
        // SAFETY: a host address is never device memory; CUDA answers 1 and frees nothing.
        unsafe { g((&raw mut host).cast()) };
    }
}

/// Makes `cudaGetLastError` report `cudaErrorMemoryAllocation` once, exactly as after a real
/// failed `cudaMalloc`: by making one (1 PiB, which no device has). The re-entrancy guard is
/// held, so the call is neither pooled nor recorded.
fn set_last_error_out_of_memory() {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;
    // SAFETY: cudaMalloc has the ABI F.
    if let Some(f) = unsafe { crate::real::as_fn::<F>(crate::real::exported(Sym::CudaMalloc)) } {
        let mut q = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; the call fails and allocates nothing.
        let rc = unsafe { f(&mut q, 1 << 50) };
        if rc == 0 && !q.is_null() {
            type G = unsafe extern "C" fn(*mut c_void) -> i32;
            // SAFETY: cudaFree has the ABI G; frees what the unexpected success returned.
            if let Some(g) =
                unsafe { crate::real::as_fn::<G>(crate::real::exported(Sym::CudaFree)) }
            {
                unsafe { g(q) };
            }
        }
    }
}

unsafe fn malloc_async(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    s: Stream,
) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, Stream) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && !p.is_null() && size > 0 && pool::active() && !pool::capturing(s) {
            let key = pool::stream_key(s, sym == Sym::CudaMallocAsyncPtsz);
            // SAFETY: `p` is the caller's out-pointer.
            if let Some(rc) = unsafe { pooled_alloc(api, p, size, key, s as u64) } {
                return rc;
            }
        }
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size, s) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            trace::record(
                RecordKind::AllocAsync,
                api,
                rc,
                ptr,
                size as u64,
                d,
                s as u64,
            );
        }
        rc
    })
}

unsafe fn free_async(sym: Sym, real: usize, api: Api, p: *mut c_void, s: Stream) -> i32 {
    type F = unsafe extern "C" fn(*mut c_void, Stream) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && pool::pooling() && !p.is_null() && !pool::capturing(s) {
            let key = pool::stream_key(s, sym == Sym::CudaFreeAsyncPtsz);
            let kind = FreeKind::OnStream(key);
            // SAFETY: only reached with the guard held.
            if let Some(rc) = unsafe { pooled_free(RecordKind::FreeAsync, api, p, kind, s as u64) }
            {
                return rc;
            }
        }
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, s) };
        if rec {
            trace::record(
                RecordKind::FreeAsync,
                api,
                rc,
                p as u64,
                0,
                DEVICE_UNKNOWN,
                s as u64,
            );
        }
        rc
    })
}

unsafe fn malloc_from_pool(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    pool: *mut c_void,
    s: Stream,
) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, *mut c_void, Stream) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size, pool, s) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            trace::record(
                RecordKind::AllocAsync,
                api,
                rc,
                ptr,
                size as u64,
                d,
                s as u64,
            );
        }
        rc
    })
}

unsafe fn malloc_managed(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size, flags) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            let d = runtime_device();
            trace::record(RecordKind::ManagedAlloc, api, rc, ptr, size as u64, d, 0);
        }
        rc
    })
}

unsafe fn malloc_host(sym: Sym, real: usize, api: Api, p: *mut *mut c_void, size: usize) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            trace::record(
                RecordKind::HostAlloc,
                api,
                rc,
                ptr,
                size as u64,
                DEVICE_UNKNOWN,
                0,
            );
        }
        rc
    })
}

unsafe fn host_alloc(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    size: usize,
    flags: u32,
) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, size, flags) };
        if rec {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_ptr(p, rc) };
            trace::record(
                RecordKind::HostAlloc,
                api,
                rc,
                ptr,
                size as u64,
                DEVICE_UNKNOWN,
                0,
            );
        }
        rc
    })
}

unsafe fn free_host(sym: Sym, real: usize, api: Api, p: *mut c_void) -> i32 {
    type F = unsafe extern "C" fn(*mut c_void) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p) };
        if rec {
            trace::record(
                RecordKind::HostFree,
                api,
                rc,
                p as u64,
                0,
                DEVICE_UNKNOWN,
                0,
            );
        }
        rc
    })
}

unsafe fn malloc_pitch(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut *mut c_void,
    pitch: *mut usize,
    width: usize,
    height: usize,
) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, *mut usize, usize, usize) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, pitch, width, height) };
        if rec {
            // SAFETY: both out-pointers were written by the successful call.
            let (ptr, pitch) = unsafe { (out_ptr(p, rc), out_usize(pitch, rc)) };
            let size = pitch.saturating_mul(height as u64);
            trace::record(RecordKind::Alloc, api, rc, ptr, size, runtime_device(), 0);
        }
        rc
    })
}

unsafe fn malloc_3d(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut CudaPitchedPtr,
    extent: CudaExtent,
) -> i32 {
    type F = unsafe extern "C" fn(*mut CudaPitchedPtr, CudaExtent) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(p, extent) };
        if rec {
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
            trace::record(RecordKind::Alloc, api, rc, ptr, size, runtime_device(), 0);
        }
        rc
    })
}

unsafe fn mem_get_info(
    sym: Sym,
    real: usize,
    api: Api,
    free: *mut usize,
    total: *mut usize,
) -> i32 {
    type F = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(free, total) };
        if rec {
            // SAFETY: both out-pointers were written by the successful call.
            unsafe { pool::show_mem_info(api, rc, free, total, runtime_device()) };
        }
        rc
    })
}
