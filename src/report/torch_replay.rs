//! `gpushim simulate --torch`: the tensors a run's PyTorch allocator handed out and took back,
//! replayed in order through the model of that allocator (`engine::torch`) under another
//! `PYTORCH_CUDA_ALLOC_CONF`; and the replay of the setting the run used, checked against the
//! segments the run really took.
//!
//! What the replay takes from the trace: each tensor's request (size, stream, device) and its
//! free; when a freed tensor's memory came back (PyTorch's own record of it, so work still
//! running on another stream delays reuse in the replay as it did in the run); calls of
//! `torch.cuda.empty_cache()` (segments given back with no failed allocation before them);
//! and the addresses CUDA handed out, offered to the model for its segments so a replay of the
//! recorded setting places every tensor where the run placed it.

use crate::engine::torch::{DeviceLimits, Hint, Model, SegmentEvent, TorchConf};
use crate::report::sites::site_label;
use crate::report::units::human_bytes;
use crate::trace::format::{Api, Record, RecordKind};
use crate::trace::reader::{ReadError, ReadOptions, TraceReader};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const GIB: u64 = 1 << 30;
/// The device memory assumed when the trace never learned it (an 80 GB GPU's).
const TOTAL_UNKNOWN: u64 = 80 * GIB;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    Alloc,
    FreeRequested,
    Free,
    EmptyCache,
    /// PyTorch could not serve the request; `ptr` holds the free memory CUDA reported.
    Oom,
    /// A segment the run took (or pages it mapped): an address for the model.
    Reserve {
        pages: bool,
    },
    Release,
    /// An address range reserved through the driver (an expandable segment's).
    Reservation,
    /// Nothing (a release that turned out to serve an allocation, not `empty_cache`).
    Skip,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    ev: Ev,
    device: u8,
    stream: u16,
    ptr: u64,
    size: u64,
    time_ns: u64,
    /// The stack of a request (its Python line), once its `StackRef` is read.
    stack: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct DeviceFacts {
    /// The device's memory as `cudaMemGetInfo` reported it.
    total: Option<u64>,
    /// The device's memory as NVML reported it (a little more than CUDA's figure).
    nvml_total: Option<u64>,
    /// At the run's first failed tensor: what PyTorch held plus what CUDA said was free.
    capacity_at_oom: Option<u64>,
    /// At the run's first failed tensor, when PyTorch refused it with no `cudaMalloc` tried (a
    /// memory fraction, `set_per_process_memory_fraction`, held it): the most it had reserved
    /// until then, which the fraction allowed (and the failed request's segment would not fit
    /// under).
    allowed_at_oom: Option<u64>,
}

