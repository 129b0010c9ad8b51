//! Several traces of one job (one per rank or process) taken together: their peaks, failures
//! and health, and which rank came closest to its device's limit.

use super::summary::Summary;
use serde::Serialize;

/// Several traces of one job (one per rank or process), taken together.
#[derive(Clone, Debug, Serialize)]
pub struct Combined {
    pub traces: usize,
    pub events: u64,
    /// Each trace's largest per-device peak, summed: what the job needs if every rank peaks at
    /// once (ranks of a data-parallel job peak together).
    pub sum_of_peaks_bytes: u64,
    /// The trace, rank and device with the largest peak.
    pub largest_peak: Option<LargestPeak>,
    pub failed_for_memory: u64,
    pub lost: u64,
    pub torn: u64,
    pub unclean_exits: usize,
    /// Each trace's NVML peak per device, the rank closest to its device's limit first.
    pub ranks_by_headroom: Vec<RankMemory>,
    /// Every rank's framework figures side by side, in rank order (PyTorch's allocator: its
    /// tensors' and its cache's peaks, the tensors by kind at exit, the activations at their
    /// most).
    pub side_by_side: Vec<RankRow>,
}

/// One rank's (trace's) PyTorch figures on one device.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow {
    pub trace: String,
    pub rank: Option<i32>,
    pub device: u8,
    pub allocated_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    pub parameters_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub activations_peak_bytes: u64,
}

/// Every trace's PyTorch figures per device, in rank order (then the trace's name).
fn side_by_side(all: &[Summary]) -> Vec<RankRow> {
    use super::kinds::Kind;
    let mut v: Vec<RankRow> = all
        .iter()
        .flat_map(|s| {
            s.framework.iter().map(|f| RankRow {
                trace: s.run.path.clone(),
                rank: s.run.rank,
                device: f.device,
                allocated_peak_bytes: f.allocated_peak_bytes,
                reserved_peak_bytes: f.reserved_peak_bytes,
                parameters_bytes: f.kinds_at_exit.bytes(Kind::Parameter),
                gradients_bytes: f.kinds_at_exit.bytes(Kind::Gradient),
                optimizer_state_bytes: f.kinds_at_exit.bytes(Kind::OptimizerState),
                activations_peak_bytes: f.activations_peak_bytes,
            })
        })
        .collect();
    v.sort_by(|a, b| (a.rank, &a.trace, a.device).cmp(&(b.rank, &b.trace, b.device)));
    v
}

/// Where the largest per-device peak of a set of traces was.
#[derive(Clone, Debug, Serialize)]
pub struct LargestPeak {
    pub trace: String,
    pub rank: Option<i32>,
    pub device: Option<u8>,
    pub peak_live_bytes: u64,
}

pub fn combine(all: &[Summary]) -> Combined {
    let mut c = Combined {
        traces: all.len(),
        events: 0,
        sum_of_peaks_bytes: 0,
        largest_peak: None,
        failed_for_memory: 0,
        lost: 0,
        torn: 0,
        unclean_exits: 0,
        ranks_by_headroom: by_headroom(all),
        side_by_side: side_by_side(all),
    };
    for s in all {
        c.events = c.events.saturating_add(s.events);
        c.lost = c.lost.saturating_add(s.health.lost);
        c.torn = c.torn.saturating_add(s.health.torn);
        c.unclean_exits = c
            .unclean_exits
            .saturating_add(usize::from(!s.health.clean_exit));
        c.sum_of_peaks_bytes = c.sum_of_peaks_bytes.saturating_add(
            s.devices
                .iter()
                .map(|d| d.peak_live_bytes)
                .max()
                .unwrap_or(0),
        );
        for d in &s.devices {
            c.failed_for_memory = c.failed_for_memory.saturating_add(d.ooms);
            if c.largest_peak
                .as_ref()
                .is_none_or(|l| d.peak_live_bytes > l.peak_live_bytes)
            {
                c.largest_peak = Some(LargestPeak {
                    trace: s.run.path.clone(),
                    rank: s.run.rank,
                    device: d.device,
                    peak_live_bytes: d.peak_live_bytes,
                });
            }
        }
    }
    c
}

/// One rank's (trace's) highest NVML figure on one device against the device's total.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct RankMemory {
    pub trace: String,
    pub rank: Option<i32>,
    pub device: u8,
    pub nvml_peak_bytes: u64,
    pub device_total_bytes: u64,
    /// The device's total less the peak: how much more this rank could have taken (less, where
    /// other processes share the device).
    pub headroom_bytes: u64,
}

/// Every trace's NVML peak per device, the one with the least headroom first.
pub fn by_headroom(all: &[Summary]) -> Vec<RankMemory> {
    let mut v: Vec<RankMemory> = all
        .iter()
        .flat_map(|s| {
            s.device_memory.iter().map(|m| RankMemory {
                trace: s.run.path.clone(),
                rank: s.run.rank,
                device: m.device,
                nvml_peak_bytes: m.at_peak.nvml_bytes,
                device_total_bytes: m.device_total_bytes,
                headroom_bytes: m.device_total_bytes.saturating_sub(m.at_peak.nvml_bytes),
            })
        })
        .collect();
    v.sort_by(|a, b| {
        a.headroom_bytes
            .cmp(&b.headroom_bytes)
            .then(a.rank.cmp(&b.rank))
    });
    v
}
