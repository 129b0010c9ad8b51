//! The memory calls the runtime and the driver share, one body each for both: allocate and
//! free (synchronous and stream-ordered), allocate from a memory pool, managed memory, and the
//! memory figures. A request the shim's pool serves is answered in [`serve`]; any other goes
//! to the real function and is recorded. What differs between the two APIs is a [`Side`].

use crate::cuda::ffi::{CU_ERROR_NOT_INITIALIZED, CUDA_ERROR_INSUFFICIENT_DRIVER};
use crate::cuda::symbols::sig::Stream;
use crate::hooks::serve::{self, Family};
use crate::hooks::{Real, recorded};
use crate::pool;
use crate::trace::Event;
use crate::trace::{driver_device, runtime_device};
use core::ffi::c_void;
use gpushim_core::engine::FreeKind;
use gpushim_core::trace::format::DEVICE_UNKNOWN;

/// What differs between the runtime's and the driver's memory calls.
pub(crate) trait Side {
    /// A device address as the API passes it: `void *` (runtime), `CUdeviceptr` (driver).
    type Ptr: Copy;
    /// What the hook answers when the real function cannot be found.
    const MISSING: i32;
    const FAMILY: Family;
    /// The calling thread's device, as this API knows it.
    fn device() -> u8;
    fn addr(p: Self::Ptr) -> u64;
    fn from_addr(a: u64) -> Self::Ptr;
    /// After a successful device allocation of the program's own (a framework's segment).
    fn after_alloc(_ptr: u64, _size: u64) {}
}

/// The CUDA runtime (`libcudart`).
pub(crate) enum Runtime {}
/// The CUDA driver (`libcuda`).
pub(crate) enum Driver {}

impl Side for Runtime {
    type Ptr = *mut c_void;
    const MISSING: i32 = CUDA_ERROR_INSUFFICIENT_DRIVER;
    const FAMILY: Family = Family::Runtime;
    fn device() -> u8 {
        runtime_device()
    }
    fn addr(p: *mut c_void) -> u64 {
        p as u64
    }
    fn from_addr(a: u64) -> *mut c_void {
        a as *mut c_void
    }
    fn after_alloc(ptr: u64, size: u64) {
        crate::hooks::torch::after_device_alloc(ptr, size);
    }
}

impl Side for Driver {
    type Ptr = u64;
    const MISSING: i32 = CU_ERROR_NOT_INITIALIZED;
    const FAMILY: Family = Family::Driver;
    fn device() -> u8 {
        driver_device()
    }
    fn addr(p: u64) -> u64 {
        p
    }
    fn from_addr(a: u64) -> u64 {
        a
    }
}

/// The address a successful call stored through `out`, or 0.
///
/// # Safety
/// `out` must be null or valid for reads when `rc` is 0.
unsafe fn written<S: Side>(out: *mut S::Ptr, rc: i32) -> u64 {
    if rc != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the caller guarantees `out` is readable after a successful call.
    S::addr(unsafe { *out })
}

type Malloc<S> = unsafe extern "C" fn(*mut <S as Side>::Ptr, usize) -> i32;
type Free<S> = unsafe extern "C" fn(<S as Side>::Ptr) -> i32;
type MallocAsync<S> = unsafe extern "C" fn(*mut <S as Side>::Ptr, usize, Stream) -> i32;
type FreeAsync<S> = unsafe extern "C" fn(<S as Side>::Ptr, Stream) -> i32;
type MallocFromPool<S> =
    unsafe extern "C" fn(*mut <S as Side>::Ptr, usize, *mut c_void, Stream) -> i32;
type MallocManaged<S> = unsafe extern "C" fn(*mut <S as Side>::Ptr, usize, u32) -> i32;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;

/// `cudaMalloc`, `cuMemAlloc_v2`.
pub(crate) unsafe fn malloc<S: Side>(real: Real<Malloc<S>>, p: *mut S::Ptr, size: usize) -> i32 {
    let Real { api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        if rec && !p.is_null() && size > 0 && pool::serves_calls() {
            if let Some((rc, ptr)) = serve::alloc(S::FAMILY, api, size, pool::SYNC_KEY, 0) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = S::from_addr(ptr) };
                if rc == 0 {
                    S::after_alloc(ptr, size as u64);
                }
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size) }
        };
        let rc = recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { written::<S>(p, rc) };
            Event::alloc(api, rc, ptr, size as u64, S::device())
        });
        if rec && rc == 0 {
            // SAFETY: `p` was written by the successful call.
            S::after_alloc(unsafe { written::<S>(p, rc) }, size as u64);
        }
        rc
    })
}

