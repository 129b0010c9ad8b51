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
//!
//! Here: the summarizer and what it applies record by record; `iterations.rs` what marks an
//! iteration and the boundaries kept, `peaks.rs` each device's peak watched, `thinned.rs` a
//! stream thinned evenly. The checkpoint it writes, with its live set and definitions, is in
//! `trace::checkpoint`.

mod iterations;
mod peaks;
mod thinned;

use crate::trace::checkpoint::definitions;
pub use crate::trace::checkpoint::seal;
pub(in crate::trace) use iterations::Boundaries;
pub use iterations::{KEPT_POSITIONS, MarkFinder, Occurrences, detect_period};
pub(in crate::trace) use peaks::{PeakWatch, snapshot_now};
pub use thinned::Thinned;

use crate::trace::format::{Api, DEVICE_UNKNOWN, RECORD_SIZE, Record, RecordKind};
use crate::trace::live::{Change, Replay, Snapshot};
use std::collections::BTreeMap;

/// Records wait this long in the reorder window (as in the reader).
const REORDER_NS: u64 = crate::trace::reader::REORDER_WINDOW_NS;
/// The reorder window is drained once it holds this many records, at least.
const DRAIN_AT_LEAST: usize = 1 << 16;
/// At a checkpoint, records this much younger than the latest stay as they came.
pub(in crate::trace) const TAIL_NS: u64 = 2_000_000;
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

/// Whether a record is a call of the program, as `summary` counts calls per API: not the
/// shim's own records (its notes, definitions, the pool's decisions), not a thread's or a
/// stream's announcement.
pub fn is_call(r: &Record) -> bool {
    r.api != Api::Shim
        && !matches!(
            r.kind,
            RecordKind::ThreadStart
                | RecordKind::StreamName
                | RecordKind::String
                | RecordKind::GraphNode
                | RecordKind::GraphEdge
                | RecordKind::Graph
        )
}

/// Records of one walk of the autograd graph kept at most: a walk past it is not kept.
const GRAPH_KEPT: usize = 4 * crate::trace::format::graph::NODES_MAX as usize;

/// The latest walk of the autograd graph (`GraphNode`, `GraphEdge` and its `Graph` record),
/// which each checkpoint carries, and the one being read.
#[derive(Default)]
pub(in crate::trace) struct GraphKept {
    pub(in crate::trace) walking: Vec<Record>,
    pub(in crate::trace) last: Vec<Record>,
}

