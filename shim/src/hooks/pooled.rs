//! Hooks the pool needs besides the allocation calls: stream lifetimes (which streams a
//! checkpoint must cover), context synchronizations (which pass fences for free), pointer
//! queries and IPC on pooled blocks (contract 2), and PyTorch's pluggable-allocator entry
//! points.

use crate::costs::Cost;
use crate::cuda::ffi::{
    CU_ERROR_NOT_INITIALIZED as MISSING, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CUDA_ERROR_INSUFFICIENT_DRIVER, ERROR_INVALID_VALUE,
};
use crate::cuda::real;
use crate::cuda::symbols::sig::of;
use crate::cuda::symbols::{Sym, sig};
use crate::guard::Guard;
use crate::hooks::{forward, serve};
use crate::os::say;
use crate::pool::ipc;
use crate::pool::{self, pooling};
use crate::state;
use crate::trace;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering};
use gpushim_core::config::Pool as PoolMode;
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN, RecordKind};

use crate::cuda::symbols::sig::Stream;

/// `cudaDeviceReset`: the current device's primary context is reset (see `pool::device_reset`).
/// The runtime may reach the driver's reset through our wrapper too; forgetting twice is
/// harmless.
pub(crate) unsafe fn device_reset(sym: Sym, real: usize, _: Api) -> i32 {
    type F = sig::CudaDeviceReset;
    forward!(sym, real, CUDA_ERROR_INSUFFICIENT_DRIVER, F, |f, _rec| {
        let device = crate::trace::runtime_device();
        let ctx = (device != DEVICE_UNKNOWN)
            .then(|| pool::device_resetting(i32::from(device)))
            .flatten();
        // SAFETY: no arguments.
        let rc = unsafe { f() };
        if let Some(c) = ctx {
            pool::device_reset(c, rc);
        }
        rc
    })
}

pub(crate) unsafe fn primary_ctx_reset(sym: Sym, real: usize, _: Api, device: c_int) -> i32 {
    type F = sig::CuDevicePrimaryCtxResetV2;
    forward!(sym, real, MISSING, F, |f, _rec| {
        let ctx = pool::device_resetting(device);
        // SAFETY: the caller's argument, unchanged.
        let rc = unsafe { f(device) };
        if let Some(c) = ctx {
            pool::device_reset(c, rc);
        }
        rc
    })
}

pub(crate) unsafe fn begin_capture_v1(sym: Sym, real: usize, _: Api, s: Stream) -> i32 {
    type F = sig::CuStreamBeginCapture;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's argument, unchanged.
        pool::begin_capture(s, sym == Sym::CuStreamBeginCapturePtsz, || unsafe { f(s) })
    })
}

pub(crate) unsafe fn begin_capture(sym: Sym, real: usize, _: Api, s: Stream, mode: c_int) -> i32 {
    type F = sig::CuStreamBeginCaptureV2;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        pool::begin_capture(s, sym == Sym::CuStreamBeginCaptureV2Ptsz, || unsafe {
            f(s, mode)
        })
    })
}

pub(crate) unsafe fn end_capture(
    sym: Sym,
    real: usize,
    _: Api,
    s: Stream,
    graph: *mut *mut c_void,
) -> i32 {
    type F = sig::CuStreamEndCapture;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(s, graph) };
        pool::end_capture(s, sym == Sym::CuStreamEndCapturePtsz, rc);
        rc
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn begin_capture_to_graph(
    sym: Sym,
    real: usize,
    _: Api,
    s: Stream,
    graph: *mut c_void,
    deps: *const c_void,
    edges: *const c_void,
    n: usize,
    mode: c_int,
) -> i32 {
    type F = sig::CuStreamBeginCaptureToGraph;
    forward!(sym, real, MISSING, F, |f, _rec| {
        let ptds = sym == Sym::CuStreamBeginCaptureToGraphPtsz;
        // SAFETY: the caller's arguments, unchanged.
        pool::begin_capture(s, ptds, || unsafe { f(s, graph, deps, edges, n, mode) })
    })
}

pub(crate) unsafe fn stream_create(
    sym: Sym,
    real: usize,
    api: Api,
    s: *mut Stream,
    flags: u32,
) -> i32 {
    type F = sig::CuStreamCreate;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(s, flags) };
        if rc == 0 && !s.is_null() && pooling() {
            // SAFETY: written by the successful call.
            pool::stream_created(unsafe { *s } as u64, flags, api);
        }
        rc
    })
}

