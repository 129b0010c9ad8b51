//! What `summarize` gathers, record by record: calls per API, the pool's activity, PyTorch's
//! counters, NVML's peaks; what is live, from the analysis's one replay, which has applied each
//! record before the tally takes it.

use super::*;

/// What `summarize` gathers, record by record.
pub(super) struct Tally {
    /// Indexed by the API byte: no lookup on the per-record path.
    pub(super) apis: Vec<Option<ApiStats>>,
    pub(super) first: u64,
    pub(super) last: u64,
    pub(super) events: u64,
    /// Per device with a pool: (its segments now, peak reserved, most live while reserved was
    /// at that peak), where reserved is the pool's segments plus VMM physical memory (NCCL's
    /// buffers, say), which the pool does not serve but which is held on the device all the
    /// same.
    pub(super) pool: BTreeMap<u8, (u64, u64, u64)>,
    pub(super) ooms: BTreeMap<u8, u64>,
    pub(super) with_python: u64,
    pub(super) allocations: u64,
    pub(super) activity: BTreeMap<u8, PoolActivity>,
    pub(super) streams_left: Option<StreamsLeft>,
    /// Per device: checkpoints made and not yet passed (number -> time), and the times taken.
    pub(super) pending_checkpoints: BTreeMap<u8, BTreeMap<u64, u64>>,
    pub(super) checkpoint_lags: BTreeMap<u8, Vec<u64>>,
    /// The thread whose next stack belongs to the `pool_streams` record.
    pub(super) site_of: Option<u16>,
    pub(super) framework: BTreeMap<u8, FrameworkMemory>,
    /// Per thread: whether its latest record (definitions aside) was a successful allocation,
    /// so a stack after it counts as that allocation's.
    pub(super) allocated_last: Vec<bool>,
    /// Per device: where NVML's figure peaked (the record's position), and its last sample
    /// (its time, and what the allocations held then).
    pub(super) nvml_peaks: BTreeMap<u8, crate::report::device_memory::NvmlPeak>,
    pub(super) nvml_last: BTreeMap<u8, (u64, u64)>,
    /// Per device: NVML's highest figure before the record being taken (the replay's facts
    /// as they were after the last record that could move them).
    pub(super) nvml_before: BTreeMap<u8, u64>,
    pub(super) nth: u64,
    /// The record (its position, its time) of the last allocation with Python frames: the
    /// program's own code still ran then.
    pub(super) last_python: Option<(u64, u64)>,
}

impl Tally {
    pub(super) fn new() -> Tally {
        Tally {
            apis: vec![None; 256],
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
            nvml_before: BTreeMap::new(),
            nth: 0,
            last_python: None,
        }
    }

    /// Reserved memory of device `d`'s pool may have moved: its peak, and the most live then.
    pub(super) fn note_reserved(&mut self, rp: &Replay, d: u8) {
        let Some(p) = self.pool.get_mut(&d) else {
            return;
        };
        let physical = rp.physical_bytes.get(&d).copied().unwrap_or(0);
        let live_now = rp.live_on(d);
        if p.0 + physical > p.1 {
            p.1 = p.0 + physical;
            p.2 = live_now;
        } else if p.0 + physical == p.1 {
            // Still at the peak: the allocation a segment was reserved for lands just after it.
            p.2 = p.2.max(live_now);
        }
    }

