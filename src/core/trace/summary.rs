//! What the oldest records of a ring said, kept as a checkpoint (see [`crate::trace::format::ring`]).
//!
//! The [`Summarizer`] reads records in the order a writer committed them, puts them back in
//! time order as the reader does, and runs the reports' own replay ([`Replay`]) over them, with
//! a few trackers beside it: calls and bytes per API, each device's peak and what held it then,
//! every failed allocation with what was live then, iteration boundaries with the live bytes of
//! each call site, NVML's samples thinned over time. [`Summarizer::checkpoint`] writes all of it
//! as a stream of records that a reader replays before the ring's records: one code path for a
//! short trace and a long one.
//!
//! The shim runs a summarizer on a helper thread (never on a hooked call), so it may allocate.

mod definitions;
mod live_set;

use crate::fasthash::FastMap;
use crate::trace::format::{self, Api, DEVICE_UNKNOWN, RECORD_SIZE, Record, RecordKind, restore};
use crate::trace::live::{Boundary, BoundaryMark, Change, Live, Replay, Snapshot, size_key};
use std::collections::{BTreeMap, HashMap};

/// Records wait this long in the reorder window (as in the reader).
const REORDER_NS: u64 = crate::trace::reader::REORDER_WINDOW_NS;
/// The reorder window is drained once it holds this many records, at least.
const DRAIN_AT_LEAST: usize = 1 << 16;
/// At a checkpoint, records this much younger than the latest stay as they came.
const TAIL_NS: u64 = 2_000_000;
/// Failed allocations kept with what was live then: the first half and the latest half.
pub const MAX_FAILURES: usize = 256;
/// NVML samples kept (thinned evenly over the run past this).
pub const MAX_NVML_SAMPLES: usize = 512;
/// Iteration boundaries kept (thinned evenly over the run past this).
pub const MAX_BOUNDARIES: usize = 256;
/// Points of the coarse series of memory over time, per device (past this, each two
/// neighbours become the one with more live memory, and the stretch a point stands for
/// doubles).
pub const MAX_SERIES: usize = 1024;
/// Records of kinds kept as they came (threads, streams, notes) past which they are dropped.
const MAX_KEPT: usize = 65_536;

/// At most `max` items kept of a stream of them, spread evenly over it: once `max` are kept,
/// every other one goes, and from then on only every `stride`-th item offered is kept.
#[derive(Clone, Debug)]
pub struct Thinned<T> {
    items: Vec<T>,
    offered: u64,
    stride: u64,
    max: usize,
}

impl<T> Thinned<T> {
    pub fn new(max: usize) -> Thinned<T> {
        Thinned {
            items: Vec::new(),
            offered: 0,
            stride: 1,
            max: max.max(2),
        }
    }

    /// Counts one more item offered; whether it is to be kept (then [`Thinned::push`] it).
    pub fn wants(&mut self) -> bool {
        self.offered += 1;
        (self.offered - 1) % self.stride == 0
    }

    /// Keeps an item [`Thinned::wants`] asked for.
    pub fn push(&mut self, item: T) {
        self.items.push(item);
        if self.items.len() >= self.max {
            let mut i = 0;
            self.items.retain(|_| {
                i += 1;
                i % 2 == 1
            });
            self.stride *= 2;
        }
    }

    pub fn items(&self) -> &[T] {
        &self.items
    }

    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}

/// Whether a record is a call of the program, as `summary` counts calls per API: not the
/// shim's own records (its notes, definitions, the pool's decisions), not a thread's or a
/// stream's announcement.
pub fn is_call(r: &Record) -> bool {
    r.api != Api::Shim
        && !matches!(
            r.kind,
            RecordKind::ThreadStart | RecordKind::StreamName | RecordKind::String
        )
}

/// Whether a record's kind makes memory (the bytes `summary` counts per API).
pub fn is_allocating(kind: RecordKind) -> bool {
    use RecordKind::*;
    matches!(
        kind,
        Alloc | AllocAsync | ManagedAlloc | HostAlloc | PhysCreate | AddressReserve | TensorAlloc
    )
}

/// Whether a record is a failed request for memory (what `oom` lists).
pub fn is_failure(r: &Record) -> bool {
    use RecordKind::*;
    match r.kind {
        Alloc | AllocAsync | ManagedAlloc => r.status != 0 && r.size > 0,
        TensorOom => true,
        _ => false,
    }
}

/// Where one call site occurred in the sequence of allocations: how often, first and last,
/// and its first [`KEPT_POSITIONS`] positions (for the regularity of its gaps).
#[derive(Clone, Debug, Default)]
pub struct Occurrences {
    pub count: u64,
    pub first: u64,
    pub last: u64,
    pub positions: Vec<u64>,
}

/// Positions kept per call site.
pub const KEPT_POSITIONS: usize = 4096;

