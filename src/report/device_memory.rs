//! Where the device memory went: NVML's figure for the process (the trace's `device_memory`
//! records) split into what each owner held (tensors, the framework's unused cache, each other
//! library by name) and what no allocating call made (the CUDA context, module code, local
//! memory: NVML's figure less the rest), at NVML's peak and at exit. Across the traces of a job:
//! which rank came closest to its device's limit.

use super::live::Replay;
use super::owners::{OwnerBytes, held_by_owner_kinds};
use crate::trace::reader::TraceTables;
use serde::Serialize;
use std::collections::BTreeMap;

/// What the part of NVML's figure that no allocating call made is called.
pub const NOT_ALLOCATED: &str = "no allocating call (CUDA context, module code, local memory)";

/// One device as NVML saw this process, split by owner at NVML's peak and at exit.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct DeviceMemory {
    /// NVML's index of the device (the CUDA ordinal too, unless CUDA_VISIBLE_DEVICES reorders).
    pub device: u8,
    pub device_total_bytes: u64,
    /// NVML did not list this process (another PID namespace): the figures are the device's.
    pub device_wide: bool,
    pub at_peak: Reckoning,
    pub at_exit: Reckoning,
}

/// NVML's figure at one moment and what it is made of: the parts add up to it exactly, the
/// last part being the rest.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Reckoning {
    /// Since the trace started (at exit: the last sample).
    pub time_ns: u64,
    pub nvml_bytes: u64,
    /// What the allocations held (every owner, the framework's unused cache included).
    pub held_bytes: u64,
    /// NVML's figure less that (0 where the allocations held more than NVML had seen yet).
    pub not_allocated_bytes: u64,
    /// Each owner's bytes, largest first.
    pub parts: Vec<OwnerBytes>,
    /// At exit: NVML's last sample came before allocations and frees that moved what they
    /// held by a MiB or more (the run ended before the sampler looked again), so its figure
    /// is of an earlier moment than the parts, and no rest can be taken from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sampled_before: bool,
}

/// Where each device's NVML figure peaked: the record's position in the trace and its time.
#[derive(Clone, Copy, Debug, Default)]
pub struct NvmlPeak {
    pub record: u64,
    pub time_ns: u64,
}

/// Splits NVML's figures of `live` (a replay of the whole trace) by owner; `held_at_exit` is
/// [`held_by_owner`] of it. Each peak is split as at exit until [`at_peaks`] has its moment.
pub fn reckon(
    live: &Replay,
    held_at_exit: &[OwnerBytes],
    peaks: &BTreeMap<u8, NvmlPeak>,
    last_sample: &BTreeMap<u8, (u64, u64)>,
) -> Vec<DeviceMemory> {
    const MIB: u64 = 1 << 20;
    let mut out = Vec::new();
    for (&device, f) in &live.facts.nvml {
        let (time_ns, held_then) = last_sample.get(&device).copied().unwrap_or((0, 0));
        let mut at_exit = split(device, f.bytes, time_ns, held_at_exit);
        // The sampler records a figure that moved by a MiB: what the allocations held moving
        // by as much after its last record means it never sampled again.
        if live.reserved_on(device).abs_diff(held_then) >= MIB {
            at_exit.sampled_before = true;
            at_exit.not_allocated_bytes = 0;
        }
        out.push(DeviceMemory {
            device,
            device_total_bytes: f.total,
            device_wide: f.device_wide,
            at_peak: if peaks.contains_key(&device) {
                Reckoning {
                    nvml_bytes: f.peak,
                    ..at_exit.clone()
                }
            } else {
                at_exit.clone()
            },
            at_exit,
        });
    }
    out
}

/// Each device's NVML peak split by owner, from the moment of its record (`peaks`), which the
/// second pass took.
pub fn at_peaks(
    all: &mut [DeviceMemory],
    peaks: &[(u8, NvmlPeak)],
    tables: &TraceTables,
    moments: &[crate::report::moments::Moment],
) {
    for m in all.iter_mut() {
        let Some(&(_, p)) = peaks.iter().find(|(d, _)| *d == m.device) else {
            continue;
        };
        let Some(at) = crate::report::moments::of(moments, p.record, m.device) else {
            continue;
        };
        // A moment does not keep which tensors were let go of then (docs/limits.md).
        let held = held_by_owner_kinds(
            tables,
            &at.replay,
            &|ptr, _| at.kinds.get(&ptr).copied(),
            &|_| false,
        );
        m.at_peak = split(m.device, m.at_peak.nvml_bytes, p.time_ns, &held);
    }
}

fn split(device: u8, nvml: u64, time_ns: u64, held: &[OwnerBytes]) -> Reckoning {
    let parts: Vec<OwnerBytes> = held
        .iter()
        .filter(|h| h.device == device && h.bytes > 0)
        .cloned()
        .collect();
    let held_bytes = parts.iter().fold(0u64, |a, p| a.saturating_add(p.bytes));
    Reckoning {
        time_ns,
        nvml_bytes: nvml,
        held_bytes,
        not_allocated_bytes: nvml.saturating_sub(held_bytes),
        parts,
        sampled_before: false,
    }
}
