//! Our `dlsym`: lookups of hooked CUDA functions on any library handle (Python ctypes, the real
//! libcudart reaching `cuGetProcAddress_v2`) get our wrapper, once the real lookup succeeded.
//!
//! The entry point is a few instructions of assembly: `dlsym(RTLD_NEXT, ...)` jumps straight to
//! glibc's `dlsym` with the caller's return address intact, because glibc resolves `RTLD_NEXT`
//! relative to its caller, and other interposers (a malloc hook, a second profiler) depend on it.
//! Every other lookup goes to `dlsym_impl`, which allocates nothing, takes no lock and uses no
//! thread-local storage, so it is safe from constructors and from inside allocator hooks.

use crate::cuda::real::{self, REAL_DLSYM};
use core::ffi::{CStr, c_char, c_void};

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl dlsym",
    ".type dlsym,@function",
    ".p2align 4",
    "dlsym:",
    "cmp rdi, -1",
    "jne 2f",
    "mov rax, qword ptr [rip + {real}]",
    "test rax, rax",
    "jz 2f",
    "jmp rax",
    "2:",
    "jmp {imp}",
    ".size dlsym, .-dlsym",
    real = sym REAL_DLSYM,
    imp = sym dlsym_impl,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl dlsym",
    ".type dlsym,%function",
    ".p2align 4",
    "dlsym:",
    "cmn x0, #1",
    "b.ne 2f",
    "adrp x16, {real}",
    "ldr x16, [x16, :lo12:{real}]",
    "cbz x16, 2f",
    "br x16",
    "2:",
    "b {imp}",
    ".size dlsym, .-dlsym",
    real = sym REAL_DLSYM,
    imp = sym dlsym_impl,
);

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("gpushim's dlsym entry is written for x86_64 and aarch64 Linux");

unsafe extern "C" fn dlsym_impl(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real_dlsym) = real::real_dlsym() else {
        return core::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, forwarded unchanged to glibc.
    let p = unsafe { real_dlsym(handle, name) };
    if p.is_null() || name.is_null() || handle == libc::RTLD_NEXT || !crate::state::enabled() {
        return p;
    }
    // SAFETY: glibc found a symbol by this name, so it is a valid NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    match crate::route::exported_by_name(name) {
        // The lookup found our own export (RTLD_DEFAULT, or a handle of the shim itself).
        Some((_, wrapper)) if wrapper == p as usize => p,
        Some((sym, wrapper)) => {
            real::offer_exported(sym, p as usize);
            wrapper as *mut c_void
        }
        None => p,
    }
}

/// Our `dlclose`: glibc's, then the real functions that lay in an unloaded library are
/// forgotten (see `real::forget_unloaded`), so a library closed and opened again at another
/// address is called where it now is.
///
/// # Safety
/// As glibc's `dlclose`: `handle` from `dlopen`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> core::ffi::c_int {
    let Some(close) = real::real_dlclose() else {
        return -1;
    };
    // SAFETY: the caller's handle, unchanged.
    let rc = unsafe { close(handle) };
    if rc == 0 {
        real::forget_unloaded();
    }
    rc
}
