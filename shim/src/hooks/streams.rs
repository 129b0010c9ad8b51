//! Hooks the pool needs of streams, contexts and captures: which streams a checkpoint must
//! cover (created and destroyed), synchronizations that pass fences for free, captures begun
//! and ended (the pool stays quiet while one is under way), and device resets (the pool forgets
//! the context's memory).

use crate::cuda::ffi::{CU_ERROR_NOT_INITIALIZED as MISSING, CUDA_ERROR_INSUFFICIENT_DRIVER};
use crate::cuda::symbols::{Sym, sig};
use crate::hooks::Real;
use crate::pool::{self, holds_blocks};
use core::ffi::{c_int, c_void};
use gpushim_core::trace::format::DEVICE_UNKNOWN;

use crate::cuda::symbols::sig::Stream;

/// `cudaDeviceReset`: the current device's primary context is reset (see `pool::device_reset`).
/// The runtime may reach the driver's reset through our wrapper too; forgetting twice is
/// harmless.
pub(crate) unsafe fn device_reset(real: Real<sig::CudaDeviceReset>) -> i32 {
    real.forward(CUDA_ERROR_INSUFFICIENT_DRIVER, |f, _rec| {
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

pub(crate) unsafe fn primary_ctx_reset(
    real: Real<sig::CuDevicePrimaryCtxResetV2>,
    device: c_int,
) -> i32 {
    real.forward(MISSING, |f, _rec| {
        let ctx = pool::device_resetting(device);
        // SAFETY: the caller's argument, unchanged.
        let rc = unsafe { f(device) };
        if let Some(c) = ctx {
            pool::device_reset(c, rc);
        }
        rc
    })
}

pub(crate) unsafe fn begin_capture_v1(real: Real<sig::CuStreamBeginCapture>, s: Stream) -> i32 {
    let Real { sym, .. } = real;
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's argument, unchanged.
        pool::begin_capture(s, sym == Sym::CuStreamBeginCapturePtsz, || unsafe { f(s) })
    })
}

pub(crate) unsafe fn begin_capture(
    real: Real<sig::CuStreamBeginCaptureV2>,
    s: Stream,
    mode: c_int,
) -> i32 {
    let Real { sym, .. } = real;
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        pool::begin_capture(s, sym == Sym::CuStreamBeginCaptureV2Ptsz, || unsafe {
            f(s, mode)
        })
    })
}

pub(crate) unsafe fn end_capture(
    real: Real<sig::CuStreamEndCapture>,
    s: Stream,
    graph: *mut *mut c_void,
) -> i32 {
    let Real { sym, .. } = real;
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(s, graph) };
        pool::end_capture(s, sym == Sym::CuStreamEndCapturePtsz, rc);
        rc
    })
}

pub(crate) unsafe fn begin_capture_to_graph(
    real: Real<sig::CuStreamBeginCaptureToGraph>,
    s: Stream,
    graph: *mut c_void,
    deps: *const c_void,
    edges: *const c_void,
    n: usize,
    mode: c_int,
) -> i32 {
    let Real { sym, .. } = real;
    real.forward(MISSING, |f, _rec| {
        let ptds = sym == Sym::CuStreamBeginCaptureToGraphPtsz;
        // SAFETY: the caller's arguments, unchanged.
        pool::begin_capture(s, ptds, || unsafe { f(s, graph, deps, edges, n, mode) })
    })
}

pub(crate) unsafe fn stream_create(
    real: Real<sig::CuStreamCreate>,
    s: *mut Stream,
    flags: u32,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, _rec| {
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
    real: Real<sig::CuStreamCreateWithPriority>,
    s: *mut Stream,
    flags: u32,
    priority: c_int,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(s, flags, priority) };
        if rc == 0 && !s.is_null() && holds_blocks() {
            // SAFETY: written by the successful call.
            pool::stream_created(unsafe { *s } as u64, flags, api);
        }
        rc
    })
}

pub(crate) unsafe fn stream_destroy(real: Real<sig::CuStreamDestroyV2>, s: Stream) -> i32 {
    real.forward(MISSING, |f, _rec| {
        if holds_blocks() && !s.is_null() {
            pool::stream_destroying(s as u64);
        }
        // SAFETY: the caller's arguments, unchanged.
        unsafe { f(s) }
    })
}

pub(crate) unsafe fn ctx_synchronize(real: Real<sig::CuCtxSynchronize>) -> i32 {
    real.forward(MISSING, |f, _rec| {
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
