//! The reports that replay a trace's allocations: `peak`, `leaks` (with growth per iteration),
//! `oom`. Decoding streams: memory grows with the live allocations and the distinct call sites,
//! never with the length of the trace. Reports that need a moment found by a first pass (the
//! peak) read the trace twice.

use crate::trace::format::{DEVICE_UNKNOWN, Record, RecordKind};
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// A live allocation as the replay knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    pub size: u64,
    pub device: u8,
    /// Stack id (0: none recorded).
    pub stack: u64,
    /// String id of the innermost NVTX range of the allocating thread (0: none).
    pub range: u64,
    pub time_ns: u64,
    pub thread: u16,
    pub stream: u16,
    pub api: u8,
}

/// The call-site key of an allocation: its stack id, or without a stack its API and size
/// (flagged in the top bit).
pub fn site_key(l: &Live) -> u64 {
    if l.stack != 0 {
        l.stack
    } else {
        (1 << 63) | (u64::from(l.api) << 48) | (l.size & ((1 << 48) - 1))
    }
}

/// The allocation state of a trace at one moment, updated record by record.
#[derive(Default)]
pub struct Replay {
    /// By address, so the blocks of a segment can be walked in order.
    pub live: BTreeMap<u64, Live>,
    /// VMM physical allocations (`cuMemCreate`: NCCL's buffers, say) by handle: device memory
    /// held, though not at an address of its own.
    pub physical: HashMap<u64, Live>,
    /// Live bytes per device, physical allocations included.
    pub live_bytes: BTreeMap<u8, u64>,
    /// The pool's segments (runs with the shim's pool): base -> (size, device).
    pub segments: BTreeMap<u64, (u64, u8)>,
    pub reserved: BTreeMap<u8, u64>,
    /// The latest real free/total memory per device (`MemInfo` records).
    pub mem_info: BTreeMap<u8, (u64, u64)>,
    last_alloc: HashMap<u16, u64>,
    ranges: HashMap<u16, Vec<u64>>,
    /// Records applied.
    pub index: u64,
    pub time_ns: u64,
}

/// What a record changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Alloc {
        ptr: u64,
        device: u8,
    },
    /// A VMM physical allocation on `device` was created or released.
    Physical {
        device: u8,
    },
    Free {
        ptr: u64,
        live: Live,
    },
    Other,
}

impl Replay {
    /// What an allocation record makes live (an unknown device counts as device 0).
    fn live_of(&self, r: &Record) -> Live {
        Live {
            size: r.size,
            device: if r.device == DEVICE_UNKNOWN {
                0
            } else {
                r.device
            },
            stack: 0,
            range: self
                .ranges
                .get(&r.thread)
                .and_then(|s| s.last().copied())
                .unwrap_or(0),
            time_ns: r.time_ns,
            thread: r.thread,
            stream: r.stream,
            api: r.api as u8,
        }
    }

    /// Everything live: allocations by address, then physical allocations.
    pub fn all_live(&self) -> impl Iterator<Item = &Live> {
        self.live.values().chain(self.physical.values())
    }

