//! Hooks for the CUDA driver API (`libcuda`), each in two shells (see `hook::driver_hook`): the
//! exported symbol and the wrapper that entry-point lookups hand out.

use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CU_MEM_LOCATION_TYPE_DEVICE, CuMemAllocationPropHead,
};
use crate::cuda::symbols::{Sym, sig};
use crate::hooks::host::{free_host, host_alloc};
use crate::hooks::serve::{self, Family::Driver as DRIVER};
use crate::hooks::{driver_hook, forward, out_u64, out_usize, recorded};
use crate::pool;
use crate::trace::driver_device;
use core::ffi::c_void;
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN, RecordKind};

use crate::cuda::symbols::sig::Stream;

driver_hook!(cuMemAlloc_v2 / proc_cuMemAlloc_v2 = CuMemAllocV2, CuMemAlloc
    => mem_alloc(p: *mut u64, size: usize));
driver_hook!(cuMemFree_v2 / proc_cuMemFree_v2 = CuMemFreeV2, CuMemFree => mem_free(p: u64));
driver_hook!(cuMemAllocAsync / proc_cuMemAllocAsync = CuMemAllocAsync, CuMemAllocAsync
    => mem_alloc_async(p: *mut u64, size: usize, s: Stream));
driver_hook!(cuMemAllocAsync_ptsz / proc_cuMemAllocAsync_ptsz = CuMemAllocAsyncPtsz,
    CuMemAllocAsyncPtsz => mem_alloc_async(p: *mut u64, size: usize, s: Stream));
driver_hook!(cuMemFreeAsync / proc_cuMemFreeAsync = CuMemFreeAsync, CuMemFreeAsync
    => mem_free_async(p: u64, s: Stream));
driver_hook!(cuMemFreeAsync_ptsz / proc_cuMemFreeAsync_ptsz = CuMemFreeAsyncPtsz,
    CuMemFreeAsyncPtsz => mem_free_async(p: u64, s: Stream));
driver_hook!(cuMemAllocFromPoolAsync / proc_cuMemAllocFromPoolAsync = CuMemAllocFromPoolAsync,
    CuMemAllocFromPoolAsync
    => mem_alloc_from_pool(p: *mut u64, size: usize, pool: *mut c_void, s: Stream));
driver_hook!(cuMemAllocFromPoolAsync_ptsz / proc_cuMemAllocFromPoolAsync_ptsz
    = CuMemAllocFromPoolAsyncPtsz, CuMemAllocFromPoolAsyncPtsz
    => mem_alloc_from_pool(p: *mut u64, size: usize, pool: *mut c_void, s: Stream));
driver_hook!(cuMemAllocPitch_v2 / proc_cuMemAllocPitch_v2 = CuMemAllocPitchV2, CuMemAllocPitch
    => mem_alloc_pitch(p: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32));
driver_hook!(cuMemAllocManaged / proc_cuMemAllocManaged = CuMemAllocManaged, CuMemAllocManaged
    => mem_alloc_managed(p: *mut u64, size: usize, flags: u32));
driver_hook!(cuMemHostAlloc / proc_cuMemHostAlloc = CuMemHostAlloc, CuMemHostAlloc
    => host_alloc(p: *mut *mut c_void, size: usize, flags: u32));
driver_hook!(cuMemFreeHost / proc_cuMemFreeHost = CuMemFreeHost, CuMemFreeHost
    => free_host(p: *mut c_void));
driver_hook!(cuMemCreate / proc_cuMemCreate = CuMemCreate, CuMemCreate
    => mem_create(h: *mut u64, size: usize, prop: *const CuMemAllocationPropHead, flags: u64));
driver_hook!(cuMemRelease / proc_cuMemRelease = CuMemRelease, CuMemRelease
    => mem_release(h: u64));
driver_hook!(cuMemMap / proc_cuMemMap = CuMemMap, CuMemMap
    => mem_map(p: u64, size: usize, offset: usize, h: u64, flags: u64));
