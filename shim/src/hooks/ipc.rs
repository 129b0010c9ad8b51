//! Legacy CUDA IPC on pooled blocks: export gives a block that starts its segment the real
//! handle and any other a ticket; import maps each segment once per context.

use crate::cuda::ffi::{CU_ERROR_NOT_INITIALIZED as MISSING, ERROR_INVALID_VALUE};
use crate::cuda::symbols::sig;
use crate::hooks::Real;
use crate::os::say;
use crate::pool::ipc;
use crate::pool::{self, holds_blocks};
use crate::state;
use crate::trace;
use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, Ordering};

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
    real: Real<sig::CuIpcGetMemHandle>,
    handle: *mut c_void,
    p: u64,
) -> i32 {
    real.forward(MISSING, |f, rec| {
        let Some(b) = (if holds_blocks() {
            pool::lookup(p)
        } else {
            None
        }) else {
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
            return if pool::expandable() {
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
        // The segment is marked exported before the handle leaves: freed, it goes back to CUDA.
        pool::mark_exported(b.ptr);
        // SAFETY: the caller's handle buffer holds CU_IPC_HANDLE_SIZE bytes.
        unsafe { core::ptr::copy_nonoverlapping(out.as_ptr(), handle.cast::<u8>(), ipc::HANDLE) };
        if rec {
            trace::record(trace::Event::ipc_export(
                p,
                b.requested,
                trace::driver_device(),
            ));
        }
        0
    })
}

use crate::cuda::ffi::CuIpcMemHandle as IpcHandle;

/// IPC import: tickets become the real handle plus an offset; every open goes through the
/// table so a segment is mapped once per context however many blocks of it are opened.
pub(crate) unsafe fn ipc_open(
    real: Real<sig::CuIpcOpenMemHandleV2>,
    out: *mut u64,
    h: IpcHandle,
    flags: u32,
) -> i32 {
    real.forward(MISSING, |f, rec| {
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
                    trace::record(trace::Event::ipc_open(p, trace::driver_device()));
                }
                0
            }
            Err(rc) => rc,
        }
    })
}

pub(crate) unsafe fn ipc_close(real: Real<sig::CuIpcCloseMemHandle>, p: u64) -> i32 {
    real.forward(MISSING, |f, rec| {
        let rc = match ipc::close(p) {
            // SAFETY: the caller's argument, unchanged.
            ipc::Close::PassThrough => unsafe { f(p) },
            ipc::Close::Kept => 0,
            // SAFETY: the base this process opened and no returned pointer still uses.
            ipc::Close::Base(base) => unsafe { f(base) },
        };
        if rec && rc == 0 {
            trace::record(trace::Event::ipc_close(p, trace::driver_device()));
        }
        rc
    })
}
