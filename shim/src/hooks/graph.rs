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
//! Every read of PyTorch's memory goes through the kernel, so that a pointer that does not lead
//! where the layout says reads as an error (EFAULT), never a fault. Which call depends on the
//! process: with no seccomp filter (`Seccomp: 0` in `/proc/self/status`, read at each walk),
//! `process_vm_readv` on the process itself, one call for many words; under a filter, whose
//! action for a call it cannot know in advance and which may kill the process on one it
//! forbids (systemd's `SystemCallFilter` does by default), only `write` of the words into a
//! pipe of its own and `read` of them back, calls no program that runs Python can forbid. A
//! node that does not read as PyTorch's `Node` (a version whose layout differs) ends the walk
//! and every later one; a process where neither way reads (no pipe can be made, or the first
//! read of a live node is refused) makes none. Either is said in the trace. The walk
//! allocates nothing: its tables are static, one walk at a time (a thread that finds one under
//! way goes on without).

use crate::trace::{self, Event};
use core::cell::{Cell, UnsafeCell};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
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
    /// How the walk under way reads ([`choose_reader`]).
    reader: Reader,
    seen: [usize; SEEN],
    seen_count: usize,
    stack: [usize; NODES],
    classes: [(usize, u64); CLASSES],
}

struct Shared(UnsafeCell<Tables>);
// SAFETY: the tables are touched only by the thread that holds `BUSY`.
unsafe impl Sync for Shared {}

static TABLES: Shared = Shared(UnsafeCell::new(Tables {
    reader: Reader::Vm,
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

/// How this walk reads the process's memory (chosen at its start, [`choose_reader`]).
#[derive(Clone, Copy)]
enum Reader {
    /// `process_vm_readv` on the process itself: no seccomp filter is installed.
    Vm,
    /// `write` into the pipe (read end, write end) and `read` back: a filter is, or the
    /// process's status could not be read.
    Pipe(i32, i32),
}

/// This process's pipe for reads under a filter (-1: none made yet).
static PIPE_READ: AtomicI32 = AtomicI32::new(-1);
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The process that made the pipe: a forked child makes its own (the parent's is shared).
static PIPE_PID: AtomicI32 = AtomicI32::new(0);

/// Whether a seccomp filter may stand between this process and `process_vm_readv`: anything
/// but `Seccomp:\t0` in `/proc/self/status` (a status that cannot be read counts as a filter).
fn filtered() -> bool {
    // SAFETY: a NUL-terminated literal path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return true;
    }
    let mut buf = [0u8; 4096];
    let mut len = 0usize;
    while let Some(rest) = buf.get_mut(len..)
        && !rest.is_empty()
    {
        // SAFETY: reads at most `rest.len()` bytes into our own buffer.
        let n = unsafe { libc::read(fd, rest.as_mut_ptr().cast(), rest.len()) };
        if n <= 0 {
            break;
        }
        len += n as usize;
    }
    // SAFETY: `fd` is ours, opened above.
    unsafe { libc::close(fd) };
    seccomp_mode(buf.get(..len).unwrap_or(&[])) != Some(b'0')
}

/// The first character of the `Seccomp:` field of a `/proc/PID/status` text, if it has one.
fn seccomp_mode(status: &[u8]) -> Option<u8> {
    const KEY: &[u8] = b"\nSeccomp:";
    let at = status.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    status
        .get(at..)?
        .iter()
        .copied()
        .find(|b| !b.is_ascii_whitespace())
}

/// This process's pipe for reads under a filter, made once per process: `None` where none can
/// be made.
fn pipe() -> Option<(i32, i32)> {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() };
    let (r, w) = (
        PIPE_READ.load(Ordering::Relaxed),
        PIPE_WRITE.load(Ordering::Relaxed),
    );
    if PIPE_PID.load(Ordering::Relaxed) == pid && r >= 0 {
        return Some((r, w));
    }
    if r >= 0 {
        // A forked child's copy of its parent's pipe: the child's own to close.
        // SAFETY: both descriptors are this process's copies of the parent's pipe.
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }
    let mut fds = [-1i32; 2];
    // SAFETY: `fds` holds the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        PIPE_READ.store(-1, Ordering::Relaxed);
        return None;
    }
    PIPE_READ.store(fds[0], Ordering::Relaxed);
    PIPE_WRITE.store(fds[1], Ordering::Relaxed);
    PIPE_PID.store(pid, Ordering::Relaxed);
    Some((fds[0], fds[1]))
}

/// The reader for the walk about to begin: `None` where the process has a filter and no pipe.
fn choose_reader() -> Option<Reader> {
    if filtered() {
        let (r, w) = pipe()?;
        Some(Reader::Pipe(r, w))
    } else {
        Some(Reader::Vm)
    }
}

/// Copies `len` bytes at `addr` into `out` through the pipe: the kernel copies them from
/// `addr` into the pipe, or answers EFAULT where it cannot read them (a short count where
/// only the first part reads). Whatever went in is read back, so the pipe is empty again.
/// `len` is at most a page, so one write of it is whole or refused (PIPE_BUF).
fn through_pipe(r: i32, w: i32, addr: usize, out: *mut u8, len: usize) -> bool {
    // SAFETY: the kernel reads `len` bytes at `addr` for us and answers EFAULT rather than
    // faulting where it cannot; the pipe is ours and empty.
    let put = unsafe { libc::write(w, addr as *const libc::c_void, len) };
    if put <= 0 {
        return false;
    }
    // SAFETY: `out` has room for `len` bytes (the callers' buffers) and `put <= len`.
    let got = unsafe { libc::read(r, out.cast(), put as usize) };
    put as usize == len && got == put
}

/// Reads `out.len()` words at `addr` of this process; false where any of them cannot be read.
fn read(reader: Reader, addr: usize, out: &mut [u64]) -> bool {
    let bytes = core::mem::size_of_val(out);
    if let Reader::Pipe(r, w) = reader {
        return through_pipe(r, w, addr, out.as_mut_ptr().cast(), bytes);
    }
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
fn read_each(reader: Reader, addrs: &[usize], out: &mut [u64; EDGES_AT_ONCE]) -> usize {
    let n = addrs.len().min(EDGES_AT_ONCE);
    if let Reader::Pipe(r, w) = reader {
        let mut got = 0;
        for (a, o) in addrs.iter().zip(out.iter_mut()).take(n) {
            let word: *mut u64 = o;
            if !through_pipe(r, w, *a, word.cast(), 8) {
                break;
            }
            got += 1;
        }
        return got;
    }
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
    if !read(tables.reader, vptr.checked_sub(8)?, &mut typeinfo)
        || !read(
            tables.reader,
            (typeinfo[0] as usize).checked_add(8)?,
            &mut name_at,
        )
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
        if !read(tables.reader, at, w) {
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
    let reader = choose_reader();
    if let Some(r) = reader {
        t.reader = r;
    }
    if !reader.is_some_and(|r| read(r, start, &mut head)) {
        // No way to read (a filter, and no pipe), or the running node, which is live, refused:
        // the process's doing, not the address's.
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
    if !read(t.reader, node, head) || !plausible(head) {
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
        if !read(t.reader, at as usize, chunk) {
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
        if read_each(t.reader, &targets[..asked], &mut numbers) != asked {
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