impl Occurrences {
    fn add(&mut self, at: u64) {
        if self.count == 0 {
            self.first = at;
        }
        self.count += 1;
        self.last = at;
        if self.positions.len() < KEPT_POSITIONS {
            self.positions.push(at);
        }
    }
}

/// The call site that marks the program's repeating unit (its step), from where each site
/// occurred in the sequence of allocations (`total` allocations in all).
///
/// A training step allocates from most of its lines once; a line that allocates many times a
/// step (a loop inside the step) or only at start (an optimizer's state, made at its first
/// step) is not the step. So each candidate site (3 occurrences or more, spread over at least
/// half of the run after its first, its 10th and 90th percentile gaps within 4x of its mean
/// gap) is scored by how many sites occur about as often as it does (within 10%, or 1); the
/// best score wins, then the fewest occurrences, then the site seen first. Ties resolve the
/// same way every time.
pub fn detect_period<S: std::hash::BuildHasher>(
    sites: &HashMap<u64, Occurrences, S>,
    total: u64,
) -> Option<u64> {
    let counts: Vec<u64> = sites
        .values()
        .map(|o| o.count)
        .filter(|&n| n >= 3)
        .collect();
    let near = |a: u64, b: u64| a.abs_diff(b) <= (b / 10).max(1);
    sites
        .iter()
        .filter(|(_, o)| o.count >= 3 && o.positions.len() >= 3)
        .filter(|(_, o)| {
            let span = o.last.saturating_sub(o.first);
            span.saturating_mul(2) >= total.saturating_sub(o.first)
        })
        .filter(|(_, o)| {
            // Steady: no long absence and no burst against its mean gap (a step's count of
            // allocations changes with its shapes, so gaps vary by some factor, not by 4).
            let t = &o.positions;
            let mut gaps: Vec<u64> = t.windows(2).map(|w| w[1].saturating_sub(w[0])).collect();
            gaps.sort_unstable();
            let lo = gaps[gaps.len() / 10];
            let hi = gaps[(gaps.len() * 9 / 10).min(gaps.len() - 1)];
            let mean = (t[t.len() - 1] - t[0]) / (t.len() as u64 - 1);
            lo > 0 && lo.saturating_mul(4) >= mean && hi <= mean.saturating_mul(4)
        })
        .max_by_key(|(k, o)| {
            let score = counts.iter().filter(|&&n| near(n, o.count)).count();
            (
                score,
                std::cmp::Reverse(o.count),
                std::cmp::Reverse(o.first),
                std::cmp::Reverse(**k),
            )
        })
        .map(|(k, _)| *k)
}

/// What marks the iterations, learnt from the records: NVTX names and how often each came,
/// and where each call site allocated (by stack where stacks were recorded, else by API and
/// size). Positions in the sequence of allocations, not times: an iteration's allocations come
/// in the same order every time, while their timing varies with the machine.
#[derive(Default)]
pub struct MarkFinder {
    /// By string id: how often, and whether a range (not a mark).
    pub names: FastMap<u64, (u64, bool)>,
    by_stack: FastMap<u64, Occurrences>,
    by_size: FastMap<u64, Occurrences>,
    pending: FastMap<u16, u64>,
    pub allocations: u64,
}

impl MarkFinder {
    /// Learns from one record (whose replay made change `c`).
    pub fn learn(&mut self, r: &Record, c: Change) {
        match r.kind {
            RecordKind::RangePush | RecordKind::RangeStart | RecordKind::Mark => {
                let e = self
                    .names
                    .entry(r.ptr)
                    .or_insert((0, r.kind != RecordKind::Mark));
                e.0 += 1;
            }
            RecordKind::StackRef => {
                // A segment the framework takes for a tensor has the tensor's stack: it is not
                // an allocation of that call site's own (see `Change::StackOfRaw`).
                if let Some(t) = self.pending.remove(&r.thread)
                    && c != Change::StackOfRaw
                {
                    self.by_stack.entry(r.ptr).or_default().add(t);
                }
            }
            _ => {
                if !r.kind.is_definition() {
                    self.pending.remove(&r.thread);
                }
                if let Change::Alloc { .. } = c {
                    self.allocations += 1;
                    self.pending.insert(r.thread, self.allocations);
                    self.by_size
                        .entry(size_key(r.api as u8, r.size))
                        .or_default()
                        .add(self.allocations);
                }
            }
        }
    }

    /// How often `mark` came in the records learnt from.
    pub fn count_of(&self, mark: BoundaryMark) -> u64 {
        match mark {
            BoundaryMark::Nvtx(id) => self.names.get(&id).map_or(0, |n| n.0),
            BoundaryMark::Site(key) => self
                .by_stack
                .get(&key)
                .or_else(|| self.by_size.get(&key))
                .map_or(0, |o| o.count),
        }
    }

