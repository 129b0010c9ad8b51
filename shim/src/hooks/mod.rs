//! The hooks' bodies, which the rows of [`crate::cuda::functions`] name: [`memory`] (the
//! memory calls the runtime and the driver share), [`runtime`] and [`driver`] (what only one
//! has), [`host`] (pinned host memory), for the pool [`streams`] (streams, contexts,
//! captures, resets), [`pointers`] (pointer queries) and [`ipc`], [`pluggable`] (PyTorch's
//! pluggable allocator), [`serve`] (a request the pool answers), [`torch`] (PyTorch's
//! allocator trace, its late frees held in [`requested`]) and [`nvtx`]; and what every hook
//! shares: find the real function, enter the re-entrancy guard, call, record.

pub mod driver;
pub mod graph;
pub mod host;
pub mod ipc;
pub mod memory;
pub mod nvtx;
pub mod pluggable;
pub mod pointers;
pub mod requested;
pub mod runtime;
pub mod serve;
pub mod streams;
pub mod torch;

use crate::cuda::symbols::{SigOf, Sym};
use crate::pool;
use crate::trace;
use core::ffi::c_void;
use gpushim_core::trace::format::Api;

/// What a hook's body is handed: the real function of its row, typed by the row's signature
/// (`None` when it cannot be found), the symbol it stands for and the trace API of its records.
/// The hook's shell makes it from the row ([`crate::route`]); a body's declared `F` that is not
/// the row's signature does not compile.
#[derive(Clone, Copy)]
pub struct Real<F> {
    pub sym: Sym,
    pub f: Option<F>,
    pub api: Api,
}

impl<F: Copy> Real<F> {
    /// The real function of `S`'s row, found as `find` finds it (the exported symbol's, or the
    /// one an entry-point lookup returned).
    pub fn of<S: SigOf<F = F>>(f: Option<F>, api: Api) -> Real<F> {
        Real {
            sym: S::SYM,
            f,
            api,
        }
    }

    /// Calls `body(f, rec)` with the real function inside the re-entrancy guard (`rec`: whether
    /// this call is recorded); when the real function cannot be found, says so once and
    /// returns `missing`.
    pub fn forward(self, missing: i32, body: impl FnOnce(F, bool) -> i32) -> i32 {
        match self.f {
            None => crate::state::missing(self.sym, missing),
            Some(f) => {
                let guard = crate::guard::Guard::enter();
                body(f, guard.records())
            }
        }
    }
}

/// The body every recorded hook shares once it holds the real function: make the call, and
/// when this call is recorded (the guard says so), record its outcome. `outcome(rc)` is the
/// event of the hook's kind (its constructor in `trace::Event` says what its numbers mean),
/// read from what the call wrote, and built only when recording.
pub fn recorded(
    rec: bool,
    call: impl FnOnce() -> i32,
    outcome: impl FnOnce(i32) -> trace::Event,
) -> i32 {
    // Under way from before the call until its record is written: NVML is not sampled
    // meanwhile (trace::device_memory), so each sample agrees with the records around it.
    let _under_way = trace::device_memory::InCall::begin();
    let rc = call();
    if rec {
        trace::record(outcome(rc));
    }
    rc
}

/// The pointer a successful call stored through `out`, or 0.
///
/// # Safety
/// `out` must be null or valid for reads when `rc` is 0.
pub unsafe fn out_ptr(out: *mut *mut c_void, rc: i32) -> u64 {
    if rc != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees `out` is readable after a successful call.
    unsafe { *out as u64 }
}

/// The device pointer a successful driver call stored through `out`, or 0.
///
/// # Safety
/// `out` must be null or valid for reads when `rc` is 0.
pub unsafe fn out_u64(out: *mut u64, rc: i32) -> u64 {
    if rc != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees `out` is readable after a successful call.
    unsafe { *out }
}

/// The `usize` a successful call stored through `out`, or 0.
///
/// # Safety
/// `out` must be null or valid for reads when `rc` is 0.
pub unsafe fn out_usize(out: *mut usize, rc: i32) -> u64 {
    if rc != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees `out` is readable after a successful call.
    unsafe { *out as u64 }
}

/// Records what `cudaMemGetInfo`/`cuMemGetInfo_v2` returned and, with a pool, replaces it
/// with what the process can use (see `mem_info`), recorded as well.
///
/// # Safety
/// `free` and `total` must be what the caller passed to the call that returned `rc`.
pub(crate) unsafe fn show_mem_info(
    api: Api,
    rc: i32,
    free: *mut usize,
    total: *mut usize,
    device: u8,
) {
    // SAFETY: the caller vouches for the out-pointers.
    let (fr, to) = unsafe { (out_usize(free, rc), out_usize(total, rc)) };
    trace::record(trace::Event::mem_info(api, rc, fr, to, device));
    if rc != 0 || free.is_null() || total.is_null() || !pool::holds_blocks() {
        return;
    }
    let (f2, t2) = pool::mem_info(fr, to);
    // SAFETY: both out-pointers were written by the successful call.
    unsafe {
        *free = f2 as usize;
        *total = t2 as usize;
    }
    trace::record(trace::Event::mem_info_shown(api, f2, t2, device));
}