    pub fn apply(&mut self, r: &Record) -> Change {
        self.index += 1;
        self.time_ns = self.time_ns.max(r.time_ns);
        use RecordKind::*;
        match r.kind {
            Alloc | AllocAsync | ManagedAlloc if r.status == 0 && r.ptr != 0 => {
                let l = self.live_of(r);
                let device = l.device;
                if let Some(old) = self.live.insert(r.ptr, l) {
                    // Freed by a route the trace did not see.
                    {
                        let v = self.live_bytes.entry(old.device).or_default();
                        *v = v.saturating_sub(old.size);
                    }
                }
                {
                    let v = self.live_bytes.entry(device).or_default();
                    *v = v.saturating_add(r.size);
                }
                self.last_alloc.insert(r.thread, r.ptr);
                Change::Alloc { ptr: r.ptr, device }
            }
            PhysCreate if r.status == 0 => {
                let l = Live {
                    stream: 0,
                    ..self.live_of(r)
                };
                let device = l.device;
                if let Some(old) = self.physical.insert(r.ptr, l) {
                    {
                        let v = self.live_bytes.entry(old.device).or_default();
                        *v = v.saturating_sub(old.size);
                    }
                }
                {
                    let v = self.live_bytes.entry(device).or_default();
                    *v = v.saturating_add(r.size);
                }
                Change::Physical { device }
            }
            PhysRelease if r.status == 0 => match self.physical.remove(&r.ptr) {
                Some(l) => {
                    {
                        let v = self.live_bytes.entry(l.device).or_default();
                        *v = v.saturating_sub(l.size);
                    }
                    Change::Physical { device: l.device }
                }
                None => Change::Other,
            },
            Free | FreeAsync if r.status == 0 && r.ptr != 0 => {
                self.last_alloc.remove(&r.thread);
                match self.live.remove(&r.ptr) {
                    Some(l) => {
                        {
                            let v = self.live_bytes.entry(l.device).or_default();
                            *v = v.saturating_sub(l.size);
                        }
                        Change::Free {
                            ptr: r.ptr,
                            live: l,
                        }
                    }
                    None => Change::Other,
                }
            }
            StackRef => {
                if let Some(p) = self.last_alloc.remove(&r.thread)
                    && let Some(l) = self.live.get_mut(&p)
                {
                    l.stack = r.ptr;
                }
                Change::Other
            }
            RangePush => {
                self.ranges.entry(r.thread).or_default().push(r.ptr);
                Change::Other
            }
            RangePop => {
                if let Some(s) = self.ranges.get_mut(&r.thread) {
                    s.pop();
                }
                Change::Other
            }
            SegmentReserve => {
                self.segments.insert(r.ptr, (r.size, r.device));
                {
                    let v = self.reserved.entry(r.device).or_default();
                    *v = v.saturating_add(r.size);
                }
                Change::Other
            }
            SegmentRelease => {
                self.segments.remove(&r.ptr);
                let v = self.reserved.entry(r.device).or_default();
                *v = v.saturating_sub(r.size);
                Change::Other
            }
            MemInfo if r.status == 0 => {
                let d = if r.device == DEVICE_UNKNOWN {
                    0
                } else {
                    r.device
                };
                self.mem_info.insert(d, (r.ptr, r.size));
                Change::Other
            }
            _ => {
                // Any other record of the thread ends the window in which a StackRef belongs
                // to its allocation.
                if !matches!(r.kind, Stack | StackData | String | StringData | Module) {
                    self.last_alloc.remove(&r.thread);
                }
                Change::Other
            }
        }
    }

    pub fn live_on(&self, device: u8) -> u64 {
        self.live_bytes.get(&device).copied().unwrap_or(0)
    }

    /// Reserved memory on a device: the pool's segments plus VMM physical memory (which the
    /// pool does not serve), or (pass-through) what is live.
    pub fn reserved_on(&self, device: u8) -> u64 {
        if self.segments.is_empty() && self.reserved.is_empty() {
            self.live_on(device)
        } else {
            let physical: u64 = self
                .physical
                .values()
                .filter(|l| l.device == device)
                .map(|l| l.size)
                .sum();
            self.reserved.get(&device).copied().unwrap_or(0) + physical
        }
    }

    /// The largest free range inside the pool's segments of `device` (0 without a pool).
    pub fn largest_free_block(&self, device: u8) -> u64 {
        let mut best = 0;
        for (&base, &(size, d)) in &self.segments {
            if d != device {
                continue;
            }
            // A hostile trace may name a segment that runs past 2^64: saturate.
            let end = base.saturating_add(size);
            let mut at = base;
            for (&p, l) in self.live.range(base..end) {
                best = best.max(p.saturating_sub(at));
                at = at.max(p.saturating_add(l.size));
            }
            best = best.max(end.saturating_sub(at));
        }
        best
    }
}

/// Opens a trace, says where its damage is if any, and replays it through `f`.
pub fn replay_each(
    path: &Path,
    opts: &ReadOptions,
    mut f: impl FnMut(&TraceReader, &mut Replay, &Record, Change),
) -> Result<(TraceReader, Replay), ReadError> {
    let mut reader = TraceReader::open_with(path, opts)?;
    let mut replay = Replay::default();
    while let Some(r) = reader.next() {
        let c = replay.apply(&r);
        f(&reader, &mut replay, &r, c);
    }
    Ok((reader, replay))
}