    /// The NVTX range (pushed, else a mark) seen most often, 3 times or more; else the call
    /// site of the detected period, by stack where stacks were recorded, else by API and size.
    pub fn choose(&self) -> Option<BoundaryMark> {
        self.names
            .iter()
            .filter(|(_, (n, _))| *n >= 3)
            .max_by_key(|(id, (n, push))| (*push, *n, std::cmp::Reverse(**id)))
            .map(|(&id, _)| BoundaryMark::Nvtx(id))
            .or_else(|| {
                detect_period(&self.by_stack, self.allocations)
                    .or_else(|| detect_period(&self.by_size, self.allocations))
                    .map(BoundaryMark::Site)
            })
    }
}

/// Allocations the summarizer learns from before it gives up finding what marks an iteration.
const LEARN_AT_MOST: u64 = 1 << 20;

/// Learns what marks an iteration until the first checkpoint (when the ring is half full:
/// most of a ring of records seen), then keeps live bytes by call site at each boundary.
struct Boundaries {
    finder: MarkFinder,
    mark: Option<BoundaryMark>,
    decided: bool,
    /// Boundaries seen (those before the choice counted too), and the ones kept.
    seen: u64,
    kept: Thinned<Boundary>,
}

impl Boundaries {
    /// Chooses the mark from what was learnt, once.
    fn decide(&mut self) {
        if self.decided {
            return;
        }
        self.mark = self.finder.choose();
        // Nothing repeats yet in what was read (a summarizer lapped at the start reads little
        // before its first checkpoint): it learns on, up to a bound, and tries again at the
        // next checkpoint.
        if self.mark.is_none() && self.finder.allocations < LEARN_AT_MOST {
            return;
        }
        self.decided = true;
        // The boundaries before the choice were seen, not sampled: they count.
        self.seen = self.mark.map_or(0, |m| self.finder.count_of(m));
        self.finder = MarkFinder::default();
    }

    fn sample(&mut self, rp: &Replay, time_ns: u64) {
        self.seen += 1;
        if self.kept.wants() {
            self.kept.push(Boundary {
                ordinal: self.seen,
                time_ns,
                total: rp.total_live(),
                by_site: rp.live_by_site(),
            });
        }
    }
}

/// A device's peak as the summarizer watches it. What held it is not copied at each new peak
/// (a leak makes one every step): the allocations made and freed on the device since the peak
/// are journalled, and the peak's live set is the current one with the journal undone, taken
/// when a checkpoint is written or the journal grows past the live set.
#[derive(Default)]
struct PeakWatch {
    bytes: u64,
    time_ns: u64,
    reserved: u64,
    /// The peak moved and its snapshot is not taken yet.
    pending: bool,
    /// Since the peak: (address, None) allocated, (address, Some(what it was)) freed.
    journal: Vec<(u64, Option<Live>)>,
    snapshot: Snapshot,
    /// The peak before this one, where a raw device allocation set this one: the framework's
    /// segment record that claims it a few records later undoes the peak (as the replay does).
    before: Option<Box<PeakBefore>>,
}

/// A peak kept aside while the allocation that passed it may still turn out to be a segment.
struct PeakBefore {
    bytes: u64,
    time_ns: u64,
    reserved: u64,
    snapshot: Snapshot,
    /// Set by physical memory (an expandable segment's page): the next page keeps this.
    physical: bool,
}

/// Live allocations up to which a peak passed by a raw device allocation keeps the one before
/// it (a copy of what held it); past it, the peak may read a segment's rounding high.
const KEEP_PEAK_BEFORE_UPTO: usize = 1 << 16;

impl PeakWatch {
    /// A new peak: `raw` where a device allocation of the program's (not a tensor) set it.
    /// `raw`: (the allocation's key, whether physical) where a device allocation of the
    /// program's (not a tensor) set it; the peak before it is then taken without it.
    fn passed(&mut self, rp: &Replay, device: u8, time_ns: u64, raw: Option<(u64, bool)>) {
        // Only a framework whose tensors are recorded claims segments (a program allocating
        // with cudaMalloc alone makes a new peak at each allocation, and keeping the one before
        // would copy its live set each time).
        let keep_before =
            raw.filter(|_| rp.tensors.recorded() && rp.live.len() <= KEEP_PEAK_BEFORE_UPTO);
        match keep_before {
            // Pages of one expandable segment come one after another: the peak before the first
            // is the one to go back to.
            Some((_, true)) if self.before.as_ref().is_some_and(|b| b.physical) => {}
            Some((key, physical)) => {
                self.materialize_without(rp, device, Some((key, physical)));
                self.before = Some(Box::new(PeakBefore {
                    bytes: self.bytes,
                    time_ns: self.time_ns,
                    reserved: self.reserved,
                    snapshot: core::mem::take(&mut self.snapshot),
                    physical,
                }));
            }
            None => self.before = None,
        }
        self.bytes = rp.live_on(device);
        self.time_ns = time_ns;
        self.reserved = rp.reserved_on(device);
        self.pending = true;
        self.journal.clear();
    }