/// The tensors of one trace, in order, and what the replay needs to know about the run.
pub struct Input {
    reader: TraceReader,
    events: Vec<Event>,
    devices: BTreeMap<u8, DeviceFacts>,
    /// The run's setting: its text and where it came from.
    pub recorded: RecordedSetting,
    pub tensors: u64,
    /// The trace starts at a checkpoint: its first tensors were folded into it.
    pub from_checkpoint: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct RecordedSetting {
    /// `PYTORCH_CUDA_ALLOC_CONF`'s (or `PYTORCH_ALLOC_CONF`'s) text; empty: the defaults.
    pub text: String,
    /// Where it was read: the variable's name, "inferred" (a trace from before settings were
    /// kept, whose expandable segments show in its records), or "unset".
    pub source: String,
}

/// What reading the trace gathers, record by record.
#[derive(Default)]
struct Gather {
    events: Vec<Event>,
    devices: BTreeMap<u8, DeviceFacts>,
    tensors: u64,
    from_checkpoint: bool,
    pages_seen: bool,
    tensors_off: Option<u64>,
    /// The run's setting collects garbage: a release just before a new segment served it.
    collects: bool,
    /// Per thread: the event whose stack comes next.
    stack_for: HashMap<u16, usize>,
    /// Per device: a failed device allocation since its last tensor event.
    failed: HashMap<u8, bool>,
    /// Per device: the open release burst's tentative `EmptyCache` (its index).
    burst: HashMap<u8, Option<usize>>,
    /// Per device: the bytes the run's segments held, and the most they held.
    reserved: HashMap<u8, u64>,
    most_reserved: HashMap<u8, u64>,
}

impl Gather {
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
                if let Some(i) = self.stack_for.remove(&r.thread) {
                    self.events[i].stack = r.ptr;
                }
            }
            RecordKind::Tensors if r.size == 0 => self.tensors_off = Some(r.ptr),
            RecordKind::SegmentReserve if r.api == Api::Torch => self.reserve(r),
            RecordKind::SegmentRelease if r.api == Api::Torch => self.release(r),
            RecordKind::AddressReserve if r.status == 0 => {
                self.events.push(event(Ev::Reservation, r));
            }
            RecordKind::Alloc | RecordKind::PhysCreate if r.failed() => {
                self.failed.insert(r.device, true);
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
        let no_call = !self.failed.get(&r.device).copied().unwrap_or(false);
        self.failed.insert(r.device, false);
        self.burst.insert(r.device, None);
        if ev == Ev::Alloc {
            self.tensors += 1;
        }
        if ev == Ev::Oom {
            let held = self.reserved.get(&r.device).copied().unwrap_or(0);
            let most = self.most_reserved.get(&r.device).copied().unwrap_or(0);
            let d = self.devices.entry(r.device).or_default();
            if d.capacity_at_oom.is_none() && d.allowed_at_oom.is_none() && no_call {
                d.allowed_at_oom = Some(most);
            }
            d.capacity_at_oom.get_or_insert(held.saturating_add(r.ptr));
        }
        if matches!(ev, Ev::Alloc | Ev::Oom) {
            self.stack_for.insert(r.thread, self.events.len());
        }
        self.events.push(event(ev, r));
    }

    fn reserve(&mut self, r: &Record) {
        let pages = r.mapped_pages();
        self.pages_seen |= pages;
        let held = self.reserved.entry(r.device).or_default();
        *held += r.size;
        let most = self.most_reserved.entry(r.device).or_default();
        *most = (*most).max(*held);
        // Segments taken right after segments given back: the release served an allocation
        // (the collector's, or a retry after a failure), not empty_cache.
        if self.collects
            && let Some(Some(i)) = self.burst.get(&r.device)
        {
            self.events[*i].ev = Ev::Skip;
        }
        self.events.push(event(Ev::Reserve { pages }, r));
    }

    /// Segments given back with no failed allocation since the last tensor: `empty_cache()`
    /// (one event for the burst), replayed as one.
    fn release(&mut self, r: &Record) {
        let held = self.reserved.entry(r.device).or_default();
        *held = held.saturating_sub(r.size);
        let open = self.burst.entry(r.device).or_default();
        if open.is_none() {
            let by_failure = self.failed.get(&r.device).copied().unwrap_or(false);
            let mut e = event(Ev::EmptyCache, r);
            if by_failure {
                e.ev = Ev::Skip;
            }
            *open = Some(self.events.len());
            self.events.push(e);
        }
        self.events.push(event(Ev::Release, r));
    }
}

