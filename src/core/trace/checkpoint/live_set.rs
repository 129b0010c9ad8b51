//! The live set in a checkpoint: every live allocation by call site, or, when the checkpoint
//! would not fit its slot, the newest ones one by one and the older ones summed by call site.
//!
//! A ring's checkpoint slot is an eighth of `trace_max`. A program that keeps more allocations
//! live than a slot holds (a 4 MiB trace holds about 16,000) would get no checkpoint at all
//! from then on, the reports falling back to the last one that fitted and counting every
//! record since as lost. Summed by site, what the older allocations hold still reaches every report,
//! under the line that made them; only their addresses are gone, so a later free of one is not
//! matched (the replay counts it, and the reports say their live figures are then an upper
//! bound). The newest are the ones a program frees soonest, so they stay itemized.

use super::write::{Writer, blank};
use crate::trace::format::{Api, RecordKind, restore};
use crate::trace::live::{Live, Replay};
use std::collections::BTreeMap;

/// Where the stand-ins for summed allocations are numbered from: far above any address a
/// device or host allocation takes (x86-64 and AArch64 user space ends below 2^57).
pub const SUMMED_BASE: u64 = 0xfff0_0000_0000_0000;

/// Writes the live allocations (all of them with `itemize` None, else at most that many one
/// by one), then the pinned host allocations.
pub(super) fn write(
    w: &mut Writer,
    rp: &Replay,
    joined: &crate::fasthash::FastMap<u64, u64>,
    itemize: Option<usize>,
) {
    let joined_of = |p: u64, physical: bool| {
        if physical {
            0
        } else {
            joined.get(&p).copied().unwrap_or(0)
        }
    };
    let mut live: Vec<(u64, Live, bool)> = rp
        .live
        .iter()
        .map(|(&p, l)| (p, *l, false))
        .chain(rp.physical.iter().map(|(&h, l)| (h, *l, true)))
        .collect();
    if let Some(n) = itemize.filter(|&n| n < live.len()) {
        live.sort_unstable_by_key(|&(p, l, physical)| (physical, std::cmp::Reverse(l.time_ns), p));
        let older = live.split_off(n);
        let summed = sum_by_site(older, &joined_of, &mut live);
        for (device, (count, bytes)) in summed {
            w.restore(restore::SUMMED, device, count, bytes, 0);
        }
    }
    // The live allocations, by call site (and the forward stack a backward tensor is joined
    // to, in the site's time field).
    live.sort_unstable_by_key(|&(p, l, physical)| {
        (
            l.stack,
            l.range,
            l.caller,
            joined_of(p, physical),
            l.time_ns,
            p,
        )
    });
    let mut site = None;
    for (p, l, physical) in live {
        let forward = joined_of(p, physical);
        if site != Some((l.stack, l.range, l.caller, forward)) {
            site = Some((l.stack, l.range, l.caller, forward));
            w.restore(restore::SITE, 0, l.stack, l.range, forward);
            w.push(crate::trace::format::Record {
                kind: RecordKind::Caller,
                api: Api::Shim,
                ptr: l.caller[0],
                size: l.caller[1],
                ..blank()
            });
        }
        let kind = if physical {
            RecordKind::PhysCreate
        } else {
            RecordKind::from_u8(l.kind).unwrap_or(RecordKind::Alloc)
        };
        w.push(crate::trace::format::Record {
            kind,
            api: Api::from_u8(l.api).unwrap_or(Api::Shim),
            device: l.device,
            status: 0,
            thread: l.thread,
            time_ns: l.time_ns,
            ptr: p,
            size: l.size,
            stream: l.stream,
        });
    }
    let mut host: Vec<(u64, u64)> = rp.pinned.by_address.iter().map(|(&p, &s)| (p, s)).collect();
    host.sort_unstable();
    for (p, s) in host {
        w.push(crate::trace::format::Record {
            kind: RecordKind::HostAlloc,
            api: Api::CudaMallocHost,
            ptr: p,
            size: s,
            ..blank()
        });
    }
}

/// Sums `older` by call site into one stand-in allocation each (at [`SUMMED_BASE`] on, its
/// time the oldest's), appended to `live`; returns the allocations and bytes summed per device.
/// VMM handles are never summed (a framework's segment names them).
fn sum_by_site(
    older: Vec<(u64, Live, bool)>,
    joined_of: &impl Fn(u64, bool) -> u64,
    live: &mut Vec<(u64, Live, bool)>,
) -> BTreeMap<u8, (u64, u64)> {
    type Key = (u64, u64, [u64; 2], u64, u8, u8, u8, u16, u16);
    let mut sites: BTreeMap<Key, Live> = BTreeMap::new();
    let mut per_device: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
    for (p, l, physical) in older {
        if physical {
            live.push((p, l, physical));
            continue;
        }
        let key = (
            l.stack,
            l.range,
            l.caller,
            joined_of(p, false),
            l.device,
            l.kind,
            l.api,
            l.thread,
            l.stream,
        );
        let s = sites.entry(key).or_insert(Live { size: 0, ..l });
        s.size = s.size.saturating_add(l.size);
        s.time_ns = s.time_ns.min(l.time_ns);
        let d = per_device.entry(l.device).or_default();
        d.0 += 1;
        d.1 = d.1.saturating_add(l.size);
    }
    for (i, l) in sites.into_values().enumerate() {
        live.push((SUMMED_BASE + i as u64, l, false));
    }
    per_device
}
