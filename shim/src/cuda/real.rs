//! Finding the real CUDA functions behind our hooks.
//!
//! Two tables of addresses, filled lazily and never cleared:
//! - `EXPORTED[sym]`: what our exported symbol and our `dlsym` answers forward to. Found with
//!   `dlsym(RTLD_NEXT, name)`, else through `dlopen(soname, RTLD_NOLOAD)` of the already loaded
//!   library (it was loaded `RTLD_LOCAL`, as Python extension modules are), else taken from the
//!   handle a `dlsym` caller used.
//! - `PROC[sym]`: what the wrappers handed out by `cuGetProcAddress` and
//!   `cudaGetDriverEntryPoint` forward to: exactly the pointer the real lookup returned.
//!
//! Nothing here allocates or locks: every entry is one atomic word set with compare-and-swap.

use crate::cuda::symbols::{SYM_COUNT, Sym};
use core::ffi::{CStr, c_char, c_void};
use core::sync::atomic::{AtomicUsize, Ordering};

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, found with `dlvsym` so that our own `dlsym` is never called by mistake.
/// Read by the `dlsym` trampoline in assembly.
pub static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

static EXPORTED: [AtomicUsize; SYM_COUNT] = [const { AtomicUsize::new(0) }; SYM_COUNT];
static PROC: [AtomicUsize; SYM_COUNT] = [const { AtomicUsize::new(0) }; SYM_COUNT];

#[cfg(target_arch = "x86_64")]
const DLSYM_VERSIONS: &[&CStr] = &[c"GLIBC_2.2.5", c"GLIBC_2.34"];
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: &[&CStr] = &[c"GLIBC_2.17", c"GLIBC_2.34"];

/// glibc's `name`, found with `dlvsym` (oldest version first, which every glibc has) so that
/// our own override is never called by mistake; cached in `slot`. Allocates nothing: safe from
/// a constructor or from inside `dlsym`.
fn glibc_function(slot: &AtomicUsize, name: &CStr) -> usize {
    let p = slot.load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    for v in DLSYM_VERSIONS {
        // SAFETY: dlvsym with RTLD_NEXT and NUL-terminated names; it does not allocate on
        // success.
        let q = unsafe { libc::dlvsym(libc::RTLD_NEXT, name.as_ptr(), v.as_ptr()) };
        if !q.is_null() {
            slot.store(q as usize, Ordering::Release);
            return q as usize;
        }
    }
    0
}

/// glibc's `dlsym`. Resolved once; safe to call from a constructor or from inside `dlsym`.
pub fn real_dlsym() -> Option<DlsymFn> {
    let p = glibc_function(&REAL_DLSYM, c"dlsym");
    // SAFETY: `p` is 0 or glibc's dlsym, whose ABI is DlsymFn.
    unsafe { as_fn::<DlsymFn>(p) }
}

