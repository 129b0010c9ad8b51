//! Where the device memory went: NVML's figure for the process (the trace's `device_memory`
//! records) split into what each owner held (tensors, the framework's unused cache, each other
//! library by name) and what no allocating call made (the CUDA context, module code, local
//! memory: NVML's figure less the rest), at NVML's peak and at exit. Across the traces of a job:
//! which rank came closest to its device's limit.

use super::live::Replay;
use super::owners::{OwnerBytes, held_by_owner_kinds};
use super::units::{human_bytes, human_duration};
use crate::trace::reader::TraceReader;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

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
    reader: &TraceReader,
    moments: &[crate::report::moments::Moment],
) {
    for m in all.iter_mut() {
        let Some(&(_, p)) = peaks.iter().find(|(d, _)| *d == m.device) else {
            continue;
        };
        let Some(at) = crate::report::moments::of(moments, p.record, m.device) else {
            continue;
        };
        let held = held_by_owner_kinds(reader, &at.replay, &|ptr, _| at.kinds.get(&ptr).copied());
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

/// The reckoning as a table: a row per owner, a column per moment, NVML's figure last.
pub fn render(o: &mut String, all: &[DeviceMemory]) {
    for m in all {
        let whose = if m.device_wide {
            "the whole device (NVML did not list this process)"
        } else {
            "this process"
        };
        let _ = writeln!(
            o,
            "device {} memory as NVML saw {whose}, of {}:",
            m.device,
            human_bytes(m.device_total_bytes)
        );
        let moments = [&m.at_peak, &m.at_exit];
        let mut owners: Vec<&str> = Vec::new();
        for r in moments {
            for p in &r.parts {
                if !owners.contains(&p.owner.as_str()) {
                    owners.push(&p.owner);
                }
            }
        }
        let width = crate::report::units::column(
            owners
                .iter()
                .map(|o| o.len())
                .chain([NOT_ALLOCATED.len()])
                .max()
                .unwrap_or(0),
        );
        // NVML's peak, not the allocations': NVML samples the process's memory now and then,
        // and its highest sample can come at another moment than the most live allocations.
        let peak_head = format!("at NVML's peak ({})", human_duration(m.at_peak.time_ns));
        let _ = writeln!(o, "  {:width$}  {peak_head:>24}  {:>12}", "", "at exit");
        let row = |o: &mut String, name: &str, a: u64, b: u64| {
            let _ = writeln!(
                o,
                "  {name:width$}  {:>24}  {:>12}",
                human_bytes(a),
                human_bytes(b)
            );
        };
        for owner in owners {
            let of = |r: &Reckoning| {
                r.parts
                    .iter()
                    .find(|p| p.owner == owner)
                    .map_or(0, |p| p.bytes)
            };
            row(o, owner, of(&m.at_peak), of(&m.at_exit));
        }
        if m.at_exit.sampled_before {
            // What the allocations held at exit is known; NVML's figure then is not.
            let cell = |o: &mut String, name: &str, a: u64| {
                let _ = writeln!(o, "  {name:width$}  {:>24}  {:>12}", human_bytes(a), "-");
            };
            cell(o, NOT_ALLOCATED, m.at_peak.not_allocated_bytes);
            cell(o, "= NVML", m.at_peak.nvml_bytes);
            let _ = writeln!(
                o,
                "  (NVML's last sample, {} at {}, came before allocations and frees that moved \
                 what they held by a MiB or more: the run ended before the sampler looked again, \
                 so there is no NVML figure at exit)",
                human_bytes(m.at_exit.nvml_bytes),
                human_duration(m.at_exit.time_ns)
            );
        } else {
            row(
                o,
                NOT_ALLOCATED,
                m.at_peak.not_allocated_bytes,
                m.at_exit.not_allocated_bytes,
            );
            row(o, "= NVML", m.at_peak.nvml_bytes, m.at_exit.nvml_bytes);
        }
        let _ = writeln!(
            o,
            "  (\"{}\" is NVML's figure less what the allocations held at that moment: it moves \
             when NVML samples between a free and the next allocation, or when the CUDA context \
             grows, as when a library loads its kernels)",
            NOT_ALLOCATED.split(" (").next().unwrap_or(NOT_ALLOCATED)
        );
    }
}
