//! Reading a trace's tensors, and what the replay needs to know about the run, in one pass.

use super::{DeviceFacts, Ev, Event, Input, RecordedSetting, ReplayError, Seed, SeedTensor};
use crate::fasthash::FastMap;
use crate::report::kinds::{Kind, KindTracker};
use crate::report::pass::{Said, Seen, Tracker};
use crate::report::torch_allocator::model::TorchConf;
use crate::trace::format::restore;
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::live::slot;
use crate::trace::reader::{ReadOptions, TraceReader, TraceTables};
use std::collections::{BTreeMap, HashMap};

/// What reading the trace gathers, record by record.
#[derive(Default)]
struct Gather {
    events: Vec<Event>,
    devices: BTreeMap<u8, DeviceFacts>,
    tensors: u64,
    from_checkpoint: bool,
    /// Inside a checkpoint's state (between its `BEGIN` and `END`), and in its live set.
    restoring: bool,
    in_live_set: bool,
    seed: Seed,
    /// The checkpoint counted tensors of PyTorch's (the run had them, whether or not any is
    /// live or in the ring).
    summarized_tensors: bool,
    pages_seen: bool,
    /// Per thread: its latest tensor or segment event, which a `TensorPool` record places.
    /// By thread and by device, the places are a vector's (see [`slot`]), not a map's: every
    /// tensor event asked them, and their hashes were a third of a long trace's read.
    pool_for: Vec<Option<usize>>,
    /// The run's events in private pools.
    private_events: u64,
    tensors_off: Option<u64>,
    /// The run's setting collects garbage: a release just before a new segment served it.
    collects: bool,
    /// Per thread: the event whose stack comes next.
    stack_for: Vec<Option<usize>>,
    /// Per device: a failed device allocation since its last tensor event.
    failed: Vec<bool>,
    /// Per device: the open release burst's tentative `EmptyCache` (its index).
    burst: Vec<Option<usize>>,
    /// Per device: the bytes the run's segments held, and the most they held.
    segments: Reserved,
    /// Live requests not yet given a kind: their event, by address.
    undecided: FastMap<u64, usize>,
    /// The autograd graph's walks (a ring's checkpoint keeps the latest).
    graph: crate::trace::graph::Walks,
    /// The memory the events may take, and whether they ran short of it.
    budget: Budget,
}

/// Per device: the bytes the run's segments held, and the most they held.
#[derive(Default)]
struct Reserved {
    now: HashMap<u8, u64>,
    most: HashMap<u8, u64>,
}

/// The memory the gathered events may take.
#[derive(Default)]
struct Budget {
    /// The most bytes the events may take (`GPUSHIM_REPLAY_MEMORY`; none: what the process
    /// can have).
    most_bytes: Option<u64>,
    /// `GPUSHIM_REPLAY_MEMORY`'s text, where it is not a size.
    not_a_size: Option<String>,
    /// Room for more events could not be had: how many were held then (no more are taken).
    short: Option<usize>,
}

impl Gather {
    /// One more event, where there is room: the vector grows as a vector does, but a growth
    /// that the process cannot have (a limit on its address space, the machine's memory) or
    /// that passes `most_bytes` stops the gathering, and the replay says so rather than the
    /// process being aborted by the allocator. The events are the one thing a replay holds
    /// that grows with the trace (48 bytes each, tens of millions in a long run's).
    fn push(&mut self, e: Event) {
        if self.budget.short.is_some() {
            return;
        }
        let held = self.events.len();
        if held == self.events.capacity() {
            let more = held.max(1024);
            let bytes = (held.saturating_add(more) as u64)
                .saturating_mul(std::mem::size_of::<Event>() as u64);
            let within = self.budget.most_bytes.is_none_or(|most| bytes <= most);
            let events = &mut self.events;
            if !within || crate::memory::fallible(|| events.try_reserve_exact(more)).is_err() {
                self.budget.short = Some(held);
                return;
            }
        }
        self.events.push(e);
    }

    /// The `i`-th event, where it was gathered.
    fn at(&mut self, i: usize) -> Option<&mut Event> {
        self.events.get_mut(i)
    }

