//! Every CUDA function the shim resolves, hooks or hands out, named once.

use core::ffi::CStr;

pub use sig::SigOf;

/// Which library a real function lives in, to find it when `RTLD_NEXT` cannot (the library was
/// loaded `RTLD_LOCAL`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lib {
    Runtime,
    Driver,
}

impl Lib {
    pub const fn sonames(self) -> &'static [&'static CStr] {
        match self {
            Lib::Runtime => &[
                c"libcudart.so.13",
                c"libcudart.so.12",
                c"libcudart.so.11.0",
                c"libcudart.so",
            ],
            Lib::Driver => &[c"libcuda.so.1", c"libcuda.so"],
        }
    }
}

macro_rules! symbols {
    ($($var:ident = $name:literal in $lib:ident,)*) => {
        /// A real CUDA function, by its exported (ABI-exact) name.
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[repr(usize)]
        pub enum Sym { $($var,)* }

        pub const SYM_COUNT: usize = [$(Sym::$var,)*].len();

        impl Sym {
            pub const fn c_name(self) -> &'static CStr {
                match self { $(Sym::$var => $name,)* }
            }

            pub const fn lib(self) -> Lib {
                match self { $(Sym::$var => Lib::$lib,)* }
            }
        }
    };
}

symbols! {
    CudaMalloc = c"cudaMalloc" in Runtime,
    CudaFree = c"cudaFree" in Runtime,
    CudaMallocAsync = c"cudaMallocAsync" in Runtime,
    CudaMallocAsyncPtsz = c"cudaMallocAsync_ptsz" in Runtime,
    CudaFreeAsync = c"cudaFreeAsync" in Runtime,
    CudaFreeAsyncPtsz = c"cudaFreeAsync_ptsz" in Runtime,
    CudaMallocFromPoolAsync = c"cudaMallocFromPoolAsync" in Runtime,
    CudaMallocFromPoolAsyncPtsz = c"cudaMallocFromPoolAsync_ptsz" in Runtime,
    CudaMallocManaged = c"cudaMallocManaged" in Runtime,
    CudaMallocHost = c"cudaMallocHost" in Runtime,
    CudaHostAlloc = c"cudaHostAlloc" in Runtime,
    CudaFreeHost = c"cudaFreeHost" in Runtime,
    CudaMallocPitch = c"cudaMallocPitch" in Runtime,
    CudaMalloc3D = c"cudaMalloc3D" in Runtime,
    CudaMemGetInfo = c"cudaMemGetInfo" in Runtime,
    CudaGetDriverEntryPoint = c"cudaGetDriverEntryPoint" in Runtime,
    CudaGetDriverEntryPointPtsz = c"cudaGetDriverEntryPoint_ptsz" in Runtime,
    CudaGetDriverEntryPointByVersion = c"cudaGetDriverEntryPointByVersion" in Runtime,
    CudaGetDriverEntryPointByVersionPtsz = c"cudaGetDriverEntryPointByVersion_ptsz" in Runtime,
    CudaDeviceReset = c"cudaDeviceReset" in Runtime,
    // Resolved, not hooked.
    CudaGetDevice = c"cudaGetDevice" in Runtime,
    CudaRuntimeGetVersion = c"cudaRuntimeGetVersion" in Runtime,

    CuMemAllocV2 = c"cuMemAlloc_v2" in Driver,
    CuMemFreeV2 = c"cuMemFree_v2" in Driver,
    CuMemAllocAsync = c"cuMemAllocAsync" in Driver,
    CuMemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" in Driver,
    CuMemFreeAsync = c"cuMemFreeAsync" in Driver,
    CuMemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" in Driver,
    CuMemAllocFromPoolAsync = c"cuMemAllocFromPoolAsync" in Driver,
    CuMemAllocFromPoolAsyncPtsz = c"cuMemAllocFromPoolAsync_ptsz" in Driver,
    CuMemAllocPitchV2 = c"cuMemAllocPitch_v2" in Driver,
    CuMemAllocManaged = c"cuMemAllocManaged" in Driver,
    CuMemHostAlloc = c"cuMemHostAlloc" in Driver,
    CuMemFreeHost = c"cuMemFreeHost" in Driver,
    CuMemCreate = c"cuMemCreate" in Driver,
    CuMemRelease = c"cuMemRelease" in Driver,
    CuMemMap = c"cuMemMap" in Driver,
    CuMemUnmap = c"cuMemUnmap" in Driver,
    CuMemAddressReserve = c"cuMemAddressReserve" in Driver,
    CuMemAddressFree = c"cuMemAddressFree" in Driver,
    CuMemSetAccess = c"cuMemSetAccess" in Driver,
    CuMemGetInfoV2 = c"cuMemGetInfo_v2" in Driver,
    CuGetProcAddress = c"cuGetProcAddress" in Driver,
    CuGetProcAddressV2 = c"cuGetProcAddress_v2" in Driver,
    // Hooked for the pool: stream lifetimes, synchronization points, pointer queries, IPC.
    CuStreamCreate = c"cuStreamCreate" in Driver,
    CuStreamCreateWithPriority = c"cuStreamCreateWithPriority" in Driver,
    CuStreamDestroyV2 = c"cuStreamDestroy_v2" in Driver,
    CuCtxSynchronize = c"cuCtxSynchronize" in Driver,
    CuMemGetAddressRangeV2 = c"cuMemGetAddressRange_v2" in Driver,
    CuPointerGetAttribute = c"cuPointerGetAttribute" in Driver,
    CuPointerGetAttributes = c"cuPointerGetAttributes" in Driver,
    CuIpcGetMemHandle = c"cuIpcGetMemHandle" in Driver,
    CuIpcOpenMemHandleV2 = c"cuIpcOpenMemHandle_v2" in Driver,
    CuIpcCloseMemHandle = c"cuIpcCloseMemHandle" in Driver,
    CuStreamBeginCapture = c"cuStreamBeginCapture" in Driver,
    CuStreamBeginCapturePtsz = c"cuStreamBeginCapture_ptsz" in Driver,
    CuStreamBeginCaptureV2 = c"cuStreamBeginCapture_v2" in Driver,
    CuStreamBeginCaptureV2Ptsz = c"cuStreamBeginCapture_v2_ptsz" in Driver,
    CuStreamBeginCaptureToGraph = c"cuStreamBeginCaptureToGraph" in Driver,
    CuStreamBeginCaptureToGraphPtsz = c"cuStreamBeginCaptureToGraph_ptsz" in Driver,
    CuStreamEndCapture = c"cuStreamEndCapture" in Driver,
    CuStreamEndCapturePtsz = c"cuStreamEndCapture_ptsz" in Driver,
    CuDevicePrimaryCtxReset = c"cuDevicePrimaryCtxReset" in Driver,
    CuDevicePrimaryCtxResetV2 = c"cuDevicePrimaryCtxReset_v2" in Driver,
    // Resolved, not hooked.
    CuThreadExchangeStreamCaptureMode = c"cuThreadExchangeStreamCaptureMode" in Driver,
    CuCtxGetDevice = c"cuCtxGetDevice" in Driver,
    CuCtxGetCurrent = c"cuCtxGetCurrent" in Driver,
    CuCtxPushCurrentV2 = c"cuCtxPushCurrent_v2" in Driver,
    CuCtxPopCurrentV2 = c"cuCtxPopCurrent_v2" in Driver,
    CuEventCreate = c"cuEventCreate" in Driver,
    CuEventRecord = c"cuEventRecord" in Driver,
    CuCtxRecordEvent = c"cuCtxRecordEvent" in Driver,
    CuEventQuery = c"cuEventQuery" in Driver,
    CuEventSynchronize = c"cuEventSynchronize" in Driver,
    CuEventDestroyV2 = c"cuEventDestroy_v2" in Driver,
    CuStreamIsCapturing = c"cuStreamIsCapturing" in Driver,
    CuStreamQuery = c"cuStreamQuery" in Driver,
    CuDevicePrimaryCtxGetState = c"cuDevicePrimaryCtxGetState" in Driver,
    CuDevicePrimaryCtxRetain = c"cuDevicePrimaryCtxRetain" in Driver,
    CuDevicePrimaryCtxReleaseV2 = c"cuDevicePrimaryCtxRelease_v2" in Driver,
}

