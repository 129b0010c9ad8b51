//! PyTorch's autograd graph, read when a backward pass begins: each node's class and where
//! each of its inputs came from (another node, a parameter, or nothing that takes a gradient).
//! What an op makes under `torch.autocast` depends on the ops whose outputs it took, which the
//! tensors alone do not tell (`docs/fit.md`, "Autocast as a what-if").
//!
//! When the autograd engine runs a node numbered above every node seen so far (the first node
//! of a newer graph to allocate), the shim walks the graph below it, once that allocation's
//! record has its stack (a record and its `StackRef` stay together), and writes a `GraphNode`
//! record per node, a `GraphEdge` per input and a `Graph` record at the end. It walks the
//! first three backward passes of a trace and, in a ring, again each time half the ring has
//! been written since the last walk, so that a ring keeps a recent one.
//!
//! Every read of PyTorch's memory goes through `process_vm_readv` on the process itself: a
//! pointer that does not lead where the layout says reads as an error, never a fault. A node
//! that does not read as PyTorch's `Node` (a version whose layout differs) ends the walk and
//! every later one; a process that may not read itself that way (a seccomp profile) makes
//! none. Either is said in the trace. The walk allocates nothing: its tables are static, one
//! walk at a time (a thread that finds one under way goes on without).

use crate::trace::{self, Event};
use core::cell::{Cell, UnsafeCell};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use gpushim_core::trace::format::graph;

/// Where a `Node`'s fields lie (`torch/csrc/autograd/function.h`, every 2.x release on x86-64
/// with libstdc++): the vtable pointer, the `enable_shared_from_this` weak pointer,
/// `sequence_nr_` (24), `topological_nr_`, `has_parent_` (40), `thread_id_` (48), a
/// `std::mutex` (40 bytes), then `next_edges_` (96), a `std::vector<Edge>`: begin, end,
/// capacity.
const SEQUENCE: usize = 3;
const HAS_PARENT_BYTE: usize = 40;
const THREAD: usize = 6;
const EDGES: usize = 12;
/// The words read of a node: up to the end of `next_edges_`.
const HEAD_WORDS: usize = EDGES + 3;
/// An `Edge`: a `std::shared_ptr<Node>` (object, control block), then `uint32_t input_nr`,
/// padded to 24 bytes.
const EDGE_WORDS: usize = 3;
/// Edges read in one system call.
const EDGES_AT_ONCE: usize = 64;
/// More inputs than this and the node does not read as one.
const EDGES_MAX: u64 = 1 << 20;
/// Walks made before the ring rule takes over.
const WALKS_FIRST: u32 = 3;

const NODES: usize = graph::NODES_MAX as usize;
/// The nodes seen, by address (open addressing, at most half full).
const SEEN: usize = 2 * NODES;
/// Class names by vtable: (vtable, string id).
const CLASSES: usize = 256;

struct Tables {
    seen: [usize; SEEN],
    seen_count: usize,
    stack: [usize; NODES],
    classes: [(usize, u64); CLASSES],
}

struct Shared(UnsafeCell<Tables>);
// SAFETY: the tables are touched only by the thread that holds `BUSY`.
unsafe impl Sync for Shared {}

static TABLES: Shared = Shared(UnsafeCell::new(Tables {
    seen: [0; SEEN],
    seen_count: 0,
    stack: [0; NODES],
    classes: [(0, 0); CLASSES],
}));
/// A walk is under way (and the tables are its).
static BUSY: AtomicBool = AtomicBool::new(false);
/// No walk is made again: a node did not read as PyTorch's, or reads are refused.
static OFF: AtomicBool = AtomicBool::new(false);
/// The highest sequence number + 1 of a node that began a backward pass so far.
static NEWEST: AtomicU64 = AtomicU64::new(0);
/// Walks written to the trace of `GENERATION`.
static WALKS: AtomicU32 = AtomicU32::new(0);
static GENERATION: AtomicU32 = AtomicU32::new(u32::MAX);
/// In a ring: the records claimed at which another walk is due.
static DUE_AT: AtomicU64 = AtomicU64::new(0);

