//! What a checkpoint puts back: each `Restore` record of the summarizer's (`trace::summary`,
//! its format in `format::restore`) restores a part of the replay's state.

use crate::trace::format::{Api, DEVICE_UNKNOWN, Record, restore};
use crate::trace::live::{
    Boundary, BoundaryMark, DeviceLive, Holding, NvmlFigure, Replay, Segment, Snapshot,
    device_or_0, slot,
};

/// The most boundaries, and call sites per boundary, a checkpoint restores (the summarizer
/// writes at most `summary::MAX_BOUNDARIES`; more can only come from a hostile file, whose
/// copies of the series would cost time without end).
const MAX_RESTORED_BOUNDARIES: usize = 1024;
const MAX_RESTORED_SITES: usize = 1 << 16;

impl Replay {
    pub(in crate::trace) fn restore(&mut self, r: &Record) {
        let device = device_or_0(r.device);
        match r.status {
            restore::BEGIN => self.restored.active = true,
            restore::END => {
                self.restored.active = false;
                self.restored.site = (0, 0, [0; 2]);
            }
            restore::SITE => self.restored.site = (r.ptr, r.size, [0; 2]),
            restore::FRAMEWORK_PHYSICAL => {
                self.framework_physical.insert(r.ptr, (r.size, device));
            }
            restore::SEGMENT => {
                let s = self.segments.entry(r.ptr).or_insert(Segment {
                    device: r.device,
                    framework: r.api == Api::Torch,
                    pages: r.thread != 0,
                    ..Segment::default()
                });
                s.size = s.size.saturating_add(r.size);
                let v = self.reserved.entry(r.device).or_default();
                *v = v.saturating_add(r.size);
            }
            restore::TENSOR_BYTES => {
                self.tensors.restore(device, r.ptr, r.size);
            }
            restore::DEVICE_PEAK => {
                if self.devices.len() <= device as usize {
                    self.devices
                        .resize(device as usize + 1, DeviceLive::default());
                }
                let d = &mut self.devices[device as usize];
                d.seen = true;
                if r.ptr >= d.peak {
                    d.peak = r.ptr;
                    d.peak_time_ns = r.time_ns;
                }
            }
            restore::HOST_PEAK => self.pinned.peak = self.pinned.peak.max(r.ptr),
            restore::NVML => {
                self.facts.nvml.insert(
                    r.device,
                    NvmlFigure {
                        bytes: r.ptr,
                        peak: r.time_ns,
                        total: r.size,
                        device_wide: r.thread != 0,
                    },
                );
            }
            restore::UNMATCHED => {
                self.unmatched_frees = self.unmatched_frees.saturating_add(r.ptr);
                self.restored.unmatched_frees = self.restored.unmatched_frees.saturating_add(r.ptr);
            }
            restore::MEM_INFO => {
                self.facts.mem_info.insert(device, (r.ptr, r.size));
            }
            restore::STARTED => self.ranges.start(r.size, r.ptr, self.index),
            restore::RANGE_OPEN => self.ranges.push(r.thread, r.ptr),
            restore::API => {
                let t = self.restored.api_totals.entry(r.api as u8).or_default();
                t.0 = t.0.saturating_add(r.ptr);
                t.1 = t.1.saturating_add(r.time_ns);
                t.2 = t.2.saturating_add(r.size);
            }
            restore::SNAPSHOT => self.restored.snapshots.push(Snapshot {
                device,
                failure: r.thread != 0,
                time_ns: r.time_ns,
                live: r.ptr,
                reserved: r.size,
                ..Snapshot::default()
            }),
            restore::SNAPSHOT_MORE => {
                if let Some(s) = self.restored.snapshots.last_mut() {
                    s.largest_free_block = r.ptr;
                    s.device_free = r.size.checked_sub(1);
                }
            }
            // A checkpoint keeps at most MAX_BOUNDARIES: more is a hostile file, ignored.
            restore::BOUNDARY if self.restored.boundaries.len() >= MAX_RESTORED_BOUNDARIES => {}
            restore::BOUNDARY => {
                let by_site = self
                    .restored
                    .boundaries
                    .last()
                    .map(|b| b.by_site.clone())
                    .unwrap_or_default();
                self.restored.boundaries.push(Boundary {
                    ordinal: r.ptr,
                    time_ns: r.time_ns,
                    total: r.size,
                    by_site,
                });
            }
            restore::SERIES => self
                .restored
                .series
                .push((r.time_ns, device, r.ptr, r.size)),
            restore::LAST_ALLOC => *slot(&mut self.threads.last_alloc, r.thread) = r.ptr,
            restore::AWAITING_CALLER => {
                *slot(&mut self.threads.awaiting_caller, r.thread) = Some((r.size != 0, r.ptr));
            }
            restore::PENDING_PHYSICAL => {
                slot(&mut self.threads.pending_physical, r.thread).push(r.ptr)
            }
            restore::BOUNDARY_MARK => {
                self.restored.boundary_count = r.size;
                self.restored.boundary_mark = Some(if r.thread == 0 {
                    BoundaryMark::Nvtx(r.ptr)
                } else {
                    BoundaryMark::Site(r.ptr)
                });
            }
            _ => {}
        }
    }

    /// A `Holding` record: one call site's bytes at the snapshot or boundary before it.
    pub(in crate::trace) fn restore_holding(&mut self, r: &Record) {
        let count = restore::count_of(r);
        if r.device == DEVICE_UNKNOWN {
            if let Some(b) = self.restored.boundaries.last_mut() {
                if r.time_ns == 0 {
                    b.by_site.remove(&r.ptr);
                } else if b.by_site.len() < MAX_RESTORED_SITES || b.by_site.contains_key(&r.ptr) {
                    b.by_site.insert(r.ptr, r.time_ns);
                }
            }
        } else if let Some(s) = self.restored.snapshots.last_mut() {
            s.holdings.push(Holding {
                stack: r.ptr,
                range: r.size,
                bytes: r.time_ns,
                allocations: count,
            });
        }
    }
}