pub(crate) unsafe fn stream_create_with_priority(
    sym: Sym,
    real: usize,
    api: Api,
    s: *mut Stream,
    flags: u32,
    priority: c_int,
) -> i32 {
    type F = sig::CuStreamCreateWithPriority;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(s, flags, priority) };
        if rc == 0 && !s.is_null() && pooling() {
            // SAFETY: written by the successful call.
            pool::stream_created(unsafe { *s } as u64, flags, api);
        }
        rc
    })
}

pub(crate) unsafe fn stream_destroy(sym: Sym, real: usize, _: Api, s: Stream) -> i32 {
    type F = sig::CuStreamDestroyV2;
    forward!(sym, real, MISSING, F, |f, _rec| {
        if pooling() && !s.is_null() {
            pool::stream_destroying(s as u64);
        }
        // SAFETY: the caller's arguments, unchanged.
        unsafe { f(s) }
    })
}

pub(crate) unsafe fn ctx_synchronize(sym: Sym, real: usize, _: Api) -> i32 {
    type F = sig::CuCtxSynchronize;
    forward!(sym, real, MISSING, F, |f, _rec| {
        let token = if pooling() {
            pool::synchronizing()
        } else {
            None
        };
        // SAFETY: no arguments.
        let rc = unsafe { f() };
        if rc == 0
            && let Some(t) = token
        {
            pool::synchronized(t);
        }
        rc
    })
}

pub(crate) unsafe fn get_address_range(
    sym: Sym,
    real: usize,
    _: Api,
    base: *mut u64,
    size: *mut usize,
    p: u64,
) -> i32 {
    type F = sig::CuMemGetAddressRangeV2;
    forward!(sym, real, MISSING, F, |f, _rec| {
        if pooling()
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
    sym: Sym,
    real: usize,
    _: Api,
    data: *mut c_void,
    attr: c_int,
    p: u64,
) -> i32 {
    type F = sig::CuPointerGetAttribute;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(data, attr, p) };
        if rc == 0 && !data.is_null() && pooling() {
            // SAFETY: the real call wrote this attribute's value through `data`.
            unsafe { fix_attribute(attr, data, p) };
        }
        rc
    })
}

pub(crate) unsafe fn pointer_get_attributes(
    sym: Sym,
    real: usize,
    _: Api,
    n: u32,
    attrs: *const c_int,
    data: *mut *mut c_void,
    p: u64,
) -> i32 {
    type F = sig::CuPointerGetAttributes;
    forward!(sym, real, MISSING, F, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(n, attrs, data, p) };
        if rc == 0 && !attrs.is_null() && !data.is_null() && pooling() {
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

static IPC_SAID: AtomicBool = AtomicBool::new(false);

fn ipc_refused(why: core::fmt::Arguments<'_>) -> i32 {
    if !IPC_SAID.swap(true, Ordering::Relaxed) {
        say(why);
    }
    ERROR_INVALID_VALUE
}

/// IPC export. A block that starts its segment gets the segment's real handle (the peer maps
/// the segment at the block's address); any other pooled block gets a ticket (see `ipc`).
pub(crate) unsafe fn ipc_get_mem_handle(
    sym: Sym,
    real: usize,
    _: Api,
    handle: *mut c_void,
    p: u64,
) -> i32 {
    type F = sig::CuIpcGetMemHandle;
    forward!(sym, real, MISSING, F, |f, rec| {
        let Some(b) = (if pooling() { pool::lookup(p) } else { None }) else {
            // SAFETY: the caller's arguments, unchanged.
            return unsafe { f(handle, p) };
        };
        if handle.is_null() {
            return ERROR_INVALID_VALUE;
        }
        let mut segment = [0u8; ipc::HANDLE];
        // SAFETY: `segment` has room for a handle; the segment is live memory of this context.
        let rc = unsafe { f(segment.as_mut_ptr().cast(), b.segment) };
        if rc != 0 {
            return if state::conf().pool == PoolMode::Expandable {
                ipc_refused(format_args!(
                    "IPC export of pooled memory is not possible with pool:expandable (CUDA \
                     cannot export its mappings through cuIpcGetMemHandle, error {rc}); use \
                     pool:caching"
                ))
            } else {
                rc
            };
        }
        let out = if b.ptr == b.segment {
            segment
        } else {
            match ipc::ticket(&segment, b.ptr, b.ptr - b.segment, b.requested) {
                Ok(t) => t,
                Err(ipc::TicketError::NoTable) => {
                    return ipc_refused(format_args!(
                        "IPC export of a pooled block inside a segment needs a ticket table in \
                         /dev/shm, which cannot be made here; refused (error 1). Run with \
                         GPUSHIM_CONF=pool:off to share such memory"
                    ));
                }
                Err(ipc::TicketError::Full) => {
                    return ipc_refused(format_args!(
                        "IPC export refused (error 1): this process has 65536 pooled blocks \
                         exported and not freed"
                    ));
                }
            }
        };
        // The segment is sealed before the handle leaves: freed, it goes back to CUDA.
        pool::seal(b.ptr);
        // SAFETY: the caller's handle buffer holds CU_IPC_HANDLE_SIZE bytes.
        unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), handle.cast::<u8>(), ipc::HANDLE) };
        if rec {
            trace::record(
                RecordKind::IpcExport,
                Api::Shim,
                0,
                p,
                b.requested,
                pool_device(),
                0,
            );
        }
        0
    })
}

