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
