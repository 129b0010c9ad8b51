//! The addresses of our hooks: which name `dlsym` answers with which wrapper, which wrapper an
//! entry-point lookup hands out for which ABI, and whether an address is one of ours (so a
//! lookup that already went through us is never wrapped twice).

use crate::cuda::symbols::Sym;
use crate::hooks::{driver, pooled as pool_hooks, runtime};
use crate::route::entry;
use core::ffi::{CStr, c_void};

/// A function address in a static table.
#[derive(Clone, Copy)]
pub struct Addr(*const c_void);

// SAFETY: code addresses are immutable and valid for the life of the library (-z nodelete).
unsafe impl Sync for Addr {}

macro_rules! addr {
    ($f:path) => {
        Addr($f as *const c_void)
    };
}

/// Exported hooks, by the symbol they stand for (their own name).
static EXPORTED: &[(Sym, Addr)] = &[
    (Sym::CudaMalloc, addr!(runtime::cudaMalloc)),
    (Sym::CudaFree, addr!(runtime::cudaFree)),
    (Sym::CudaMallocAsync, addr!(runtime::cudaMallocAsync)),
    (
        Sym::CudaMallocAsyncPtsz,
        addr!(runtime::cudaMallocAsync_ptsz),
    ),
    (Sym::CudaFreeAsync, addr!(runtime::cudaFreeAsync)),
    (Sym::CudaFreeAsyncPtsz, addr!(runtime::cudaFreeAsync_ptsz)),
    (
        Sym::CudaMallocFromPoolAsync,
        addr!(runtime::cudaMallocFromPoolAsync),
    ),
    (
        Sym::CudaMallocFromPoolAsyncPtsz,
        addr!(runtime::cudaMallocFromPoolAsync_ptsz),
    ),
    (Sym::CudaMallocManaged, addr!(runtime::cudaMallocManaged)),
    (Sym::CudaMallocHost, addr!(runtime::cudaMallocHost)),
    (Sym::CudaHostAlloc, addr!(runtime::cudaHostAlloc)),
    (Sym::CudaFreeHost, addr!(runtime::cudaFreeHost)),
    (Sym::CudaMallocPitch, addr!(runtime::cudaMallocPitch)),
    (Sym::CudaMalloc3D, addr!(runtime::cudaMalloc3D)),
    (Sym::CudaMemGetInfo, addr!(runtime::cudaMemGetInfo)),
    (Sym::CudaDeviceReset, addr!(pool_hooks::cudaDeviceReset)),
    (
        Sym::CudaGetDriverEntryPoint,
        addr!(entry::cudaGetDriverEntryPoint),
    ),
    (
        Sym::CudaGetDriverEntryPointPtsz,
        addr!(entry::cudaGetDriverEntryPoint_ptsz),
    ),
    (
        Sym::CudaGetDriverEntryPointByVersion,
        addr!(entry::cudaGetDriverEntryPointByVersion),
    ),
    (
        Sym::CudaGetDriverEntryPointByVersionPtsz,
        addr!(entry::cudaGetDriverEntryPointByVersion_ptsz),
    ),
    (Sym::CuMemAllocV2, addr!(driver::cuMemAlloc_v2)),
    (Sym::CuMemFreeV2, addr!(driver::cuMemFree_v2)),
    (Sym::CuMemAllocAsync, addr!(driver::cuMemAllocAsync)),
    (
        Sym::CuMemAllocAsyncPtsz,
        addr!(driver::cuMemAllocAsync_ptsz),
    ),
    (Sym::CuMemFreeAsync, addr!(driver::cuMemFreeAsync)),
    (Sym::CuMemFreeAsyncPtsz, addr!(driver::cuMemFreeAsync_ptsz)),
    (
        Sym::CuMemAllocFromPoolAsync,
        addr!(driver::cuMemAllocFromPoolAsync),
    ),
    (
        Sym::CuMemAllocFromPoolAsyncPtsz,
        addr!(driver::cuMemAllocFromPoolAsync_ptsz),
    ),
    (Sym::CuMemAllocPitchV2, addr!(driver::cuMemAllocPitch_v2)),
    (Sym::CuMemAllocManaged, addr!(driver::cuMemAllocManaged)),
    (Sym::CuMemHostAlloc, addr!(driver::cuMemHostAlloc)),
    (Sym::CuMemFreeHost, addr!(driver::cuMemFreeHost)),
    (Sym::CuMemCreate, addr!(driver::cuMemCreate)),
    (Sym::CuMemRelease, addr!(driver::cuMemRelease)),
    (Sym::CuMemMap, addr!(driver::cuMemMap)),
    (Sym::CuMemUnmap, addr!(driver::cuMemUnmap)),
    (Sym::CuMemAddressReserve, addr!(driver::cuMemAddressReserve)),
    (Sym::CuMemAddressFree, addr!(driver::cuMemAddressFree)),
    (Sym::CuMemSetAccess, addr!(driver::cuMemSetAccess)),
    (Sym::CuMemGetInfoV2, addr!(driver::cuMemGetInfo_v2)),
    (Sym::CuStreamCreate, addr!(pool_hooks::cuStreamCreate)),
    (
        Sym::CuStreamCreateWithPriority,
        addr!(pool_hooks::cuStreamCreateWithPriority),
    ),
    (
        Sym::CuStreamDestroyV2,
        addr!(pool_hooks::cuStreamDestroy_v2),
    ),
    (Sym::CuCtxSynchronize, addr!(pool_hooks::cuCtxSynchronize)),
    (
        Sym::CuMemGetAddressRangeV2,
        addr!(pool_hooks::cuMemGetAddressRange_v2),
    ),
    (
        Sym::CuPointerGetAttribute,
        addr!(pool_hooks::cuPointerGetAttribute),
    ),
    (
        Sym::CuPointerGetAttributes,
        addr!(pool_hooks::cuPointerGetAttributes),
    ),
    (Sym::CuIpcGetMemHandle, addr!(pool_hooks::cuIpcGetMemHandle)),
    (
        Sym::CuIpcOpenMemHandleV2,
        addr!(pool_hooks::cuIpcOpenMemHandle_v2),
    ),
    (
        Sym::CuIpcCloseMemHandle,
        addr!(pool_hooks::cuIpcCloseMemHandle),
    ),
    (
        Sym::CuStreamBeginCapture,
        addr!(pool_hooks::cuStreamBeginCapture),
    ),
    (
        Sym::CuStreamBeginCapturePtsz,
        addr!(pool_hooks::cuStreamBeginCapture_ptsz),
    ),
    (
        Sym::CuStreamBeginCaptureV2,
        addr!(pool_hooks::cuStreamBeginCapture_v2),
    ),
    (
        Sym::CuDevicePrimaryCtxReset,
        addr!(pool_hooks::cuDevicePrimaryCtxReset),
    ),
    (
        Sym::CuDevicePrimaryCtxResetV2,
        addr!(pool_hooks::cuDevicePrimaryCtxReset_v2),
    ),
    (
        Sym::CuStreamBeginCaptureV2Ptsz,
        addr!(pool_hooks::cuStreamBeginCapture_v2_ptsz),
    ),
    (
        Sym::CuStreamBeginCaptureToGraph,
        addr!(pool_hooks::cuStreamBeginCaptureToGraph),
    ),
    (
        Sym::CuStreamBeginCaptureToGraphPtsz,
        addr!(pool_hooks::cuStreamBeginCaptureToGraph_ptsz),
    ),
    (
        Sym::CuStreamEndCapture,
        addr!(pool_hooks::cuStreamEndCapture),
    ),
    (
        Sym::CuStreamEndCapturePtsz,
        addr!(pool_hooks::cuStreamEndCapture_ptsz),
    ),
    (Sym::CuGetProcAddress, addr!(entry::cuGetProcAddress)),
    (Sym::CuGetProcAddressV2, addr!(entry::cuGetProcAddress_v2)),
];

