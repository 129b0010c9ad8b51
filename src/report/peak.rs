//! `peak`: the moment of most live memory on each device, and who held it then.

use super::kinds::{Kind, KindHolders};
use super::live::{Change, Live, Replay};
use super::moments::Moment;
use super::pass::{Said, Seen, Slot, Tracker};
use super::sites::{Holder, holders, merge_holders, range_label, site_label};
use crate::trace::format::Api;
use crate::trace::format::Record;
use crate::trace::reader::{ReadOptions, TraceTables};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Peak {
    pub device: u8,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    pub time_ns: u64,
    /// PyTorch's tensors live at the peak by kind, each kind's call sites under it (empty
    /// without the framework's tensors, or for a peak a checkpoint kept).
    pub by_kind: Vec<KindHolders>,
    /// The kinds are told from the lines alone (a peak a ring's checkpoint kept: it keeps no
    /// lifetimes, so a phase's temporaries count with what it keeps, and workspaces with the
    /// line that made them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kinds_from_lines: bool,
    pub by_call_site: Vec<Holder>,
    pub by_range: Vec<Holder>,
    /// Live allocations at the peak, with their stacks and their kinds (PyTorch's tensors;
    /// for flame graphs).
    #[serde(skip)]
    pub stacks: Vec<(Vec<String>, u64, Option<Kind>)>,
}

/// A device's most live bytes so far: (bytes, record index, time).
type Best = (u64, u64, u64);

/// When each device peaked, record by record (the analysis's first pass): the first record
/// reaching its maximum.
#[derive(Default)]
pub struct PeakFinder {
    /// (live bytes, record index, time of the record that made the peak)
    best: crate::trace::by_device::ByDevice<Best>,
    /// Per device: the best before a peak the program's own allocation set (a `cudaMalloc` or
    /// VMM handle the framework's segment record may yet claim as its segment: never live).
    /// (the best before, the allocation's address or handle, whether a handle)
    before_raw: BTreeMap<u8, (Best, u64, bool)>,
}

/// What the first pass found of the peaks: those a ring's checkpoint kept (whole), and the
/// moments of the others, to be taken in the second pass.
pub struct PeaksFound {
    pub kept: Vec<Peak>,
    /// (device, record index, time)
    pub wanted: Vec<(u8, u64, u64)>,
}

impl PeakFinder {
    /// One record, after `rp` applied it (the change it made is `c`).
    fn see_parts(&mut self, rp: &Replay, r: &Record, c: Change, said: &mut Vec<Said>) {
        use crate::trace::format::{Api, RecordKind};
        if rp.restored.active || r.kind == RecordKind::Restore {
            return;
        }
        let framework_segment = r.kind == RecordKind::SegmentReserve && r.api == Api::Torch;
        match c {
            Change::Alloc { device, .. } | Change::Physical { device } if !framework_segment => {
                let live = rp.live_on(device);
                let e = self.best.get_or_insert_with(device, || (0, 0, 0));
                if live > e.0 {
                    let mut was = *e;
                    *e = (live, rp.index, r.time_ns);
                    let physical = r.kind == RecordKind::PhysCreate;
                    if physical || r.kind == RecordKind::Alloc {
                        // Pages of one segment: the self.best before the first of them.
                        if let Some(&(first, _, true)) = self.before_raw.get(&device)
                            && physical
                        {
                            was = first;
                        } else {
                            said.push(Said::Move {
                                from: Slot::Peak(device),
                                to: Slot::BeforeRaw(device),
                            });
                        }
                        self.before_raw.insert(device, (was, r.ptr, physical));
                    } else {
                        self.before_raw.remove(&device);
                        said.push(Said::Forget(Slot::BeforeRaw(device)));
                    }
                    said.push(Said::Here(Slot::Peak(device)));
                }
            }
            // The framework's segment claimed the allocation that set the peak.
            Change::Free { ptr } if framework_segment => {
                let live = rp.freed;
                if let Some(&(was, key, false)) = self.before_raw.get(&live.device)
                    && key == ptr
                {
                    self.best.insert(live.device, was);
                    self.before_raw.remove(&live.device);
                    said.push(Said::Move {
                        from: Slot::BeforeRaw(live.device),
                        to: Slot::Peak(live.device),
                    });
                }
            }
            Change::Physical { device } if framework_segment => {
                if let Some(&(was, _, true)) = self.before_raw.get(&device) {
                    self.best.insert(device, was);
                    self.before_raw.remove(&device);
                    said.push(Said::Move {
                        from: Slot::BeforeRaw(device),
                        to: Slot::Peak(device),
                    });
                }
            }
            _ => {}
        }
    }

