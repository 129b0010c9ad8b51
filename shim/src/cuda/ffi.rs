//! The few CUDA types and constants the shim needs. Exported signatures use plain integers:
//! an enum would be undefined behaviour the day CUDA returns a code we do not list.

use core::ffi::c_void;

/// `cudaErrorInsufficientDriver`: what the runtime returns when no driver can be reached.
pub const CUDA_ERROR_INSUFFICIENT_DRIVER: i32 = 35;
/// `CUDA_ERROR_NOT_INITIALIZED`: returned by a driver hook whose real function cannot be found.
pub const CU_ERROR_NOT_INITIALIZED: i32 = 3;

/// `CU_GET_PROC_ADDRESS_LEGACY_STREAM` / `cudaEnableLegacyStream`.
pub const PROC_LEGACY_STREAM: u64 = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` / `cudaEnablePerThreadDefaultStream`.
pub const PROC_PER_THREAD_STREAM: u64 = 2;

/// `cudaExtent`, passed by value to `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaPitchedPtr`.
#[repr(C)]
pub struct CudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `CUipcMemHandle` (and `cudaIpcMemHandle_t`): 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CuIpcMemHandle(pub [u8; 64]);

/// The head of `CUmemAllocationProp`: enough to read the device it allocates on.
#[repr(C)]
pub struct CuMemAllocationPropHead {
    pub type_: i32,
    pub requested_handle_types: i32,
    pub location_type: i32,
    pub location_id: i32,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;

/// `CUDA_ERROR_INVALID_VALUE` / `cudaErrorInvalidValue`.
pub const ERROR_INVALID_VALUE: i32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY` / `cudaErrorMemoryAllocation`: the same code in both APIs.
pub const ERROR_OUT_OF_MEMORY: i32 = 2;
/// `CUDA_ERROR_NOT_PERMITTED` / `cudaErrorNotPermitted`: what `cuIpcOpenMemHandle` answers for a
/// handle of memory its exporter freed.
pub const ERROR_NOT_PERMITTED: i32 = 800;
/// `cudaErrorStreamCaptureUnsupported` / `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (the same
/// number): a call not allowed while a stream is being captured.
pub const ERROR_STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
/// `CU_STREAM_NON_BLOCKING`: a stream that does not synchronize with the legacy stream.
pub const CU_STREAM_NON_BLOCKING: u32 = 1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: u32 = 2;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` and `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: i32 = 11;
pub const CU_POINTER_ATTRIBUTE_RANGE_SIZE: i32 = 12;
/// The stream handles with a meaning of their own: `CU_STREAM_LEGACY` and
/// `CU_STREAM_PER_THREAD` (the same values as `cudaStreamLegacy` and `cudaStreamPerThread`).
pub const STREAM_LEGACY: u64 = 1;
pub const STREAM_PER_THREAD: u64 = 2;
