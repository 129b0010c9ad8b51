//! What a checkpoint kept of one moment, and what the live allocations of one device held then
//! by call site and range.

use super::Live;
use std::collections::HashMap;

/// What a checkpoint kept of one moment: a device's peak, or a failed allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub device: u8,
    pub failure: bool,
    pub time_ns: u64,
    pub live: u64,
    pub reserved: u64,
    pub largest_free_block: u64,
    pub device_free: Option<u64>,
    /// What each call site and range held, the most first.
    pub holdings: Vec<Holding>,
}

/// What one call site (stack id) in one NVTX range (string id) held at a snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holding {
    pub stack: u64,
    pub range: u64,
    pub bytes: u64,
    pub allocations: u64,
}

impl Snapshot {
    /// What `live` (allocations of one device) holds, by call site and range.
    pub fn of<'a>(live: impl Iterator<Item = &'a Live>, device: u8, time_ns: u64) -> Snapshot {
        let mut by: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
        for l in live {
            let e = by.entry((l.stack, l.range)).or_default();
            e.0 = e.0.saturating_add(l.size);
            e.1 += 1;
        }
        let mut holdings: Vec<Holding> = by
            .into_iter()
            .map(|((stack, range), (bytes, allocations))| Holding {
                stack,
                range,
                bytes,
                allocations,
            })
            .collect();
        holdings.sort_unstable_by_key(|h| (std::cmp::Reverse(h.bytes), h.stack, h.range));
        Snapshot {
            device,
            time_ns,
            holdings,
            ..Snapshot::default()
        }
    }
}