/// A call site as people read it: the first frames of its stack, innermost first.
pub fn site_label(reader: &TraceReader, stack: u64) -> String {
    if stack >> 63 == 1 {
        let api = crate::trace::format::Api::from_u8((stack >> 48) as u8 & 0x7f).map_or("?", |a| a.name());
        let why = if reader.has_stacks() {
            "no stack recorded for these allocations"
        } else {
            "no stack: record with GPUSHIM_CONF=stacks:on"
        };
        return format!("{api} of {} B ({why})", stack & ((1 << 48) - 1));
    }
    match reader.stack(stack) {
        Some(frames) if stack != 0 && !frames.is_empty() => frames
            .iter()
            .take(4)
            .map(|&ip| crate::report::symbolize::describe(reader, ip))
            .collect::<Vec<_>>()
            .join(" < "),
        // Stacks were on (sampled, or this one not written yet): nothing to suggest.
        _ if reader.has_stacks() => "(no stack recorded for these allocations)".into(),
        _ => "(no stack: record with GPUSHIM_CONF=stacks:on)".into(),
    }
}

pub fn range_label(reader: &TraceReader, range: u64) -> String {
    if range == 0 {
        "(no NVTX range)".into()
    } else {
        reader
            .string(range)
            .unwrap_or("(unnamed range)")
            .to_string()
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub label: String,
    pub bytes: u64,
    pub allocations: u64,
}

fn holders<'a>(
    live: impl Iterator<Item = &'a Live>,
    device: Option<u8>,
    key: impl Fn(&Live) -> u64,
    label: impl Fn(u64) -> String,
) -> Vec<Holder> {
    let mut by: HashMap<u64, (u64, u64)> = HashMap::new();
    for l in live.filter(|l| device.is_none_or(|d| l.device == d)) {
        let e = by.entry(key(l)).or_default();
        e.0 = e.0.saturating_add(l.size);
        e.1 += 1;
    }
    // Two stacks that read the same (frames beyond the first four differ) are one row.
    let mut merged: HashMap<String, (u64, u64)> = HashMap::new();
    for (k, (bytes, allocations)) in by {
        let e = merged.entry(label(k)).or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += allocations;
    }
    let mut v: Vec<Holder> = merged
        .into_iter()
        .map(|(label, (bytes, allocations))| Holder {
            label,
            bytes,
            allocations,
        })
        .collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.label.cmp(&b.label)));
    v
}

#[derive(Clone, Debug, Serialize)]
pub struct Peak {
    pub device: u8,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    pub time_ns: u64,
    pub by_call_site: Vec<Holder>,
    pub by_range: Vec<Holder>,
    /// Live allocations at the peak, with their stacks (for flame graphs).
    #[serde(skip)]
    pub stacks: Vec<(Vec<String>, u64)>,
}

/// Replays the first `at` records, then the stack references that follow within a short window
/// (a stack is recorded just after its allocation; other threads may come in between).
fn replay_until(reader: &mut TraceReader, at: u64) -> Replay {
    let mut rp = Replay::default();
    while rp.index < at {
        let Some(r) = reader.next() else {
            return rp;
        };
        rp.apply(&r);
    }
    for _ in 0..64 {
        let Some(r) = reader.next() else {
            break;
        };
        if r.kind == RecordKind::StackRef {
            let index = rp.index;
            rp.apply(&r);
            rp.index = index;
        }
    }
    rp
}

/// The moment of peak live memory on each device, and what was live then.
pub fn peak(path: &Path, opts: &ReadOptions) -> Result<Vec<Peak>, ReadError> {
    // Pass 1: when each device peaked (the first record reaching its maximum).
    // (live bytes, record index, time of the record that made the peak)
    let mut best: BTreeMap<u8, (u64, u64, u64)> = BTreeMap::new();
    replay_each(path, opts, |_, rp, r, c| {
        if let Change::Alloc { device, .. } | Change::Physical { device } = c {
            let live = rp.live_on(device);
            let e = best.entry(device).or_insert((0, 0, 0));
            if live > e.0 {
                *e = (live, rp.index, r.time_ns);
            }
        }
    })?;
    let mut out = Vec::new();
    for (&device, &(_, at, peak_time)) in &best {
        let mut reader = TraceReader::open_with(path, opts)?;
        let rp = replay_until(&mut reader, at);
        let stacks = rp
            .all_live()
            .filter(|l| l.device == device)
            .map(|l| {
                let frames = reader
                    .stack(l.stack)
                    .map(|f| {
                        f.iter()
                            .map(|&ip| crate::report::symbolize::describe(&reader, ip))
                            .collect()
                    })
                    .unwrap_or_else(|| vec!["(no stack)".to_string()]);
                (frames, l.size)
            })
            .collect();
        out.push(Peak {
            device,
            live_bytes: rp.live_on(device),
            reserved_bytes: rp.reserved_on(device),
            // The allocation that made the peak, not the stack records read after it.
            time_ns: peak_time,
            by_call_site: holders(
                rp.all_live(),
                Some(device),
                |l| l.stack,
                |k| site_label(&reader, k),
            ),
            by_range: holders(
                rp.all_live(),
                Some(device),
                |l| l.range,
                |k| range_label(&reader, k),
            ),
            stacks,
        });
    }
    Ok(out)
}

