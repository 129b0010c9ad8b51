//! `gpushim summary`: calls, bytes and failures per API, peak live memory per device, and the
//! health of the trace itself (torn, lost, truncated, damaged).

use super::kinds::Kind;
use super::live::Replay;
use super::units::{human_bytes, human_duration};
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::reader::{DecodeStats, ReadError, ReadOptions, TraceInfo, TraceReader};
use crate::trace::summary::is_allocating;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Allocations with Python frames against all successful allocations.
#[derive(Clone, Debug, Serialize)]
pub struct PythonFrames {
    pub allocations_with: u64,
    pub allocations: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ApiStats {
    pub api: String,
    pub calls: u64,
    pub failed: u64,
    /// Bytes obtained by the successful allocating calls.
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DeviceSummary {
    /// CUDA device ordinal, or null when the shim could not tell.
    pub device: Option<u8>,
    pub peak_live_bytes: u64,
    pub peak_time_ns: u64,
    pub live_bytes_at_end: u64,
    pub live_allocations_at_end: u64,
    /// The shim pool's segments at their high-water mark (equal to live without a pool).
    pub peak_reserved_bytes: u64,
    /// Live bytes at the moment reserved peaked.
    pub live_at_reserved_peak_bytes: u64,
    /// Fragmentation at the peak of reserved memory: the share of reserved bytes that held no
    /// live allocation at that moment, 1 - live / reserved (`docs/internals.md`).
    pub fragmentation_at_peak: f64,
    /// Allocations that failed for lack of memory on this device.
    pub ooms: u64,
}

/// The framework's own caching allocator on one device, from its allocator trace (PyTorch):
/// what `torch.cuda.memory_allocated` and `memory_reserved` read, at their peaks and at exit.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct FrameworkMemory {
    pub device: u8,
    /// Bytes of live tensors: at their peak, and at exit.
    pub allocated_peak_bytes: u64,
    pub allocated_at_end_bytes: u64,
    pub tensors_at_end: u64,
    /// Bytes of the framework's segments (its cache): at their peak, and at exit.
    pub reserved_peak_bytes: u64,
    pub reserved_at_end_bytes: u64,
    /// Reserved at exit that no tensor used: what the cache holds unused.
    pub cached_unused_at_end_bytes: u64,
    pub segments_taken: u64,
    pub segments_given_back: u64,
    /// Requests the framework's allocator could not serve for lack of memory.
    pub ooms: u64,
    /// The live tensors by kind at their peak (`allocated_peak_bytes`), and at exit; empty
    /// where the kinds cannot be told (the peak lay before a ring's records).
    pub kinds_at_peak: super::kinds::ByKind,
    pub kinds_at_exit: super::kinds::ByKind,
    /// The most bytes of activations live at once (as a backward began: what the forward left
    /// for it), which may come before or after the tensors' peak; 0 with no backward.
    pub activations_peak_bytes: u64,
}

/// What the shim's pool did on one device (its own records): how often it went to the device
/// for memory and gave it back, split blocks, and waited for the GPU.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PoolActivity {
    pub device: u8,
    pub segments_reserved: u64,
    pub bytes_reserved: u64,
    pub segments_released: u64,
    pub splits: u64,
    /// Waits for the device so that freed blocks could be reused (memory pressure or `limit`).
    pub waits: u64,
    /// Out-of-memory answers turned into success by giving the idle cache back.
    pub oom_retries: u64,
    /// Checkpoints made to prove fenced blocks free, and how long they took to pass (from
    /// made to passed: how far the GPU ran behind the host), median and longest.
    pub checkpoints: u64,
    pub checkpoint_pass_median_ns: u64,
    pub checkpoint_pass_max_ns: u64,
}