/// Reads the trace's tensors. Errors: the trace cannot be read, or has no tensors of
/// PyTorch's allocator (with why, when the trace says).
pub fn read(path: &Path, opts: &ReadOptions) -> Result<Input, ReplayError> {
    // An allocator's state depends on every tensor before: the replay reads them all, and of
    // the filters keeps only the devices asked for.
    let only = crate::trace::filter::Filter {
        devices: opts.filter.devices.clone(),
        ..Default::default()
    };
    if opts.filter != only {
        return Err(ReplayError::Filtered);
    }
    let whole = ReadOptions {
        filter: Default::default(),
        ..opts.clone()
    };
    let mut reader = TraceReader::open_with(path, &whole)?;
    let conf_env = setting_of(&reader.info().env);
    let mut g = Gather {
        collects: conf_env
            .as_ref()
            .and_then(|(_, t)| TorchConf::parse(t).ok())
            .is_some_and(|c| c.gc_threshold > 0.0),
        ..Gather::default()
    };
    while let Some(r) = reader.next() {
        if r.kind == RecordKind::Restore {
            g.from_checkpoint = true;
        }
        if !reader.in_checkpoint() {
            g.take(&r);
        }
    }
    if g.tensors == 0 {
        return Err(ReplayError::NoTensors {
            why: g
                .tensors_off
                .map(|c| crate::trace::format::tensors_off::reason(c).to_string()),
        });
    }
    if !only.devices.is_empty() {
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
    Ok(Input {
        reader,
        events: g.events,
        devices: g.devices,
        recorded,
        tensors: g.tensors,
        from_checkpoint: g.from_checkpoint,
    })
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

#[derive(Debug)]
pub enum ReplayError {
    Read(ReadError),
    NoTensors {
        why: Option<String>,
    },
    /// A filter other than `--device`: the replay needs every tensor.
    Filtered,
    Setting {
        text: String,
        reason: String,
    },
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Read(e) => e.fmt(f),
            ReplayError::NoTensors { why } => write!(
                f,
                "the trace holds no tensors of PyTorch's caching allocator{}; record a PyTorch \
                 run with tensors on (the default) to replay it",
                why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
            ),
            ReplayError::Setting { text, reason } => write!(f, "--torch {text:?}: {reason}"),
            ReplayError::Filtered => write!(
                f,
                "the replay of PyTorch's allocator needs every tensor in order (what a setting \
                 does depends on all that came before): of the filters it takes only --device"
            ),
        }
    }
}

impl std::error::Error for ReplayError {}

impl From<ReadError> for ReplayError {
    fn from(e: ReadError) -> Self {
        ReplayError::Read(e)
    }
}

/// What the replay is allowed: `--limit`, `--fraction`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    /// Bytes PyTorch may hold on each device (None: what the trace says the device had).
    pub limit: Option<u64>,
    /// `set_per_process_memory_fraction`'s value, if the program set one.
    pub fraction: Option<f64>,
    /// Stop after the run's first failed tensor (what a setting would have done there).
    pub stop_at_oom: bool,
}