/// The C signature of every real function the shim calls, declared once, beside the symbol
/// list: `sig::CudaMalloc` is `cudaMalloc`'s. [`crate::cuda::real::function`] hands a real
/// function out only typed by its own signature.
#[allow(non_camel_case_types)]
pub mod sig {
    use super::Sym;
    use crate::cuda::ffi::{CuIpcMemHandle, CudaExtent, CudaPitchedPtr};
    use core::ffi::{c_char, c_int, c_void};

    /// A stream handle (`cudaStream_t`, `CUstream`).
    pub type Stream = *mut c_void;

    /// Ties a symbol (a unit type named after it) to its signature.
    pub trait SigOf {
        const SYM: Sym;
        type F: Copy;
    }

    macro_rules! signatures {
        ($($var:ident: fn($($a:ty),*) -> $r:ty;)*) => {
            $(
                pub type $var = unsafe extern "C" fn($($a),*) -> $r;
            )*
            /// One unit type per symbol, for [`SigOf`]: names at the type level only.
            #[allow(dead_code)]
            pub mod of {
                $(
                    pub struct $var;
                    impl super::SigOf for $var {
                        const SYM: super::Sym = super::Sym::$var;
                        type F = super::$var;
                    }
                )*
            }
        };
    }

    signatures! {
        CudaMalloc: fn(*mut *mut c_void, usize) -> i32;
        CudaFree: fn(*mut c_void) -> i32;
        CudaMallocAsync: fn(*mut *mut c_void, usize, Stream) -> i32;
        CudaFreeAsync: fn(*mut c_void, Stream) -> i32;
        CudaMallocFromPoolAsync: fn(*mut *mut c_void, usize, *mut c_void, Stream) -> i32;
        CudaMallocManaged: fn(*mut *mut c_void, usize, u32) -> i32;
        CudaMallocHost: fn(*mut *mut c_void, usize) -> i32;
        CudaHostAlloc: fn(*mut *mut c_void, usize, u32) -> i32;
        CudaFreeHost: fn(*mut c_void) -> i32;
        CudaMallocPitch: fn(*mut *mut c_void, *mut usize, usize, usize) -> i32;
        CudaMalloc3D: fn(*mut CudaPitchedPtr, CudaExtent) -> i32;
        CudaMemGetInfo: fn(*mut usize, *mut usize) -> i32;
        CudaGetDriverEntryPoint: fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> i32;
        CudaGetDriverEntryPointPtsz: fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> i32;
        CudaGetDriverEntryPointByVersion:
            fn(*const c_char, *mut *mut c_void, u32, u64, *mut c_int) -> i32;
        CudaGetDriverEntryPointByVersionPtsz:
            fn(*const c_char, *mut *mut c_void, u32, u64, *mut c_int) -> i32;
        CudaDeviceReset: fn() -> i32;
        CudaGetDevice: fn(*mut c_int) -> i32;
        CudaRuntimeGetVersion: fn(*mut c_int) -> i32;
        CuMemAllocV2: fn(*mut u64, usize) -> i32;
        CuMemFreeV2: fn(u64) -> i32;
        CuMemAllocAsync: fn(*mut u64, usize, Stream) -> i32;
        CuMemFreeAsync: fn(u64, Stream) -> i32;
        CuMemAllocFromPoolAsync: fn(*mut u64, usize, *mut c_void, Stream) -> i32;
        CuMemAllocPitchV2: fn(*mut u64, *mut usize, usize, usize, u32) -> i32;
        CuMemAllocManaged: fn(*mut u64, usize, u32) -> i32;
        CuMemHostAlloc: fn(*mut *mut c_void, usize, u32) -> i32;
        CuMemFreeHost: fn(*mut c_void) -> i32;
        CuMemCreate: fn(*mut u64, usize, *const c_void, u64) -> i32;
        CuMemRelease: fn(u64) -> i32;
        CuMemMap: fn(u64, usize, usize, u64, u64) -> i32;
        CuMemUnmap: fn(u64, usize) -> i32;
        CuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64) -> i32;
        CuMemAddressFree: fn(u64, usize) -> i32;
        CuMemSetAccess: fn(u64, usize, *const c_void, usize) -> i32;
        CuMemGetInfoV2: fn(*mut usize, *mut usize) -> i32;
        CuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64) -> i32;
        CuGetProcAddressV2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> i32;
        CuStreamCreate: fn(*mut Stream, u32) -> i32;
        CuStreamCreateWithPriority: fn(*mut Stream, u32, c_int) -> i32;
        CuStreamDestroyV2: fn(Stream) -> i32;
        CuCtxSynchronize: fn() -> i32;
        CuMemGetAddressRangeV2: fn(*mut u64, *mut usize, u64) -> i32;
        CuPointerGetAttribute: fn(*mut c_void, c_int, u64) -> i32;
        CuPointerGetAttributes: fn(u32, *const c_int, *mut *mut c_void, u64) -> i32;
        CuIpcGetMemHandle: fn(*mut c_void, u64) -> i32;
        CuIpcOpenMemHandleV2: fn(*mut u64, CuIpcMemHandle, u32) -> i32;
        CuIpcCloseMemHandle: fn(u64) -> i32;
        CuStreamBeginCapture: fn(Stream) -> i32;
        CuStreamBeginCaptureV2: fn(Stream, c_int) -> i32;
        CuStreamBeginCaptureToGraph:
            fn(Stream, *mut c_void, *const c_void, *const c_void, usize, c_int) -> i32;
        CuStreamEndCapture: fn(Stream, *mut *mut c_void) -> i32;
        CuThreadExchangeStreamCaptureMode: fn(*mut c_int) -> i32;
        CuCtxGetDevice: fn(*mut c_int) -> i32;
        CuCtxGetCurrent: fn(*mut usize) -> i32;
        CuCtxPushCurrentV2: fn(usize) -> i32;
        CuCtxPopCurrentV2: fn(*mut usize) -> i32;
        CuEventCreate: fn(*mut usize, u32) -> i32;
        CuEventRecord: fn(usize, usize) -> i32;
        CuCtxRecordEvent: fn(usize, usize) -> i32;
        CuEventQuery: fn(usize) -> i32;
        CuEventSynchronize: fn(usize) -> i32;
        CuStreamIsCapturing: fn(usize, *mut c_int) -> i32;
        CuStreamQuery: fn(usize) -> i32;
        CuDevicePrimaryCtxReset: fn(c_int) -> i32;
        CuDevicePrimaryCtxResetV2: fn(c_int) -> i32;
        CuDevicePrimaryCtxGetState: fn(c_int, *mut u32, *mut c_int) -> i32;
        CuDevicePrimaryCtxRetain: fn(*mut usize, c_int) -> i32;
        CuDevicePrimaryCtxReleaseV2: fn(c_int) -> i32;
    }
}