/// When the process left the legacy stream, which ends the pool's single-stream rule.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StreamsLeft {
    pub time_ns: u64,
    /// The call that created or used the other stream.
    pub api: String,
    pub stream: u64,
    /// Where it was called from, when the trace has its stack.
    pub site: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TraceHealth {
    pub committed: u64,
    pub torn: u64,
    /// Claimed slots never written (block tails); not lost records.
    pub unused: u64,
    pub lost: u64,
    pub truncated: u64,
    /// A trace of any length: records its checkpoint summarizes (the detail before the ring),
    /// and records that left the ring before they were summarized.
    pub summarized: u64,
    pub unsummarized: u64,
    pub damage: Option<String>,
    pub clean_exit: bool,
    /// The process still runs (what is "at exit" is then "now").
    pub running: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub path: String,
    pub program: String,
    pub pid: u32,
    pub host: String,
    pub rank: Option<i32>,
    pub duration_ns: u64,
    pub events: u64,
    pub apis: Vec<ApiStats>,
    pub devices: Vec<DeviceSummary>,
    pub pinned_host_peak_bytes: u64,
    /// Frees of pointers this trace never saw allocated (allocated before tracing, or by a
    /// route the trace missed).
    pub unmatched_frees: u64,
    /// How many successful allocations carry Python frames, when any does.
    pub python_frames: Option<PythonFrames>,
    /// Per device whose memory the shim's pool served.
    pub pool: Vec<PoolActivity>,
    /// Under a pool: when the single-stream rule ended (null while it held throughout).
    pub streams_left_legacy: Option<StreamsLeft>,
    /// Per device: the framework's tensors and cache, when the trace holds its tensors.
    pub framework: Vec<FrameworkMemory>,
    /// Why the trace holds no tensors of the framework, when the shim said.
    pub tensors_off: Option<String>,
    /// What each owner (the library that asked CUDA, or the framework for its tensors and
    /// cache) held at exit, per device.
    pub held_at_exit: Vec<super::owners::OwnerBytes>,
    /// Per device, what NVML said this process used, against what the trace explains.
    pub device_memory: Vec<super::device_memory::DeviceMemory>,
    pub health: TraceHealth,
}