    /// The replay undid the peak (a segment record claimed the allocation that set it): back to
    /// the one before.
    fn undo(&mut self, replay_peak: u64) {
        if replay_peak >= self.bytes {
            return;
        }
        if let Some(b) = self.before.take() {
            self.bytes = b.bytes;
            self.time_ns = b.time_ns;
            self.reserved = b.reserved;
            self.snapshot = b.snapshot;
            self.pending = false;
            self.journal.clear();
        }
    }

    fn materialize(&mut self, rp: &Replay, device: u8) {
        self.materialize_without(rp, device, None);
    }

    /// The snapshot of a pending peak, leaving out `made` (key, physical): an allocation
    /// applied after it.
    fn materialize_without(&mut self, rp: &Replay, device: u8, made: Option<(u64, bool)>) {
        if !self.pending {
            return;
        }
        if let Some((key, false)) = made {
            self.journal.push((key, None));
        }
        self.pending = false;
        let mut set: HashMap<u64, Live> = rp
            .live
            .iter()
            .filter(|(_, l)| l.device == device)
            .map(|(&p, &l)| (p, l))
            .collect();
        for (p, was) in self.journal.drain(..).rev() {
            match was {
                None => {
                    set.remove(&p);
                }
                Some(l) => {
                    set.insert(p, l);
                }
            }
        }
        let physical = rp
            .physical
            .iter()
            .filter(|&(&h, l)| l.device == device && made != Some((h, true)))
            .map(|(_, l)| l);
        self.snapshot = Snapshot::of(set.values().chain(physical), device, self.time_ns);
        self.snapshot.live = self.bytes;
        self.snapshot.reserved = self.reserved;
    }
}

/// What was live on `device` now, for a failure: by call site, with the pool's figures.
fn snapshot_now(rp: &Replay, device: u8, time_ns: u64) -> Snapshot {
    let mut s = Snapshot::of(
        rp.all_live().filter(|l| l.device == device),
        device,
        time_ns,
    );
    s.failure = true;
    s.live = rp.live_on(device);
    s.reserved = rp.reserved_on(device);
    s.largest_free_block = rp.largest_free_block(device);
    s.device_free = rp.facts.mem_info.get(&device).map(|m| m.0);
    s
}

/// A failed allocation kept: what was live then, and its records (the failure, its stack).
struct Failure {
    snapshot: Snapshot,
    records: Vec<Record>,
}

/// Summarizes the records of a trace as they come (see the module's notes).
pub struct Summarizer {
    replay: Replay,
    /// Definitions as they came, each once.
    defs: definitions::Definitions,
    /// Records of kinds kept as they came (threads, streams, the framework's state, notes).
    kept: Vec<Record>,
    /// The thread whose next stack belongs to a kept note.
    kept_stack_of: Option<u16>,
    window: Vec<(u64, u64, Record)>,
    /// The window's length at which `feed` drains it next.
    drain_at: usize,
    latest_ns: u64,
    fed: u64,
    applied: u64,
    applied_ns: u64,
    apis: Vec<(u64, u64, u64)>,
    peaks: BTreeMap<u8, PeakWatch>,
    failures: Vec<Failure>,
    failures_dropped: u64,
    /// The thread whose next stack belongs to the latest failure.
    failure_stack_of: Option<u16>,
    boundaries: Boundaries,
    nvml: Thinned<Record>,
    series: BTreeMap<u8, Series>,
    /// Live backward tensors and the forward stack their autograd sequence number joins them
    /// to (see `trace::backward`), so that a checkpoint's live allocations keep the join.
    joins: AutogradJoins,
}

/// Forward sequence numbers the summarizer keeps: a backward pass follows its forward within a
/// step (thousands of numbers), and this map lives in the traced process (a few MiB at most).
const AUTOGRAD_KEPT: usize = 1 << 16;

/// The summarizer's side of `trace::backward`: it holds no frames, so it keeps only which live
/// allocation another thread's forward stack joins (the reader checks the allocation's stack is
/// a backward function's before it joins them).
#[derive(Default)]
struct AutogradJoins {
    /// Sequence number -> (thread, stack) of the first allocation that recorded it.
    forward: BTreeMap<u64, (u16, u64)>,
    /// Live allocation -> the forward stack joined to it.
    live: crate::fasthash::FastMap<u64, u64>,
}

impl AutogradJoins {
    /// A `StackRef` about to name `thread`'s allocation `ptr`.
    fn stack_ref(&mut self, r: &Record, ptr: u64) {
        let sequence = crate::trace::backward::sequence_of(r);
        if sequence == 0 {
            return;
        }
        match self.forward.get(&sequence) {
            Some(&(thread, stack)) if thread != r.thread => {
                if ptr != 0 {
                    self.live.insert(ptr, stack);
                }
            }
            Some(_) => {}
            None => {
                self.forward.insert(sequence, (r.thread, r.ptr));
                while self.forward.len() > AUTOGRAD_KEPT {
                    self.forward.pop_first();
                }
            }
        }
    }
}

