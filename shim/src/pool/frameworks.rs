//! Whether the process has a caching allocator of its own above the shim (`trim:auto`).
//!
//! A framework that caches (PyTorch's caching allocator, RMM, CuPy's memory pool, JAX's BFC
//! allocator) calls `cudaFree` only when it means to give memory back: `empty_cache`, an
//! out-of-memory retry, `free_all_blocks`. Caching that memory again in the shim would only
//! keep it from other processes and from NVML's figures, so under `trim:auto` the pool then
//! gives a segment back at the free that empties it, as CUDA does. Programs without such an
//! allocator (PyTorch with `PYTORCH_NO_CUDA_MEMORY_CACHING=1`, plain CUDA programs) keep the
//! pool's caching, and idle memory goes back after a second.

use crate::options::Foreign;
use core::ffi::{CStr, c_int, c_void};

/// An environment variable and the value that turns a framework's cache off.
type Off = Option<(Foreign, &'static [u8])>;

/// Loaded-library names that carry a caching allocator, with the setting that turns it off.
const CACHING: &[(&[u8], Off)] = &[
    (b"libc10_cuda.so", Some((Foreign::PytorchNoCaching, b"1"))),
    (b"librmm", None),
    (b"cupy/cuda/memory", None),
    (b"cupy_backends", None),
    (b"xla_extension", Some((Foreign::XlaAllocator, b"platform"))),
    (b"jax_cuda", Some((Foreign::XlaAllocator, b"platform"))),
];

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, found: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid entry for the duration of the call; `found` is the
    // bool given to dl_iterate_phdr below.
    let (name, found) = unsafe { ((*info).dlpi_name, &mut *(found as *mut bool)) };
    if name.is_null() {
        return 0;
    }
    // SAFETY: dlpi_name is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes();
    for (lib, off) in CACHING {
        if !contains(name, lib) {
            continue;
        }
        let disabled =
            off.is_some_and(|(var, val)| var.value().is_some_and(|v| v.to_bytes() == val));
        if !disabled {
            *found = true;
            return 1;
        }
    }
    0
}

/// Whether a library with an active caching allocator is loaded. Allocates nothing; takes the
/// loader's lock (never called from `dlsym` or a constructor).
pub fn caching_allocator_loaded() -> bool {
    let mut found = false;
    // SAFETY: `visit` matches the callback type and only reads the entries it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut found).cast()) };
    found
}