#[derive(Clone, Debug, Serialize)]
pub struct Growth {
    pub call_site: String,
    /// Median growth between consecutive iteration boundaries.
    pub bytes_per_iteration: u64,
    pub live_at_first_boundary: u64,
    pub live_at_last_boundary: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Iterations {
    /// What marks an iteration: an NVTX range or mark name, or a detected period.
    pub boundary: String,
    pub count: u64,
    /// Live bytes (all devices) at each boundary.
    pub live_at_boundaries: Vec<u64>,
    pub growing: Vec<Growth>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Leaks {
    /// `--boundary NAME` named no NVTX range or mark of the trace: the names it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boundary_not_found: Option<Vec<String>>,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    pub iterations: Option<Iterations>,
    pub clean_exit: bool,
}

/// Keeps at most this many boundaries (evenly thinned past it).
const MAX_BOUNDARIES: usize = 1000;

/// What was live at exit, by call site; and, with iteration boundaries (an NVTX range or mark
/// that repeats, `boundary` if given, else a detected period), the call sites whose live bytes
/// grow steadily from one iteration to the next.
pub fn leaks(path: &Path, boundary: Option<&str>, opts: &ReadOptions) -> Result<Leaks, ReadError> {
    // Pass 1: candidate boundaries (NVTX names) and allocation sites for period detection.
    let mut names: HashMap<u64, (u64, bool)> = HashMap::new();
    // Allocation times by site: by stack where stacks were recorded, else by API and size.
    // Positions in the sequence of allocations, not times: an iteration's allocations come in
    // the same order every time, while their timing varies with the machine.
    let mut by_stack: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut by_size: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut pending: HashMap<u16, u64> = HashMap::new();
    let mut allocations = 0u64;
    let (reader, _) = replay_each(path, opts, |_, _, r, c| match r.kind {
        RecordKind::RangePush | RecordKind::Mark => {
            let e = names
                .entry(r.ptr)
                .or_insert((0, r.kind == RecordKind::RangePush));
            e.0 += 1;
        }
        RecordKind::StackRef => {
            if let Some(t) = pending.remove(&r.thread) {
                let v = by_stack.entry(r.ptr).or_default();
                if v.len() < 100_000 {
                    v.push(t);
                }
            }
        }
        _ => {
            pending.remove(&r.thread);
            if let Change::Alloc { .. } = c {
                allocations += 1;
                pending.insert(r.thread, allocations);
                let key = (1 << 63) | ((r.api as u64) << 48) | (r.size & ((1 << 48) - 1));
                let v = by_size.entry(key).or_default();
                if v.len() < 100_000 {
                    v.push(allocations);
                }
            }
        }
    })?;
    // By stack where stacks were recorded; by API and size where they were not, or sampled
    // too sparsely to show a period.
    let period = || detect_period(&by_stack).or_else(|| detect_period(&by_size));
    // Choose the boundary.
    // (description, NVTX string id, or the site key of a detected period)
    type Boundary = (String, Option<u64>, Option<u64>);
    let chosen: Option<Boundary> = match boundary {
        Some(name) => names
            .keys()
            .find(|&&id| reader.string(id) == Some(name))
            .map(|&id| (format!("NVTX '{name}'"), Some(id), None)),
        None => names
            .iter()
            .filter(|(_, (n, _))| *n >= 3)
            .max_by_key(|(id, (n, push))| (*push, *n, std::cmp::Reverse(**id)))
            .map(|(&id, _)| {
                (
                    format!("NVTX '{}'", reader.string(id).unwrap_or("?")),
                    Some(id),
                    None,
                )
            })
            .or_else(|| {
                period().map(|key| {
                    (
                        format!(
                            "detected period: each allocation from {} (no NVTX ranges in the trace)",
                            site_label(&reader, key)
                        ),
                        None,
                        Some(key),
                    )
                })
            }),
    };
    let chosen_missing = chosen.is_none();
    let name_ids: Vec<u64> = names.keys().copied().collect();
    // Pass 2: live bytes per call site at each boundary, from the live set (the stacks of
    // earlier allocations are all in by then).
    let mut series: Vec<HashMap<u64, u64>> = Vec::new();
    let mut totals: Vec<u64> = Vec::new();
    let mut seen = 0u64;
    let (reader, rp) = replay_each(path, opts, |_, rp, r, c| {
        let is_boundary = match &chosen {
            Some((_, Some(id), _)) => {
                matches!(r.kind, RecordKind::RangePush | RecordKind::Mark) && r.ptr == *id
            }
            Some((_, None, Some(key))) if key >> 63 == 1 => {
                matches!(c, Change::Alloc { .. })
                    && ((1 << 63) | ((r.api as u64) << 48) | (r.size & ((1 << 48) - 1))) == *key
            }
            Some((_, None, Some(key))) => r.kind == RecordKind::StackRef && r.ptr == *key,
            _ => false,
        };
        if is_boundary {
            seen += 1;
            if series.len() < MAX_BOUNDARIES {
                let mut by: HashMap<u64, u64> = HashMap::new();
                for l in rp.all_live() {
                    {
                        let v = by.entry(site_key(l)).or_default();
                        *v = v.saturating_add(l.size);
                    }
                }
                series.push(by);
                totals.push(rp.live_bytes.values().sum());
            }
        }
    })?;
    let iterations = chosen.map(|(boundary, _, _)| {
        let mut growing = Vec::new();
        if series.len() >= 3 {
            let keys: std::collections::HashSet<u64> =
                series.iter().flat_map(|m| m.keys().copied()).collect();
            for k in keys {
                let s: Vec<u64> = series
                    .iter()
                    .map(|m| m.get(&k).copied().unwrap_or(0))
                    .collect();
                let mut diffs: Vec<i128> =
                    s.windows(2).map(|w| w[1] as i128 - w[0] as i128).collect();
                let rising = diffs.iter().filter(|&&d| d >= 0).count();
                diffs.sort_unstable();
                let median = diffs[diffs.len() / 2];
                if median > 0 && rising * 4 >= diffs.len() * 3 && s[s.len() - 1] > s[0] {
                    growing.push(Growth {
                        call_site: site_label(&reader, k),
                        bytes_per_iteration: median as u64,
                        live_at_first_boundary: s[0],
                        live_at_last_boundary: s[s.len() - 1],
                    });
                }
            }
            growing.sort_by_key(|g| std::cmp::Reverse(g.bytes_per_iteration));
        }
        Iterations {
            boundary,
            count: seen,
            live_at_boundaries: totals.clone(),
            growing,
        }
    });
    let boundary_not_found = boundary.filter(|_| chosen_missing).map(|_| {
        let mut seen: Vec<String> = name_ids
            .iter()
            .filter_map(|&id| reader.string(id).map(str::to_string))
            .collect();
        seen.sort();
        seen.dedup();
        seen
    });
    Ok(Leaks {
        boundary_not_found,
        live_at_exit_bytes: rp.live_bytes.values().sum(),
        live_at_exit: holders(rp.all_live(), None, site_key, |k| site_label(&reader, k)),
        iterations,
        clean_exit: reader.info().clean_exit,
    })
}

/// The call site that recurs most often at a regular place in the sequence of allocations (at
/// least 3 times): once per iteration, in a loop. `sites` holds each site's positions in that
/// sequence. Regular means the gaps between its occurrences stay within 1.5x of each other (the
/// 10th and 90th percentiles, so a first or last iteration that differs does not count): a
/// site allocated several times per iteration comes in bursts and fails. Ties go to the site
/// seen first, so the same trace always gives the same answer.
fn detect_period(sites: &HashMap<u64, Vec<u64>>) -> Option<u64> {
    sites
        .iter()
        .filter(|(_, t)| t.len() >= 3)
        .filter(|(_, t)| {
            let mut gaps: Vec<u64> = t.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
            gaps.sort_unstable();
            let lo = gaps[gaps.len() / 10];
            let hi = gaps[(gaps.len() * 9 / 10).min(gaps.len() - 1)];
            lo > 0 && hi.saturating_mul(2) <= lo.saturating_mul(3)
        })
        .max_by_key(|(k, t)| (t.len(), std::cmp::Reverse(t[0]), std::cmp::Reverse(**k)))
        .map(|(k, _)| *k)
}

#[derive(Clone, Debug, Serialize)]
pub struct Oom {
    pub time_ns: u64,
    pub api: String,
    pub status: u8,
    pub device: u8,
    pub requested_bytes: u64,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    /// Reserved by the pool and not live: cached.
    pub cached_bytes: u64,
    pub largest_free_block: u64,
    /// The pool refused because of `limit`, not the device.
    pub limit_hit: bool,
    /// The device's own free memory at the last `cudaMemGetInfo` before, if any.
    pub device_free_bytes: Option<u64>,
    pub holders: Vec<Holder>,
}

/// Every failed allocation, with what held memory at that moment.
pub fn oom(path: &Path, opts: &ReadOptions) -> Result<Vec<Oom>, ReadError> {
    let mut out = Vec::new();
    let mut limit_pending: HashMap<u16, bool> = HashMap::new();
    replay_each(path, opts, |reader, rp, r, _| match r.kind {
        RecordKind::LimitHit => {
            limit_pending.insert(r.thread, true);
        }
        RecordKind::Alloc | RecordKind::AllocAsync | RecordKind::ManagedAlloc
            if r.status != 0 && r.size > 0 =>
        {
            let device = if r.device == DEVICE_UNKNOWN {
                0
            } else {
                r.device
            };
            let live = rp.live_on(device);
            let reserved = rp.reserved_on(device);
            let mut h = holders(
                rp.all_live(),
                Some(device),
                |l| l.stack,
                |k| site_label(reader, k),
            );
            h.truncate(10);
            out.push(Oom {
                time_ns: r.time_ns,
                api: r.api.name().to_string(),
                status: r.status,
                device,
                requested_bytes: r.size,
                live_bytes: live,
                reserved_bytes: reserved,
                cached_bytes: reserved.saturating_sub(live),
                largest_free_block: rp.largest_free_block(device),
                limit_hit: limit_pending.remove(&r.thread).unwrap_or(false),
                device_free_bytes: rp.mem_info.get(&device).map(|m| m.0),
                holders: h,
            });
        }
        _ => {}
    })?;
    Ok(out)
}

/// Holders of several traces added up by label (a call site is labelled by module and offset,
/// so the same code in every rank has the same label).
pub fn merge_holders<'a>(holders: impl IntoIterator<Item = &'a Holder>) -> Vec<Holder> {
    let mut by: HashMap<&str, (u64, u64)> = HashMap::new();
    for h in holders {
        let e = by.entry(h.label.as_str()).or_default();
        e.0 = e.0.saturating_add(h.bytes);
        e.1 += h.allocations;
    }
    let mut out: Vec<Holder> = by
        .into_iter()
        .map(|(label, (bytes, allocations))| Holder {
            label: label.to_string(),
            bytes,
            allocations,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    out
}

/// The peaks of a job's traces (one per rank) together.
#[derive(Clone, Debug, Serialize)]
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

/// A call site growing in one or more ranks of a job.
#[derive(Clone, Debug, Serialize)]
pub struct JobGrowth {
    pub call_site: String,
    /// How many traces it grows in.
    pub traces: usize,
    /// Its growth per iteration, added up over those traces.
    pub bytes_per_iteration: u64,
}

/// The leaks of a job's traces together.
#[derive(Clone, Debug, Serialize)]
pub struct JobLeaks {
    pub traces: usize,
    pub live_at_exit_bytes: u64,
    pub live_at_exit: Vec<Holder>,
    /// Traces that did not exit cleanly.
    pub unclean: Vec<String>,
    pub growing: Vec<JobGrowth>,
}

pub fn combine_leaks(all: &[(String, Leaks)]) -> JobLeaks {
    let mut growing: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for g in all
        .iter()
        .filter_map(|(_, l)| l.iterations.as_ref())
        .flat_map(|it| &it.growing)
    {
        let e = growing.entry(g.call_site.as_str()).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(g.bytes_per_iteration);
    }
    let mut growing: Vec<JobGrowth> = growing
        .into_iter()
        .map(|(call_site, (traces, bytes))| JobGrowth {
            call_site: call_site.to_string(),
            traces,
            bytes_per_iteration: bytes,
        })
        .collect();
    growing.sort_by_key(|g| std::cmp::Reverse(g.bytes_per_iteration));
    JobLeaks {
        traces: all.len(),
        live_at_exit_bytes: all.iter().map(|(_, l)| l.live_at_exit_bytes).sum(),
        live_at_exit: merge_holders(all.iter().flat_map(|(_, l)| &l.live_at_exit)),
        unclean: all
            .iter()
            .filter(|(_, l)| !l.clean_exit)
            .map(|(t, _)| t.clone())
            .collect(),
        growing,
    }
}