pub type DlcloseFn = unsafe extern "C" fn(*mut c_void) -> core::ffi::c_int;
static REAL_DLCLOSE: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlclose`.
pub fn real_dlclose() -> Option<DlcloseFn> {
    let p = glibc_function(&REAL_DLCLOSE, c"dlclose");
    // SAFETY: `p` is 0 or glibc's dlclose, whose ABI is DlcloseFn.
    unsafe { as_fn::<DlcloseFn>(p) }
}

/// The addresses of `names` in the library `soname` the process has already loaded (0 for a
/// name it lacks); `None` when no such library is loaded. Nothing is loaded, and the library
/// is not held after (the program holds it). Through glibc's `dlsym`, never our hooks.
pub fn loaded_symbols<const N: usize>(soname: &CStr, names: [&CStr; N]) -> Option<[usize; N]> {
    let dlsym = real_dlsym()?;
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a library already loaded.
    let h = unsafe { libc::dlopen(soname.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if h.is_null() {
        return None;
    }
    // SAFETY: a handle and NUL-terminated names.
    let found = names.map(|n| unsafe { dlsym(h, n.as_ptr()) } as usize);
    if let Some(close) = real_dlclose() {
        // SAFETY: balances the dlopen above; the library stays loaded for its other users.
        unsafe { close(h) };
    }
    Some(found)
}

/// Whether `p` lies in a loaded object.
fn mapped(p: usize) -> bool {
    // SAFETY: an all-zero Dl_info is a valid out-buffer; dladdr only reads the loader's tables.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::dladdr(p as *const c_void, &mut info) != 0 }
}

/// Whether `p` lies in libgpushim.so itself (one of our hooks or wrappers): a lookup that finds
/// it has found us, not the real function.
pub fn in_this_library(p: usize) -> bool {
    // SAFETY: all-zero Dl_info values are valid out-buffers; dladdr only reads the loader's
    // tables.
    let (mut ours, mut theirs): (libc::Dl_info, libc::Dl_info) =
        unsafe { (core::mem::zeroed(), core::mem::zeroed()) };
    let me = in_this_library as fn(usize) -> bool as *const c_void;
    // SAFETY: as above.
    unsafe {
        libc::dladdr(me, &mut ours) != 0
            && libc::dladdr(p as *const c_void, &mut theirs) != 0
            && ours.dli_fbase == theirs.dli_fbase
    }
}

/// A library was unloaded (`dlclose`): every real function that no longer lies in a loaded
/// object is forgotten, so the next call finds it again (in the library loaded anew, perhaps
/// at another address) instead of jumping into unmapped memory. A wrapper whose function is
/// gone answers "not found" until a new entry-point lookup offers the new one.
pub fn forget_unloaded() {
    for table in [&EXPORTED, &PROC] {
        for e in table.iter() {
            let p = e.load(Ordering::Acquire);
            if p != 0 && !mapped(p) {
                let _ = e.compare_exchange(p, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
}

/// The real function behind an exported hook, or 0 when it cannot be found.
pub fn exported(sym: Sym) -> usize {
    let p = EXPORTED[sym as usize].load(Ordering::Acquire);
    if p != 0 {
        return p;
    }
    resolve_exported(sym)
}

#[cold]
fn resolve_exported(sym: Sym) -> usize {
    let Some(dlsym) = real_dlsym() else {
        return 0;
    };
    let name = sym.c_name().as_ptr();
    // SAFETY: glibc's dlsym called from this library, so RTLD_NEXT means "after gpushim".
    let mut p = unsafe { dlsym(libc::RTLD_NEXT, name) } as usize;
    if p == 0 || in_this_library(p) {
        p = sym
            .lib()
            .sonames()
            .iter()
            .filter_map(|soname| loaded_symbols(soname, [sym.c_name()]))
            .map(|[q]| q)
            .find(|&q| q != 0 && !in_this_library(q))
            .unwrap_or(0);
    }
    if p == 0 {
        return 0;
    }
    offer_exported(sym, p)
}

/// Records `p` as the real function of `sym` unless one is known already; returns the one in
/// use.
pub fn offer_exported(sym: Sym, p: usize) -> usize {
    match EXPORTED[sym as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => p,
        Err(existing) => existing,
    }
}

/// The real function behind a wrapper handed out by a driver entry-point lookup.
pub fn proc(sym: Sym) -> usize {
    PROC[sym as usize].load(Ordering::Acquire)
}

/// Takes `p`, just returned by a real entry-point lookup for `sym`, as the function our wrapper
/// will call. Refused (`false`) when the wrapper already forwards to a different function: the
/// caller then gets the real pointer untouched, never a wrapper that calls something else.
pub fn offer_proc(sym: Sym, p: usize) -> bool {
    match PROC[sym as usize].compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(existing) => existing == p,
    }
}

/// Casts a resolved address to the function type of the symbol it was resolved for.
///
/// # Safety
/// `addr` must be 0 or the address of a function whose ABI is `F`, and `F` must be a function
/// pointer type.
pub unsafe fn as_fn<F: Copy>(addr: usize) -> Option<F> {
    const { assert!(core::mem::size_of::<F>() == core::mem::size_of::<usize>()) };
    if addr == 0 {
        None
    } else {
        // SAFETY: sizes match (checked at compile time); the caller vouches for the ABI.
        Some(unsafe { core::mem::transmute_copy::<usize, F>(&addr) })
    }
}

/// The real function behind our hook for `S`, typed by its signature (declared once in
/// [`crate::cuda::symbols::sig`]), or `None` when it cannot be found.
pub fn function<S: crate::cuda::symbols::SigOf>() -> Option<S::F> {
    // SAFETY: `S::F` is the C signature of `S::SYM` (declared beside it); `exported` returns 0
    // or the address of that very function.
    unsafe { as_fn::<S::F>(exported(S::SYM)) }
}

/// The real function behind the wrapper an entry-point lookup handed out for `S`, typed by its
/// signature, or `None` when none was taken.
pub fn proc_function<S: crate::cuda::symbols::SigOf>() -> Option<S::F> {
    // SAFETY: `S::F` is the C signature of `S::SYM`; `offer_proc` takes only what a real
    // lookup returned for that ABI (`symbols::driver_abi`).
    unsafe { as_fn::<S::F>(proc(S::SYM)) }
}