driver_hook!(cuMemUnmap / proc_cuMemUnmap = CuMemUnmap, CuMemUnmap
    => mem_unmap(p: u64, size: usize));
driver_hook!(cuMemAddressReserve / proc_cuMemAddressReserve = CuMemAddressReserve,
    CuMemAddressReserve
    => mem_address_reserve(p: *mut u64, size: usize, align: usize, addr: u64, flags: u64));
driver_hook!(cuMemAddressFree / proc_cuMemAddressFree = CuMemAddressFree, CuMemAddressFree
    => mem_address_free(p: u64, size: usize));
driver_hook!(cuMemSetAccess / proc_cuMemSetAccess = CuMemSetAccess, CuMemSetAccess
    => mem_set_access(p: u64, size: usize, desc: *const c_void, count: usize));
driver_hook!(cuMemGetInfo_v2 / proc_cuMemGetInfo_v2 = CuMemGetInfoV2, CuMemGetInfo
    => mem_get_info(free: *mut usize, total: *mut usize));

unsafe fn mem_alloc(sym: Sym, real: usize, api: Api, p: *mut u64, size: usize) -> i32 {
    type F = sig::CuMemAllocV2;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && !p.is_null() && size > 0 && pool::active() {
            if let Some((rc, ptr)) = serve::alloc(DRIVER, api, size, pool::SYNC_KEY, 0) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = ptr };
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::Alloc, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            (ptr, size as u64, driver_device())
        })
    })
}

unsafe fn mem_free(sym: Sym, real: usize, api: Api, p: u64) -> i32 {
    type F = sig::CuMemFreeV2;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && pool::pooling() && p != 0 {
            if let Some(rc) = serve::free(DRIVER, RecordKind::Free, api, p, FreeKind::Sync, 0) {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p) }
        };
        recorded(rec, RecordKind::Free, api, 0, call, |_| {
            (p, 0, DEVICE_UNKNOWN)
        })
    })
}

unsafe fn mem_alloc_async(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut u64,
    size: usize,
    s: Stream,
) -> i32 {
    type F = sig::CuMemAllocAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec
            && !p.is_null()
            && size > 0
            && pool::active()
            && !pool::capturing(s, sym == Sym::CuMemAllocAsyncPtsz)
        {
            let key = pool::stream_key(s, sym == Sym::CuMemAllocAsyncPtsz, api);
            if let Some((rc, ptr)) = serve::alloc(DRIVER, api, size, key, s as u64) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = ptr };
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, s) }
        };
        recorded(rec, RecordKind::AllocAsync, api, s as u64, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            let d = driver_device();
            (ptr, size as u64, d)
        })
    })
}

unsafe fn mem_free_async(sym: Sym, real: usize, api: Api, p: u64, s: Stream) -> i32 {
    type F = sig::CuMemFreeAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        if rec && pool::pooling() && p != 0 && !pool::capturing(s, sym == Sym::CuMemFreeAsyncPtsz) {
            let key = pool::stream_key(s, sym == Sym::CuMemFreeAsyncPtsz, api);
            let kind = FreeKind::OnStream(key);
            if let Some(rc) = serve::free(DRIVER, RecordKind::FreeAsync, api, p, kind, s as u64) {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, s) }
        };
        recorded(rec, RecordKind::FreeAsync, api, s as u64, call, |_| {
            (p, 0, DEVICE_UNKNOWN)
        })
    })
}

unsafe fn mem_alloc_from_pool(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut u64,
    size: usize,
    pool: *mut c_void,
    s: Stream,
) -> i32 {
    type F = sig::CuMemAllocFromPoolAsync;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, pool, s) }
        };
        recorded(rec, RecordKind::AllocAsync, api, s as u64, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            let d = driver_device();
            (ptr, size as u64, d)
        })
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn mem_alloc_pitch(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> i32 {
    type F = sig::CuMemAllocPitchV2;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, pitch, width, height, elem) }
        };
        recorded(rec, RecordKind::Alloc, api, 0, call, |rc| {
            // SAFETY: both out-pointers were written by the successful call.
            let (ptr, pitch) = unsafe { (out_u64(p, rc), out_usize(pitch, rc)) };
            let size = pitch.saturating_mul(height as u64);
            (ptr, size, driver_device())
        })
    })
}

