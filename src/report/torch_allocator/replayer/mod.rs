//! One replay: a model of PyTorch's allocator per device, fed the run's events in order.

use super::{Bounds, DeviceOutcome, Ev, Event, Failure, Fidelity, Input, Outcome, TOTAL_UNKNOWN};
use crate::report::sites::site_label;
use crate::report::torch_allocator::model::{DeviceLimits, Hint, Model, SegmentEvent, TorchConf};
use crate::report::units::human_bytes;
use crate::trace::reader::TraceTables;
use std::collections::BTreeMap;

mod edited;
mod repeat;
mod resized;
mod seed;

pub(super) use edited::Edited;
pub use repeat::Repeating;
pub(super) use repeat::{Period, Stretch, stretch_of};
pub use resized::{Resized, WhatIf};

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
        site: (e.stack != 0).then(|| site_label(&input.tables, e.stack)),
    }
}

/// One replay under way: a model per device, where each recorded tensor went, what failed.
struct Replayer<'a> {
    input: &'a Input,
    bounds: &'a Bounds,
    models: BTreeMap<u8, Model>,
    /// (device, the run's address) -> the replay's address.
    placed: crate::fasthash::FastMap<(u8, u64), u64>,
    /// The run's own segment events, per device.
    recorded: BTreeMap<u8, Vec<SegmentEvent>>,
    /// Per device: tensors, and those placed at the run's own address.
    same: BTreeMap<u8, (u64, u64)>,
    first_failure: Option<Failure>,
    /// Optional requests (see `Event::optional`) the replay could not serve and went on without.
    done_without: u64,
    serves_oom: Option<bool>,
    /// Per device: the bytes the seed put back (the run's reserved memory when the ring began).
    seeded: BTreeMap<u8, u64>,
    start_not_exact: Option<String>,
    /// Per device: what PyTorch's private pools hold now, as the run held them.
    private: BTreeMap<u8, u64>,
    /// The run's failure was in a private pool, which the replay does not model.
    oom_in_private_pool: bool,
    /// What the private pools held at the run's failure.
    private_at_oom: u64,
    /// A request failed and the bounds ask to stop there.
    stopped: bool,
}