/// Live and reserved memory of one device over time, a point per stretch of `every_ns` (the
/// highest live of the stretch, so peaks stay).
struct Series {
    every_ns: u64,
    points: Vec<(u64, u64, u64)>,
}

impl Series {
    fn note(&mut self, t: u64, live: u64, reserved: u64) {
        match self.points.last_mut() {
            Some(last) if t / self.every_ns == last.0 / self.every_ns => {
                if live > last.1 {
                    *last = (t, live, reserved);
                }
            }
            _ => self.points.push((t, live, reserved)),
        }
        if self.points.len() >= MAX_SERIES {
            self.every_ns *= 2;
            let every = self.every_ns;
            let mut merged: Vec<(u64, u64, u64)> = Vec::with_capacity(MAX_SERIES / 2 + 1);
            for p in self.points.drain(..) {
                match merged.last_mut() {
                    Some(m) if p.0 / every == m.0 / every => {
                        if p.1 > m.1 {
                            *m = p;
                        }
                    }
                    _ => merged.push(p),
                }
            }
            self.points = merged;
        }
    }
}

impl Default for Summarizer {
    fn default() -> Self {
        Summarizer::new()
    }
}

impl Summarizer {
    pub fn new() -> Summarizer {
        Summarizer {
            replay: Replay::default(),
            defs: definitions::Definitions::default(),
            kept: Vec::new(),
            kept_stack_of: None,
            window: Vec::new(),
            drain_at: DRAIN_AT_LEAST,
            latest_ns: 0,
            fed: 0,
            applied: 0,
            applied_ns: 0,
            apis: vec![(0, 0, 0); 256],
            peaks: BTreeMap::new(),
            failures: Vec::new(),
            failures_dropped: 0,
            failure_stack_of: None,
            boundaries: Boundaries {
                finder: MarkFinder::default(),
                mark: None,
                decided: false,
                seen: 0,
                kept: Thinned::new(MAX_BOUNDARIES),
            },
            nvml: Thinned::new(MAX_NVML_SAMPLES),
            series: BTreeMap::new(),
            joins: AutogradJoins::default(),
        }
    }

    /// Takes one committed record body, in the order the writers claimed them. Definitions
    /// (strings, stacks, modules) are kept at once, in that order, since their data records
    /// carry bytes where other records carry times; other records wait in the reorder window.
    pub fn feed(&mut self, body: &[u8; RECORD_SIZE]) {
        self.fed += 1;
        let Some(r) = Record::decode(body) else {
            return;
        };
        if self.defs.take(&r, body) {
            return;
        }
        self.latest_ns = self.latest_ns.max(r.time_ns);
        self.window.push((r.time_ns, self.fed, r));
        // Drained when it has grown to twice what the last drain left: a fast writer's 20 ms
        // can be more than 65,536 records, and sorting them all again at every record fed
        // would take the summarizer quadratic time and let the writers lap it.
        if self.window.len() >= self.drain_at {
            self.drain(false);
            self.drain_at = (2 * self.window.len()).max(DRAIN_AT_LEAST);
        }
    }

    /// Applies the records of the window older than the reorder window (all with `all`).
    pub fn drain(&mut self, all: bool) {
        self.drain_older_than(if all { None } else { Some(REORDER_NS) });
    }

    /// Applies the records more than `window` ns older than the latest fed (all with `None`).
    fn drain_older_than(&mut self, window: Option<u64>) {
        self.window.sort_by_key(|w| (w.0, w.1));
        let cut = match window {
            None => self.window.len(),
            Some(w) => {
                let t = self.latest_ns.saturating_sub(w);
                let by_time = self.window.partition_point(|w| w.0 < t);
                by_time.max(self.window.len().saturating_sub(1 << 20))
            }
        };
        // Applied from the window's own buffer (taken for the loop, then given back), so that a
        // drain allocates nothing.
        let mut window = std::mem::take(&mut self.window);
        for (_, _, r) in window.drain(..cut) {
            self.apply(&r);
        }
        self.window = window;
    }

