//! The driver entry-point lookups: `cuGetProcAddress{,_v2}` and
//! `cudaGetDriverEntryPoint{,ByVersion}{,_ptsz}`. After the real lookup succeeded, a memory
//! function whose ABI we know for the version and stream flavour asked for is handed out as our
//! wrapper; anything else (unknown names, older or newer ABIs) is returned untouched.

use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CUDA_ERROR_INSUFFICIENT_DRIVER, PROC_LEGACY_STREAM,
    PROC_PER_THREAD_STREAM,
};
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::cuda::symbols::{self, Sym, sig};
use crate::hooks::Real;
use crate::state;
use core::ffi::{CStr, c_char, c_int, c_void};

/// Replaces `*pfn` with our wrapper when the looked-up function is one we hook in exactly this
/// ABI. Allocates nothing.
///
/// # Safety
/// `symbol` must be null or NUL-terminated; `pfn` null or valid for reads and writes.
unsafe fn wrap(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, per_thread: bool) {
    if !state::enabled() || symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the caller vouches for `pfn`.
    let got = unsafe { *pfn } as usize;
    if got == 0 || real::in_this_library(got) {
        return;
    }
    // SAFETY: the caller vouches that `symbol` is NUL-terminated.
    let name = unsafe { CStr::from_ptr(symbol) };
    let Some(abi) = symbols::driver_abi(name, version, per_thread) else {
        return;
    };
    let Some(w) = super::proc_wrapper(abi) else {
        return;
    };
    if real::offer_proc(abi, got) {
        // SAFETY: as above.
        unsafe { *pfn = w as *mut c_void };
    }
}

/// A lookup through the real function at `real` (of type `F`): `call` makes it; when it
/// succeeded, the pointer it wrote is ours to wrap for `version()` and the stream flavour.
///
/// # Safety
/// `real` must be 0 or a function of type `F`; `symbol` and `pfn` as for [`wrap`].
unsafe fn lookup<F: Copy>(
    real: Real<F>,
    missing: i32,
    call: impl FnOnce(F) -> i32,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: impl FnOnce() -> i32,
    per_thread: bool,
) -> i32 {
    let Some(f) = real.f else {
        return state::missing(real.sym, missing);
    };
    let rc = call(f);
    if rc == 0 {
        // SAFETY: the real lookup accepted these pointers.
        unsafe { wrap(symbol, pfn, version(), per_thread) };
    }
    rc
}

/// `cuGetProcAddress` (the ABI before CUDA 12).
pub(crate) unsafe fn get_proc_address(
    real: Real<sig::CuGetProcAddress>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> i32 {
    // SAFETY: the caller's arguments, unchanged, to the function resolved for this symbol.
    let call = |f: sig::CuGetProcAddress| unsafe { f(symbol, pfn, version, flags) };
    let per_thread = flags & PROC_PER_THREAD_STREAM != 0;
    // SAFETY: `real` was resolved for this symbol; the pointers are the caller's.
    unsafe { lookup(real, MISSING, call, symbol, pfn, || version, per_thread) }
}

/// `cuGetProcAddress_v2` (CUDA 12 and later).
pub(crate) unsafe fn get_proc_address_v2(
    real: Real<sig::CuGetProcAddressV2>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> i32 {
    // SAFETY: the caller's arguments, unchanged, to the function resolved for this symbol.
    let call = |f: sig::CuGetProcAddressV2| unsafe { f(symbol, pfn, version, flags, status) };
    let per_thread = flags & PROC_PER_THREAD_STREAM != 0;
    // SAFETY: `real` was resolved for this symbol; the pointers are the caller's.
    unsafe { lookup(real, MISSING, call, symbol, pfn, || version, per_thread) }
}

/// The runtime's stream flavour for a lookup: per-thread when asked for, or by default from the
/// `_ptsz` entry point (what `--default-stream per-thread` code calls).
fn runtime_per_thread(flags: u64, ptsz_entry: bool) -> bool {
    flags & PROC_PER_THREAD_STREAM != 0 || (ptsz_entry && flags & PROC_LEGACY_STREAM == 0)
}

/// The CUDA version `cudaGetDriverEntryPoint` looks symbols up for: the runtime's own.
fn runtime_version() -> i32 {
    // SAFETY: resolved for cudaRuntimeGetVersion, whose ABI is F.
    let Some(f) = real::function::<of::CudaRuntimeGetVersion>() else {
        return 0;
    };
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    if unsafe { f(&mut v) } == 0 { v } else { 0 }
}

/// `cudaGetDriverEntryPoint{,_ptsz}`: the real lookup, then our wrapper for a function we hook
/// in the ABI of the runtime's version.
pub(crate) unsafe fn driver_entry_point(
    real: Real<sig::CudaGetDriverEntryPoint>,
    symbol: *const c_char,
    func: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> i32 {
    // SAFETY: the caller's arguments, unchanged (the `_ptsz` entry point has the same ABI).
    let call = |f: sig::CudaGetDriverEntryPoint| unsafe { f(symbol, func, flags, status) };
    let per_thread = runtime_per_thread(flags, real.sym == Sym::CudaGetDriverEntryPointPtsz);
    let missing = CUDA_ERROR_INSUFFICIENT_DRIVER;
    // SAFETY: `real` was resolved for this symbol; the pointers are the caller's.
    unsafe {
        lookup(
            real,
            missing,
            call,
            symbol,
            func,
            runtime_version,
            per_thread,
        )
    }
}

/// `cudaGetDriverEntryPointByVersion{,_ptsz}`: the same for the version asked for.
pub(crate) unsafe fn driver_entry_point_by_version(
    real: Real<sig::CudaGetDriverEntryPointByVersion>,
    symbol: *const c_char,
    func: *mut *mut c_void,
    version: u32,
    flags: u64,
    status: *mut c_int,
) -> i32 {
    type F = sig::CudaGetDriverEntryPointByVersion;
    // SAFETY: the caller's arguments, unchanged (the `_ptsz` entry point has the same ABI).
    let call = |f: F| unsafe { f(symbol, func, version, flags, status) };
    let ptsz = real.sym == Sym::CudaGetDriverEntryPointByVersionPtsz;
    let per_thread = runtime_per_thread(flags, ptsz);
    let version = || i32::try_from(version).unwrap_or(i32::MAX);
    let missing = CUDA_ERROR_INSUFFICIENT_DRIVER;
    // SAFETY: `real` was resolved for this symbol; the pointers are the caller's.
    unsafe { lookup(real, missing, call, symbol, func, version, per_thread) }
}