    /// The peaks a checkpoint kept, and the moments to take for the others; `whole` is the
    /// first pass's replay, `reader` its reader (the checkpoint's stacks are named from it).
    pub fn finish(
        mut self,
        tables: &TraceTables,
        whole: &Replay,
        opts: &ReadOptions,
    ) -> PeaksFound {
        let mut kept = Vec::new();
        // A trace of any length: a peak before the ring, as the checkpoint kept it.
        // The checkpoint may keep several moments of one device (one per summarizing pass): its
        // peak is the highest of them.
        let mut highest: BTreeMap<u8, &crate::trace::live::Snapshot> = BTreeMap::new();
        for snap in whole.restored.snapshots.iter().filter(|s| !s.failure) {
            if !opts.filter.devices.is_empty() && !opts.filter.devices.contains(&snap.device) {
                continue;
            }
            let e = highest.entry(snap.device).or_insert(snap);
            if snap.live > e.live {
                *e = snap;
            }
        }
        for (device, snap) in highest {
            if self.best.get(device).is_some_and(|b| b.0 > snap.live) {
                continue;
            }
            self.best.remove(device);
            kept.push(from_snapshot(tables, snap));
        }
        let wanted = self
            .best
            .iter()
            .map(|(d, &(_, at, t))| (d, at, t))
            .collect();
        PeaksFound { kept, wanted }
    }
}

/// Every device's peak: those the checkpoint kept, and the others from their moments.
pub fn peaks(tables: &TraceTables, found: PeaksFound, moments: &[Moment]) -> Vec<Peak> {
    let mut out = found.kept;
    for (device, at, peak_time) in found.wanted {
        if let Some(m) = super::moments::of(moments, at, device) {
            out.push(at_moment(tables, m, peak_time));
        }
    }
    out.sort_by_key(|p| p.device);
    out
}

/// A device's peak from its moment (`peak_time`: the time of the allocation that made it, not
/// of the stack records read after it).
fn at_moment(tables: &TraceTables, m: &Moment, peak_time: u64) -> Peak {
    let (rp, kinds, device) = (&m.replay, &m.kinds, m.device);
    let in_order = rp.live_in_order();
    let tensors: Vec<(Kind, &Live)> = rp
        .live
        .iter()
        .filter(|(_, l)| l.device == device && l.api == Api::Torch as u8)
        .map(|(p, l)| (kinds.get(p).copied().unwrap_or(Kind::Unknown), l))
        .collect();
    let by_kind = super::kinds::by_kind_and_site(&tensors, |k| site_label(tables, k));
    let stacks = in_order
        .iter()
        .map(|&(p, l)| (p, l))
        .chain(rp.physical.values().map(|l| (0, l)))
        .filter(|(_, l)| l.device == device)
        .map(|(p, l)| {
            let frames = frames_of(tables, l.stack);
            let kind = (l.api == Api::Torch as u8)
                .then(|| kinds.get(&p).copied().unwrap_or(Kind::Unknown));
            (frames, l.size, kind)
        })
        .collect();
    Peak {
        device,
        live_bytes: rp.live_on(device),
        reserved_bytes: rp.reserved_on(device),
        time_ns: peak_time,
        by_kind,
        kinds_from_lines: false,
        by_call_site: holders(
            rp.all_live(),
            Some(device),
            |l| l.stack,
            |k| site_label(tables, k),
        ),
        by_range: holders(
            rp.all_live(),
            Some(device),
            |l| l.range,
            |k| range_label(tables, k),
        ),
        stacks,
    }
}