/// A request the replay could not serve.
#[derive(Clone, Debug, Serialize)]
pub struct Failure {
    pub device: u8,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub time_ns: u64,
    /// Where the request was made (its Python line), when the trace has its stack.
    pub site: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceOutcome {
    pub device: u8,
    pub limit_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// Reserved but not allocated when reserved peaked (the fragmentation PyTorch's OOM message
    /// calls "reserved but unallocated").
    pub unallocated_at_peak_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub retries: u64,
    pub failures: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The setting replayed, as `PYTORCH_CUDA_ALLOC_CONF` takes it ("" for the defaults).
    pub setting: String,
    /// Of the device with the highest peak reserved.
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub unallocated_at_peak_bytes: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub failures: u64,
    pub first_failure: Option<Failure>,
    /// For a run that failed a tensor: whether this setting served that request.
    pub serves_recorded_oom: Option<bool>,
    pub devices: Vec<DeviceOutcome>,
}

/// How the replay of the recorded setting compares with the run, device by device.
#[derive(Clone, Debug, Serialize)]
pub struct Fidelity {
    pub device: u8,
    /// Segments taken and given back (or pages mapped and unmapped), in the run and replayed.
    pub recorded_segment_events: usize,
    pub replayed_segment_events: usize,
    /// The first that differ (index, the run's, the replay's), if any.
    pub first_difference: Option<(usize, String, String)>,
    pub recorded_peak_reserved_bytes: u64,
    pub replayed_peak_reserved_bytes: u64,
    pub tensors: u64,
    /// Tensors the replay put at the address the run put them.
    pub tensors_at_recorded_address: u64,
}

impl Fidelity {
    pub fn exact(&self) -> bool {
        self.first_difference.is_none()
            && self.recorded_peak_reserved_bytes == self.replayed_peak_reserved_bytes
    }
}

fn limits_for(input: &Input, device: u8, b: &Bounds) -> DeviceLimits {
    let facts = input.devices.get(&device).copied().unwrap_or_default();
    let known = facts.total.or(facts.nvml_total);
    let total = known.unwrap_or(TOTAL_UNKNOWN);
    DeviceLimits {
        capacity: b
            .limit
            .or(facts.capacity_at_oom)
            .or(known)
            .unwrap_or(u64::MAX),
        allowed: b
            .fraction
            .map(|f| (f * total as f64) as u64)
            .or(facts.allowed_at_oom),
        total_memory: total,
    }
}

fn describe(e: &SegmentEvent) -> String {
    match e {
        SegmentEvent::Reserve { ptr, size } => format!("{} at {ptr:#x} taken", human_bytes(*size)),
        SegmentEvent::Release { ptr, size } => {
            format!("{} at {ptr:#x} given back", human_bytes(*size))
        }
    }
}

/// A request the replay of `input` could not serve.
fn failure(input: &Input, e: &Event, reserved: u64) -> Failure {
    Failure {
        device: e.device,
        requested_bytes: e.size,
        reserved_bytes: reserved,
        time_ns: e.time_ns,
        site: (e.stack != 0).then(|| site_label(&input.reader, e.stack)),
    }
}

/// One replay under way: a model per device, where each recorded tensor went, what failed.
struct Replayer<'a> {
    input: &'a Input,
    bounds: &'a Bounds,
    models: BTreeMap<u8, Model>,
    /// (device, the run's address) -> the replay's address.
    placed: HashMap<(u8, u64), u64>,
    /// The run's own segment events, per device.
    recorded: BTreeMap<u8, Vec<SegmentEvent>>,
    /// Per device: tensors, and those placed at the run's own address.
    same: BTreeMap<u8, (u64, u64)>,
    first_failure: Option<Failure>,
    serves_oom: Option<bool>,
}

impl<'a> Replayer<'a> {
    fn new(input: &'a Input, conf: &TorchConf, bounds: &'a Bounds, compare: bool) -> Self {
        let models = input
            .devices
            .keys()
            .map(|&d| {
                let mut m = Model::new(conf.clone(), limits_for(input, d, bounds));
                if compare {
                    m.keep_log();
                }
                (d, m)
            })
            .collect();
        Replayer {
            input,
            bounds,
            models,
            placed: HashMap::new(),
            recorded: BTreeMap::new(),
            same: BTreeMap::new(),
            first_failure: None,
            serves_oom: None,
        }
    }

    /// Applies one event; false once the replay should stop.
    fn apply(&mut self, e: &Event) -> bool {
        if e.ev == Ev::Reservation {
            // The driver's records may not know the device: every device may take it.
            let hint = Hint {
                ptr: e.ptr,
                bytes: e.size,
                reservation: true,
            };
            match self.models.get_mut(&e.device) {
                Some(m) => m.hint(hint),
                None => self.models.values_mut().for_each(|m| m.hint(hint)),
            }
            return true;
        }
        let Some(m) = self.models.get_mut(&e.device) else {
            return true;
        };
        let run = self.recorded.entry(e.device).or_default();
        match e.ev {
            Ev::Reserve { .. } => {
                m.hint(Hint {
                    ptr: e.ptr,
                    bytes: e.size,
                    reservation: false,
                });
                run.push(SegmentEvent::Reserve {
                    ptr: e.ptr,
                    size: e.size,
                });
            }
            Ev::Release => run.push(SegmentEvent::Release {
                ptr: e.ptr,
                size: e.size,
            }),
            Ev::EmptyCache => m.empty_cache(),
            Ev::Alloc => self.alloc(e),
            Ev::FreeRequested => {
                if let Some(&p) = self.placed.get(&(e.device, e.ptr)) {
                    m.free_requested(p);
                }
                m.clear_hints();
            }
            Ev::Free => {
                if let Some(p) = self.placed.remove(&(e.device, e.ptr)) {
                    m.free_completed(p);
                }
                m.clear_hints();
            }
            Ev::Oom => {
                self.oom(e);
                return !self.bounds.stop_at_oom;
            }
            Ev::Skip | Ev::Reservation => {}
        }
        true
    }