impl GraphKept {
    fn see(&mut self, r: &Record) {
        use crate::trace::format::graph;
        match r.kind {
            RecordKind::GraphNode | RecordKind::GraphEdge if self.walking.len() < GRAPH_KEPT => {
                self.walking.push(*r);
            }
            RecordKind::Graph => {
                let read = matches!(r.status, graph::WHOLE | graph::CUT);
                if read && self.walking.len() < GRAPH_KEPT {
                    self.walking.push(*r);
                    self.last = std::mem::take(&mut self.walking);
                }
                self.walking.clear();
            }
            _ => {}
        }
    }
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

/// A failed allocation kept: what was live then, and its records (the failure, its stack).
pub(in crate::trace) struct Failure {
    pub(in crate::trace) snapshot: Snapshot,
    pub(in crate::trace) records: Vec<Record>,
}

/// Summarizes the records of a trace as they come (see the module's notes).
pub struct Summarizer {
    pub(in crate::trace) replay: Replay,
    /// Definitions as they came, each once.
    pub(in crate::trace) defs: definitions::Definitions,
    /// Records of kinds kept as they came (threads, streams, the framework's state, notes).
    pub(in crate::trace) kept: Vec<Record>,
    /// The thread whose next stack belongs to a kept note.
    pub(in crate::trace) kept_stack_of: Option<u16>,
    pub(in crate::trace) window: Vec<(u64, u64, Record)>,
    /// The window's length at which `feed` drains it next.
    pub(in crate::trace) drain_at: usize,
    pub(in crate::trace) latest_ns: u64,
    pub(in crate::trace) fed: u64,
    pub(in crate::trace) applied: u64,
    pub(in crate::trace) applied_ns: u64,
    pub(in crate::trace) apis: Vec<(u64, u64, u64)>,
    pub(in crate::trace) peaks: BTreeMap<u8, PeakWatch>,
    pub(in crate::trace) failures: Vec<Failure>,
    pub(in crate::trace) failures_dropped: u64,
    /// The thread whose next stack belongs to the latest failure.
    pub(in crate::trace) failure_stack_of: Option<u16>,
    pub(in crate::trace) boundaries: Boundaries,
    pub(in crate::trace) nvml: Thinned<Record>,
    pub(in crate::trace) series: BTreeMap<u8, Series>,
    /// Live backward tensors and the forward stack their autograd sequence number joins them
    /// to (see `trace::backward`), so that a checkpoint's live allocations keep the join.
    pub(in crate::trace) joins: AutogradJoins,
    pub(in crate::trace) graph: GraphKept,
}

/// Forward sequence numbers the summarizer keeps: a backward pass follows its forward within a
/// step (thousands of numbers), and this map lives in the traced process (a few MiB at most).
const AUTOGRAD_KEPT: usize = 1 << 16;

/// The summarizer's side of `trace::backward`: it holds no frames, so it keeps only which live
/// allocation another thread's forward stack joins (the reader checks the allocation's stack is
/// a backward function's before it joins them).
#[derive(Default)]
pub(in crate::trace) struct AutogradJoins {
    /// Sequence number -> (thread, stack) of the first allocation that recorded it.
    pub(in crate::trace) forward: BTreeMap<u64, (u16, u64)>,
    /// Live allocation -> the forward stack joined to it.
    pub(in crate::trace) live: crate::fasthash::FastMap<u64, u64>,
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
pub(in crate::trace) struct Series {
    pub(in crate::trace) every_ns: u64,
    pub(in crate::trace) points: Vec<(u64, u64, u64)>,
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
            graph: GraphKept::default(),
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
        if self.defs.take(&r, body, definitions::Source::Ring) {
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

    /// Whether the ring's own copies of definitions are to be kept too: only when the
    /// recorder's log of them is missing some (it had no room, or there is none).
    pub fn keep_ring_definitions(&mut self, keep: bool) {
        self.defs.ring_ignored = !keep;
    }

    /// Takes one body of the recorder's log of definitions (`recorder::definitions`): kept
    /// once, beside the ring's copies of the same definitions.
    pub fn feed_definition(&mut self, body: &[u8; RECORD_SIZE]) {
        if let Some(r) = Record::decode(body) {
            self.defs.take(&r, body, definitions::Source::Log);
        }
    }

    /// Applies the records of the window older than the reorder window (all with `all`).
    pub fn drain(&mut self, all: bool) {
        self.drain_older_than(if all { None } else { Some(REORDER_NS) });
    }

    /// Applies the records more than `window` ns older than the latest fed (all with `None`).
    pub(in crate::trace) fn drain_older_than(&mut self, window: Option<u64>) {
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
            GraphNode | GraphEdge | Graph => self.graph.see(r),
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
        // The raw `cudaMalloc` (or VMM handle) of a segment PyTorch's record claims a moment
        // later is not a moment of the series: counted with the segment's tensors it would
        // read the device higher than it ever was (the page's columns skip it alike).
        let raw = self.replay.tensors.recorded() && matches!(r.kind, Alloc | PhysCreate);
        let changed = match c {
            Change::Alloc { device, .. } | Change::Physical { device } => Some(device),
            Change::Free { .. } => Some(self.replay.freed.device),
            Change::Other | Change::StackOfRaw => None,
        };
        if let Some(device) = changed
            && !raw
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
            Change::Free { ptr } => {
                let live = self.replay.freed;
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

    pub(in crate::trace) fn settle_peaks(&mut self) {
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
}

#[cfg(test)]
mod tests;