    fn apply(&mut self, r: &Record) {
        use RecordKind::*;
        self.applied += 1;
        self.applied_ns = self.applied_ns.max(r.time_ns);
        if is_call(r) {
            let a = &mut self.apis[r.api as usize];
            a.0 += 1;
            if r.failed() {
                a.2 += 1;
            } else if is_allocating(r.kind) {
                a.1 = a.1.saturating_add(r.size);
            }
        }
        self.keep_stack(r);
        match r.kind {
            ThreadStart | StreamName | Tensors => self.keep(r),
            PoolStreams => {
                self.keep(r);
                self.kept_stack_of = Some(r.thread);
            }
            DeviceMemory if self.nvml.wants() => self.nvml.push(*r),
            _ => {}
        }
        // VMM memory and framework segments change what is live without an address the
        // journal follows: the snapshots of peaks reached before them are taken first.
        if matches!(r.kind, PhysCreate | PhysRelease | SegmentReserve) {
            self.settle_peaks();
        }
        if is_failure(r) {
            self.failure(r);
        }
        if r.kind == StackRef {
            let ptr = self.replay.last_alloc_of(r.thread);
            self.joins.stack_ref(r, ptr);
        }
        let c = self.replay.apply(r);
        if let Change::Free { ptr, .. } = c {
            self.joins.live.remove(&ptr);
        }
        if let Change::Alloc { device, .. }
        | Change::Physical { device }
        | Change::Free {
            live: Live { device, .. },
            ..
        } = c
        {
            let (live, reserved) = (self.replay.live_on(device), self.replay.reserved_on(device));
            self.series
                .entry(device)
                .or_insert(Series {
                    every_ns: 1_000_000,
                    points: Vec::new(),
                })
                .note(r.time_ns, live, reserved);
        }
        match c {
            Change::Alloc { device, .. } | Change::Physical { device } => {
                let live = self.replay.live_on(device);
                let w = self.peaks.entry(device).or_default();
                if live > w.bytes {
                    let raw = match (r.kind, c) {
                        (_, Change::Physical { .. }) => Some((r.ptr, true)),
                        (RecordKind::Alloc, Change::Alloc { ptr, .. }) => Some((ptr, false)),
                        _ => None,
                    };
                    w.passed(&self.replay, device, r.time_ns, raw);
                } else if let (true, Change::Alloc { ptr, .. }) = (w.pending, c) {
                    w.journal.push((ptr, None));
                }
            }
            Change::Free { ptr, live } => {
                if let Some(w) = self.peaks.get_mut(&live.device)
                    && w.pending
                {
                    w.journal.push((ptr, Some(live)));
                }
            }
            Change::Other | Change::StackOfRaw => {}
        }
        if r.kind == RecordKind::SegmentReserve {
            for (d, peak, _) in self.replay.peaks() {
                if let Some(w) = self.peaks.get_mut(&d) {
                    w.undo(peak);
                }
            }
        }
        // A journal longer than the live set costs more to keep than a snapshot.
        let live_count = self.replay.live.len();
        for (&d, w) in self.peaks.iter_mut() {
            if w.journal.len() > live_count.max(1 << 16) {
                w.materialize(&self.replay, d);
            }
        }
        let b = &mut self.boundaries;
        if !b.decided {
            b.finder.learn(r, c);
        } else if let Some(mark) = b.mark
            && mark.is_boundary(r, c)
        {
            b.sample(&self.replay, r.time_ns);
        }
    }

    /// A stack that belongs to a kept record or a failure goes with it.
    fn keep_stack(&mut self, r: &Record) {
        if r.kind == RecordKind::StackRef {
            if self.failure_stack_of == Some(r.thread) {
                self.failure_stack_of = None;
                if let Some(f) = self.failures.last_mut() {
                    f.records.push(*r);
                }
            }
            if self.kept_stack_of == Some(r.thread) {
                self.kept_stack_of = None;
                self.keep(r);
            }
        } else if !r.kind.is_definition() {
            if self.failure_stack_of == Some(r.thread) {
                self.failure_stack_of = None;
            }
            if self.kept_stack_of == Some(r.thread) {
                self.kept_stack_of = None;
            }
        }
    }

    fn keep(&mut self, r: &Record) {
        if self.kept.len() < MAX_KEPT {
            self.kept.push(*r);
        }
    }

    fn settle_peaks(&mut self) {
        for (&d, w) in self.peaks.iter_mut() {
            w.materialize(&self.replay, d);
        }
    }

    fn failure(&mut self, r: &Record) {
        let device = if r.device == DEVICE_UNKNOWN {
            0
        } else {
            r.device
        };
        if self.failures.len() >= MAX_FAILURES {
            self.failures.remove(MAX_FAILURES / 2);
            self.failures_dropped += 1;
        }
        self.failures.push(Failure {
            snapshot: snapshot_now(&self.replay, device, r.time_ns),
            records: vec![*r],
        });
        self.failure_stack_of = Some(r.thread);
    }