    /// A record of a checkpoint's state: PyTorch's segments and the tensors live in them are
    /// the seed; the rest is the reports' (the records after `END`, not yet summarized when
    /// the checkpoint was written, are the run's own and taken as they come).
    fn restore(&mut self, r: &Record) {
        if r.kind == RecordKind::Restore {
            self.in_live_set = r.status == restore::SITE;
            match r.status {
                restore::BEGIN => self.restoring = true,
                restore::END => self.restoring = false,
                restore::SEGMENT if r.api == Api::Torch && r.thread != 0 => {
                    self.pages_seen = true;
                    self.seed.not_exact(
                        "PyTorch's expandable segments are kept as the pages mapped, not as \
                         the segment they belong to",
                    );
                }
                restore::SEGMENT if r.api == Api::Torch => {
                    let d = self.seed.devices.entry(r.device).or_default();
                    d.segments.push((r.ptr, r.size));
                    let held = self.segments.now.entry(r.device).or_default();
                    *held = held.saturating_add(r.size);
                    let most = self.segments.most.entry(r.device).or_default();
                    *most = (*most).max(*held);
                }
                restore::TENSOR_BYTES if r.size > 0 => self.summarized_tensors = true,
                restore::SUMMED => self.seed.not_exact(
                    "the checkpoint summed its oldest allocations by line, without their \
                     addresses",
                ),
                _ => {}
            }
            return;
        }
        if self.in_live_set && r.kind == RecordKind::TensorAlloc {
            self.tensors += 1;
            let d = self.seed.devices.entry(r.device).or_default();
            d.tensors.push(SeedTensor {
                ptr: r.ptr,
                size: r.size,
                stream: r.stream,
                made_ns: r.time_ns,
            });
        }
    }

    fn take(&mut self, r: &Record) {
        let tensor_event = match r.kind {
            RecordKind::TensorAlloc => Some(Ev::Alloc),
            RecordKind::TensorFreeRequested => Some(Ev::FreeRequested),
            RecordKind::TensorFree => Some(Ev::Free),
            RecordKind::TensorOom => Some(Ev::Oom),
            _ => None,
        };
        if let Some(ev) = tensor_event {
            self.tensor(ev, r);
            return;
        }
        match r.kind {
            RecordKind::StackRef => {
                if let Some(i) = slot(&mut self.stack_for, r.thread).take()
                    && let Some(e) = self.at(i)
                {
                    e.stack = r.ptr;
                    e.sequence = crate::trace::backward::sequence_of(r);
                }
            }
            RecordKind::TensorPool => {
                if let Some(i) = slot(&mut self.pool_for, r.thread).take()
                    && let Some(e) = self.at(i)
                {
                    e.private = true;
                    let release = e.ev == Ev::Release;
                    self.private_events += 1;
                    // A private pool's segment given back (its pool freed): not empty_cache.
                    if release
                        && let Some(prev) = i.checked_sub(1).and_then(|p| self.at(p))
                        && prev.ev == Ev::EmptyCache
                    {
                        prev.ev = Ev::Skip;
                    }
                }
            }
            RecordKind::Tensors if r.size == 0 => self.tensors_off = Some(r.ptr),
            RecordKind::SegmentReserve if r.api == Api::Torch => self.reserve(r),
            RecordKind::SegmentRelease if r.api == Api::Torch => self.release(r),
            RecordKind::AddressReserve if r.status == 0 => self.push(event(Ev::Reservation, r)),
            RecordKind::Alloc | RecordKind::PhysCreate if r.failed() => {
                *slot(&mut self.failed, r.device.into()) = true;
            }
            RecordKind::MemInfo if r.status == 0 && r.size > 0 => {
                let d = self.devices.entry(r.device).or_default();
                d.total.get_or_insert(r.size);
            }
            RecordKind::DeviceMemory if r.size > 0 => {
                let d = self.devices.entry(r.device).or_default();
                d.nvml_total.get_or_insert(r.size);
            }
            _ => {}
        }
    }

    fn tensor(&mut self, ev: Ev, r: &Record) {
        // A failed `cudaMalloc` since the last tensor event: the device refused, not a fraction.
        let no_call = !std::mem::take(slot(&mut self.failed, r.device.into()));
        *slot(&mut self.burst, r.device.into()) = None;
        if ev == Ev::Alloc {
            self.tensors += 1;
        }
        if ev == Ev::Oom {
            let held = self.segments.now.get(&r.device).copied().unwrap_or(0);
            let most = self.segments.most.get(&r.device).copied().unwrap_or(0);
            let d = self.devices.entry(r.device).or_default();
            if d.capacity_at_oom.is_none() && d.allowed_at_oom.is_none() && no_call {
                d.allowed_at_oom = Some(most);
            }
            d.capacity_at_oom.get_or_insert(held.saturating_add(r.ptr));
        }
        if matches!(ev, Ev::Alloc | Ev::Oom) {
            *slot(&mut self.stack_for, r.thread) = Some(self.events.len());
            *slot(&mut self.pool_for, r.thread) = Some(self.events.len());
        }
        self.push(event(ev, r));
    }

