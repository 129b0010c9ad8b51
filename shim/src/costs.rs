//! Where the shim's own time goes, when `GPUSHIM_COSTS=1`: a count and a sum of nanoseconds
//! per kind of work (the allocation and free hooks as the program sees them, the pool's lock,
//! the engine, the driver calls the pool makes, the recorder), printed to stderr at exit. Off,
//! each measured spot costs one relaxed load. No allocation, no lock: the counters are static
//! atomics and the report is written from a stack buffer.

use core::sync::atomic::{AtomicU64, Ordering};
use gpushim_core::trace::recorder::clock_ns;

/// What a measured span is.
#[derive(Clone, Copy)]
pub enum Cost {
    /// A pooled allocation hook, from the pool's decision to serve it to its answer (the
    /// record included); PyTorch's pluggable entry point `gpushim_alloc` counts here too.
    Malloc,
    /// A pooled free hook, likewise (`gpushim_free` too).
    Free,
    /// Waiting for the pool's lock.
    Lock,
    /// The engine's work for an allocation (lock held), driver calls included.
    PoolAlloc,
    /// The engine's work for a free (lock held).
    PoolFree,
    /// Making a checkpoint: an event per busy stream, a query per tracked stream.
    Seal,
    /// The checkpoints made because nothing cached fitted a request (the others are made
    /// ahead, at most [`crate::pool`]'s spacing apart), a part of [`Cost::Seal`].
    SealWanted,
    /// The checkpoints made on the helper thread, ahead of need (`pool::sealer`), a part of
    /// [`Cost::Seal`].
    SealAhead,
    /// Asking whether checkpoints passed (`cuEventQuery`).
    Query,
    /// A new segment (`cuMemAlloc_v2`).
    Reserve,
    /// Segments given back (`cuMemFree_v2`), after the lock.
    Release,
    /// Pages mapped into an expandable segment.
    Map,
    /// One record written to the trace, its stacks included.
    Record,
    /// The stacks of one record (Python frames, sampled native frames): their capture,
    /// interning and records, a part of [`Cost::Record`].
    Stacks,
    /// Of those, the walks over the thread's Python frames (the frame cache's misses
    /// included), a part of [`Cost::Stacks`].
    PyWalk,
    /// Of those, finding or adding the stack in the trace's table and writing its record, a
    /// part of [`Cost::Stacks`].
    Intern,
    /// Finding the pooled block that holds an address (pointer queries, IPC), lock held.
    Lookup,
    /// Python frames read by the captures (a count, no time).
    PyFrames,
    /// Of those, the ones the thread's cache did not know (its code object at that
    /// instruction): their names and line looked up in the shared tables, timed.
    PyFrameMiss,
    /// One call of PyTorch's allocator trace into the shim (a tensor's allocation, its free,
    /// a segment), whatever it records.
    Tensor,
    /// A walk of PyTorch's autograd graph when a backward pass began (`hooks::graph`), a part
    /// of [`Cost::Tensor`].
    GraphWalk,
}

const NAMES: [&str; 21] = [
    "malloc hook",
    "free hook",
    "pool lock wait",
    "engine alloc",
    "engine free",
    "checkpoint made",
    "  of which nothing fit",
    "  of which on a helper",
    "checkpoint query",
    "cuMemAlloc",
    "cuMemFree",
    "pages mapped",
    "trace record",
    "  of which stacks",
    "    python walk",
    "    stack interned",
    "pointer lookup",
    "python frames",
    "  of which not cached",
    "tensor event",
    "  of which graph walks",
];
const KINDS: usize = NAMES.len();

static CALLS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];
static NANOS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];

static STATE: crate::os::LazyFlag = crate::os::LazyFlag::new();

fn on() -> bool {
    STATE.get_or(
        || crate::state::settings().costs,
        |on| {
            if on {
                crate::lifecycle::on_exit(report);
            }
        },
    )
}

fn now() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The start of a measured span: 0 when costs are not measured.
#[inline]
pub fn start() -> u64 {
    if on() { now().max(1) } else { 0 }
}

/// Ends the span begun at `t0` (from [`start`]) as `kind`.
#[inline]
pub fn end(kind: Cost, t0: u64) {
    if t0 != 0 {
        let i = kind as usize;
        CALLS[i].fetch_add(1, Ordering::Relaxed);
        NANOS[i].fetch_add(now().saturating_sub(t0), Ordering::Relaxed);
    }
}

/// Counts `n` of `kind` (work counted, not timed).
#[inline]
pub fn add(kind: Cost, n: u64) {
    if n != 0 && on() {
        CALLS[kind as usize].fetch_add(n, Ordering::Relaxed);
    }
}

/// Measures `f` as `kind`.
#[inline]
pub fn measure<R>(kind: Cost, f: impl FnOnce() -> R) -> R {
    let t0 = start();
    let r = f();
    end(kind, t0);
    r
}

/// What one measured span of nothing costs (two clock reads), in ns: timing adds it to every
/// span, and to the span around it.
fn span_cost() -> u64 {
    let mut best = u64::MAX;
    for _ in 0..1000 {
        let t0 = now();
        best = best.min(now().saturating_sub(t0));
    }
    best
}

/// At exit: one line per kind of work that happened.
fn report() {
    crate::os::say(format_args!(
        "costs of pid {} (GPUSHIM_COSTS): work, calls, total ms, mean ns (a span of nothing \
         measures {} ns, in each mean and in the means around it)",
        // SAFETY: getpid cannot fail.
        unsafe { libc::getpid() },
        span_cost()
    ));
    for (i, name) in NAMES.iter().enumerate() {
        let calls = CALLS[i].load(Ordering::Relaxed);
        if calls == 0 {
            continue;
        }
        let nanos = NANOS[i].load(Ordering::Relaxed);
        crate::os::say(format_args!(
            "  {name:18} {calls:>10} {:>10.1} {:>8}",
            nanos as f64 / 1e6,
            nanos / calls
        ));
    }
}
