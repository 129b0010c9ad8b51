//! Each device's peak as the summarizer watches it, and what was live at a failure.

use crate::trace::live::{Live, Replay, Snapshot};
use std::collections::HashMap;

/// A device's peak as the summarizer watches it. What held it is not copied at each new peak
/// (a leak makes one every step): the allocations made and freed on the device since the peak
/// are journalled, and the peak's live set is the current one with the journal undone, taken
/// when a checkpoint is written or the journal grows past the live set.
#[derive(Default)]
pub(in crate::trace) struct PeakWatch {
    pub(in crate::trace) bytes: u64,
    pub(in crate::trace) time_ns: u64,
    pub(in crate::trace) reserved: u64,
    /// The peak moved and its snapshot is not taken yet.
    pub(in crate::trace) pending: bool,
    /// Since the peak: (address, None) allocated, (address, Some(what it was)) freed.
    pub(in crate::trace) journal: Vec<(u64, Option<Live>)>,
    pub(in crate::trace) snapshot: Snapshot,
    /// The peak before this one, where a raw device allocation set this one: the framework's
    /// segment record that claims it a few records later undoes the peak (as the replay does).
    pub(in crate::trace) before: Option<Box<PeakBefore>>,
}

/// A peak kept aside while the allocation that passed it may still turn out to be a segment.
pub(in crate::trace) struct PeakBefore {
    pub(in crate::trace) bytes: u64,
    pub(in crate::trace) time_ns: u64,
    pub(in crate::trace) reserved: u64,
    pub(in crate::trace) snapshot: Snapshot,
    /// Set by physical memory (an expandable segment's page): the next page keeps this.
    pub(in crate::trace) physical: bool,
}

/// Live allocations up to which a peak passed by a raw device allocation keeps the one before
/// it (a copy of what held it); past it, the peak may read a segment's rounding high.
const KEEP_PEAK_BEFORE_UPTO: usize = 1 << 16;

impl PeakWatch {
    /// A new peak: `raw` where a device allocation of the program's (not a tensor) set it.
    /// `raw`: (the allocation's key, whether physical) where a device allocation of the
    /// program's (not a tensor) set it; the peak before it is then taken without it.
    pub(in crate::trace) fn passed(
        &mut self,
        rp: &Replay,
        device: u8,
        time_ns: u64,
        raw: Option<(u64, bool)>,
    ) {
        // Only a framework whose tensors are recorded claims segments (a program allocating
        // with cudaMalloc alone makes a new peak at each allocation, and keeping the one before
        // would copy its live set each time).
        let keep_before =
            raw.filter(|_| rp.tensors.recorded() && rp.live.len() <= KEEP_PEAK_BEFORE_UPTO);
        match keep_before {
            // Pages of one expandable segment come one after another: the peak before the first
            // is the one to go back to.
            Some((_, true)) if self.before.as_ref().is_some_and(|b| b.physical) => {}
            Some((key, physical)) => {
                self.materialize_without(rp, device, Some((key, physical)));
                self.before = Some(Box::new(PeakBefore {
                    bytes: self.bytes,
                    time_ns: self.time_ns,
                    reserved: self.reserved,
                    snapshot: core::mem::take(&mut self.snapshot),
                    physical,
                }));
            }
            None => self.before = None,
        }
        self.bytes = rp.live_on(device);
        self.time_ns = time_ns;
        self.reserved = rp.reserved_on(device);
        self.pending = true;
        self.journal.clear();
    }

    /// The replay undid the peak (a segment record claimed the allocation that set it): back to
    /// the one before.
    pub(in crate::trace) fn undo(&mut self, replay_peak: u64) {
        if replay_peak >= self.bytes {
            return;
        }
        if let Some(b) = self.before.take() {
            self.bytes = b.bytes;
            self.time_ns = b.time_ns;
            self.reserved = b.reserved;
            self.snapshot = b.snapshot;
            self.pending = false;
            self.journal.clear();
        }
    }

    pub(in crate::trace) fn materialize(&mut self, rp: &Replay, device: u8) {
        self.materialize_without(rp, device, None);
    }

    /// The snapshot of a pending peak, leaving out `made` (key, physical): an allocation
    /// applied after it.
    pub(in crate::trace) fn materialize_without(
        &mut self,
        rp: &Replay,
        device: u8,
        made: Option<(u64, bool)>,
    ) {
        if !self.pending {
            return;
        }
        if let Some((key, false)) = made {
            self.journal.push((key, None));
        }
        self.pending = false;
        let mut set: HashMap<u64, Live> = rp
            .live
            .iter()
            .filter(|(_, l)| l.device == device)
            .map(|(&p, &l)| (p, l))
            .collect();
        for (p, was) in self.journal.drain(..).rev() {
            match was {
                None => {
                    set.remove(&p);
                }
                Some(l) => {
                    set.insert(p, l);
                }
            }
        }
        let physical = rp
            .physical
            .iter()
            .filter(|&(&h, l)| l.device == device && made != Some((h, true)))
            .map(|(_, l)| l);
        self.snapshot = Snapshot::of(set.values().chain(physical), device, self.time_ns);
        self.snapshot.live = self.bytes;
        self.snapshot.reserved = self.reserved;
    }
}

/// What was live on `device` now, for a failure: by call site, with the pool's figures.
pub(in crate::trace) fn snapshot_now(rp: &Replay, device: u8, time_ns: u64) -> Snapshot {
    let mut s = Snapshot::of(
        rp.all_live().filter(|l| l.device == device),
        device,
        time_ns,
    );
    s.failure = true;
    s.live = rp.live_on(device);
    s.reserved = rp.reserved_on(device);
    s.largest_free_block = rp.largest_free_block(device);
    s.device_free = rp.facts.mem_info.get(&device).map(|m| m.0);
    s
}