    fn reserve(&mut self, r: &Record) {
        let pages = r.mapped_pages();
        self.pages_seen |= pages;
        let held = self.segments.now.entry(r.device).or_default();
        *held += r.size;
        let most = self.segments.most.entry(r.device).or_default();
        *most = (*most).max(*held);
        // Segments taken right after segments given back: the release served an allocation
        // (the collector's, or a retry after a failure), not empty_cache.
        if self.collects
            && let Some(&Some(i)) = self.burst.get(usize::from(r.device))
            && let Some(e) = self.at(i)
        {
            e.ev = Ev::Skip;
        }
        *slot(&mut self.pool_for, r.thread) = Some(self.events.len());
        self.push(event(Ev::Reserve { pages }, r));
    }

    /// Segments given back with no failed allocation since the last tensor: `empty_cache()`
    /// (one event for the burst), replayed as one.
    fn release(&mut self, r: &Record) {
        let held = self.segments.now.entry(r.device).or_default();
        *held = held.saturating_sub(r.size);
        let by_failure = self
            .failed
            .get(usize::from(r.device))
            .copied()
            .unwrap_or(false);
        let open = slot(&mut self.burst, r.device.into());
        if open.is_none() {
            let mut e = event(Ev::EmptyCache, r);
            if by_failure {
                e.ev = Ev::Skip;
            }
            *open = Some(self.events.len());
            self.push(e);
        }
        *slot(&mut self.pool_for, r.thread) = Some(self.events.len());
        self.push(event(Ev::Release, r));
    }
}

/// What a replay reads with: every record (`only`, the devices asked, is applied to the
/// requests), of a ring's checkpoints the one with the most records after it (the replay
/// needs the tensors one by one, and starts from the cache the checkpoint kept).
pub fn as_replay(opts: &ReadOptions) -> ReadOptions {
    ReadOptions {
        filter: Default::default(),
        longest_ring: true,
        ..opts.clone()
    }
}

/// The requests `reader` reads (opened [`as_replay`] reads), of the devices `only` keeps.
/// Errors: the trace cannot be read, or has no tensors of PyTorch's allocator (with why, when
/// the trace says).
pub fn read_by(
    mut reader: TraceReader,
    only: &crate::trace::filter::Filter,
) -> Result<Input, ReplayError> {
    let mut kinds = KindTracker::default();
    let mut g = Requests::new(&reader);
    while let Some(r) = reader.next() {
        let decided = kinds.observe(&reader, &r);
        g.see_parts(&reader, &r, decided);
    }
    g.finish(reader, &kinds, only)
}

/// The filter a replay reads with: of the filters it keeps only the devices asked for (an
/// allocator's state depends on every tensor before, so the replay reads them all).
pub fn devices_only(opts: &ReadOptions) -> Result<crate::trace::filter::Filter, ReplayError> {
    let only = crate::trace::filter::Filter {
        devices: opts.filter.devices.clone(),
        ..Default::default()
    };
    if opts.filter != only {
        return Err(ReplayError::Filtered);
    }
    Ok(only)
}

/// The replay's requests gathered as a tracker of a pass that reads every record (the
/// analysis's first pass, [`crate::report::analysis`]), beside the reports': the trace read
/// once for both. The pass's reader must read what a replay's would
/// ([`TraceReader::reads_as_replay`]), with no filter, and observe each record with the
/// tensors' kinds before [`Requests::see`].
pub struct Requests(Box<Gather>);

impl Requests {
    pub fn new(tables: &TraceTables) -> Requests {
        let conf_env = setting_of(&tables.info().env);
        let most = tables.mode().replay_memory.clone();
        let most_bytes = most.as_deref().and_then(crate::config::parse_size);
        Requests(Box::new(Gather {
            budget: Budget {
                most_bytes,
                not_a_size: most.filter(|_| most_bytes.is_none()),
                short: None,
            },
            collects: conf_env
                .as_ref()
                .and_then(|(_, t)| TorchConf::parse(t).ok())
                .is_some_and(|c| c.gc_threshold > 0.0),
            ..Gather::default()
        }))
    }

    /// One record, after the kinds observed it (`decided`: what they decided of it).
    fn see_parts(&mut self, tables: &TraceTables, r: &Record, decided: Option<(u64, Kind)>) {
        let g = &mut *self.0;
        if r.kind == RecordKind::Restore {
            g.from_checkpoint = true;
        }
        if matches!(
            r.kind,
            RecordKind::GraphNode | RecordKind::GraphEdge | RecordKind::Graph
        ) {
            g.graph.see(r, |id| tables.string(id).map(str::to_string));
            return;
        }
        if g.restoring || r.kind == RecordKind::Restore {
            g.restore(r);
        } else {
            g.take(r);
            if r.kind == RecordKind::TensorAlloc
                && r.status == 0
                && r.ptr != 0
                && g.budget.short.is_none()
                && let Some(i) = g.events.len().checked_sub(1)
            {
                g.undecided.insert(r.ptr, i);
            }
        }
        if let Some((ptr, k)) = decided
            && let Some(i) = g.undecided.remove(&ptr)
            && let Some(e) = g.at(i)
        {
            e.kind = k;
        }
    }

