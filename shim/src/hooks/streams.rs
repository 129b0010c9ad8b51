//! Hooks the pool needs of streams, contexts and captures: which streams a checkpoint must
//! cover (created and destroyed), synchronizations that pass fences for free, captures begun
//! and ended (the pool stays quiet while one is under way), and device resets (the pool forgets
//! the context's memory).

use crate::cuda::ffi::{CU_ERROR_NOT_INITIALIZED as MISSING, CUDA_ERROR_INSUFFICIENT_DRIVER};
use crate::cuda::symbols::{Sym, sig};
use crate::hooks::forward;
use crate::pool::{self, holds_blocks};
use core::ffi::{c_int, c_void};
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN};

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
        if rc == 0 && !s.is_null() && holds_blocks() {
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
        if rc == 0 && !s.is_null() && holds_blocks() {
            // SAFETY: written by the successful call.
            pool::stream_created(unsafe { *s } as u64, flags, api);
        }
        rc
    })
}

pub(crate) unsafe fn stream_destroy(sym: Sym, real: usize, _: Api, s: Stream) -> i32 {
    type F = sig::CuStreamDestroyV2;
    forward!(sym, real, MISSING, F, |f, _rec| {
        if holds_blocks() && !s.is_null() {
            pool::stream_destroying(s as u64);
        }
        // SAFETY: the caller's arguments, unchanged.
        unsafe { f(s) }
    })
}

pub(crate) unsafe fn ctx_synchronize(sym: Sym, real: usize, _: Api) -> i32 {
    type F = sig::CuCtxSynchronize;
    forward!(sym, real, MISSING, F, |f, _rec| {
        let token = if holds_blocks() {
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