    /// Writes the checkpoint: every record applied so far summarized, then the records still in
    /// the reorder window as they are. `covered` is the ring index up to which every record was
    /// fed; `room` the records the checkpoint's slot holds: a checkpoint that would not fit
    /// lists fewer live allocations one by one and sums the rest by call site
    /// (`live_set`), so that it fits whenever what it holds besides them does. Writes the
    /// bodies to `out` (the caller puts the commit words).
    pub fn checkpoint(&mut self, covered: u64, room: usize, out: &mut Vec<[u8; RECORD_SIZE]>) {
        // The records still waiting go into the checkpoint as they are: only the last
        // TAIL_NS of them (a writer's block is abandoned within 1 ms, so records further
        // apart than that come in time order), so a fast writer's 20 ms do not fill it.
        self.drain_older_than(Some(TAIL_NS));
        // The first checkpoint decides what marks the iterations, from the records so far.
        self.boundaries.decide();
        self.settle_peaks();
        self.window.sort_by_key(|x| (x.0, x.1));
        let start = out.len();
        self.write_into(covered, None, out);
        let mut itemize: Option<usize> = None;
        for _ in 0..6 {
            let written = out.len() - start;
            if written <= room {
                return;
            }
            let excess = written - room;
            let waiting = self.window.len();
            if waiting > 0 && (waiting >= excess || itemize == Some(0)) {
                // What does not fit is the records still waiting (a fast writer's last
                // milliseconds): they are applied now, in the order they have, rather than
                // leave the ring without a checkpoint. A record another thread claimed earlier
                // and committed later can then come after one it preceded.
                self.drain_older_than(None);
            } else {
                // Each allocation left out costs a record less; the stand-ins and their sites
                // take some back, so ask for a little more than the excess each time.
                let live = self.replay.live.len() + self.replay.physical.len();
                itemize = Some(
                    itemize
                        .unwrap_or(live)
                        .saturating_sub(excess + excess / 8 + 64),
                );
            }
            out.truncate(start);
            self.write_into(covered, itemize, out);
        }
    }

    fn write_into(&self, covered: u64, itemize: Option<usize>, out: &mut Vec<[u8; RECORD_SIZE]>) {
        let mut w = Writer { out };
        w.restore(restore::BEGIN, 0, covered, self.applied, self.applied_ns);
        for d in &self.defs.bodies {
            w.out.push(*d);
        }
        for r in &self.kept {
            w.record(r);
        }
        let rp = &self.replay;
        let (threads, started) = rp.open_ranges();
        for (t, ids) in threads {
            for id in ids {
                w.push(Record {
                    thread: t,
                    ..restore_record(restore::RANGE_OPEN, 0, id, 0, 0)
                });
            }
        }
        for (name, id) in started {
            w.restore(restore::STARTED, 0, name, id, 0);
        }
        for (base, size, d) in rp.segments() {
            w.restore(restore::SEGMENT, d, base, size, 0);
        }
        for (h, size, d) in rp.framework_physical() {
            w.restore(restore::FRAMEWORK_PHYSICAL, d, h, size, 0);
        }
        live_set::write(&mut w, rp, &self.joins.live, itemize);
        self.write_figures(&mut w);
        for w_ in self.peaks.values() {
            w.snapshot(&w_.snapshot, false);
        }
        for f in &self.failures {
            w.snapshot(&f.snapshot, true);
            for r in &f.records {
                w.record(r);
            }
        }
        self.write_boundaries(&mut w);
        write_thread_pending(&mut w, &self.replay);
        w.restore(restore::END, 0, 0, 0, 0);
        // The records not yet applied, as they came (sorted by `checkpoint`).
        for (_, _, r) in &self.window {
            w.record(r);
        }
    }

    /// What the replay holds in figures: tensors, peaks, NVML's samples and figures, CUDA's
    /// pools, the series, unknown frees, `cudaMemGetInfo`, calls per API.
    fn write_figures(&self, w: &mut Writer) {
        let rp = &self.replay;
        for (&d, &(now, peak)) in &rp.tensors.bytes {
            w.restore(restore::TENSOR_BYTES, d, now, peak, 0);
        }
        for (d, peak, t) in rp.peaks() {
            w.restore(restore::DEVICE_PEAK, d, peak, 0, t);
        }
        w.restore(restore::HOST_PEAK, 0, rp.host_peak, 0, 0);
        for r in self.nvml.items() {
            w.record(r);
        }
        // CUDA's own pools: their latest figures, as the records that said them.
        for (&(d, pool), &(reserved, used)) in &rp.facts.cuda_pools {
            w.record(&Record {
                kind: RecordKind::CudaPool,
                api: Api::Shim,
                device: d,
                status: pool,
                thread: 0,
                time_ns: 0,
                ptr: reserved,
                size: used,
                stream: 0,
            });
        }
        for (&d, f) in &rp.facts.nvml {
            w.push(Record {
                thread: u16::from(f.device_wide),
                ..restore_record(restore::NVML, d, f.bytes, f.total, f.peak)
            });
        }
        for (&d, series) in &self.series {
            for &(t, live, reserved) in &series.points {
                w.restore(restore::SERIES, d, live, reserved, t);
            }
        }
        w.restore(restore::UNMATCHED, 0, rp.unmatched_frees, 0, 0);
        for (&d, &(free, total)) in &rp.facts.mem_info {
            w.restore(restore::MEM_INFO, d, free, total, 0);
        }
        for (api, &(calls, bytes, failed)) in self.apis.iter().enumerate() {
            if calls > 0
                && let Some(a) = Api::from_u8(api as u8)
            {
                w.push(Record {
                    api: a,
                    ..restore_record(restore::API, 0, calls, failed, bytes)
                });
            }
        }
    }