    /// The replay's input, from the reader that read every record and the kinds it ended
    /// with; of the devices, those `only` keeps (all where it names none).
    pub fn finish(
        self,
        reader: TraceReader,
        kinds: &KindTracker,
        only: &crate::trace::filter::Filter,
    ) -> Result<Input, ReplayError> {
        let mut g = *self.0;
        if let Some(text) = g.budget.not_a_size.take() {
            return Err(ReplayError::MemorySetting { text });
        }
        if let Some(events) = g.budget.short {
            return Err(ReplayError::Memory {
                events: events as u64,
                bytes: (events as u64).saturating_mul(std::mem::size_of::<Event>() as u64),
                most: g.budget.most_bytes,
            });
        }
        let conf_env = setting_of(&reader.info().env);
        // Each device's total as CUDA counts it, from the header where no `cudaMemGetInfo` said
        // it: NVML's total is larger by what the driver keeps, which no process can have.
        for (d, m) in reader.info().devices.iter().enumerate() {
            if let (Some(m), Ok(d)) = (m, u8::try_from(d))
                && m.memory > 0
            {
                g.devices
                    .entry(d)
                    .or_default()
                    .total
                    .get_or_insert(m.memory);
            }
        }
        // Live at the end: the kind their phase gives what outlives it.
        for (&ptr, &i) in &g.undecided {
            if let Some(e) = g.events.get_mut(i) {
                e.kind = kinds.lasting(&reader, ptr, 0);
            }
        }
        if g.tensors == 0 && g.summarized_tensors {
            let records = reader.info().claimed;
            return Err(ReplayError::Summarized {
                records,
                trace_max_needed: super::trace_max_for(records),
            });
        }
        if g.tensors == 0 {
            return Err(ReplayError::NoTensors {
                why: g
                    .tensors_off
                    .map(|c| crate::trace::format::tensors_off::reason(c).to_string()),
            });
        }
        if !only.devices.is_empty() {
            g.seed.devices.retain(|d, _| only.devices.contains(d));
            g.events
                .retain(|e| e.ev == Ev::Reservation || only.devices.contains(&e.device));
            g.devices.retain(|d, _| only.devices.contains(d));
        }
        for e in g.events.iter().filter(|e| e.ev == Ev::Alloc) {
            g.devices.entry(e.device).or_default();
        }
        let recorded = match conf_env {
            Some((name, text)) => RecordedSetting { text, source: name },
            None if g.pages_seen => RecordedSetting {
                text: "expandable_segments:True".into(),
                source: "inferred".into(),
            },
            None => RecordedSetting {
                text: String::new(),
                source: "unset".into(),
            },
        };
        // The vector grew by doubling: what it reserved past its events is given back (a
        // long run's are a gigabyte, and a limit on the address space counts the reserve).
        g.events.shrink_to_fit();
        Ok(Input {
            tables: reader.into_tables(),
            events: g.events,
            devices: g.devices,
            recorded,
            tensors: g.tensors,
            from_checkpoint: g.from_checkpoint,
            steps_begun: kinds.steps_begun(),
            seed: g.seed,
            graph: g.graph,
            period: std::sync::OnceLock::new(),
            last_before_free: std::sync::OnceLock::new(),
        })
    }
}

fn event(ev: Ev, r: &Record) -> Event {
    Event {
        ev,
        device: r.device,
        stream: r.stream,
        ptr: r.ptr,
        size: r.size,
        time_ns: r.time_ns,
        stack: 0,
        sequence: 0,
        private: false,
        optional: false,
        kind: Kind::Unknown,
    }
}

/// The run's setting as PyTorch reads it: `PYTORCH_ALLOC_CONF` first, then the older name.
fn setting_of(env: &[String]) -> Option<(String, String)> {
    ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"]
        .iter()
        .find_map(|name| {
            env.iter()
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .map(|v| (name.to_string(), v.to_string()))
        })
}

impl Tracker for Requests {
    #[inline(always)]
    fn see(&mut self, seen: &Seen<'_>, _said: &mut Vec<Said>) {
        self.see_parts(seen.reader, seen.record, seen.decided);
    }
}