/// `cudaFree`, `cuMemFree_v2`.
pub(crate) unsafe fn free<S: Side>(real: Real<Free<S>>, p: S::Ptr) -> i32 {
    let Real { api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        let addr = S::addr(p);
        if rec && pool::holds_blocks() && addr != 0 {
            if let Some(rc) = serve::free(S::FAMILY, api, addr, FreeKind::Sync, 0) {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p) }
        };
        recorded(rec, call, |rc| Event::free(api, rc, addr, DEVICE_UNKNOWN))
    })
}

/// `cudaMallocAsync{,_ptsz}`, `cuMemAllocAsync{,_ptsz}`.
pub(crate) unsafe fn malloc_async<S: Side>(
    real: Real<MallocAsync<S>>,
    p: *mut S::Ptr,
    size: usize,
    s: Stream,
) -> i32 {
    let Real { sym, api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        pool::allow_pool_questions();
        let per_thread = sym.per_thread();
        if rec
            && !p.is_null()
            && size > 0
            && pool::serves_calls()
            && !pool::capturing(s, per_thread)
        {
            let key = pool::stream_key(s, per_thread, api);
            if let Some((rc, ptr)) = serve::alloc(S::FAMILY, api, size, key, s as u64) {
                // SAFETY: `p` is the caller's out-pointer, checked non-null.
                unsafe { *p = S::from_addr(ptr) };
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, s) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { written::<S>(p, rc) };
            Event::alloc_async(api, rc, ptr, size as u64, S::device(), s as u64)
        })
    })
}

/// `cudaFreeAsync{,_ptsz}`, `cuMemFreeAsync{,_ptsz}`.
pub(crate) unsafe fn free_async<S: Side>(real: Real<FreeAsync<S>>, p: S::Ptr, s: Stream) -> i32 {
    let Real { sym, api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        let addr = S::addr(p);
        let per_thread = sym.per_thread();
        if rec && pool::holds_blocks() && addr != 0 && !pool::capturing(s, per_thread) {
            let how = FreeKind::OnStream(pool::stream_key(s, per_thread, api));
            if let Some(rc) = serve::free(S::FAMILY, api, addr, how, s as u64) {
                return rc;
            }
        }
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, s) }
        };
        recorded(rec, call, |rc| {
            Event::free_async(api, rc, addr, DEVICE_UNKNOWN, s as u64)
        })
    })
}

/// `cudaMallocFromPoolAsync{,_ptsz}`, `cuMemAllocFromPoolAsync{,_ptsz}`: CUDA's memory pools
/// serve these; the shim's pool never does.
pub(crate) unsafe fn malloc_from_pool<S: Side>(
    real: Real<MallocFromPool<S>>,
    p: *mut S::Ptr,
    size: usize,
    pool: *mut c_void,
    s: Stream,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        pool::allow_pool_questions();
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, pool, s) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { written::<S>(p, rc) };
            Event::alloc_async(api, rc, ptr, size as u64, S::device(), s as u64)
        })
    })
}

type PoolCreate = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32;
type GraphAllocNode =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_void, usize, *mut c_void) -> i32;
type GraphFreeNode<S> = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_void,
    *const c_void,
    usize,
    <S as Side>::Ptr,
) -> i32;

/// Where `CUDA_MEM_ALLOC_NODE_PARAMS` (and the runtime's `cudaMemAllocNodeParams`, laid out
/// alike) keep what the record needs: the pool properties' location type (1: a device) and id,
/// the size asked, and the address CUDA writes back.
const NODE_LOCATION_TYPE: usize = 8;
const NODE_LOCATION_ID: usize = 12;
const NODE_BYTESIZE: usize = 104;
const NODE_DPTR: usize = 112;