impl<'a> Replayer<'a> {
    /// `as_run`: the run's own requests at their own sizes, no what-if.
    fn new(
        input: &'a Input,
        conf: &TorchConf,
        bounds: &'a Bounds,
        compare: bool,
        as_run: bool,
    ) -> Self {
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
        let mut r = Replayer {
            input,
            bounds,
            models,
            placed: Default::default(),
            recorded: BTreeMap::new(),
            same: BTreeMap::new(),
            first_failure: None,
            done_without: 0,
            serves_oom: None,
            seeded: BTreeMap::new(),
            start_not_exact: None,
            private: BTreeMap::new(),
            oom_in_private_pool: false,
            private_at_oom: 0,
            stopped: false,
        };
        if input.from_checkpoint {
            let recorded = TorchConf::parse(&input.recorded.text).ok();
            // The run itself (its own requests under its own setting) from its own cache, to
            // the byte; another run (`fit`'s other batches and settings) afresh.
            r.start_not_exact = if !bounds.afresh || (as_run && recorded.as_ref() == Some(conf)) {
                r.seed()
            } else {
                r.seed_afresh()
            };
        }
        r
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
        if e.private {
            // A private pool (a CUDA graph's, a MemPool) as the run had it: its segments hold
            // memory the default pools cannot use, its tensors are not theirs.
            let held = self.private.entry(e.device).or_default();
            match e.ev {
                Ev::Reserve { .. } => *held = held.saturating_add(e.size),
                Ev::Release => *held = held.saturating_sub(e.size),
                Ev::Oom => {
                    self.oom_in_private_pool = true;
                    return !self.bounds.stop_at_oom;
                }
                _ => {}
            }
            m.set_outside(*held);
            return true;
        }
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
            Ev::Alloc => {
                self.alloc(e);
                return !self.stopped;
            }
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
        // No bytes, no block: PyTorch hands out a null pointer for an empty tensor (a what-if
        // that takes a request away sizes it 0); its free finds nothing placed.
        if e.size == 0 {
            return;
        }
        let stream = u64::from(e.stream);
        let got = match m.malloc(e.size, stream) {
            Ok(p) => p,
            Err(_) if e.optional => {
                // Done without: its free, when it comes, finds nothing placed.
                m.clear_hints();
                self.done_without += 1;
                return;
            }
            Err(oom) => {
                if self.first_failure.is_none() {
                    self.first_failure = Some(failure(input, e, oom.reserved));
                }
                if self.bounds.stop_at_failure {
                    self.stopped = true;
                    return;
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
        if self.serves_oom.is_none() {
            self.private_at_oom = self.private.get(&e.device).copied().unwrap_or(0);
        }
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
            failures: devices
                .iter()
                .map(|d| d.failures)
                .sum::<u64>()
                .saturating_sub(self.done_without),
            done_without: self.done_without,
            first_failure: self.first_failure.clone(),
            serves_recorded_oom: self.serves_oom,
            devices,
            start_not_exact: self.start_not_exact.clone(),
            private_pool_bytes_at_oom: self.private_at_oom,
            oom_in_private_pool: self.oom_in_private_pool,
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
                    recorded_peak_reserved_bytes: peak_of(
                        self.seeded.get(&d).copied().unwrap_or(0),
                        run,
                    ),
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
    let mut r = Replayer::new(input, conf, bounds, compare, true);
    // Without the segment log to compare, repeats are passed over as `fit`'s are.
    match input.stretch().filter(|_| !compare && !every_event(input)) {
        Some(st) => {
            let rs = input.resized(|_, size, _| size);
            let (applied, passed) = r.replay_repeating((&rs, input.stream()), st, true);
            counted(input, applied, passed);
        }
        None => {
            let mut applied = 0;
            for e in &input.events {
                applied += 1;
                if !r.apply(e) {
                    break;
                }
            }
            counted(input, applied, 0);
        }
    }
    let fidelity = if compare { r.fidelity() } else { Vec::new() };
    (r.outcome(conf), fidelity)
}

/// A request [`Input::last_before_free`] found never freed.
const NEVER_FREED: u32 = u32::MAX;

impl Input {
    /// Each tensor request in order: whether it was freed before the program asked for
    /// anything else (a scratch buffer of the operation that made it).
    pub fn scratch(&self) -> Vec<bool> {
        self.freed_within(0)
    }

    /// Each tensor request in order: whether it was freed before more than `later` other
    /// requests were made after it.
    pub fn freed_within(&self, later: usize) -> Vec<bool> {
        self.last_before_free()
            .enumerate()
            .map(|(n, last)| last.is_some_and(|j| j.saturating_sub(n) <= later))
            .collect()
    }

    /// For each tensor request, the last request made before it was freed (itself, where
    /// none came between; `None` where it was never freed). Found once and kept: `fit` asks
    /// four times, and each look is a pass over every event with a map of the live ones.
    pub fn last_before_free(&self) -> impl ExactSizeIterator<Item = Option<usize>> + '_ {
        self.last_before_free
            .get_or_init(|| {
                let mut out = Vec::new();
                let mut live: crate::fasthash::FastMap<(u8, u64), usize> = Default::default();
                for e in &self.events {
                    match e.ev {
                        Ev::Alloc => {
                            live.insert((e.device, e.ptr), out.len());
                            out.push(NEVER_FREED);
                        }
                        Ev::FreeRequested | Ev::Free => {
                            if let Some(n) = live.remove(&(e.device, e.ptr)) {
                                // Past `u32`'s requests (more than memory holds): as if
                                // never freed.
                                out[n] = u32::try_from(out.len() - 1).unwrap_or(NEVER_FREED);
                            }
                        }
                        _ => {}
                    }
                }
                out
            })
            .iter()
            .map(|&j| (j != NEVER_FREED).then_some(j as usize))
    }

    /// Each tensor request's kind, in the order of [`Input::requests`]: from the same read.
    pub fn request_kinds(&self) -> Vec<crate::report::kinds::Kind> {
        self.events
            .iter()
            .filter(|e| e.ev == Ev::Alloc)
            .map(|e| e.kind)
            .collect()
    }

    /// Each tensor request in order: its size, stack and autograd sequence number (0: none
    /// recorded; a forward tensor's and its op's node's backward tensors' are the same).
    pub fn request_fields(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.events
            .iter()
            .filter(|e| e.ev == Ev::Alloc)
            .map(|e| (e.size, e.stack, e.sequence))
    }

    /// Each tensor request in order: the stream it was asked on (the trace's number of it).
    pub fn request_streams(&self) -> impl Iterator<Item = u16> + '_ {
        self.events
            .iter()
            .filter(|e| e.ev == Ev::Alloc)
            .map(|e| e.stream)
    }

    /// The frees that waited on work of other streams: asked for, completed later (as after
    /// `record_stream`).
    pub fn deferred_frees(&self) -> u64 {
        let n = self.events.iter().filter(|e| e.ev == Ev::FreeRequested);
        n.count() as u64
    }

    /// Each tensor request in order: its size and stack.
    pub fn requests(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.events
            .iter()
            .filter(|e| e.ev == Ev::Alloc)
            .map(|e| (e.size, e.stack))
    }

    /// The device memory of the run's first device as CUDA (else NVML) reported it; an 80 GB
    /// GPU's when the trace never learned it.
    pub fn total_memory(&self) -> u64 {
        self.devices
            .values()
            .find_map(|f| f.total.or(f.nvml_total))
            .unwrap_or(TOTAL_UNKNOWN)
    }

    /// Finds now, once, what the replays and the classing of the requests ask of the events
    /// as a whole: each request's last request before its free, and the stretch that repeats
    /// (`fit` has a thread of its own find them while it classes the requests).
    pub fn prepare(&self) {
        let _ = self.last_before_free();
        let _ = self.stretch();
    }

    /// The longest stretch of the run's events that repeats (see [`stretch_of`]), found once.
    pub(super) fn stretch(&self) -> Option<&Stretch> {
        self.period
            .get_or_init(|| stretch_of(&self.events))
            .as_ref()
    }

    /// The run's events, for a replay that passes over their repeats.
    pub(in crate::report::torch_allocator::replayer) fn stream(&self) -> edited::Stream<'_> {
        edited::Stream {
            events: &self.events,
            sources: None,
        }
    }

    pub(super) fn period(&self) -> Option<Period> {
        self.stretch().map(|s| s.period)
    }

    /// The run's header and what its records defined (strings, stacks): plain data, the file
    /// read once and let go.
    pub fn tables(&self) -> &TraceTables {
        &self.tables
    }
}

/// One replay more of `input`, that applied and passed over so many events:
/// `GPUSHIM_READS=1` says them, and the tests see that a replay did pass some (see
/// `repeat.rs`).
fn counted(input: &Input, applied: usize, passed: usize) {
    use crate::trace::reader::ReadCounts;
    let counts = &input.tables().mode().counts;
    ReadCounts::add(&counts.replays, 1);
    ReadCounts::add(&counts.replay_events, applied as u64);
    ReadCounts::add(&counts.replay_passed, passed as u64);
}

/// Every event replayed, none passed over (`ReadMode::replay_every_event`; the tests
/// compare).
fn every_event(input: &Input) -> bool {
    input.tables().mode().replay_every_event
}

/// Replays resized requests under `conf` (see [`Resized`]). Without a what-if, the repeats of
/// a training loop that go as one just replayed went are passed over (see `repeat.rs`;
/// `ReadMode::replay_every_event`: every event replayed, which the tests compare).
pub fn replay_resized(
    input: &Input,
    events: &Resized<'_>,
    conf: &TorchConf,
    bounds: &Bounds,
) -> Outcome {
    let mut r = Replayer::new(input, conf, bounds, false, events.as_run);
    let what_if = !events.what_if.none();
    // A what-if's edits, held once for all its replays where they repeat; else the run's.
    let repeating = match what_if {
        _ if every_event(input) => None,
        true => edited_of(input, &events.what_if).map(|e| (e.stream(), e.stretch())),
        false => input.stretch().map(|st| (input.stream(), st)),
    };
    match repeating {
        Some((stream, st)) => {
            let (applied, passed) = r.replay_repeating((events, stream), st, false);
            counted(input, applied, passed);
        }
        None => {
            let mut applied = 0;
            events.each(&mut |e| {
                applied += 1;
                r.apply(e)
            });
            counted(input, applied, 0);
        }
    }
    r.outcome(conf)
}

/// The what-if's edits of `input`'s events (the one what-if asked: a checkpoint's or
/// autocast's, never both), made at its first replay and held for the rest; `None` where they
/// do not repeat.
fn edited_of<'a>(input: &Input, what_if: &WhatIf<'a>) -> Option<&'a Edited> {
    let held = match (what_if.checkpointing, what_if.autocast, what_if.edits) {
        (Some(c), None, None) => &c.edited,
        (None, Some(a), None) => &a.edited,
        (None, None, Some(s)) => &s.edited,
        _ => return None,
    };
    held.get_or_init(|| Edited::of(input, what_if).map(std::sync::Arc::new))
        .as_deref()
}

/// The most a run held: `held` at first, then its segment events.
fn peak_of(mut held: u64, log: &[SegmentEvent]) -> u64 {
    let mut peak = held;
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