/// Whether walks are made, from the configuration (`graph`), set where the PyTorch hook reads
/// its settings: off, none is.
pub fn configure(on: bool) {
    if !on {
        OFF.store(true, Ordering::Relaxed);
    }
}

thread_local! {
    /// A node whose graph is due to be walked once the record being written has its stack
    /// (0: none): the walk's records must not come between a record and its `StackRef`.
    static PENDING: Cell<usize> = const { Cell::new(0) };
}

/// The autograd engine runs `node` on this thread (its sequence number + 1: `sequence`, 0 when
/// the node does not read as one), which allocates: the graph below it is walked, once the
/// allocation's record is whole ([`walk_pending`]), if it begins a newer graph and a walk is
/// due.
pub fn on_backward(node: usize, sequence: u64) {
    if sequence == 0 || node == 0 || OFF.load(Ordering::Relaxed) {
        return;
    }
    if NEWEST.load(Ordering::Relaxed) >= sequence || BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    if NEWEST.load(Ordering::Relaxed) < sequence {
        NEWEST.store(sequence, Ordering::Relaxed);
        let generation = trace::RECORDER.generation();
        if GENERATION.swap(generation, Ordering::Relaxed) != generation {
            WALKS.store(0, Ordering::Relaxed);
            // SAFETY: this thread holds `BUSY`.
            unsafe { (*TABLES.0.get()).classes = [(0, 0); CLASSES] };
        }
        if due() {
            let _ = PENDING.try_with(|p| p.set(node));
        }
    }
    BUSY.store(false, Ordering::Release);
}

/// Walks the graph this thread found due, if any: called once a record and its stack are
/// written, while the engine still runs the node (it is the same call).
pub fn walk_pending() {
    let node = PENDING.try_with(|p| p.replace(0)).unwrap_or(0);
    if node == 0 || BUSY.swap(true, Ordering::Acquire) {
        return;
    }
    crate::costs::measure(crate::costs::Cost::GraphWalk, || walk(node));
    WALKS.fetch_add(1, Ordering::Relaxed);
    let slots = trace::RECORDER.ring_slots();
    DUE_AT.store(
        trace::RECORDER.claimed().saturating_add(slots / 2),
        Ordering::Relaxed,
    );
    BUSY.store(false, Ordering::Release);
}

/// Whether a walk is due: the first few, then in a ring once half of it was written since.
fn due() -> bool {
    WALKS.load(Ordering::Relaxed) < WALKS_FIRST
        || (trace::RECORDER.ring_slots() > 0
            && trace::RECORDER.claimed() >= DUE_AT.load(Ordering::Relaxed))
}

/// Reads `out.len()` words at `addr` of this process; false where any of them cannot be read.
fn read(addr: usize, out: &mut [u64]) -> bool {
    let bytes = core::mem::size_of_val(out);
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: bytes,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes,
    };
    // SAFETY: one local buffer we own of `bytes` bytes; the remote side is only read by the
    // kernel, which answers an address it cannot read with an error (EFAULT), not a fault.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == bytes as isize
}

/// The word at each of `addrs` (at most [`EDGES_AT_ONCE`]) into `out`, in one call: how many
/// were read, from the first (a read stops at the first address it cannot read).
fn read_each(addrs: &[usize], out: &mut [u64; EDGES_AT_ONCE]) -> usize {
    let n = addrs.len().min(EDGES_AT_ONCE);
    let local = libc::iovec {
        iov_base: out.as_mut_ptr().cast(),
        iov_len: n * 8,
    };
    let mut remote = [libc::iovec {
        iov_base: core::ptr::null_mut(),
        iov_len: 8,
    }; EDGES_AT_ONCE];
    for (r, a) in remote.iter_mut().zip(addrs) {
        r.iov_base = *a as *mut libc::c_void;
    }
    // SAFETY: as in `read`: `n` remote words into our own buffer of `n` words.
    let got =
        unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, remote.as_ptr(), n as _, 0) };
    if got < 0 { 0 } else { got as usize / 8 }
}