    /// What marks the iterations, and live bytes by call site at each boundary kept (each
    /// boundary's changes from the one before).
    fn write_boundaries(&self, w: &mut Writer) {
        if let Some(mark) = self.boundaries.mark {
            let (thread, key) = match mark {
                BoundaryMark::Nvtx(id) => (0, id),
                BoundaryMark::Site(k) => (1, k),
            };
            w.push(Record {
                thread,
                ..restore_record(restore::BOUNDARY_MARK, 0, key, self.boundaries.seen, 0)
            });
            let empty: HashMap<u64, u64> = HashMap::new();
            let mut before = &empty;
            for b in self.boundaries.kept.items() {
                let by = &b.by_site;
                w.restore(restore::BOUNDARY, 0, b.ordinal, b.total, b.time_ns);
                let mut changed: Vec<(u64, u64)> = by
                    .iter()
                    .filter(|&(k, v)| before.get(k) != Some(v))
                    .map(|(&k, &v)| (k, v))
                    .chain(
                        before
                            .keys()
                            .filter(|k| !by.contains_key(k))
                            .map(|&k| (k, 0)),
                    )
                    .collect();
                changed.sort_unstable();
                for (k, v) in changed {
                    w.push(Record {
                        kind: RecordKind::Holding,
                        api: Api::Shim,
                        device: DEVICE_UNKNOWN,
                        ptr: k,
                        time_ns: v,
                        ..blank()
                    });
                }
                before = by;
            }
        }
    }
}

/// The live allocations (and VMM handles, and pinned host memory), grouped by call site.
/// Per thread: what the replay waits for next on it (an allocation's stack, its caller, a
/// framework segment to claim physical memory).
fn write_thread_pending(w: &mut Writer, rp: &Replay) {
    for p in rp.thread_pending() {
        let on = |what, ptr, size| Record {
            thread: p.thread,
            ..restore_record(what, 0, ptr, size, 0)
        };
        if p.last_alloc != 0 {
            w.push(on(restore::LAST_ALLOC, p.last_alloc, 0));
        }
        if let Some((vmm, key)) = p.awaiting_caller {
            w.push(on(restore::AWAITING_CALLER, key, u64::from(vmm)));
        }
        for h in p.pending_physical {
            w.push(on(restore::PENDING_PHYSICAL, h, 0));
        }
    }
}

fn blank() -> Record {
    Record {
        kind: RecordKind::Restore,
        api: Api::Shim,
        device: 0,
        status: 0,
        thread: 0,
        time_ns: 0,
        ptr: 0,
        size: 0,
        stream: 0,
    }
}

fn restore_record(what: u8, device: u8, ptr: u64, size: u64, time_ns: u64) -> Record {
    Record {
        status: what,
        device,
        ptr,
        size,
        time_ns,
        ..blank()
    }
}

/// Encodes records into a checkpoint's bodies.
struct Writer<'a> {
    out: &'a mut Vec<[u8; RECORD_SIZE]>,
}

impl Writer<'_> {
    fn push(&mut self, r: Record) {
        let mut b = [0u8; RECORD_SIZE];
        r.encode_body(&mut b);
        self.out.push(b);
    }

    fn record(&mut self, r: &Record) {
        self.push(*r);
    }

    fn restore(&mut self, what: u8, device: u8, ptr: u64, size: u64, time_ns: u64) {
        self.push(restore_record(what, device, ptr, size, time_ns));
    }

    fn snapshot(&mut self, s: &Snapshot, failure: bool) {
        self.push(Record {
            thread: u16::from(failure),
            ..restore_record(restore::SNAPSHOT, s.device, s.live, s.reserved, s.time_ns)
        });
        self.restore(
            restore::SNAPSHOT_MORE,
            s.device,
            s.largest_free_block,
            s.device_free.map_or(0, |f| f.saturating_add(1)),
            0,
        );
        for h in &s.holdings {
            let (lo, hi) = restore::split_count(h.allocations);
            self.push(Record {
                kind: RecordKind::Holding,
                api: Api::Shim,
                device: s.device,
                thread: lo,
                stream: hi,
                ptr: h.stack,
                size: h.range,
                time_ns: h.bytes,
                status: 0,
            });
        }
    }
}

/// Commit words for a checkpoint's records (record `i` of the checkpoint gets the tag of `i`).
pub fn seal(bodies: &mut [[u8; RECORD_SIZE]]) {
    for (i, b) in bodies.iter_mut().enumerate() {
        b[..2].copy_from_slice(&format::commit_tag(i as u64).to_le_bytes());
    }
}

#[cfg(test)]
mod tests;