/// `cudaGraphAddMemAllocNode`, `cuGraphAddMemAllocNode`: a graph's memory node added directly
/// (not captured) takes its address now, as a captured `cudaMallocAsync` does; recorded as a
/// stream-ordered allocation, with who asked.
pub(crate) unsafe fn graph_alloc_node<S: Side>(
    real: Real<GraphAllocNode>,
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    n: usize,
    params: *mut c_void,
) -> i32 {
    let api = real.api;
    real.forward(S::MISSING, |f, rec| {
        pool::allow_pool_questions();
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(node, graph, deps, n, params) }
        };
        recorded(rec, call, |rc| {
            if rc != 0 || params.is_null() {
                return Event::alloc_async(api, rc, 0, 0, DEVICE_UNKNOWN, 0);
            }
            // SAFETY: a successful call read the parameters and wrote the address into them.
            let (kind, id, size, ptr) = unsafe {
                let p = params.cast::<u8>();
                (
                    p.add(NODE_LOCATION_TYPE).cast::<i32>().read_unaligned(),
                    p.add(NODE_LOCATION_ID).cast::<i32>().read_unaligned(),
                    p.add(NODE_BYTESIZE).cast::<u64>().read_unaligned(),
                    p.add(NODE_DPTR).cast::<u64>().read_unaligned(),
                )
            };
            let device = match u8::try_from(id) {
                Ok(d) if kind == 1 => d,
                _ => DEVICE_UNKNOWN,
            };
            Event::alloc_async(api, rc, ptr, size, device, 0)
        })
    })
}

/// `cudaGraphAddMemFreeNode`, `cuGraphAddMemFreeNode`: the free node of a graph's allocation,
/// recorded as a stream-ordered free (the memory stays the graph's, as for a captured one).
pub(crate) unsafe fn graph_free_node<S: Side>(
    real: Real<GraphFreeNode<S>>,
    node: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const c_void,
    n: usize,
    p: S::Ptr,
) -> i32 {
    let api = real.api;
    real.forward(S::MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(node, graph, deps, n, p) }
        };
        recorded(rec, call, |rc| {
            Event::free_async(api, rc, S::addr(p), DEVICE_UNKNOWN, 0)
        })
    })
}
type PoolDestroy = unsafe extern "C" fn(*mut c_void) -> i32;

/// `cudaMemPoolCreate`, `cuMemPoolCreate`: a pool on a device is one the sampler asks what it
/// reserves (`trace::device_memory`). Both layers may see one creation; the second is a no-op.
pub(crate) unsafe fn pool_create<S: Side>(
    real: Real<PoolCreate>,
    pool: *mut *mut c_void,
    props: *const c_void,
) -> i32 {
    real.forward(S::MISSING, |f, _rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(pool, props) };
        if rc == 0 && !pool.is_null() && !props.is_null() {
            // SAFETY: a successful call read `props`, a `CUmemPoolProps` (the runtime's
            // `cudaMemPoolProps` has its layout): the location's type at byte 8 (1: a device)
            // and its id at byte 12; and wrote the pool through `pool`.
            let (kind, id, handle) = unsafe {
                let p = props.cast::<i32>();
                (p.add(2).read_unaligned(), p.add(3).read_unaligned(), *pool)
            };
            if kind == 1
                && let Ok(device) = u8::try_from(id)
            {
                crate::trace::device_memory::pool_created(handle as usize, device);
            }
        }
        rc
    })
}

/// `cudaMemPoolDestroy`, `cuMemPoolDestroy`: the sampler lets go of the pool (waiting for a
/// question under way to be answered) before CUDA destroys it.
pub(crate) unsafe fn pool_destroy<S: Side>(real: Real<PoolDestroy>, pool: *mut c_void) -> i32 {
    real.forward(S::MISSING, |f, _rec| {
        crate::trace::device_memory::pool_destroying(pool as usize);
        // SAFETY: the caller's argument, unchanged.
        unsafe { f(pool) }
    })
}

/// `cudaMallocManaged`, `cuMemAllocManaged`.
pub(crate) unsafe fn malloc_managed<S: Side>(
    real: Real<MallocManaged<S>>,
    p: *mut S::Ptr,
    size: usize,
    flags: u32,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        let call = || {
            // SAFETY: the caller's arguments, unchanged.
            unsafe { f(p, size, flags) }
        };
        recorded(rec, call, |rc| {
            // SAFETY: `p` was written by the successful call.
            let ptr = unsafe { written::<S>(p, rc) };
            Event::managed_alloc(api, rc, ptr, size as u64, S::device())
        })
    })
}

/// `cudaMemGetInfo`, `cuMemGetInfo_v2`: recorded, and under a pool what the process can use.
pub(crate) unsafe fn mem_get_info<S: Side>(
    real: Real<MemGetInfo>,
    free: *mut usize,
    total: *mut usize,
) -> i32 {
    let Real { api, .. } = real;
    real.forward(S::MISSING, |f, rec| {
        // SAFETY: the caller's arguments, unchanged.
        let rc = unsafe { f(free, total) };
        if rec {
            // SAFETY: both out-pointers were written by the successful call.
            unsafe { crate::hooks::show_mem_info(api, rc, free, total, S::device()) };
        }
        rc
    })
}