    fn alloc(&mut self, e: &Event) {
        let input = self.input;
        let Some(m) = self.models.get_mut(&e.device) else {
            return;
        };
        let stream = u64::from(e.stream);
        let got = match m.malloc(e.size, stream) {
            Ok(p) => p,
            Err(oom) => {
                if self.first_failure.is_none() {
                    self.first_failure = Some(failure(input, e, oom.reserved));
                }
                // The run went on: so does the replay, as if the memory were there.
                m.unlimited(|m| m.malloc(e.size, stream))
                    .unwrap_or_default()
            }
        };
        m.clear_hints();
        let s = self.same.entry(e.device).or_default();
        s.0 += 1;
        s.1 += u64::from(got == e.ptr);
        self.placed.insert((e.device, e.ptr), got);
    }

    /// The run failed this request: does the replay serve it?
    fn oom(&mut self, e: &Event) {
        let Some(m) = self.models.get_mut(&e.device) else {
            return;
        };
        let served = match m.malloc(e.size, u64::from(e.stream)) {
            Ok(p) => {
                // The program never got it: it raised. The block goes back.
                m.free_completed(p);
                true
            }
            Err(_) => false,
        };
        m.clear_hints();
        let reserved = m.stats().reserved;
        if self.serves_oom.is_none() {
            self.serves_oom = Some(served && self.first_failure.is_none());
        }
        if !served && self.first_failure.is_none() {
            self.first_failure = Some(failure(self.input, e, reserved));
        }
    }

    fn outcome(&self, conf: &TorchConf) -> Outcome {
        let devices: Vec<DeviceOutcome> = self
            .models
            .iter()
            .map(|(&d, m)| {
                let s = m.stats();
                DeviceOutcome {
                    device: d,
                    limit_bytes: limits_for(self.input, d, self.bounds).capacity,
                    peak_reserved_bytes: s.peak_reserved,
                    peak_allocated_bytes: s.peak_allocated,
                    unallocated_at_peak_bytes: s
                        .peak_reserved
                        .saturating_sub(s.allocated_at_peak_reserved),
                    device_allocs: s.device_allocs,
                    device_frees: s.device_frees,
                    retries: s.retries,
                    failures: s.failures,
                }
            })
            .collect();
        let top = devices.iter().max_by_key(|d| d.peak_reserved_bytes);
        Outcome {
            setting: conf.to_string(),
            peak_reserved_bytes: top.map_or(0, |d| d.peak_reserved_bytes),
            peak_allocated_bytes: top.map_or(0, |d| d.peak_allocated_bytes),
            unallocated_at_peak_bytes: top.map_or(0, |d| d.unallocated_at_peak_bytes),
            device_allocs: devices.iter().map(|d| d.device_allocs).sum(),
            device_frees: devices.iter().map(|d| d.device_frees).sum(),
            failures: devices.iter().map(|d| d.failures).sum(),
            first_failure: self.first_failure.clone(),
            serves_recorded_oom: self.serves_oom,
            devices,
        }
    }