/// What `summarize` gathers, record by record.
struct Tally {
    /// Indexed by the API byte: no lookup on the per-record path.
    apis: Vec<Option<ApiStats>>,
    live: Replay,
    first: u64,
    last: u64,
    events: u64,
    /// Per device with a pool: (its segments now, peak reserved, most live while reserved was
    /// at that peak), where reserved is the pool's segments plus VMM physical memory (NCCL's
    /// buffers, say), which the pool does not serve but which is held on the device all the
    /// same.
    pool: BTreeMap<u8, (u64, u64, u64)>,
    ooms: BTreeMap<u8, u64>,
    with_python: u64,
    allocations: u64,
    activity: BTreeMap<u8, PoolActivity>,
    streams_left: Option<StreamsLeft>,
    /// Per device: checkpoints made and not yet passed (number -> time), and the times taken.
    pending_checkpoints: BTreeMap<u8, BTreeMap<u64, u64>>,
    checkpoint_lags: BTreeMap<u8, Vec<u64>>,
    /// The thread whose next stack belongs to the `pool_streams` record.
    site_of: Option<u16>,
    framework: BTreeMap<u8, FrameworkMemory>,
    /// Per thread: whether its latest record (definitions aside) was a successful allocation,
    /// so a stack after it counts as that allocation's.
    allocated_last: Vec<bool>,
    /// Per device: where NVML's figure peaked (the record's position), and its last sample.
    nvml_peaks: BTreeMap<u8, super::device_memory::NvmlPeak>,
    nvml_last: BTreeMap<u8, u64>,
    nth: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            apis: vec![None; 256],
            live: Replay::default(),
            first: u64::MAX,
            last: 0,
            events: 0,
            pool: BTreeMap::new(),
            ooms: BTreeMap::new(),
            with_python: 0,
            allocations: 0,
            activity: BTreeMap::new(),
            streams_left: None,
            pending_checkpoints: BTreeMap::new(),
            checkpoint_lags: BTreeMap::new(),
            site_of: None,
            framework: BTreeMap::new(),
            allocated_last: Vec::new(),
            nvml_peaks: BTreeMap::new(),
            nvml_last: BTreeMap::new(),
            nth: 0,
        }
    }

    /// Reserved memory of device `d`'s pool may have moved: its peak, and the most live then.
    fn note_reserved(&mut self, d: u8) {
        let Some(p) = self.pool.get_mut(&d) else {
            return;
        };
        let physical = self.live.physical_bytes.get(&d).copied().unwrap_or(0);
        let live_now = self.live.live_on(d);
        if p.0 + physical > p.1 {
            p.1 = p.0 + physical;
            p.2 = live_now;
        } else if p.0 + physical == p.1 {
            // Still at the peak: the allocation a segment was reserved for lands just after it.
            p.2 = p.2.max(live_now);
        }
    }

    fn take(&mut self, reader: &TraceReader, r: &Record) {
        self.nth += 1;
        // A checkpoint's records restore what the run did before the ring: state, not calls.
        if r.kind == RecordKind::Restore || self.live.restoring {
            self.live.apply(r);
            return;
        }
        if r.kind == RecordKind::DeviceMemory {
            self.nvml(r);
        }
        let torch = r.api == crate::trace::format::Api::Torch;
        self.segments_and_pool(r, torch);
        if self.site_of == Some(r.thread) && !r.kind.is_definition() {
            self.site_of = None;
            if r.kind == RecordKind::StackRef {
                if let Some(s) = &mut self.streams_left {
                    s.site = Some(super::sites::site_label(reader, r.ptr));
                }
                return;
            }
        }
        if r.kind == RecordKind::PoolStreams {
            // The pool's note, not a call of the program.
            if self.streams_left.is_none() {
                self.streams_left = Some(StreamsLeft {
                    time_ns: r.time_ns,
                    api: r.api.name().to_string(),
                    stream: r.ptr,
                    site: None,
                });
                self.site_of = Some(r.thread);
            }
            return;
        }
        if matches!(
            r.kind,
            RecordKind::Alloc | RecordKind::AllocAsync | RecordKind::ManagedAlloc
        ) && r.status == 2
        {
            *self.ooms.entry(r.device).or_default() += 1;
        }
        self.python_frames(reader, r);
        // The calls of the program, counted as the summarizer of a ring trace counts them.
        if !crate::trace::summary::is_call(r) {
            // The pool's own decisions (and the shim's notes) still change what is live.
            if r.api == crate::trace::format::Api::Shim
                && !matches!(r.kind, RecordKind::ThreadStart | RecordKind::StreamName)
            {
                self.live.apply(r);
            }
            return;
        }
        self.call(r, torch);
    }

    fn nvml(&mut self, r: &Record) {
        let peak = self.live.facts.nvml.get(&r.device).map_or(0, |f| f.peak);
        if r.ptr > peak || !self.nvml_peaks.contains_key(&r.device) {
            self.nvml_peaks.insert(
                r.device,
                super::device_memory::NvmlPeak {
                    record: self.nth,
                    time_ns: r.time_ns,
                },
            );
        }
        self.nvml_last.insert(r.device, r.time_ns);
    }

    /// The framework's segments and the shim's pool: segments, splits, waits, checkpoints.
    fn segments_and_pool(&mut self, r: &Record, torch: bool) {
        match r.kind {
            RecordKind::SegmentReserve | RecordKind::SegmentRelease | RecordKind::TensorOom
                if torch =>
            {
                let f = self
                    .framework
                    .entry(r.device)
                    .or_insert_with(|| FrameworkMemory {
                        device: r.device,
                        ..FrameworkMemory::default()
                    });
                match r.kind {
                    RecordKind::SegmentReserve => f.segments_taken += 1,
                    RecordKind::SegmentRelease => f.segments_given_back += 1,
                    _ => f.ooms += 1,
                }
            }
            RecordKind::SegmentReserve => {
                let e = self.pool.entry(r.device).or_default();
                e.0 = e.0.saturating_add(r.size);
                self.note_reserved(r.device);
                let a = activity_of(&mut self.activity, r.device);
                a.segments_reserved += 1;
                a.bytes_reserved = a.bytes_reserved.saturating_add(r.size);
            }
            RecordKind::SegmentRelease => {
                let p = self.pool.entry(r.device).or_default();
                p.0 = p.0.saturating_sub(r.size);
                activity_of(&mut self.activity, r.device).segments_released += 1;
            }
            RecordKind::Split => {
                // Newer traces: one record counts many splits (`ptr` 0, `size` the count);
                // older traces have one record per split.
                activity_of(&mut self.activity, r.device).splits +=
                    if r.ptr == 0 { r.size } else { 1 }
            }
            RecordKind::PoolSync => activity_of(&mut self.activity, r.device).waits += 1,
            RecordKind::OomRetry => activity_of(&mut self.activity, r.device).oom_retries += 1,
            RecordKind::PoolCheckpoint if r.size == 0 => {
                activity_of(&mut self.activity, r.device).checkpoints += 1;
                self.pending_checkpoints
                    .entry(r.device)
                    .or_default()
                    .insert(r.ptr, r.time_ns);
            }
            RecordKind::PoolCheckpoint => {
                // A pass covers every checkpoint up to its number.
                if let Some(p) = self.pending_checkpoints.get_mut(&r.device) {
                    let passed: Vec<u64> = p.range(..=r.ptr).map(|(&id, _)| id).collect();
                    for id in passed {
                        if let Some(made) = p.remove(&id) {
                            self.checkpoint_lags
                                .entry(r.device)
                                .or_default()
                                .push(r.time_ns.saturating_sub(made));
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// A stack with Python frames right after a successful allocation of its thread counts.
    fn python_frames(&mut self, reader: &TraceReader, r: &Record) {
        if r.kind == RecordKind::StackRef
            && self.allocated_last.get(r.thread as usize) == Some(&true)
            && reader
                .stack(r.ptr)
                .and_then(|f| f.first())
                .is_some_and(|&f| crate::trace::format::as_py_frame(f).is_some())
        {
            self.with_python += 1;
        }
        if !r.kind.is_definition() {
            let i = r.thread as usize;
            if self.allocated_last.len() <= i {
                self.allocated_last.resize(i + 1, false);
            }
            self.allocated_last[i] = r.status == 0 && is_allocating(r.kind) && r.ptr != 0;
        }
    }

    /// A call of the program's (or a tensor of the framework's).
    fn call(&mut self, r: &Record, torch: bool) {
        self.events += 1;
        self.live.apply(r);
        if torch && let Some(f) = self.framework.get_mut(&r.device) {
            let reserved = self.live.reserved.get(&r.device).copied().unwrap_or(0);
            f.reserved_peak_bytes = f.reserved_peak_bytes.max(reserved);
        }
        self.note_reserved(r.device);
        self.first = self.first.min(r.time_ns);
        self.last = self.last.max(r.time_ns);
        let a = self.apis[r.api as usize].get_or_insert_with(|| ApiStats {
            api: r.api.name().to_string(),
            ..ApiStats::default()
        });
        a.calls += 1;
        if r.failed() {
            a.failed += 1;
        } else if is_allocating(r.kind) {
            self.allocations += 1;
            a.bytes = a.bytes.saturating_add(r.size);
        }
    }

    /// What a ring trace's checkpoint counted of the records before the ring.
    fn add_checkpoint_counts(&mut self) {
        for (&api, &(calls, bytes, failed)) in &self.live.api_totals {
            let Some(a) = crate::trace::format::Api::from_u8(api) else {
                continue;
            };
            let s = self.apis[api as usize].get_or_insert_with(|| ApiStats {
                api: a.name().to_string(),
                ..ApiStats::default()
            });
            s.calls = s.calls.saturating_add(calls);
            s.failed = s.failed.saturating_add(failed);
            s.bytes = s.bytes.saturating_add(bytes);
            self.events = self.events.saturating_add(calls);
        }
        for s in self.live.snapshots.iter().filter(|s| s.failure) {
            *self.ooms.entry(s.device).or_default() += 1;
        }
    }

    /// The framework's figures at the end (none without its tensors).
    fn framework_at_end(&mut self) {
        if !self.live.tensors.recorded() {
            self.framework.clear();
            return;
        }
        for (&d, &(now, peak)) in &self.live.tensors.bytes {
            let f = self.framework.entry(d).or_insert_with(|| FrameworkMemory {
                device: d,
                ..FrameworkMemory::default()
            });
            f.allocated_peak_bytes = peak;
            f.allocated_at_end_bytes = now;
            f.tensors_at_end = self
                .live
                .live
                .values()
                .filter(|l| l.device == d && l.api == crate::trace::format::Api::Torch as u8)
                .count() as u64;
        }
        for f in self.framework.values_mut() {
            f.reserved_at_end_bytes = self.live.reserved.get(&f.device).copied().unwrap_or(0);
            f.cached_unused_at_end_bytes = f
                .reserved_at_end_bytes
                .saturating_sub(f.allocated_at_end_bytes);
        }
    }

    fn devices(&self) -> Vec<DeviceSummary> {
        let mut allocs_at_end: BTreeMap<u8, u64> = BTreeMap::new();
        for l in self.live.all_live() {
            *allocs_at_end.entry(l.device).or_default() += 1;
        }
        self.live
            .peaks()
            .map(|(d, peak, t)| {
                let (peak_reserved, live_then) = match self.pool.get(&d) {
                    Some(&(_, p, l)) => (p, l),
                    None => (peak, peak),
                };
                DeviceSummary {
                    device: (d != crate::trace::format::DEVICE_UNKNOWN).then_some(d),
                    peak_live_bytes: peak,
                    peak_time_ns: t,
                    live_bytes_at_end: self.live.live_on(d),
                    live_allocations_at_end: allocs_at_end.get(&d).copied().unwrap_or(0),
                    peak_reserved_bytes: peak_reserved,
                    live_at_reserved_peak_bytes: live_then,
                    fragmentation_at_peak: super::units::fragmentation(live_then, peak_reserved),
                    ooms: self.ooms.get(&d).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// The pool's activity per device, with how long its checkpoints took to pass.
    fn pool_activity(&mut self) -> Vec<PoolActivity> {
        let lags = &mut self.checkpoint_lags;
        std::mem::take(&mut self.activity)
            .into_values()
            .map(|mut a| {
                if let Some(l) = lags.get_mut(&a.device) {
                    l.sort_unstable();
                    a.checkpoint_pass_median_ns = l.get(l.len() / 2).copied().unwrap_or(0);
                    a.checkpoint_pass_max_ns = l.last().copied().unwrap_or(0);
                }
                a
            })
            .collect()
    }
}

fn health(info: &TraceInfo, stats: &DecodeStats) -> TraceHealth {
    TraceHealth {
        committed: stats.committed,
        torn: stats.torn,
        unused: stats.unused,
        lost: stats.lost,
        truncated: stats.truncated,
        summarized: info.summarized,
        unsummarized: stats.unsummarized,
        damage: stats.damage.as_ref().map(|d| {
            format!(
                "offset {} (record {}): {}; {} later records not decoded",
                d.offset, d.index, d.reason, d.skipped
            )
        }),
        clean_exit: info.clean_exit,
        running: info.running_here(),
    }
}

pub fn summarize(path: &Path, opts: &ReadOptions) -> Result<Summary, ReadError> {
    let mut reader = TraceReader::open_with(path, opts)?;
    let info: TraceInfo = reader.info().clone();
    let mut t = Tally::new();
    let mut kinds = super::kinds::Kinds::default();
    // Per device: the tensors' peak so far and the record that reached it.
    let mut tensor_peaks: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
    let mut read = 0u64;
    while let Some(r) = reader.next() {
        read += 1;
        t.take(&reader, &r);
        kinds.observe(&reader, &r);
        if r.kind == RecordKind::TensorAlloc && !t.live.restoring {
            let d = if r.device == crate::trace::format::DEVICE_UNKNOWN {
                0
            } else {
                r.device
            };
            let live = t.live.tensors.live_on(d);
            let e = tensor_peaks.entry(d).or_default();
            if live > e.0 {
                *e = (live, read);
            }
        }
    }
    t.add_checkpoint_counts();
    t.framework_at_end();
    let lasting = |p: u64, l: &super::live::Live| Some(kinds.lasting(&reader, p, l.stack));
    for f in t.framework.values_mut() {
        f.activations_peak_bytes = kinds.activation_peaks().get(&f.device).map_or(0, |p| p.0);
        f.kinds_at_exit = super::kinds::ByKind::of(
            t.live
                .live
                .iter()
                .filter(|(_, l)| l.device == f.device && l.api == Api::Torch as u8)
                .filter_map(|(&p, l)| Some((lasting(p, l)?, l.size))),
        );
        // The peak as the ring's records show it (not one a checkpoint kept from before).
        if let Some(&(bytes, at)) = tensor_peaks.get(&f.device)
            && bytes == f.allocated_peak_bytes
        {
            let mut again = TraceReader::open_with(path, opts)?;
            let (rp, by_ptr) = super::kinds::replay_with_kinds(&mut again, at);
            f.kinds_at_peak = super::kinds::ByKind::of(
                rp.live
                    .iter()
                    .filter(|(_, l)| l.device == f.device && l.api == Api::Torch as u8)
                    .map(|(p, l)| (by_ptr.get(p).copied().unwrap_or(Kind::Unknown), l.size)),
            );
        }
    }
    let held_at_exit = super::owners::held_by_owner_kinds(&reader, &t.live, &lasting);
    let device_memory = super::device_memory::reckon(
        path,
        opts,
        &t.live,
        &held_at_exit,
        &t.nvml_peaks,
        &t.nvml_last,
    )?;
    let stats: DecodeStats = reader.stats().clone();
    let devices = t.devices();
    Ok(Summary {
        path: crate::files::shown(&info.path).to_string(),
        program: info.program.clone(),
        pid: info.pid,
        host: info.host.clone(),
        rank: (info.rank >= 0).then_some(info.rank),
        // Since the trace started (times are relative to its start).
        duration_ns: if t.events > 0 { t.last.max(t.first) } else { 0 },
        events: t.events,
        apis: std::mem::take(&mut t.apis).into_iter().flatten().collect(),
        devices,
        pinned_host_peak_bytes: t.live.host_peak,
        unmatched_frees: t.live.unmatched_frees,
        python_frames: (t.with_python > 0).then_some(PythonFrames {
            allocations_with: t.with_python,
            allocations: t.allocations,
        }),
        pool: t.pool_activity(),
        streams_left_legacy: t.streams_left.take(),
        framework: std::mem::take(&mut t.framework).into_values().collect(),
        held_at_exit,
        device_memory,
        tensors_off: t
            .live
            .tensors
            .off
            .map(|c| crate::trace::format::tensors_off::reason(c).to_string()),
        health: health(&info, &stats),
    })
}

fn activity_of(all: &mut BTreeMap<u8, PoolActivity>, device: u8) -> &mut PoolActivity {
    all.entry(device).or_insert_with(|| PoolActivity {
        device,
        ..PoolActivity::default()
    })
}

impl Summary {
    pub fn render(&self) -> String {
        let mut o = String::new();
        self.render_calls(&mut o);
        self.render_devices(&mut o);
        self.render_held(&mut o);
        super::device_memory::render(&mut o, &self.device_memory);
        if let Some(why) = &self.tensors_off {
            let _ = writeln!(o, "tensors: not recorded: {why}");
        }
        self.render_pool(&mut o);
        self.render_misc(&mut o);
        self.render_health(&mut o);
        o
    }

    /// The trace's process, its events, and the calls per API.
    fn render_calls(&self, o: &mut String) {
        let rank = self.rank.map(|r| format!(", rank {r}")).unwrap_or_default();
        let _ = writeln!(
            o,
            "{}: {} (pid {} on {}{rank})",
            self.path, self.program, self.pid, self.host
        );
        let _ = writeln!(
            o,
            "{} events over {}",
            self.events,
            human_duration(self.duration_ns)
        );
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "{:<30} {:>10} {:>8} {:>14}",
            "API", "calls", "failed", "bytes"
        );
        for a in &self.apis {
            let _ = writeln!(
                o,
                "{:<30} {:>10} {:>8} {:>14}",
                a.api,
                a.calls,
                a.failed,
                if a.bytes > 0 {
                    human_bytes(a.bytes)
                } else {
                    "-".into()
                }
            );
        }
    }

    /// Each device's peaks and fragmentation, and PyTorch's own figures.
    fn render_devices(&self, o: &mut String) {
        let _ = writeln!(o);
        for d in &self.devices {
            let name = d
                .device
                .map(|d| format!("device {d}"))
                .unwrap_or_else(|| "device ?".into());
            let _ = writeln!(
                o,
                "{name}: peak live {} at {}, live at end {} in {} allocations",
                human_bytes(d.peak_live_bytes),
                human_duration(d.peak_time_ns),
                human_bytes(d.live_bytes_at_end),
                d.live_allocations_at_end
            );
            let _ = writeln!(
                o,
                "{:width$}  peak reserved {}, when {} was live: {:.1}% of it held nothing \
                 (fragmentation); {} failed for lack of memory",
                "",
                human_bytes(d.peak_reserved_bytes),
                human_bytes(d.live_at_reserved_peak_bytes),
                d.fragmentation_at_peak * 100.0,
                d.ooms,
                width = name.len()
            );
        }
        for f in &self.framework {
            let _ = writeln!(
                o,
                "PyTorch on device {}: tensors {} at peak, {} at exit ({} tensors); its cache \
                 {} at peak, {} at exit, of which {} held no tensor; {} segments taken, {} given \
                 back, {} out of memory",
                f.device,
                human_bytes(f.allocated_peak_bytes),
                human_bytes(f.allocated_at_end_bytes),
                f.tensors_at_end,
                human_bytes(f.reserved_peak_bytes),
                human_bytes(f.reserved_at_end_bytes),
                human_bytes(f.cached_unused_at_end_bytes),
                f.segments_taken,
                f.segments_given_back,
                f.ooms
            );
            if !f.kinds_at_peak.0.is_empty() {
                let _ = writeln!(
                    o,
                    "  tensors by kind at their peak: {}",
                    f.kinds_at_peak.line()
                );
            }
            if f.activations_peak_bytes > 0 {
                let _ = writeln!(
                    o,
                    "  activations at their most: {} (as a backward began)",
                    human_bytes(f.activations_peak_bytes)
                );
            }
            if !f.kinds_at_exit.0.is_empty() {
                let _ = writeln!(o, "  tensors by kind at exit: {}", f.kinds_at_exit.line());
            }
        }
    }

    /// What each owner held at exit (or now, in a running process).
    fn render_held(&self, o: &mut String) {
        let mut devices: Vec<u8> = self.held_at_exit.iter().map(|h| h.device).collect();
        devices.dedup();
        for d in devices {
            let parts: Vec<String> = self
                .held_at_exit
                .iter()
                .filter(|h| h.device == d && h.bytes > 0)
                .map(|h| format!("{} {}", h.owner, human_bytes(h.bytes)))
                .collect();
            if !parts.is_empty() {
                let when = if self.health.running {
                    "now"
                } else {
                    "at exit"
                };
                let _ = writeln!(o, "held {when} on device {d}: {}", parts.join(", "));
            }
        }
    }

    /// What the shim's pool did, and whether the process left the legacy stream.
    fn render_pool(&self, o: &mut String) {
        for p in &self.pool {
            let _ = writeln!(
                o,
                "pool on device {}: {} segments reserved ({}), {} released, {} splits, {} waits for the GPU, {} out-of-memory retries",
                p.device,
                p.segments_reserved,
                human_bytes(p.bytes_reserved),
                p.segments_released,
                p.splits,
                p.waits,
                p.oom_retries
            );
            if p.checkpoints > 0 {
                let _ = writeln!(
                    o,
                    "pool on device {}: {} checkpoints (a CUDA event after work that may still use \
                     freed blocks; a block waits until the GPU passes it), passed after {} \
                     (median), {} (longest)",
                    p.device,
                    p.checkpoints,
                    human_duration(p.checkpoint_pass_median_ns),
                    human_duration(p.checkpoint_pass_max_ns)
                );
            }
        }
        match (&self.streams_left_legacy, self.pool.is_empty()) {
            (Some(s), _) => {
                let _ = writeln!(
                    o,
                    "pool: the process left the legacy stream (CUDA's default stream, which runs \
                     all work in order) at {} ({}, stream {:#x}{}): from then on a block freed \
                     with cudaFree waited for the GPU to pass it before reuse, as work on other \
                     streams may still use it",
                    human_duration(s.time_ns),
                    s.api,
                    s.stream,
                    s.site
                        .as_ref()
                        .map(|x| format!(", at {x}"))
                        .unwrap_or_default()
                );
            }
            (None, false) => {
                let _ = writeln!(
                    o,
                    "pool: all work on the legacy stream: blocks freed with cudaFree were reused at once"
                );
            }
            (None, true) => {}
        }
    }

    /// Pinned host memory, frees of unknown pointers, Python frames.
    fn render_misc(&self, o: &mut String) {
        if self.pinned_host_peak_bytes > 0 {
            let _ = writeln!(
                o,
                "pinned host memory: peak {}",
                human_bytes(self.pinned_host_peak_bytes)
            );
        }
        if self.unmatched_frees > 0 {
            let _ = writeln!(
                o,
                "{} frees of pointers not allocated in this trace",
                self.unmatched_frees
            );
        }
        if let Some(p) = &self.python_frames {
            let _ = write!(
                o,
                "Python frames: {} of {} allocations",
                p.allocations_with, p.allocations
            );
            if p.allocations_with < p.allocations {
                let _ = write!(
                    o,
                    " (the others were made where Python frames cannot be read: a thread not \
                     running Python, interpreter start or exit)"
                );
            }
            let _ = writeln!(o);
        }
    }

    /// The trace's own health: records, losses, checkpoint, damage.
    fn render_health(&self, o: &mut String) {
        let h = &self.health;
        let _ = writeln!(
            o,
            "trace: {} records, {} torn, {} lost, {} missing past the end of the file{}",
            h.committed,
            h.torn,
            h.lost,
            h.truncated,
            if h.clean_exit {
                ""
            } else if h.running {
                "; the process is still running"
            } else {
                "; the process did not exit cleanly"
            }
        );
        if h.summarized > 0 || h.unsummarized > 0 {
            let _ = writeln!(
                o,
                "trace of any length: {} earlier records summarized in its checkpoint (the \
                 reports cover them; the records above are the recent ones in detail){}",
                h.summarized,
                if h.unsummarized > 0 {
                    format!(
                        "; {} records left the ring before they were summarized (raise \
                         trace_max)",
                        h.unsummarized
                    )
                } else {
                    String::new()
                }
            );
        }
        if let Some(d) = &h.damage {
            let _ = writeln!(o, "damage: {d}");
        }
    }
}
