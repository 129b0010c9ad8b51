//! Hooks for the CUDA driver API (`libcuda`) beyond what it shares with the runtime
//! ([`super::memory`]): pitched allocations and the virtual memory management functions. Each
//! is exported and handed out by entry-point lookups (`route`).

use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CU_MEM_LOCATION_TYPE_DEVICE, CuMemAllocationPropHead,
};
use crate::cuda::symbols::sig;
use crate::hooks::{Real, out_u64, out_usize, recorded};
use crate::trace::Event;
use crate::trace::driver_device;
use core::ffi::c_void;
use gpushim_core::trace::format::DEVICE_UNKNOWN;

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
        recorded(rec, call, |rc| {
            // SAFETY: both out-pointers were written by the successful call.
            let (ptr, pitch) = unsafe { (out_u64(p, rc), out_usize(pitch, rc)) };
            let size = pitch.saturating_mul(height as u64);
            Event::alloc(api, rc, ptr, size, driver_device())
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
        recorded(rec, call, |rc| {
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
            Event::phys_create(api, rc, handle, size as u64, device)
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
        recorded(rec, call, |rc| Event::phys_release(api, rc, h))
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
        let rc = recorded(rec, call, |rc| Event::map(api, rc, p, size as u64));
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
        recorded(rec, call, |rc| Event::unmap(api, rc, p, size as u64))
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
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { out_u64(p, rc) };
            Event::address_reserve(api, rc, ptr, size as u64)
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
        recorded(rec, call, |rc| Event::address_free(api, rc, p, size as u64))
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
        recorded(rec, call, |rc| Event::set_access(api, rc, p, size as u64))
    })
}