/// How `cuGetProcAddress` names a driver function (its base name), from which CUDA version the
/// ABI we wrap is the one returned, and which of our symbols is that ABI (legacy and
/// per-thread-default-stream variants).
pub struct DriverEntry {
    pub base: &'static CStr,
    pub since: i32,
    /// The first version that returns a newer ABI (listed in another row).
    pub until: i32,
    pub legacy: Sym,
    pub per_thread: Sym,
}

/// Versions at or past this one may return an ABI we have not seen; those pass through.
pub const FIRST_UNKNOWN_VERSION: i32 = 14000;

const fn entry(base: &'static CStr, since: i32, legacy: Sym, per_thread: Sym) -> DriverEntry {
    older(base, since, FIRST_UNKNOWN_VERSION, legacy, per_thread)
}

/// A row for an older ABI of a function, returned for versions in `since..until`.
const fn older(
    base: &'static CStr,
    since: i32,
    until: i32,
    legacy: Sym,
    per_thread: Sym,
) -> DriverEntry {
    DriverEntry {
        base,
        since,
        until,
        legacy,
        per_thread,
    }
}

pub const DRIVER_ENTRIES: &[DriverEntry] = &[
    entry(c"cuMemAlloc", 3020, Sym::CuMemAllocV2, Sym::CuMemAllocV2),
    entry(c"cuMemFree", 3020, Sym::CuMemFreeV2, Sym::CuMemFreeV2),
    entry(
        c"cuMemAllocPitch",
        3020,
        Sym::CuMemAllocPitchV2,
        Sym::CuMemAllocPitchV2,
    ),
    entry(
        c"cuMemGetInfo",
        3020,
        Sym::CuMemGetInfoV2,
        Sym::CuMemGetInfoV2,
    ),
    entry(
        c"cuMemAllocManaged",
        6000,
        Sym::CuMemAllocManaged,
        Sym::CuMemAllocManaged,
    ),
    entry(
        c"cuMemHostAlloc",
        2020,
        Sym::CuMemHostAlloc,
        Sym::CuMemHostAlloc,
    ),
    entry(
        c"cuMemFreeHost",
        2000,
        Sym::CuMemFreeHost,
        Sym::CuMemFreeHost,
    ),
    entry(
        c"cuMemAllocAsync",
        11020,
        Sym::CuMemAllocAsync,
        Sym::CuMemAllocAsyncPtsz,
    ),
    entry(
        c"cuMemFreeAsync",
        11020,
        Sym::CuMemFreeAsync,
        Sym::CuMemFreeAsyncPtsz,
    ),
    entry(
        c"cuMemAllocFromPoolAsync",
        11020,
        Sym::CuMemAllocFromPoolAsync,
        Sym::CuMemAllocFromPoolAsyncPtsz,
    ),
    entry(c"cuMemCreate", 10020, Sym::CuMemCreate, Sym::CuMemCreate),
    entry(c"cuMemRelease", 10020, Sym::CuMemRelease, Sym::CuMemRelease),
    entry(c"cuMemMap", 10020, Sym::CuMemMap, Sym::CuMemMap),
    entry(c"cuMemUnmap", 10020, Sym::CuMemUnmap, Sym::CuMemUnmap),
    entry(
        c"cuMemAddressReserve",
        10020,
        Sym::CuMemAddressReserve,
        Sym::CuMemAddressReserve,
    ),
    entry(
        c"cuMemAddressFree",
        10020,
        Sym::CuMemAddressFree,
        Sym::CuMemAddressFree,
    ),
    entry(
        c"cuMemSetAccess",
        10020,
        Sym::CuMemSetAccess,
        Sym::CuMemSetAccess,
    ),
    entry(
        c"cuStreamCreate",
        2000,
        Sym::CuStreamCreate,
        Sym::CuStreamCreate,
    ),
    entry(
        c"cuStreamCreateWithPriority",
        5050,
        Sym::CuStreamCreateWithPriority,
        Sym::CuStreamCreateWithPriority,
    ),
    entry(
        c"cuStreamDestroy",
        4000,
        Sym::CuStreamDestroyV2,
        Sym::CuStreamDestroyV2,
    ),
    entry(
        c"cuCtxSynchronize",
        2000,
        Sym::CuCtxSynchronize,
        Sym::CuCtxSynchronize,
    ),
    entry(
        c"cuMemGetAddressRange",
        3020,
        Sym::CuMemGetAddressRangeV2,
        Sym::CuMemGetAddressRangeV2,
    ),
    entry(
        c"cuPointerGetAttribute",
        4000,
        Sym::CuPointerGetAttribute,
        Sym::CuPointerGetAttribute,
    ),
    entry(
        c"cuPointerGetAttributes",
        7000,
        Sym::CuPointerGetAttributes,
        Sym::CuPointerGetAttributes,
    ),
    entry(
        c"cuIpcGetMemHandle",
        4010,
        Sym::CuIpcGetMemHandle,
        Sym::CuIpcGetMemHandle,
    ),
    entry(
        c"cuIpcOpenMemHandle",
        11000,
        Sym::CuIpcOpenMemHandleV2,
        Sym::CuIpcOpenMemHandleV2,
    ),
    entry(
        c"cuIpcCloseMemHandle",
        4010,
        Sym::CuIpcCloseMemHandle,
        Sym::CuIpcCloseMemHandle,
    ),
    entry(
        c"cuStreamBeginCapture",
        10010,
        Sym::CuStreamBeginCaptureV2,
        Sym::CuStreamBeginCaptureV2Ptsz,
    ),
    older(
        c"cuStreamBeginCapture",
        10000,
        10010,
        Sym::CuStreamBeginCapture,
        Sym::CuStreamBeginCapturePtsz,
    ),
    entry(
        c"cuDevicePrimaryCtxReset",
        11000,
        Sym::CuDevicePrimaryCtxResetV2,
        Sym::CuDevicePrimaryCtxResetV2,
    ),
    older(
        c"cuDevicePrimaryCtxReset",
        7000,
        11000,
        Sym::CuDevicePrimaryCtxReset,
        Sym::CuDevicePrimaryCtxReset,
    ),
    entry(
        c"cuStreamBeginCaptureToGraph",
        12030,
        Sym::CuStreamBeginCaptureToGraph,
        Sym::CuStreamBeginCaptureToGraphPtsz,
    ),
    entry(
        c"cuStreamEndCapture",
        10000,
        Sym::CuStreamEndCapture,
        Sym::CuStreamEndCapturePtsz,
    ),
    // cuGetProcAddress: the v1 ABI below 12.0, the v2 ABI (with symbolStatus) from 12.0.
    entry(
        c"cuGetProcAddress",
        11030,
        Sym::CuGetProcAddress,
        Sym::CuGetProcAddress,
    ),
];

impl DriverEntry {
    /// The ABI a lookup of this entry returns for `version` and the stream flavour asked for,
    /// or `None` when it is one we do not wrap.
    pub fn abi(&self, version: i32, per_thread: bool) -> Option<Sym> {
        if version < self.since || version >= self.until.min(FIRST_UNKNOWN_VERSION) {
            return None;
        }
        if self.legacy == Sym::CuGetProcAddress && version >= 12000 {
            return Some(Sym::CuGetProcAddressV2);
        }
        Some(if per_thread {
            self.per_thread
        } else {
            self.legacy
        })
    }
}

/// The ABI a lookup of `name` (as given to `cuGetProcAddress`) returns for `version` and the
/// stream flavour asked for, when it is one we wrap. No allocation.
pub fn driver_abi(name: &CStr, version: i32, per_thread: bool) -> Option<Sym> {
    let name = name.to_bytes();
    DRIVER_ENTRIES
        .iter()
        .filter(|e| e.base.to_bytes() == name)
        .find_map(|e| e.abi(version, per_thread))
}
