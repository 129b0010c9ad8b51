//! Hooks for the CUDA driver API (`libcuda`) beyond what it shares with the runtime
//! ([`super::memory`]): pitched allocations and the virtual memory management functions. Each
//! is exported and handed out by entry-point lookups (`route`).

use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CU_MEM_LOCATION_TYPE_DEVICE, CuMemAllocationPropHead,
};
use crate::cuda::symbols::sig;
use crate::hooks::{Real, out_u64, out_usize, recorded};
use crate::trace::driver_device;
use core::ffi::c_void;
use gpushim_core::trace::format::{DEVICE_UNKNOWN, RecordKind};

pub(crate) unsafe fn mem_alloc_pitch(
    real: Real<sig::CuMemAllocPitchV2>,
    p: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: u32,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
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

pub(crate) unsafe fn mem_create(
    real: Real<sig::CuMemCreate>,
    h: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> i32 {
    // The allocation's properties begin with where it lives (the part the record needs).
    let prop = prop.cast::<CuMemAllocationPropHead>();
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
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

pub(crate) unsafe fn mem_release(real: Real<sig::CuMemRelease>, h: u64) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(h) }
        };
        recorded(rec, RecordKind::PhysRelease, api, 0, call, |_| {
            (h, 0, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn mem_map(
    real: Real<sig::CuMemMap>,
    p: u64,
    size: usize,
    offset: usize,
    h: u64,
    flags: u64,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
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

pub(crate) unsafe fn mem_unmap(real: Real<sig::CuMemUnmap>, p: u64, size: usize) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::Unmap, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn mem_address_reserve(
    real: Real<sig::CuMemAddressReserve>,
    p: *mut u64,
    size: usize,
    align: usize,
    addr: u64,
    flags: u64,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
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

pub(crate) unsafe fn mem_address_free(
    real: Real<sig::CuMemAddressFree>,
    p: u64,
    size: usize,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        recorded(rec, RecordKind::AddressFree, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}

pub(crate) unsafe fn mem_set_access(
    real: Real<sig::CuMemSetAccess>,
    p: u64,
    size: usize,
    desc: *const c_void,
    count: usize,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, desc, count) }
        };
        recorded(rec, RecordKind::SetAccess, api, 0, call, |_| {
            (p, size as u64, DEVICE_UNKNOWN)
        })
    })
}
