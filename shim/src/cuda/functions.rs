//! Every CUDA function the shim resolves, hooks or hands out: one row each. From these rows
//! follow the symbol list and each real function's type (`cuda::symbols`), the exported hooks,
//! the wrappers entry-point lookups hand out and the tables `dlsym` and those lookups read
//! (`route`), and the check that each recorded hook's trace API is named after it.
//!
//! A row:
//!
//! ```text
//! Variant = c_name in Runtime|Driver fn(arg: Type, ...)
//!     [=> crate::path::to::body as ApiVariant]
//!     [, entry Both|Legacy|PerThread c"lookup name" since VERSION [until VERSION]]... ;
//! ```
//!
//! - `=> body as Api`: the function is hooked: exported under `c_name` (and, from the driver,
//!   handed out by entry-point lookups too); the hook calls `body(real, args...)` where `real`
//!   ([`crate::hooks::Real`]) holds the real function typed by this row's signature, the
//!   symbol and the API (`Runtime` and `Driver` name the two sides of a body both APIs share,
//!   `hooks::memory`; a body whose declared function type is not the row's does not compile).
//!   `Api` is the trace's API of its records:
//!   its name must be `c_name` (checked at compile time), or `Shim` for hooks that record
//!   nothing of their own. Without it, the function is only resolved, for the shim's own calls.
//! - `entry`: a driver entry-point lookup of that name, for CUDA versions `since..until`
//!   (until the first version whose ABI is unknown when not given), returns this ABI: for both
//!   stream flavours, or only the legacy or only the per-thread-default-stream one.
//!
//! Adding a hooked function is one row here and, where no body fits, a body in `hooks/`.
//! The rows are handed to a macro (`cuda_functions!(then)` expands to `then! { rows }`), so the
//! layers below the hooks read them without depending on the hooks: a path is only a token
//! until the `route` layer expands it.

