//! Pointer queries on pooled blocks (contract 2): a block answers with its own range, not its
//! segment's, so a caller can use what it gets.

use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
};
use crate::cuda::symbols::sig;
use crate::hooks::Real;
use crate::pool::{self, holds_blocks};
use core::ffi::{c_int, c_void};

pub(crate) unsafe fn get_address_range(
    real: Real<sig::CuMemGetAddressRangeV2>,
    base: *mut u64,
    size: *mut usize,
    p: u64,
) -> i32 {
    real.forward(MISSING, |f, _rec| {
        if holds_blocks()
            && let Some(b) = pool::lookup(p)
        {
            // The block, not the segment (or mapped page) it was cut from, is the caller's
            // allocation.
            // SAFETY: the caller's out-pointers (either may be null, as CUDA allows).
            unsafe {
                if !base.is_null() {
                    *base = b.ptr;
                }
                if !size.is_null() {
                    *size = b.requested as usize;
                }
            }
            return 0;
        }
        // SAFETY: the caller's arguments, unchanged.
        unsafe { f(base, size, p) }
    })
}

pub(crate) unsafe fn pointer_get_attribute(
    real: Real<sig::CuPointerGetAttribute>,
    data: *mut c_void,
    attr: c_int,
    p: u64,
) -> i32 {
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(data, attr, p) };
        if rc == 0 && !data.is_null() && holds_blocks() {
            // SAFETY: the real call wrote this attribute's value through `data`.
            unsafe { fix_attribute(attr, data, p) };
        }
        rc
    })
}

pub(crate) unsafe fn pointer_get_attributes(
    real: Real<sig::CuPointerGetAttributes>,
    n: u32,
    attrs: *const c_int,
    data: *mut *mut c_void,
    p: u64,
) -> i32 {
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(n, attrs, data, p) };
        if rc == 0 && !attrs.is_null() && !data.is_null() && holds_blocks() {
            for i in 0..n as usize {
                // SAFETY: the real call read `n` attributes and wrote `n` values.
                unsafe {
                    let d = *data.add(i);
                    if !d.is_null() {
                        fix_attribute(*attrs.add(i), d, p);
                    }
                }
            }
        }
        rc
    })
}

/// Replaces the segment's range with the block's in a pointer attribute the real call wrote.
///
/// # Safety
/// `data` must hold the value of `attr` as the real call wrote it.
unsafe fn fix_attribute(attr: c_int, data: *mut c_void, p: u64) {
    if attr != CU_POINTER_ATTRIBUTE_RANGE_START_ADDR && attr != CU_POINTER_ATTRIBUTE_RANGE_SIZE {
        return;
    }
    let Some(b) = pool::lookup(p) else {
        return;
    };
    // SAFETY: both attributes are written as 64-bit values (CUdeviceptr, size_t).
    unsafe {
        *(data as *mut u64) = if attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR {
            b.ptr
        } else {
            b.requested
        };
    }
}
