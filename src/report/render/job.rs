//! A job's traces together, as `summary` of several traces prints them.

use crate::report::job::*;
use crate::report::units::human_bytes;
use std::fmt::Write as _;

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