use crate::cuda::ffi::CuIpcMemHandle as IpcHandle;

/// IPC import: tickets become the real handle plus an offset; every open goes through the
/// table so a segment is mapped once per context however many blocks of it are opened.
pub(crate) unsafe fn ipc_open(
    sym: Sym,
    real: usize,
    _: Api,
    out: *mut u64,
    h: IpcHandle,
    flags: u32,
) -> i32 {
    type F = sig::CuIpcOpenMemHandleV2;
    forward!(sym, real, MISSING, F, |f, rec| {
        if out.is_null() || !state::enabled() {
            // SAFETY: the caller's arguments, unchanged (GPUSHIM_DISABLE=1: a pure forward).
            return unsafe { f(out, h, flags) };
        }
        let (real_handle, offset) = match ipc::read(&h.0) {
            ipc::Named::Real => (h.0, 0),
            ipc::Named::Ticket(r, o) => (r, o),
            ipc::Named::Refused(code, why) => {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    say(format_args!(
                        "cuIpcOpenMemHandle: a gpushim ticket that cannot be opened: {why}; \
                         error {code} (said once)"
                    ));
                }
                return code;
            }
        };
        let opened = ipc::open(&real_handle, offset, |base| {
            // SAFETY: a valid out-pointer and a real handle, with the caller's flags.
            unsafe { f(base, IpcHandle(real_handle), flags) }
        });
        match opened {
            Ok(p) => {
                // SAFETY: checked non-null above.
                unsafe { *out = p };
                if rec {
                    trace::record(RecordKind::IpcOpen, Api::Shim, 0, p, 0, pool_device(), 0);
                }
                0
            }
            Err(rc) => rc,
        }
    })
}

pub(crate) unsafe fn ipc_close(sym: Sym, real: usize, _: Api, p: u64) -> i32 {
    type F = sig::CuIpcCloseMemHandle;
    forward!(sym, real, MISSING, F, |f, rec| {
        let rc = match ipc::close(p) {
            // SAFETY: the caller's argument, unchanged.
            ipc::Close::PassThrough => unsafe { f(p) },
            ipc::Close::Kept => 0,
            // SAFETY: the base this process opened and no returned pointer still uses.
            ipc::Close::Base(base) => unsafe { f(base) },
        };
        if rec && rc == 0 {
            trace::record(RecordKind::IpcClose, Api::Shim, 0, p, 0, pool_device(), 0);
        }
        rc
    })
}

fn pool_device() -> u8 {
    trace::driver_device()
}

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
    let (kind, api) = (RecordKind::AllocAsync, Api::Pluggable);
    let size = size as u64;
    serve::answered(
        Cost::Malloc,
        t0,
        guard.records(),
        kind,
        api,
        rc,
        ptr,
        size,
        dev,
        stream as u64,
    );
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
    let (kind, api) = (RecordKind::FreeAsync, Api::Pluggable);
    serve::answered(
        Cost::Free,
        t0,
        guard.records(),
        kind,
        api,
        rc,
        ptr as u64,
        0,
        dev,
        stream as u64,
    );
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