/// Wrappers handed out by entry-point lookups, by the ABI they stand for.
static PROC: &[(Sym, Addr)] = &[
    (Sym::CuMemAllocV2, addr!(driver::proc_cuMemAlloc_v2)),
    (Sym::CuMemFreeV2, addr!(driver::proc_cuMemFree_v2)),
    (Sym::CuMemAllocAsync, addr!(driver::proc_cuMemAllocAsync)),
    (
        Sym::CuMemAllocAsyncPtsz,
        addr!(driver::proc_cuMemAllocAsync_ptsz),
    ),
    (Sym::CuMemFreeAsync, addr!(driver::proc_cuMemFreeAsync)),
    (
        Sym::CuMemFreeAsyncPtsz,
        addr!(driver::proc_cuMemFreeAsync_ptsz),
    ),
    (
        Sym::CuMemAllocFromPoolAsync,
        addr!(driver::proc_cuMemAllocFromPoolAsync),
    ),
    (
        Sym::CuMemAllocFromPoolAsyncPtsz,
        addr!(driver::proc_cuMemAllocFromPoolAsync_ptsz),
    ),
    (
        Sym::CuMemAllocPitchV2,
        addr!(driver::proc_cuMemAllocPitch_v2),
    ),
    (
        Sym::CuMemAllocManaged,
        addr!(driver::proc_cuMemAllocManaged),
    ),
    (Sym::CuMemHostAlloc, addr!(driver::proc_cuMemHostAlloc)),
    (Sym::CuMemFreeHost, addr!(driver::proc_cuMemFreeHost)),
    (Sym::CuMemCreate, addr!(driver::proc_cuMemCreate)),
    (Sym::CuMemRelease, addr!(driver::proc_cuMemRelease)),
    (Sym::CuMemMap, addr!(driver::proc_cuMemMap)),
    (Sym::CuMemUnmap, addr!(driver::proc_cuMemUnmap)),
    (
        Sym::CuMemAddressReserve,
        addr!(driver::proc_cuMemAddressReserve),
    ),
    (Sym::CuMemAddressFree, addr!(driver::proc_cuMemAddressFree)),
    (Sym::CuMemSetAccess, addr!(driver::proc_cuMemSetAccess)),
    (Sym::CuMemGetInfoV2, addr!(driver::proc_cuMemGetInfo_v2)),
    (Sym::CuStreamCreate, addr!(pool_hooks::proc_cuStreamCreate)),
    (
        Sym::CuStreamCreateWithPriority,
        addr!(pool_hooks::proc_cuStreamCreateWithPriority),
    ),
    (
        Sym::CuStreamDestroyV2,
        addr!(pool_hooks::proc_cuStreamDestroy_v2),
    ),
    (
        Sym::CuCtxSynchronize,
        addr!(pool_hooks::proc_cuCtxSynchronize),
    ),
    (
        Sym::CuMemGetAddressRangeV2,
        addr!(pool_hooks::proc_cuMemGetAddressRange_v2),
    ),
    (
        Sym::CuPointerGetAttribute,
        addr!(pool_hooks::proc_cuPointerGetAttribute),
    ),
    (
        Sym::CuPointerGetAttributes,
        addr!(pool_hooks::proc_cuPointerGetAttributes),
    ),
    (
        Sym::CuIpcGetMemHandle,
        addr!(pool_hooks::proc_cuIpcGetMemHandle),
    ),
    (
        Sym::CuIpcOpenMemHandleV2,
        addr!(pool_hooks::proc_cuIpcOpenMemHandle_v2),
    ),
    (
        Sym::CuIpcCloseMemHandle,
        addr!(pool_hooks::proc_cuIpcCloseMemHandle),
    ),
    (
        Sym::CuStreamBeginCapture,
        addr!(pool_hooks::proc_cuStreamBeginCapture),
    ),
    (
        Sym::CuStreamBeginCapturePtsz,
        addr!(pool_hooks::proc_cuStreamBeginCapture_ptsz),
    ),
    (
        Sym::CuStreamBeginCaptureV2,
        addr!(pool_hooks::proc_cuStreamBeginCapture_v2),
    ),
    (
        Sym::CuDevicePrimaryCtxReset,
        addr!(pool_hooks::proc_cuDevicePrimaryCtxReset),
    ),
    (
        Sym::CuDevicePrimaryCtxResetV2,
        addr!(pool_hooks::proc_cuDevicePrimaryCtxReset_v2),
    ),
    (
        Sym::CuStreamBeginCaptureV2Ptsz,
        addr!(pool_hooks::proc_cuStreamBeginCapture_v2_ptsz),
    ),
    (
        Sym::CuStreamBeginCaptureToGraph,
        addr!(pool_hooks::proc_cuStreamBeginCaptureToGraph),
    ),
    (
        Sym::CuStreamBeginCaptureToGraphPtsz,
        addr!(pool_hooks::proc_cuStreamBeginCaptureToGraph_ptsz),
    ),
    (
        Sym::CuStreamEndCapture,
        addr!(pool_hooks::proc_cuStreamEndCapture),
    ),
    (
        Sym::CuStreamEndCapturePtsz,
        addr!(pool_hooks::proc_cuStreamEndCapture_ptsz),
    ),
    (Sym::CuGetProcAddress, addr!(entry::proc_cuGetProcAddress)),
    (
        Sym::CuGetProcAddressV2,
        addr!(entry::proc_cuGetProcAddress_v2),
    ),
];

/// Our exported hook for a symbol name, if we hook it.
pub fn exported_by_name(name: &CStr) -> Option<(Sym, usize)> {
    let name = name.to_bytes();
    EXPORTED
        .iter()
        .find(|(s, _)| s.c_name().to_bytes() == name)
        .map(|(s, a)| (*s, a.0 as usize))
}

/// The wrapper an entry-point lookup hands out for an ABI.
pub fn proc_wrapper(sym: Sym) -> Option<usize> {
    PROC.iter()
        .find(|(s, _)| *s == sym)
        .map(|(_, a)| a.0 as usize)
}
