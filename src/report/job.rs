//! Several traces of one job (one per rank or process) taken together: their peaks, failures
//! and health, and which rank came closest to its device's limit.

use super::summary::Summary;
use super::units::human_bytes;
use serde::Serialize;
use std::fmt::Write as _;

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
                trace: s.path.clone(),
                rank: s.rank,
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

/// The ranks' PyTorch figures side by side, and the skew of their peaks: the rank that peaks
/// highest against the one that peaks lowest.
fn render_side_by_side(o: &mut String, rows: &[RankRow]) {
    if rows.len() < 2 {
        return;
    }
    let who = |r: &RankRow| rank_label(r.rank, &r.trace);
    let _ = writeln!(
        o,
        "  every rank's PyTorch memory (peaks; kinds at exit; activations at their most):"
    );
    let _ = writeln!(
        o,
        "    {:<10} {:>3} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "", "dev", "allocated", "reserved", "parameters", "gradients", "optimizer", "activations"
    );
    for r in rows {
        let _ = writeln!(
            o,
            "    {:<10} {:>3} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}",
            who(r),
            r.device,
            human_bytes(r.allocated_peak_bytes),
            human_bytes(r.reserved_peak_bytes),
            human_bytes(r.parameters_bytes),
            human_bytes(r.gradients_bytes),
            human_bytes(r.optimizer_state_bytes),
            human_bytes(r.activations_peak_bytes),
        );
    }
    let high = rows.iter().max_by_key(|r| r.allocated_peak_bytes);
    let low = rows.iter().min_by_key(|r| r.allocated_peak_bytes);
    if let (Some(h), Some(l)) = (high, low)
        && h.allocated_peak_bytes > l.allocated_peak_bytes
    {
        let skew = (h.allocated_peak_bytes - l.allocated_peak_bytes) as f64
            / l.allocated_peak_bytes.max(1) as f64
            * 100.0;
        let _ = writeln!(
            o,
            "  skew: {} peaks {} above {} ({skew:.1}% more)",
            who(h),
            human_bytes(h.allocated_peak_bytes - l.allocated_peak_bytes),
            who(l)
        );
    } else {
        let _ = writeln!(o, "  skew: every rank peaks at the same allocated bytes");
    }
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
                    trace: s.path.clone(),
                    rank: s.rank,
                    device: d.device,
                    peak_live_bytes: d.peak_live_bytes,
                });
            }
        }
    }
    c
}

impl Combined {
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "combined, {} traces: {} events",
            self.traces, self.events
        );
        let _ = writeln!(
            o,
            "  sum of each trace's peak live: {}",
            human_bytes(self.sum_of_peaks_bytes)
        );
        if let Some(l) = &self.largest_peak {
            let rank = l.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
            let device = l
                .device
                .map(|d| d.to_string())
                .unwrap_or_else(|| "?".into());
            let _ = writeln!(
                o,
                "  largest peak: {} on device {device} in {}{rank}",
                human_bytes(l.peak_live_bytes),
                l.trace
            );
        }
        let _ = writeln!(
            o,
            "  {} allocations failed for lack of memory; {} records lost, {} torn; {} processes did not exit cleanly",
            self.failed_for_memory, self.lost, self.torn, self.unclean_exits
        );
        render_ranks(&mut o, &self.ranks_by_headroom);
        render_side_by_side(&mut o, &self.side_by_side);
        o
    }
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
                trace: s.path.clone(),
                rank: s.rank,
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

/// A rank as the job's reports name it: `rank N`, else its trace.
fn rank_label(rank: Option<i32>, trace: &str) -> String {
    match rank {
        Some(k) => format!("rank {k}"),
        None => trace.to_string(),
    }
}

/// The job's ranks by headroom, the closest to its limit named.
pub fn render_ranks(o: &mut String, ranks: &[RankMemory]) {
    let Some(first) = ranks.first() else {
        return;
    };
    let who = |r: &RankMemory| rank_label(r.rank, &r.trace);
    let _ = writeln!(
        o,
        "  closest to its device's limit: {} on device {}, NVML peak {} of {} ({} headroom)",
        who(first),
        first.device,
        human_bytes(first.nvml_peak_bytes),
        human_bytes(first.device_total_bytes),
        human_bytes(first.headroom_bytes)
    );
    for r in ranks {
        let _ = writeln!(
            o,
            "    {:<10} device {}: NVML peak {:>10}, headroom {:>10}",
            who(r),
            r.device,
            human_bytes(r.nvml_peak_bytes),
            human_bytes(r.headroom_bytes)
        );
    }
}
