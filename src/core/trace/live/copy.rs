//! A replay copied: one device's moment, or every device's to replay on from, and what a
//! copy of every device's costs.

use super::*;

impl Replay {
    /// This moment as far as device `device` goes: its allocations and physical memory, with
    /// every count and segment (small, per device), without another device's allocations nor
    /// what a checkpoint kept of earlier moments. What a report keeps of one device's moment
    /// grows with that device's live set, not with every device's.
    pub fn for_device(&self, device: u8) -> Replay {
        self.for_devices(|d| d == device)
    }

    /// What [`Replay::for_devices`] of every device costs, in live entries: the entries, the
    /// pool's and the framework's segments, and the tables by thread (an entry a thread the
    /// trace named, a few of them to an entry's bytes). A program that starts a thread a step
    /// names thousands, and there a copy costs its threads more than its live set.
    pub fn copy_cost(&self) -> u64 {
        let threads = self.threads.awaiting_caller.len()
            + self.threads.last_alloc.len()
            + self.threads.counted_raw.len()
            + self.ranges.threads();
        (self.live.len() + self.physical.len() + self.segments.len() + threads / 4) as u64
    }

    /// [`Replay::for_device`] of the devices `keep` keeps (every device's, to replay on from).
    pub fn for_devices(&self, keep: impl Fn(u8) -> bool) -> Replay {
        // Every entry kept (one device, or all asked for: nearly always): copied whole, a
        // copy of the vectors, not an insertion of each (a real run's moments copy the live
        // set at every new peak, and insertions cost them ten times as much).
        let live = if self.live.values().all(|l| keep(l.device)) {
            self.live.clone()
        } else {
            kept(self.live.iter(), &keep)
        };
        let physical = if self.physical.values().all(|l| keep(l.device)) {
            self.physical.clone()
        } else {
            kept(self.physical.iter(), &keep)
        };
        Replay {
            live,
            physical,
            devices: self.devices.clone(),
            physical_bytes: self.physical_bytes.clone(),
            pinned: Pinned {
                by_address: FastMap::default(),
                ..self.pinned
            },
            segments: self.segments.clone(),
            reserved: self.reserved.clone(),
            tensors: self.tensors.clone(),
            pooled: self.pooled.clone(),
            threads: self.threads.clone(),
            framework_physical: self.framework_physical.clone(),
            facts: self.facts.clone(),
            ranges: self.ranges.clone(),
            restored: Restored {
                snapshots: Vec::new(),
                boundaries: Vec::new(),
                series: Vec::new(),
                api_totals: BTreeMap::new(),
                ..self.restored
            },
            ..*self
        }
    }
}

/// The allocations of `live` on the devices `keep` keeps.
fn kept<'a, C: FromIterator<(u64, Live)>>(
    live: impl Iterator<Item = (&'a u64, &'a Live)>,
    keep: impl Fn(u8) -> bool,
) -> C {
    live.filter(|(_, l)| keep(l.device))
        .map(|(&k, &l)| (k, l))
        .collect()
}