unsafe fn mem_alloc_managed(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut u64,
    size: usize,
    flags: u32,
) -> i32 {
    type F = sig::CuMemAllocManaged;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, flags) }
        };
        recorded(rec, RecordKind::ManagedAlloc, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            let d = driver_device();
            (ptr, size as u64, d)
        })
    })
}

unsafe fn mem_create(
    sym: Sym,
    real: usize,
    api: Api,
    h: *mut u64,
    size: usize,
    prop: *const CuMemAllocationPropHead,
    flags: u64,
) -> i32 {
    type F = sig::CuMemCreate;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(h, size, prop.cast(), flags) }
        };
        recorded(rec, RecordKind::PhysCreate, api, 0, call, |rc| {
            // SAFETY: `h` was written by the successful call; `prop` was read by it.
            let handle = unsafe { out_u64(h, rc) };
            let device = if rc == 0 && !prop.is_null() {
                // SAFETY: the real call accepted `prop`, so it points to a valid struct.
                let pr = unsafe { &*prop };
                if pr.location_type == CU_MEM_LOCATION_TYPE_DEVICE
                    && (0..255).contains(&pr.location_id)
                {
                    pr.location_id as u8
                } else {
                    DEVICE_UNKNOWN
                }
            } else {
                DEVICE_UNKNOWN
            };
            (handle, size as u64, device)
        })
    })
}

unsafe fn mem_release(sym: Sym, real: usize, api: Api, h: u64) -> i32 {
    type F = sig::CuMemRelease;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(h) }
        };
        recorded(rec, RecordKind::PhysRelease, api, 0, call, |_| {
            (h, 0, DEVICE_UNKNOWN)
        })
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn mem_map(
    sym: Sym,
    real: usize,
    api: Api,
    p: u64,
    size: usize,
    offset: usize,
    h: u64,
    flags: u64,
) -> i32 {
    type F = sig::CuMemMap;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, offset, h, flags) }
        };
        let rc = recorded(rec, RecordKind::Map, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        });
        if rec && rc == 0 {
            crate::hooks::torch::after_map(p, size as u64);
        }
        rc
    })
}

unsafe fn mem_unmap(sym: Sym, real: usize, api: Api, p: u64, size: usize) -> i32 {
    type F = sig::CuMemUnmap;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::Unmap, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn mem_address_reserve(
    sym: Sym,
    real: usize,
    api: Api,
    p: *mut u64,
    size: usize,
    align: usize,
    addr: u64,
    flags: u64,
) -> i32 {
    type F = sig::CuMemAddressReserve;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, align, addr, flags) }
        };
        recorded(rec, RecordKind::AddressReserve, api, 0, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            (ptr, size as u64, DEVICE_UNKNOWN)
        })
    })
}

unsafe fn mem_address_free(sym: Sym, real: usize, api: Api, p: u64, size: usize) -> i32 {
    type F = sig::CuMemAddressFree;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::AddressFree, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn mem_set_access(
    sym: Sym,
    real: usize,
    api: Api,
    p: u64,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> i32 {
    type F = sig::CuMemSetAccess;
    forward!(sym, real, MISSING, F, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, desc, count) }
        };
        recorded(rec, RecordKind::SetAccess, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}

unsafe fn mem_get_info(
    sym: Sym,
    real: usize,
    api: Api,
    free: *mut usize,
    total: *mut usize,
) -> i32 {
    type F = sig::CuMemGetInfoV2;
    forward!(sym, real, MISSING, F, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(free, total) };
        if rec {
            // SAFETY: both out-pointers were written by the successful call.
            unsafe { crate::hooks::show_mem_info(api, rc, free, total, driver_device()) };
        }
        rc
    })
}