/// Hands the rows to the macro `$then`.
macro_rules! cuda_functions {
    ($then:ident) => {
        $then! {
        // The runtime (libcudart): exported hooks.
        CudaMalloc = cudaMalloc in Runtime fn(p: *mut *mut c_void, size: usize)
            => crate::hooks::memory::malloc::<Runtime> as CudaMalloc;
        CudaFree = cudaFree in Runtime fn(p: *mut c_void)
            => crate::hooks::memory::free::<Runtime> as CudaFree;
        CudaMallocAsync = cudaMallocAsync in Runtime fn(p: *mut *mut c_void, size: usize, s: Stream)
            => crate::hooks::memory::malloc_async::<Runtime> as CudaMallocAsync;
        CudaMallocAsyncPtsz = cudaMallocAsync_ptsz in Runtime fn(p: *mut *mut c_void, size: usize, s: Stream)
            => crate::hooks::memory::malloc_async::<Runtime> as CudaMallocAsyncPtsz;
        CudaFreeAsync = cudaFreeAsync in Runtime fn(p: *mut c_void, s: Stream)
            => crate::hooks::memory::free_async::<Runtime> as CudaFreeAsync;
        CudaFreeAsyncPtsz = cudaFreeAsync_ptsz in Runtime fn(p: *mut c_void, s: Stream)
            => crate::hooks::memory::free_async::<Runtime> as CudaFreeAsyncPtsz;
        CudaMallocFromPoolAsync = cudaMallocFromPoolAsync in Runtime fn(p: *mut *mut c_void, size: usize, pool: *mut c_void, s: Stream)
            => crate::hooks::memory::malloc_from_pool::<Runtime> as CudaMallocFromPoolAsync;
        CudaMallocFromPoolAsyncPtsz = cudaMallocFromPoolAsync_ptsz in Runtime fn(p: *mut *mut c_void, size: usize, pool: *mut c_void, s: Stream)
            => crate::hooks::memory::malloc_from_pool::<Runtime> as CudaMallocFromPoolAsyncPtsz;
        CudaMallocManaged = cudaMallocManaged in Runtime fn(p: *mut *mut c_void, size: usize, flags: u32)
            => crate::hooks::memory::malloc_managed::<Runtime> as CudaMallocManaged;
        CudaMallocHost = cudaMallocHost in Runtime fn(p: *mut *mut c_void, size: usize)
            => crate::hooks::runtime::malloc_host as CudaMallocHost;
        CudaHostAlloc = cudaHostAlloc in Runtime fn(p: *mut *mut c_void, size: usize, flags: u32)
            => crate::hooks::host::host_alloc as CudaHostAlloc;
        CudaFreeHost = cudaFreeHost in Runtime fn(p: *mut c_void)
            => crate::hooks::host::free_host as CudaFreeHost;
        CudaMallocPitch = cudaMallocPitch in Runtime fn(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize)
            => crate::hooks::runtime::malloc_pitch as CudaMallocPitch;
        CudaMalloc3D = cudaMalloc3D in Runtime fn(p: *mut CudaPitchedPtr, extent: CudaExtent)
            => crate::hooks::runtime::malloc_3d as CudaMalloc3D;
        CudaMemGetInfo = cudaMemGetInfo in Runtime fn(free: *mut usize, total: *mut usize)
            => crate::hooks::memory::mem_get_info::<Runtime> as CudaMemGetInfo;
        CudaGetDriverEntryPoint = cudaGetDriverEntryPoint in Runtime
            fn(symbol: *const c_char, func: *mut *mut c_void, flags: u64, status: *mut c_int)
            => crate::route::entry::driver_entry_point as Shim;
        CudaGetDriverEntryPointPtsz = cudaGetDriverEntryPoint_ptsz in Runtime
            fn(symbol: *const c_char, func: *mut *mut c_void, flags: u64, status: *mut c_int)
            => crate::route::entry::driver_entry_point as Shim;
        CudaGetDriverEntryPointByVersion = cudaGetDriverEntryPointByVersion in Runtime
            fn(symbol: *const c_char, func: *mut *mut c_void, version: u32, flags: u64, status: *mut c_int)
            => crate::route::entry::driver_entry_point_by_version as Shim;
        CudaGetDriverEntryPointByVersionPtsz = cudaGetDriverEntryPointByVersion_ptsz in Runtime
            fn(symbol: *const c_char, func: *mut *mut c_void, version: u32, flags: u64, status: *mut c_int)
            => crate::route::entry::driver_entry_point_by_version as Shim;
        CudaDeviceReset = cudaDeviceReset in Runtime fn()
            => crate::hooks::streams::device_reset as Shim;
        CudaMemPoolCreate = cudaMemPoolCreate in Runtime fn(pool: *mut *mut c_void, props: *const c_void)
            => crate::hooks::memory::pool_create::<Runtime> as Shim;
        CudaMemPoolDestroy = cudaMemPoolDestroy in Runtime fn(pool: *mut c_void)
            => crate::hooks::memory::pool_destroy::<Runtime> as Shim;
        CudaGraphAddMemAllocNode = cudaGraphAddMemAllocNode in Runtime
            fn(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, n: usize, params: *mut c_void)
            => crate::hooks::memory::graph_alloc_node::<Runtime> as CudaGraphAddMemAllocNode;
        CudaGraphAddMemFreeNode = cudaGraphAddMemFreeNode in Runtime
            fn(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, n: usize, p: *mut c_void)
            => crate::hooks::memory::graph_free_node::<Runtime> as CudaGraphAddMemFreeNode;
        // Resolved, not hooked.
        CudaGetDevice = cudaGetDevice in Runtime fn(a0: *mut c_int);
        CudaRuntimeGetVersion = cudaRuntimeGetVersion in Runtime fn(a0: *mut c_int);

        // The driver (libcuda): each hook is exported and handed out by entry-point lookups.
        CuMemAllocV2 = cuMemAlloc_v2 in Driver fn(p: *mut u64, size: usize)
            => crate::hooks::memory::malloc::<Driver> as CuMemAlloc
            , entry Both c"cuMemAlloc" since 3020;
        CuMemFreeV2 = cuMemFree_v2 in Driver fn(p: u64)
            => crate::hooks::memory::free::<Driver> as CuMemFree
            , entry Both c"cuMemFree" since 3020;
        CuMemAllocAsync = cuMemAllocAsync in Driver fn(p: *mut u64, size: usize, s: Stream)
            => crate::hooks::memory::malloc_async::<Driver> as CuMemAllocAsync
            , entry Legacy c"cuMemAllocAsync" since 11020;
        CuMemAllocAsyncPtsz = cuMemAllocAsync_ptsz in Driver fn(p: *mut u64, size: usize, s: Stream)
            => crate::hooks::memory::malloc_async::<Driver> as CuMemAllocAsyncPtsz
            , entry PerThread c"cuMemAllocAsync" since 11020;
        CuMemFreeAsync = cuMemFreeAsync in Driver fn(p: u64, s: Stream)
            => crate::hooks::memory::free_async::<Driver> as CuMemFreeAsync
            , entry Legacy c"cuMemFreeAsync" since 11020;
        CuMemFreeAsyncPtsz = cuMemFreeAsync_ptsz in Driver fn(p: u64, s: Stream)
            => crate::hooks::memory::free_async::<Driver> as CuMemFreeAsyncPtsz
            , entry PerThread c"cuMemFreeAsync" since 11020;
        CuMemAllocFromPoolAsync = cuMemAllocFromPoolAsync in Driver fn(p: *mut u64, size: usize, pool: *mut c_void, s: Stream)
            => crate::hooks::memory::malloc_from_pool::<Driver> as CuMemAllocFromPoolAsync
            , entry Legacy c"cuMemAllocFromPoolAsync" since 11020;
        CuMemAllocFromPoolAsyncPtsz = cuMemAllocFromPoolAsync_ptsz in Driver fn(p: *mut u64, size: usize, pool: *mut c_void, s: Stream)
            => crate::hooks::memory::malloc_from_pool::<Driver> as CuMemAllocFromPoolAsyncPtsz
            , entry PerThread c"cuMemAllocFromPoolAsync" since 11020;
        CuGraphAddMemAllocNode = cuGraphAddMemAllocNode in Driver
            fn(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, n: usize, params: *mut c_void)
            => crate::hooks::memory::graph_alloc_node::<Driver> as CuGraphAddMemAllocNode
            , entry Both c"cuGraphAddMemAllocNode" since 11040;
        CuGraphAddMemFreeNode = cuGraphAddMemFreeNode in Driver
            fn(node: *mut *mut c_void, graph: *mut c_void, deps: *const c_void, n: usize, p: u64)
            => crate::hooks::memory::graph_free_node::<Driver> as CuGraphAddMemFreeNode
            , entry Both c"cuGraphAddMemFreeNode" since 11040;
        CuMemPoolCreate = cuMemPoolCreate in Driver fn(pool: *mut *mut c_void, props: *const c_void)
            => crate::hooks::memory::pool_create::<Driver> as Shim
            , entry Both c"cuMemPoolCreate" since 11020;
        CuMemPoolDestroy = cuMemPoolDestroy in Driver fn(pool: *mut c_void)
            => crate::hooks::memory::pool_destroy::<Driver> as Shim
            , entry Both c"cuMemPoolDestroy" since 11020;
        CuMemAllocPitchV2 = cuMemAllocPitch_v2 in Driver fn(p: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32)
            => crate::hooks::driver::mem_alloc_pitch as CuMemAllocPitch
            , entry Both c"cuMemAllocPitch" since 3020;
        CuMemAllocManaged = cuMemAllocManaged in Driver fn(p: *mut u64, size: usize, flags: u32)
            => crate::hooks::memory::malloc_managed::<Driver> as CuMemAllocManaged
            , entry Both c"cuMemAllocManaged" since 6000;
        CuMemHostAlloc = cuMemHostAlloc in Driver fn(p: *mut *mut c_void, size: usize, flags: u32)
            => crate::hooks::host::host_alloc as CuMemHostAlloc
            , entry Both c"cuMemHostAlloc" since 2020;
        CuMemFreeHost = cuMemFreeHost in Driver fn(p: *mut c_void)
            => crate::hooks::host::free_host as CuMemFreeHost
            , entry Both c"cuMemFreeHost" since 2000;
        CuMemCreate = cuMemCreate in Driver fn(h: *mut u64, size: usize, prop: *const c_void, flags: u64)
            => crate::hooks::driver::mem_create as CuMemCreate
            , entry Both c"cuMemCreate" since 10020;
        CuMemRelease = cuMemRelease in Driver fn(h: u64)
            => crate::hooks::driver::mem_release as CuMemRelease
            , entry Both c"cuMemRelease" since 10020;
        CuMemMap = cuMemMap in Driver fn(p: u64, size: usize, offset: usize, h: u64, flags: u64)
            => crate::hooks::driver::mem_map as CuMemMap
            , entry Both c"cuMemMap" since 10020;
        CuMemUnmap = cuMemUnmap in Driver fn(p: u64, size: usize)
            => crate::hooks::driver::mem_unmap as CuMemUnmap
            , entry Both c"cuMemUnmap" since 10020;
        CuMemAddressReserve = cuMemAddressReserve in Driver fn(p: *mut u64, size: usize, align: usize, addr: u64, flags: u64)
            => crate::hooks::driver::mem_address_reserve as CuMemAddressReserve
            , entry Both c"cuMemAddressReserve" since 10020;
        CuMemAddressFree = cuMemAddressFree in Driver fn(p: u64, size: usize)
            => crate::hooks::driver::mem_address_free as CuMemAddressFree
            , entry Both c"cuMemAddressFree" since 10020;
        CuMemSetAccess = cuMemSetAccess in Driver fn(p: u64, size: usize, desc: *const c_void, count: usize)
            => crate::hooks::driver::mem_set_access as CuMemSetAccess
            , entry Both c"cuMemSetAccess" since 10020;
        CuMemGetInfoV2 = cuMemGetInfo_v2 in Driver fn(free: *mut usize, total: *mut usize)
            => crate::hooks::memory::mem_get_info::<Driver> as CuMemGetInfo
            , entry Both c"cuMemGetInfo" since 3020;
        CuGetProcAddress = cuGetProcAddress in Driver fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64)
            => crate::route::entry::get_proc_address as Shim
            , entry Both c"cuGetProcAddress" since 11030 until 12000;
        CuGetProcAddressV2 = cuGetProcAddress_v2 in Driver fn(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int)
            => crate::route::entry::get_proc_address_v2 as Shim
            , entry Both c"cuGetProcAddress" since 12000;
        // For the pool: stream lifetimes, synchronization points, pointer queries, IPC,
        // captures, resets.
        CuStreamCreate = cuStreamCreate in Driver fn(s: *mut Stream, flags: u32)
            => crate::hooks::streams::stream_create as CuStreamCreate
            , entry Both c"cuStreamCreate" since 2000;
        CuStreamCreateWithPriority = cuStreamCreateWithPriority in Driver fn(s: *mut Stream, flags: u32, priority: c_int)
            => crate::hooks::streams::stream_create_with_priority as CuStreamCreateWithPriority
            , entry Both c"cuStreamCreateWithPriority" since 5050;
        CuStreamDestroyV2 = cuStreamDestroy_v2 in Driver fn(s: Stream)
            => crate::hooks::streams::stream_destroy as Shim
            , entry Both c"cuStreamDestroy" since 4000;
        CuCtxSynchronize = cuCtxSynchronize in Driver fn()
            => crate::hooks::streams::ctx_synchronize as Shim
            , entry Both c"cuCtxSynchronize" since 2000;
        CuMemGetAddressRangeV2 = cuMemGetAddressRange_v2 in Driver fn(base: *mut u64, size: *mut usize, p: u64)
            => crate::hooks::pointers::get_address_range as Shim
            , entry Both c"cuMemGetAddressRange" since 3020;
        CuPointerGetAttribute = cuPointerGetAttribute in Driver fn(data: *mut c_void, attr: c_int, p: u64)
            => crate::hooks::pointers::pointer_get_attribute as Shim
            , entry Both c"cuPointerGetAttribute" since 4000;
        CuPointerGetAttributes = cuPointerGetAttributes in Driver fn(n: u32, attrs: *const c_int, data: *mut *mut c_void, p: u64)
            => crate::hooks::pointers::pointer_get_attributes as Shim
            , entry Both c"cuPointerGetAttributes" since 7000;
        CuIpcGetMemHandle = cuIpcGetMemHandle in Driver fn(handle: *mut c_void, p: u64)
            => crate::hooks::ipc::ipc_get_mem_handle as Shim
            , entry Both c"cuIpcGetMemHandle" since 4010;
        CuIpcOpenMemHandleV2 = cuIpcOpenMemHandle_v2 in Driver fn(out: *mut u64, handle: CuIpcMemHandle, flags: u32)
            => crate::hooks::ipc::ipc_open as Shim
            , entry Both c"cuIpcOpenMemHandle" since 11000;
        CuIpcCloseMemHandle = cuIpcCloseMemHandle in Driver fn(p: u64)
            => crate::hooks::ipc::ipc_close as Shim
            , entry Both c"cuIpcCloseMemHandle" since 4010;
        CuStreamBeginCapture = cuStreamBeginCapture in Driver fn(s: Stream)
            => crate::hooks::streams::begin_capture_v1 as Shim
            , entry Legacy c"cuStreamBeginCapture" since 10000 until 10010;
        CuStreamBeginCapturePtsz = cuStreamBeginCapture_ptsz in Driver fn(s: Stream)
            => crate::hooks::streams::begin_capture_v1 as Shim
            , entry PerThread c"cuStreamBeginCapture" since 10000 until 10010;
        CuStreamBeginCaptureV2 = cuStreamBeginCapture_v2 in Driver fn(s: Stream, mode: c_int)
            => crate::hooks::streams::begin_capture as Shim
            , entry Legacy c"cuStreamBeginCapture" since 10010;
        CuStreamBeginCaptureV2Ptsz = cuStreamBeginCapture_v2_ptsz in Driver fn(s: Stream, mode: c_int)
            => crate::hooks::streams::begin_capture as Shim
            , entry PerThread c"cuStreamBeginCapture" since 10010;
        CuStreamBeginCaptureToGraph = cuStreamBeginCaptureToGraph in Driver fn(s: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, n: usize, mode: c_int)
            => crate::hooks::streams::begin_capture_to_graph as Shim
            , entry Legacy c"cuStreamBeginCaptureToGraph" since 12030;
        CuStreamBeginCaptureToGraphPtsz = cuStreamBeginCaptureToGraph_ptsz in Driver fn(s: Stream, graph: *mut c_void, deps: *const c_void, edges: *const c_void, n: usize, mode: c_int)
            => crate::hooks::streams::begin_capture_to_graph as Shim
            , entry PerThread c"cuStreamBeginCaptureToGraph" since 12030;
        CuStreamEndCapture = cuStreamEndCapture in Driver fn(s: Stream, graph: *mut *mut c_void)
            => crate::hooks::streams::end_capture as Shim
            , entry Legacy c"cuStreamEndCapture" since 10000;
        CuStreamEndCapturePtsz = cuStreamEndCapture_ptsz in Driver fn(s: Stream, graph: *mut *mut c_void)
            => crate::hooks::streams::end_capture as Shim
            , entry PerThread c"cuStreamEndCapture" since 10000;
        CuDevicePrimaryCtxReset = cuDevicePrimaryCtxReset in Driver fn(device: c_int)
            => crate::hooks::streams::primary_ctx_reset as Shim
            , entry Both c"cuDevicePrimaryCtxReset" since 7000 until 11000;
        CuDevicePrimaryCtxResetV2 = cuDevicePrimaryCtxReset_v2 in Driver fn(device: c_int)
            => crate::hooks::streams::primary_ctx_reset as Shim
            , entry Both c"cuDevicePrimaryCtxReset" since 11000;
        // Resolved, not hooked.
        CuThreadExchangeStreamCaptureMode = cuThreadExchangeStreamCaptureMode in Driver fn(a0: *mut c_int);
        CuCtxGetDevice = cuCtxGetDevice in Driver fn(a0: *mut c_int);
        CuCtxGetCurrent = cuCtxGetCurrent in Driver fn(a0: *mut usize);
        CuCtxPushCurrentV2 = cuCtxPushCurrent_v2 in Driver fn(a0: usize);
        CuCtxPopCurrentV2 = cuCtxPopCurrent_v2 in Driver fn(a0: *mut usize);
        CuEventCreate = cuEventCreate in Driver fn(a0: *mut usize, a1: u32);
        CuEventRecord = cuEventRecord in Driver fn(a0: usize, a1: usize);
        CuCtxRecordEvent = cuCtxRecordEvent in Driver fn(a0: usize, a1: usize);
        CuEventQuery = cuEventQuery in Driver fn(a0: usize);
        CuEventSynchronize = cuEventSynchronize in Driver fn(a0: usize);
        CuStreamIsCapturing = cuStreamIsCapturing in Driver fn(a0: usize, a1: *mut c_int);
        CuStreamQuery = cuStreamQuery in Driver fn(a0: usize);
        CuDevicePrimaryCtxGetState = cuDevicePrimaryCtxGetState in Driver fn(a0: c_int, a1: *mut u32, a2: *mut c_int);
        CuDevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain in Driver fn(a0: *mut usize, a1: c_int);
        CuDevicePrimaryCtxReleaseV2 = cuDevicePrimaryCtxRelease_v2 in Driver fn(a0: c_int);
        // The NVML sampler's questions about CUDA's own pools (`trace::device_memory`).
        CuDeviceGet = cuDeviceGet in Driver fn(a0: *mut c_int, a1: c_int);
        CuDeviceGetAttribute = cuDeviceGetAttribute in Driver fn(a0: *mut c_int, a1: c_int, a2: c_int);
        CuDeviceTotalMemV2 = cuDeviceTotalMem_v2 in Driver fn(a0: *mut usize, a1: c_int);
        CuDeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool in Driver fn(a0: *mut *mut c_void, a1: c_int);
        CuMemPoolGetAttribute = cuMemPoolGetAttribute in Driver fn(a0: *mut c_void, a1: c_int, a2: *mut c_void);
        CuDeviceGetGraphMemAttribute = cuDeviceGetGraphMemAttribute in Driver fn(a0: c_int, a1: c_int, a2: *mut c_void);
        CuCtxSetCurrent = cuCtxSetCurrent in Driver fn(a0: usize);

        }
    };
}
pub(crate) use cuda_functions;