    fn fidelity(&self) -> Vec<Fidelity> {
        self.models
            .iter()
            .map(|(&d, m)| {
                let run = self.recorded.get(&d).map(Vec::as_slice).unwrap_or(&[]);
                let rep = m.log();
                let first_difference = (0..run.len().max(rep.len()))
                    .find(|&i| run.get(i) != rep.get(i))
                    .map(|i| {
                        let show = |x: Option<&SegmentEvent>| x.map_or("nothing".into(), describe);
                        (i, show(run.get(i)), show(rep.get(i)))
                    });
                let (tensors, at) = self.same.get(&d).copied().unwrap_or_default();
                Fidelity {
                    device: d,
                    recorded_segment_events: run.len(),
                    replayed_segment_events: rep.len(),
                    first_difference,
                    recorded_peak_reserved_bytes: peak_of(run),
                    replayed_peak_reserved_bytes: m.stats().peak_reserved,
                    tensors,
                    tensors_at_recorded_address: at,
                }
            })
            .collect()
    }
}

/// Replays the trace's tensors under `conf`; with `compare`, also checks the replay against
/// the segments the run took.
pub fn replay(
    input: &Input,
    conf: &TorchConf,
    bounds: &Bounds,
    compare: bool,
) -> (Outcome, Vec<Fidelity>) {
    let mut r = Replayer::new(input, conf, bounds, compare);
    for e in &input.events {
        if !r.apply(e) {
            break;
        }
    }
    let fidelity = if compare { r.fidelity() } else { Vec::new() };
    (r.outcome(conf), fidelity)
}

/// The run's tensor requests as another run would make them: each request's size as `size`
/// gives it (from its place among the requests, its recorded size and its stack), the rest of
/// the run as it was but for its failures (another run need not fail there). The run's own
/// segments stay as hints: the model takes a recorded address only for a segment of the
/// recorded length, so at the run's own sizes the replay is the run's, to the byte.
pub struct Resized(Vec<Event>);

impl Input {
    /// Each tensor request in order: its size and stack.
    pub fn requests(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.events
            .iter()
            .filter(|e| e.ev == Ev::Alloc)
            .map(|e| (e.size, e.stack))
    }

    pub fn reader(&self) -> &TraceReader {
        &self.reader
    }

    /// The requests resized by `size(n, recorded size, stack)`, `n` counting the requests.
    pub fn resized(&self, size: impl Fn(usize, u64, u64) -> u64) -> Resized {
        let mut n = 0;
        Resized(
            self.events
                .iter()
                .filter_map(|e| match e.ev {
                    Ev::Alloc => {
                        let mut e = *e;
                        e.size = size(n, e.size, e.stack);
                        n += 1;
                        Some(e)
                    }
                    Ev::Oom | Ev::Skip => None,
                    _ => Some(*e),
                })
                .collect(),
        )
    }
}

/// Replays resized requests under `conf` (see [`Resized`]).
pub fn replay_resized(
    input: &Input,
    events: &Resized,
    conf: &TorchConf,
    bounds: &Bounds,
) -> Outcome {
    let mut r = Replayer::new(input, conf, bounds, false);
    for e in &events.0 {
        if !r.apply(e) {
            break;
        }
    }
    r.outcome(conf)
}

fn peak_of(log: &[SegmentEvent]) -> u64 {
    let (mut held, mut peak) = (0u64, 0u64);
    for e in log {
        match e {
            SegmentEvent::Reserve { size, .. } => {
                held += size;
                peak = peak.max(held);
            }
            SegmentEvent::Release { size, .. } => held = held.saturating_sub(*size),
        }
    }
    peak
}

/// The settings `--recommend` tries: expandable segments on and off, a grid of
/// `max_split_size_mb` and `roundup_power2_divisions`, and with a memory fraction the
/// collector's thresholds. The recorded setting's other keys are kept.
pub fn candidates(recorded: &TorchConf, fraction: bool) -> Vec<TorchConf> {
    const MIB: u64 = 1 << 20;
    let mut out = Vec::new();
    let gcs: &[f64] = if fraction { &[0.0, 0.6, 0.8] } else { &[0.0] };
    for expandable in [false, true] {
        for split in [None, Some(64), Some(128), Some(256), Some(512), Some(1024)] {
            for div in [0u64, 2, 4, 8, 16] {
                for &gc in gcs {
                    let mut c = recorded.clone();
                    c.expandable_segments = expandable;
                    c.max_split_size = split.map_or(u64::MAX, |s: u64| s * MIB);
                    c.roundup_divisions = [div; crate::engine::torch::conf::INTERVALS];
                    c.gc_threshold = gc;
                    out.push(c);
                }
            }
        }
    }
    out
}