    /// One record, after `rp` applied it.
    pub(super) fn take(&mut self, tables: &TraceTables, rp: &Replay, r: &Record) {
        self.nth += 1;
        // A checkpoint's records restore what the run did before the ring: state, not calls.
        // (Only a `Restore` record begins or ends restoring.)
        if r.kind == RecordKind::Restore || rp.restored.active {
            if r.kind == RecordKind::Restore {
                self.nvml_before
                    .extend(rp.facts.nvml.iter().map(|(&d, f)| (d, f.peak)));
            }
            return;
        }
        if r.kind == RecordKind::DeviceMemory {
            self.nvml(rp, r);
        }
        let torch = r.api == crate::trace::format::Api::Torch;
        self.segments_and_pool(rp, r, torch);
        if self.site_of == Some(r.thread) && !r.kind.is_definition() {
            self.site_of = None;
            if r.kind == RecordKind::StackRef {
                if let Some(s) = &mut self.streams_left {
                    s.site = Some(crate::report::sites::site_label(tables, r.ptr));
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
        self.python_frames(tables, r);
        // The calls of the program, counted as the summarizer of a ring trace counts them.
        if !crate::trace::summary::is_call(r) {
            return;
        }
        self.call(rp, r, torch);
    }

    pub(super) fn nvml(&mut self, rp: &Replay, r: &Record) {
        let peak = self.nvml_before.get(&r.device).copied().unwrap_or(0);
        let after = rp.facts.nvml.get(&r.device).map_or(0, |f| f.peak);
        self.nvml_before.insert(r.device, after);
        if r.ptr > peak || !self.nvml_peaks.contains_key(&r.device) {
            self.nvml_peaks.insert(
                r.device,
                crate::report::device_memory::NvmlPeak {
                    record: self.nth,
                    time_ns: r.time_ns,
                },
            );
        }
        self.nvml_last
            .insert(r.device, (r.time_ns, rp.reserved_on(r.device)));
    }

    /// The framework's segments and the shim's pool: segments, splits, waits, checkpoints.
    pub(super) fn segments_and_pool(&mut self, rp: &Replay, r: &Record, torch: bool) {
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
                self.note_reserved(rp, r.device);
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
    pub(super) fn python_frames(&mut self, tables: &TraceTables, r: &Record) {
        // No stack read so far with Python frames (a C program's trace): none to look up.
        if r.kind == RecordKind::StackRef
            && tables.has_python_frames()
            && self.allocated_last.get(r.thread as usize) == Some(&true)
            && tables
                .stack(r.ptr)
                .and_then(|f| f.first())
                .is_some_and(|&f| crate::trace::format::as_py_frame(f).is_some())
        {
            self.with_python += 1;
            self.last_python = Some((self.nth, r.time_ns));
        }
        if !r.kind.is_definition() {
            let i = r.thread as usize;
            if self.allocated_last.len() <= i {
                self.allocated_last.resize(i + 1, false);
            }
            self.allocated_last[i] = r.status == 0 && is_allocating(r.kind) && r.ptr != 0;
        }
    }

    /// The time from the trace's start to its last call: the last record's where no call was
    /// read past a ring's checkpoint (whose calls are counted, not timed), never `first`'s
    /// starting value.
    pub(super) fn span_ns(&self, rp: &Replay) -> u64 {
        if self.first <= self.last {
            self.last
        } else {
            rp.time_ns
        }
    }

    /// A call of the program's (or a tensor of the framework's).
    #[inline]
    pub(super) fn call(&mut self, rp: &Replay, r: &Record, torch: bool) {
        self.events += 1;
        // The framework's reserved memory moves only at its segments' records, which are also
        // the records that make a device the framework's: its peak is looked for there, not at
        // every tensor.
        if torch
            && matches!(
                r.kind,
                RecordKind::SegmentReserve | RecordKind::SegmentRelease | RecordKind::TensorOom
            )
            && let Some(f) = self.framework.get_mut(&r.device)
        {
            let reserved = rp.reserved.get(&r.device).copied().unwrap_or(0);
            f.reserved_peak_bytes = f.reserved_peak_bytes.max(reserved);
        }
        self.note_reserved(rp, r.device);
        self.first = self.first.min(r.time_ns);
        self.last = self.last.max(r.time_ns);
        let a = self.apis[r.api as usize].get_or_insert_with(|| ApiStats {
            api: r.api.name().to_string(),
            ..ApiStats::default()
        });
        a.calls += 1;
        if r.failed() {
            a.failed += 1;
            if r.status != 0 && !crate::report::oom::is_out_of_memory(r.status) {
                let f = a.failed_otherwise.get_or_insert_with(|| {
                    (0, crate::report::oom::error_name_of(r.status, r.api.name()))
                });
                f.0 = f.0.saturating_add(1);
            }
        } else if is_allocating(r.kind) {
            self.allocations += 1;
            a.bytes = a.bytes.saturating_add(r.size);
        }
    }

    /// What a ring trace's checkpoint counted of the records before the ring.
    pub(super) fn add_checkpoint_counts(&mut self, rp: &Replay) {
        for (&api, &(calls, bytes, failed)) in &rp.restored.api_totals {
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
        for s in rp.restored.snapshots.iter().filter(|s| s.failure) {
            *self.ooms.entry(s.device).or_default() += 1;
        }
    }

    /// The framework's figures at the end (none without its tensors).
    pub(super) fn framework_at_end(&mut self, rp: &Replay) {
        if !rp.tensors.recorded() {
            self.framework.clear();
            return;
        }
        for (d, (now, peak)) in rp.tensors.by_device() {
            let f = self.framework.entry(d).or_insert_with(|| FrameworkMemory {
                device: d,
                ..FrameworkMemory::default()
            });
            f.allocated_peak_bytes = peak;
            f.allocated_at_end_bytes = now;
            f.tensors_at_end = rp
                .live
                .values()
                .filter(|l| l.device == d && l.api == crate::trace::format::Api::Torch as u8)
                .count() as u64;
        }
        for f in self.framework.values_mut() {
            f.reserved_at_end_bytes = rp.reserved.get(&f.device).copied().unwrap_or(0);
            f.cached_unused_at_end_bytes = f
                .reserved_at_end_bytes
                .saturating_sub(f.allocated_at_end_bytes);
        }
    }

    pub(super) fn devices(&self, rp: &Replay) -> Vec<DeviceSummary> {
        let mut allocs_at_end: BTreeMap<u8, u64> = BTreeMap::new();
        for l in rp.all_live() {
            *allocs_at_end.entry(l.device).or_default() += 1;
        }
        rp.peaks()
            .map(|(d, peak, t)| {
                let (peak_reserved, live_then) = match self.pool.get(&d) {
                    Some(&(_, p, l)) => (p, l),
                    None => (peak, peak),
                };
                DeviceSummary {
                    device: (d != crate::trace::format::DEVICE_UNKNOWN).then_some(d),
                    peak_live_bytes: peak,
                    peak_time_ns: t,
                    live_bytes_at_end: rp.live_on(d),
                    live_allocations_at_end: allocs_at_end.get(&d).copied().unwrap_or(0),
                    peak_reserved_bytes: peak_reserved,
                    live_at_reserved_peak_bytes: live_then,
                    fragmentation_at_peak: crate::report::units::fragmentation(
                        live_then,
                        peak_reserved,
                    ),
                    ooms: self.ooms.get(&d).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// The pool's activity per device, with how long its checkpoints took to pass.
    pub(super) fn pool_activity(&mut self) -> Vec<PoolActivity> {
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

fn activity_of(all: &mut BTreeMap<u8, PoolActivity>, device: u8) -> &mut PoolActivity {
    all.entry(device).or_insert_with(|| PoolActivity {
        device,
        ..PoolActivity::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring whose checkpoint counted calls but whose records past it hold none: the run's
    /// span is its last record's time, never the unsigned maximum `first` starts at.
    #[test]
    fn a_ring_with_no_call_after_its_checkpoint_spans_to_its_last_record() {
        let mut rp = Replay::default();
        rp.time_ns = 7_000_000_000;
        rp.restored
            .api_totals
            .insert(Api::CudaMalloc as u8, (45_003, 1 << 30, 0));
        let mut t = Tally::new();
        t.add_checkpoint_counts(&rp);
        assert_eq!(t.events, 45_003);
        assert_eq!(t.span_ns(&rp), 7_000_000_000);
        t.first = 5;
        t.last = 9;
        rp.time_ns = 10;
        assert_eq!(t.span_ns(&rp), 9);
    }
}