/// The frames of stack `stack` as the flame graph names them, innermost first.
fn frames_of(tables: &TraceTables, stack: u64) -> Vec<String> {
    tables
        .stack(stack)
        .map(|f| {
            crate::report::sites::shown_frames(tables, f)
                .iter()
                .map(|&ip| crate::report::symbolize::describe(tables, ip))
                .collect()
        })
        .unwrap_or_else(|| vec!["(no stack)".to_string()])
}

/// A peak the checkpoint of a ring trace kept: what each call site and range held then.
fn from_snapshot(tables: &TraceTables, s: &crate::trace::live::Snapshot) -> Peak {
    let stacks = s
        .holdings
        .iter()
        .map(|h| {
            let frames = frames_of(tables, h.stack);
            let kind = super::kinds::lasting_kind_of_stack(tables, h.stack);
            (frames, h.bytes, kind)
        })
        .collect();
    Peak {
        device: s.device,
        live_bytes: s.live,
        reserved_bytes: s.reserved,
        time_ns: s.time_ns,
        by_kind: kinds_of_holdings(tables, &s.holdings),
        kinds_from_lines: true,
        by_call_site: super::sites::snapshot_holders(
            &s.holdings,
            |h| h.stack,
            |k| site_label(tables, k),
        ),
        by_range: super::sites::snapshot_holders(
            &s.holdings,
            |h| h.range,
            |k| range_label(tables, k),
        ),
        stacks,
    }
}

/// What a checkpoint's holdings were, by kind, from their lines alone: the holdings with Python
/// frames (the framework's tensors), each by its phase's lasting kind.
fn kinds_of_holdings(
    tables: &TraceTables,
    holdings: &[crate::trace::live::Holding],
) -> Vec<KindHolders> {
    let mut by: BTreeMap<Kind, Vec<&crate::trace::live::Holding>> = BTreeMap::new();
    for h in holdings {
        if let Some(kind) = super::kinds::lasting_kind_of_stack(tables, h.stack) {
            by.entry(kind).or_default().push(h);
        }
    }
    by.into_iter()
        .map(|(kind, hs)| KindHolders {
            kind,
            bytes: hs.iter().fold(0u64, |a, h| a.saturating_add(h.bytes)),
            tensors: hs.iter().map(|h| h.allocations).sum(),
            by_call_site: super::sites::snapshot_holders(
                &hs.into_iter().copied().collect::<Vec<_>>(),
                |h| h.stack,
                |k| site_label(tables, k),
            ),
        })
        .collect()
}

/// The peaks of a job's traces (one per rank) together.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct JobPeak {
    pub traces: usize,
    /// Every device's peak added up: what the job needs if the peaks coincide.
    pub sum_of_peaks: u64,
    pub largest_trace: String,
    pub largest_device: u8,
    pub largest_bytes: u64,
    /// What was live at each device's peak, added up over the job.
    pub by_call_site: Vec<Holder>,
    pub by_range: Vec<Holder>,
}

pub fn combine_peaks(all: &[(String, Vec<Peak>)]) -> JobPeak {
    let peaks = || {
        all.iter()
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t, p)))
    };
    let largest = peaks().max_by_key(|(_, p)| p.live_bytes);
    JobPeak {
        traces: all.len(),
        sum_of_peaks: peaks().map(|(_, p)| p.live_bytes).sum(),
        largest_trace: largest.map_or(String::new(), |(t, _)| t.clone()),
        largest_device: largest.map_or(0, |(_, p)| p.device),
        largest_bytes: largest.map_or(0, |(_, p)| p.live_bytes),
        by_call_site: merge_holders(peaks().flat_map(|(_, p)| &p.by_call_site)),
        by_range: merge_holders(peaks().flat_map(|(_, p)| &p.by_range)),
    }
}

impl Tracker for PeakFinder {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, said: &mut Vec<Said>) {
        self.see_parts(seen.rp, seen.record, seen.change, said);
    }
}