/// Replays every candidate (on all cores) and returns them best first: no failure first,
/// then the lowest peak reserved, then fewer device allocations, then the shorter setting.
pub fn recommend(input: &Input, recorded: &TorchConf, bounds: &Bounds) -> Vec<Outcome> {
    let list = candidates(recorded, bounds.fraction.is_some());
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(list.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Outcome> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(c) = list.get(i) else {
                            break;
                        };
                        mine.push(replay(input, c, bounds, false).0);
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    out.sort_by(|a, b| {
        (
            a.failures > 0,
            a.peak_reserved_bytes,
            a.device_allocs,
            a.setting.len(),
        )
            .cmp(&(
                b.failures > 0,
                b.peak_reserved_bytes,
                b.device_allocs,
                b.setting.len(),
            ))
    });
    out
}

/// The run's setting, parsed (a text PyTorch accepted that the model does not: the defaults,
/// with the reason).
pub fn recorded_conf(input: &Input) -> Result<TorchConf, ReplayError> {
    TorchConf::parse(&input.recorded.text).map_err(|e| ReplayError::Setting {
        text: input.recorded.text.clone(),
        reason: e.to_string(),
    })
}

/// For a run whose PyTorch allocator failed a tensor: the settings under which the replay, up
/// to that request and with the memory the device had then, serves it.
#[derive(Clone, Debug, Serialize)]
pub struct OomAdvice {
    /// PyTorch refused the request with no `cudaMalloc` tried: a memory fraction held it, to
    /// at least this many bytes (the most it had reserved before); the replay holds it there.
    pub fraction_bytes: Option<u64>,
    /// The trace's ring began after the run's first tensors: (records the run made, a
    /// `trace_max` that would have held them all).
    pub ring_began_late: Option<(u64, u64)>,
    pub requested_bytes: u64,
    /// What PyTorch could have held on that device: what it held plus what CUDA said was free.
    pub capacity_bytes: Option<u64>,
    pub run_setting: String,
    /// Whether the replay of the run's own setting fails there too (if not, the replay does
    /// not see what the run saw, and the advice is weak).
    pub run_setting_fails_too: bool,
    /// Settings tried.
    pub tried: usize,
    /// Those that serve the request, best first (lowest peak reserved up to it).
    pub serving: Vec<Outcome>,
}

/// The advice for the trace's first failed tensor, if it has one.
pub fn oom_advice(path: &Path, opts: &ReadOptions) -> Result<Option<OomAdvice>, ReplayError> {
    let input = match read(path, opts) {
        Ok(i) => i,
        Err(ReplayError::NoTensors { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(first) = input.events.iter().find(|e| e.ev == Ev::Oom) else {
        return Ok(None);
    };
    let info = input.reader.info();
    // A ring that began after the run's first tensors: the replay starts from what was live
    // then, not from the segments PyTorch held, so it is not the run's to the byte.
    let ring_began_late = input.from_checkpoint.then(|| {
        // Every record the run made, at 32 bytes, and room for the header and tables.
        let needed = info.claimed.saturating_mul(32).saturating_add(64 << 20);
        (info.claimed, needed)
    });
    let recorded = recorded_conf(&input)?;
    let bounds = Bounds {
        limit: None,
        fraction: None,
        stop_at_oom: true,
    };
    let (own, _) = replay(&input, &recorded, &bounds, false);
    let all = recommend(&input, &recorded, &bounds);
    let tried = all.len();
    let serving = all
        .into_iter()
        .filter(|o| o.serves_recorded_oom == Some(true))
        .collect();
    Ok(Some(OomAdvice {
        fraction_bytes: input
            .devices
            .get(&first.device)
            .and_then(|d| d.allowed_at_oom),
        requested_bytes: first.size,
        capacity_bytes: input
            .devices
            .get(&first.device)
            .and_then(|d| d.capacity_at_oom),
        run_setting: recorded.to_string(),
        run_setting_fails_too: own.serves_recorded_oom == Some(false),
        tried,
        serving,
        ring_began_late,
    }))
}

/// The advice in words, for `gpushim oom`.
pub fn render_advice(a: &OomAdvice) -> String {
    use std::fmt::Write as _;
    let name = |t: &str| {
        if t.is_empty() {
            "the defaults".to_string()
        } else {
            t.to_string()
        }
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "PyTorch's allocator replayed up to the failed request of {} under {} settings{}:",
        human_bytes(a.requested_bytes),
        a.tried,
        match (a.fraction_bytes, a.capacity_bytes) {
            (Some(f), _) => format!(
                ", PyTorch's allocator held to {} by its memory fraction \
                 (set_per_process_memory_fraction: it refused the request without asking CUDA, \
                 having reserved at most that much before)",
                human_bytes(f)
            ),
            (None, Some(c)) => format!(
                ", PyTorch's allocator held to {}: what it held at the failure (its tensors \
                 and cache) plus what CUDA then said was free; the rest of the device was not \
                 PyTorch's to take",
                human_bytes(c)
            ),
            (None, None) => String::new(),
        }
    );
    if let Some((records, needed)) = a.ring_began_late {
        let _ = writeln!(
            s,
            "  the trace's ring began after the run's first tensors ({records} records made, \
             the rest summarized): the replay starts from the tensors live when it began, not \
             from the segments PyTorch held then, so it is not the run's to the byte; to replay \
             exactly, record with GPUSHIM_CONF=trace_max:{}MiB or more",
            needed.div_ceil(1 << 20)
        );
    }
    if a.run_setting_fails_too {
        let _ = writeln!(
            s,
            "  the run's own setting ({}) fails there too, as in the run",
            name(&a.run_setting)
        );
    } else {
        let _ = writeln!(
            s,
            "  the replay of the run's own setting ({}) does not fail there: memory outside \
             PyTorch's allocator changed, so what follows is a rough guide",
            name(&a.run_setting)
        );
    }
    match a.serving.first() {
        Some(best) => {
            let shown: Vec<String> = a.serving.iter().take(3).map(|o| name(&o.setting)).collect();
            let _ = writeln!(
                s,
                "  {} of them serve it, among them {}; the one reserving least ({} at its peak):\n  \
                 export PYTORCH_CUDA_ALLOC_CONF={}",
                a.serving.len(),
                shown.join("; "),
                human_bytes(best.peak_reserved_bytes),
                if best.setting.is_empty() {
                    "\"\"".to_string()
                } else {
                    best.setting.clone()
                }
            );
        }
        None => {
            let _ = writeln!(
                s,
                "  none of them serves it: the program needs more memory there than the device \
                 had, whatever PyTorch's allocator does"
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_ring_that_began_late_says_the_replay_is_not_exact_and_the_trace_max_that_would_be() {
        let a = super::OomAdvice {
            fraction_bytes: None,
            ring_began_late: Some((1_000_000, 100 << 20)),
            requested_bytes: 1 << 20,
            capacity_bytes: None,
            run_setting: String::new(),
            run_setting_fails_too: true,
            tried: 1,
            serving: Vec::new(),
        };
        let text = super::render_advice(&a);
        assert!(text.contains("not the run's to the byte"), "{text}");
        assert!(text.contains("GPUSHIM_CONF=trace_max:100MiB"), "{text}");
    }
}