/// Whether a node's sequence number, `has_parent_` and thread read as PyTorch's do.
fn plausible(head: &[u64; HEAD_WORDS]) -> bool {
    let has_parent = head[HAS_PARENT_BYTE / 8] & 0xff;
    let thread = head[THREAD];
    head[SEQUENCE] < 1 << graph::SHIFT && has_parent <= 1 && thread != 0 && thread < 1 << 32
}

/// The string id of the class name of the node whose vtable is `vptr` (its type information's
/// name, as `hooks::torch` reads it), if it reads as one.
fn class_id(tables: &mut Tables, vptr: usize) -> Option<u64> {
    let slot = (vptr >> 4) % CLASSES;
    if let Some(&(v, id)) = tables.classes.get(slot)
        && v == vptr
    {
        return Some(id);
    }
    let mut typeinfo = [0u64; 1];
    let mut name_at = [0u64; 1];
    if !read(vptr.checked_sub(8)?, &mut typeinfo)
        || !read((typeinfo[0] as usize).checked_add(8)?, &mut name_at)
    {
        return None;
    }
    let mut words = [0u64; 20];
    // A name near the end of its mapping reads short: word by word, as far as it reads.
    let mut got = 0;
    while got < words.len() {
        let Some(at) = (name_at[0] as usize).checked_add(got * 8) else {
            break;
        };
        let Some(w) = words.get_mut(got..got + 1) else {
            break;
        };
        if !read(at, w) {
            break;
        }
        got += 1;
    }
    let mut bytes = [0u8; 160];
    for (i, w) in words.iter().take(got).enumerate() {
        if let Some(b) = bytes.get_mut(i * 8..i * 8 + 8) {
            b.copy_from_slice(&w.to_le_bytes());
        }
    }
    let len = bytes.iter().position(|&b| b == 0)?;
    let name = super::torch::class_name(bytes.get(..len)?)?;
    let id = trace::RECORDER.intern_string(name);
    if id == 0 {
        return None;
    }
    if let Some(c) = tables.classes.get_mut(slot) {
        *c = (vptr, id);
    }
    Some(id)
}

/// Marks `node` seen: `Some(true)` the first time, `Some(false)` after, `None` where the
/// table holds its most nodes already (the walk is cut there).
fn first_sight(t: &mut Tables, node: usize) -> Option<bool> {
    let mut i = (node >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) % SEEN;
    // At most `NODES` of `SEEN` slots are ever taken: the probe ends at an empty one.
    loop {
        match t.seen.get(i).copied() {
            Some(0) => break,
            Some(n) if n == node => return Some(false),
            _ => i = (i + 1) % SEEN,
        }
    }
    if t.seen_count >= NODES {
        return None;
    }
    t.seen_count += 1;
    if let Some(s) = t.seen.get_mut(i) {
        *s = node;
    }
    Some(true)
}

