//! The first pass: each device's changes counted, cut into stretches of equal count (merged two
//! by two as the run goes on, so a lane never has more than [`MAX_COLUMNS`]), and in each the
//! moment of most live memory, with what the allocators held and NVML saw then. Also the peak,
//! the failed allocations and a ring checkpoint's coarse series of the time before its detail.

use super::MAX_COLUMNS;
use crate::report::live::{Change, Replay};
use crate::trace::by_device::ByDevice;
use crate::trace::format::{DEVICE_UNKNOWN, Record, RecordKind};
use std::collections::BTreeMap;

/// One stretch of a lane and its moment of most live memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Col {
    /// The moment: the change after which it was.
    pub best: u64,
    pub time_ns: u64,
    pub live: u64,
    pub reserved: u64,
    /// NVML's highest figure while the stretch lasted (the latest before it, if none came).
    pub nvml: u64,
}

/// What the first pass found of one device.
#[derive(Debug, Default)]
pub struct LaneFound {
    /// Changes per column.
    pub width: u64,
    pub cols: Vec<Col>,
    pub changes: u64,
    /// The most live memory: (bytes, change, time).
    pub peak: Option<(u64, u64, u64)>,
    /// Failed allocations: (the changes before it, bytes, API, time).
    pub failures: Vec<(u64, u64, &'static str, u64)>,
    nvml: u64,
    pub device_total: u64,
    /// At the last change: whether it began a column, and, where the columns were merged two
    /// by two first, which of each pair was kept (`true`: the second). Read by the first
    /// pass's bands ([`super::bands`]).
    pub began: bool,
    pub merged: Vec<bool>,
}

impl LaneFound {
    /// The column that shows change `c` (1 for the first).
    pub fn column_of(&self, c: u64) -> usize {
        // The width is a power of two (1, doubled at each merge): a shift, where a division
        // at every change was a tenth of the picture's first pass.
        let shift = self.width.max(1).trailing_zeros();
        (c.saturating_sub(1) >> shift) as usize
    }

    fn change(&mut self, rp: &Replay, device: u8, time_ns: u64) {
        self.changes += 1;
        if self.width == 0 {
            self.width = 1;
        }
        self.merged.clear();
        let mut at = self.column_of(self.changes);
        if at == MAX_COLUMNS {
            let merged = &mut self.merged;
            self.cols = self
                .cols
                .chunks(2)
                .map(|p| match p {
                    [a, b] => {
                        merged.push(b.live > a.live);
                        let mut m = if b.live > a.live { *b } else { *a };
                        m.nvml = a.nvml.max(b.nvml);
                        m
                    }
                    [a] => {
                        merged.push(false);
                        *a
                    }
                    _ => Col::default(),
                })
                .collect();
            self.width *= 2;
            at = self.column_of(self.changes);
        }
        let live = rp.live_on(device);
        let now = Col {
            best: self.changes,
            time_ns,
            live,
            reserved: rp.reserved_on(device),
            nvml: self.nvml,
        };
        self.began = at >= self.cols.len();
        match self.cols.get_mut(at) {
            None => self.cols.push(now),
            Some(c) if live > c.live => {
                *c = Col {
                    nvml: c.nvml,
                    ..now
                }
            }
            Some(_) => {}
        }
        if self.peak.is_none_or(|(b, _, _)| live > b) {
            self.peak = Some((live, self.changes, time_ns));
        }
    }

    fn sample(&mut self, bytes: u64, total: u64) {
        self.nvml = bytes;
        self.device_total = total;
        let at = self.column_of(self.changes);
        if self.changes > 0
            && let Some(c) = self.cols.get_mut(at)
        {
            c.nvml = c.nvml.max(bytes);
        }
    }

    fn failure(&mut self, r: &Record) {
        // PyTorch's attempts (before and after it empties its cache) and the tensor it could not
        // make, with no change between them, are one failure: the tensor's size is the request.
        if let Some(last) = self.failures.last_mut()
            && last.0 == self.changes
        {
            if r.kind == RecordKind::TensorOom {
                last.1 = r.size;
                last.2 = r.api.name();
            }
            return;
        }
        self.failures
            .push((self.changes, r.size, r.api.name(), r.time_ns));
    }
}

/// What the first pass found: per device, and the checkpoint's series before the ring's detail
/// (time, device, live, reserved).
#[derive(Debug, Default)]
pub struct Found {
    pub lanes: ByDevice<LaneFound>,
    pub series: Vec<(u64, u8, u64, u64)>,
    /// Per device: the most live memory before the ring's detail, as its checkpoint kept it
    /// (bytes, time).
    pub peak_before: BTreeMap<u8, (u64, u64)>,
    pub tensors_recorded: bool,
}

/// The device a record changed the memory of, if it is a change that counts on the axis: an
/// allocation made or freed (not a checkpoint's restoring, and not the raw `cudaMalloc` of a
/// segment PyTorch's record claims a moment later).
pub(super) fn changed(rp: &Replay, r: &Record, c: Change) -> Option<u8> {
    if rp.restored.active || r.kind == RecordKind::Restore {
        return None;
    }
    let raw = rp.tensors.recorded() && matches!(r.kind, RecordKind::Alloc | RecordKind::PhysCreate);
    match c {
        Change::Alloc { device, .. } | Change::Physical { device } if !raw => Some(device),
        Change::Free { .. } => Some(rp.freed.device),
        _ => None,
    }
}

/// The first pass: each device's columns, record by record.
#[derive(Default)]
pub struct ColumnsPass {
    found: Found,
}

impl ColumnsPass {
    /// Each device's columns so far.
    pub fn lanes(&self) -> &ByDevice<LaneFound> {
        &self.found.lanes
    }

    /// One record, after `rp` applied it (making change `c`).
    pub(super) fn see_parts(&mut self, rp: &Replay, r: &Record, c: Change) {
        if let Some(d) = changed(rp, r, c) {
            self.found.lanes.or_default(d).change(rp, d, r.time_ns);
        } else if r.kind == RecordKind::DeviceMemory {
            self.found.lanes.or_default(r.device).sample(r.ptr, r.size);
        } else if !rp.restored.active && crate::trace::summary::is_failure(r) {
            let d = if r.device == DEVICE_UNKNOWN {
                0
            } else {
                r.device
            };
            self.found.lanes.or_default(d).failure(r);
        }
    }

    /// What the pass found; `rp` is its replay at the end.
    pub fn finish(self, rp: &Replay) -> Found {
        let mut found = self.found;
        found.series = rp.restored.series.clone();
        for snap in rp.restored.snapshots.iter().filter(|s| !s.failure) {
            let e = found.peak_before.entry(snap.device).or_default();
            if snap.live > e.0 {
                *e = (snap.live, snap.time_ns);
            }
        }
        found.tensors_recorded = rp.tensors.recorded();
        for (d, (_, total)) in &rp.facts.mem_info {
            if let Some(l) = found.lanes.get_mut(*d)
                && l.device_total == 0
            {
                l.device_total = *total;
            }
        }
        // A device seen only in NVML's samples, with no allocation: nothing to draw.
        found.lanes.retain(|_, l| l.changes > 0);
        found
    }
}
