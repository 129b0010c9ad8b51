//! Where NVML's figure went, as text (part of `summary`).

use crate::report::device_memory::*;
use crate::report::units::{human_bytes, human_duration};
use std::fmt::Write as _;

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
