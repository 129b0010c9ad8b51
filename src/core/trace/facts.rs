//! What the device said of itself, a tracker of the replay ([`super::live`]): NVML's figure
//! for the process, what CUDA's own pools reserve and use, and what `cudaMemGetInfo` answered,
//! each per device and the latest (NVML's highest too).

use crate::trace::format::{DEVICE_UNKNOWN, Record, RecordKind};
use std::collections::BTreeMap;

/// What NVML said of one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvmlFigure {
    pub bytes: u64,
    pub peak: u64,
    pub total: u64,
    pub device_wide: bool,
}

#[derive(Clone, Default)]
pub struct DeviceFacts {
    /// Per device (NVML's index): what NVML said this process used, latest and highest, the
    /// device's total, and whether the figure was the whole device's (`DeviceMemory` records).
    pub nvml: BTreeMap<u8, NvmlFigure>,
    /// Per (device, pool: 0 the default pool, 1 graph memory, 2 the pools the program
    /// created): what CUDA's own pools reserve and what their allocations use, latest
    /// (`CudaPool` records).
    pub cuda_pools: BTreeMap<(u8, u8), (u64, u64)>,
    /// The latest real free/total memory per device (`MemInfo` records).
    pub mem_info: BTreeMap<u8, (u64, u64)>,
}

impl DeviceFacts {
    /// Applies what a record says of the device; `false` for a record that says nothing of it.
    pub fn apply(&mut self, r: &Record) -> bool {
        match r.kind {
            RecordKind::CudaPool => {
                self.cuda_pools
                    .insert((r.device, r.status), (r.ptr, r.size));
            }
            RecordKind::DeviceMemory => {
                let f = self.nvml.entry(r.device).or_default();
                f.bytes = r.ptr;
                f.peak = f.peak.max(r.ptr);
                f.total = r.size;
                f.device_wide |= r.status != 0;
            }
            RecordKind::MemInfo if r.status == 0 => {
                let d = if r.device == DEVICE_UNKNOWN {
                    0
                } else {
                    r.device
                };
                self.mem_info.insert(d, (r.ptr, r.size));
            }
            _ => return false,
        }
        true
    }
}