/// Walks the graph below `start` (a live node the engine runs on this thread), writing its
/// records; the caller holds `BUSY`.
fn walk(start: usize) {
    // SAFETY: this thread holds `BUSY`, so the tables are its alone.
    let t = unsafe { &mut *TABLES.0.get() };
    t.seen.fill(0);
    t.seen_count = 0;
    let mut head = [0u64; HEAD_WORDS];
    if !read(start, &mut head) {
        // The running node is live: a read refused is the process's, not the address's.
        OFF.store(true, Ordering::Relaxed);
        trace::record(Event::graph_walked(0, 0, graph::UNREADABLE));
        return;
    }
    first_sight(t, start);
    t.stack[0] = start;
    let (mut top, mut nodes, mut edges) = (1usize, 0u64, 0u64);
    let mut outcome = graph::WHOLE;
    while let Some(node) = top.checked_sub(1).and_then(|i| t.stack.get(i).copied()) {
        top -= 1;
        match one_node(t, node, &mut head, &mut top, &mut edges) {
            Ok(cut) => {
                nodes += 1;
                if cut {
                    outcome = graph::CUT;
                }
            }
            Err(()) => {
                outcome = graph::LAYOUT;
                OFF.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    trace::record(Event::graph_walked(nodes, edges, outcome));
}

/// Writes `node` and its edges, pushing the nodes they lead to that were not seen; `Ok(true)`
/// where one could not be pushed (the stack full), `Err` where something did not read as
/// PyTorch's.
fn one_node(
    t: &mut Tables,
    node: usize,
    head: &mut [u64; HEAD_WORDS],
    top: &mut usize,
    edges: &mut u64,
) -> Result<bool, ()> {
    if !read(node, head) || !plausible(head) {
        return Err(());
    }
    let sequence = head[SEQUENCE];
    // A class whose name does not read as one (a template's) is written as 0, unknown.
    let class = class_id(t, head[0] as usize).unwrap_or(0);
    trace::record(Event::graph_node(sequence, class));
    let (begin, end, capacity) = (head[EDGES], head[EDGES + 1], head[EDGES + 2]);
    let bytes = (EDGE_WORDS * 8) as u64;
    let fits = begin <= end && end <= capacity && (end - begin) % bytes == 0 && begin % 8 == 0;
    let count = if fits {
        (end - begin) / bytes
    } else {
        u64::MAX
    };
    if count > EDGES_MAX || (begin == 0 && capacity != 0) {
        return Err(());
    }
    let mut cut = false;
    let mut index = 0u64;
    while index < count {
        let n = (count - index).min(EDGES_AT_ONCE as u64) as usize;
        let mut words = [0u64; EDGES_AT_ONCE * EDGE_WORDS];
        let at = begin + index * bytes;
        let chunk = words.get_mut(..n * EDGE_WORDS).ok_or(())?;
        if !read(at as usize, chunk) {
            return Err(());
        }
        // Each input's node and the sequence number read from it, in one call.
        let mut targets = [0usize; EDGES_AT_ONCE];
        let mut asked = 0;
        for e in 0..n {
            let function = words[e * EDGE_WORDS] as usize;
            if function != 0 {
                targets[asked] = function.checked_add(SEQUENCE * 8).ok_or(())?;
                asked += 1;
            }
        }
        let mut numbers = [0u64; EDGES_AT_ONCE];
        if read_each(&targets[..asked], &mut numbers) != asked {
            return Err(());
        }
        let mut k = 0;
        for e in 0..n {
            let function = words[e * EDGE_WORDS] as usize;
            let input_nr = words[e * EDGE_WORDS + 2] & 0xffff_ffff;
            let edge = if function == 0 {
                Event::graph_edge(sequence, index, graph::FROM_NONE, 0)
            } else {
                let from = numbers[k];
                k += 1;
                if from == u64::MAX {
                    Event::graph_edge(sequence, index, graph::FROM_LEAF, function as u64)
                } else if from < 1 << graph::SHIFT {
                    match first_sight(t, function) {
                        // Each node is pushed once, and no more than the stack holds are seen.
                        Some(true) => {
                            if let Some(s) = t.stack.get_mut(*top) {
                                *s = function;
                                *top += 1;
                            }
                        }
                        Some(false) => {}
                        None => cut = true,
                    }
                    let nr = input_nr.min(0xff);
                    Event::graph_edge(sequence, index, graph::FROM_NODE, graph::pack(from, nr))
                } else {
                    return Err(());
                }
            };
            trace::record(edge);
            *edges += 1;
            index += 1;
        }
    }
    Ok(cut)
}
