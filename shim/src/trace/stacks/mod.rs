//! Call stacks for the trace: raw return addresses with the shim's own frames dropped,
//! interned once per distinct stack, and the module map needed to symbolize them offline
//! (written at open, and again whenever a new stack holds an address outside the known
//! modules, which covers libraries loaded later without hooking `dlopen`).

mod modules;

use modules::{known, scan_modules};

use crate::trace::RECORDER;
use core::cell::{Cell, UnsafeCell};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use gpushim_core::trace::format::{BUILD_ID_MAX, RecordKind};
use gpushim_core::trace::unwind::{self, MAX_FRAMES, NATIVE_FRAMES, PYTHON_FRAMES};

/// One memory call in this many gets its native stack; 0 for none. Set when the trace opens.
pub static EVERY: AtomicU32 = AtomicU32::new(0);
/// Whether allocations get their Python frames. Set when the trace opens.
pub static PYTHON: AtomicBool = AtomicBool::new(false);
/// Whether allocating calls get their native stack in a process that runs no CPython
/// (`stacks:auto`). Set when the trace opens.
pub static NATIVE_WITHOUT_PYTHON: AtomicBool = AtomicBool::new(false);

const MAX_MODULES: usize = 1024;
/// Address ranges of the modules written to the trace: [start, end) pairs.
static RANGES: [AtomicU64; 2 * MAX_MODULES] = [const { AtomicU64::new(0) }; 2 * MAX_MODULES];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Taken by the one thread that scans the module list (a slow path).
static SCANNING: AtomicBool = AtomicBool::new(false);
/// The shim's own address range, whose frames are dropped from stacks.
static SELF_START: AtomicU64 = AtomicU64::new(0);

/// What stands for the Python frames of an allocation made where none run (PyTorch's autograd
/// thread: the backward function it runs), as one frame and the autograd sequence number that
/// ties it to the forward (see [`sequence_bits`]); registered by the layer that knows
/// (hooks/torch.rs) as a `fn() -> (u64, u64)` ((0, 0): none).
static NO_PYTHON_FRAME: AtomicUsize = AtomicUsize::new(0);
/// The autograd sequence number the next node of a thread running Python takes: PyTorch's
/// `at::sequence_number::peek()` itself, registered by hooks/torch.rs when it finds it.
static FORWARD_SEQUENCE: AtomicUsize = AtomicUsize::new(0);

/// Registers what stands for the Python frames of an allocation made where none run.
pub fn set_no_python_frame(f: fn() -> (u64, u64)) {
    NO_PYTHON_FRAME.store(f as usize, Ordering::Release);
}

/// What runs once a record and its stack are written (a walk of the autograd graph the stack
/// found due), registered by hooks/torch.rs with the frame above.
static AFTER_STACK: AtomicUsize = AtomicUsize::new(0);

/// Registers what runs once a record and its stack are written.
pub fn set_after_stack(f: fn()) {
    AFTER_STACK.store(f as usize, Ordering::Release);
}

/// Runs what is registered to run once a record and its stack are written, if anything.
pub fn after_stack() {
    let f = AFTER_STACK.load(Ordering::Acquire);
    if f == 0 {
        return;
    }
    // SAFETY: only `set_after_stack` stores here, always a `fn()`.
    let f = unsafe { core::mem::transmute::<usize, fn()>(f) };
    f()
}

/// Registers where a tensor allocated by a thread running Python reads its autograd sequence
/// number.
pub fn set_forward_sequence(f: unsafe extern "C" fn() -> u64) {
    FORWARD_SEQUENCE.store(f as usize, Ordering::Release);
}

/// The frame that stands in, and its sequence number, if one is registered and has one for
/// this thread now.
fn no_python_frame() -> (u64, u64) {
    let f = NO_PYTHON_FRAME.load(Ordering::Acquire);
    if f == 0 {
        return (0, 0);
    }
    // SAFETY: only `set_no_python_frame` stores here, always a `fn() -> (u64, u64)`.
    let f = unsafe { core::mem::transmute::<usize, fn() -> (u64, u64)>(f) };
    f()
}

/// The sequence number of a tensor allocated by a thread running Python (0: none known).
fn forward_sequence() -> u64 {
    let f = FORWARD_SEQUENCE.load(Ordering::Acquire);
    if f == 0 {
        return 0;
    }
    // SAFETY: only `set_forward_sequence` stores here, always PyTorch's `peek`, which takes
    // nothing and reads one thread-local.
    unsafe { core::mem::transmute::<usize, unsafe extern "C" fn() -> u64>(f)() }
}

/// A `StackRef`'s `size`: the stack's frame count in its low 8 bits and the autograd sequence
/// number above them (40 bits; see `format::RecordKind::StackRef`).
fn sequence_bits(frames: usize, sequence: u64) -> u64 {
    (frames as u64 & 0xff) | (sequence & ((1 << 40) - 1)) << 8
}
static SELF_END: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// Called before the trace is opened, so that what another thread records the moment the
/// trace is ready already gets the stack its configuration asks for: which stacks to take, and
/// no modules known of an earlier trace (a forked child's parent's).
pub fn configure(every: u32, python: bool, native_without_python: bool) {
    EVERY.store(every, Ordering::Relaxed);
    PYTHON.store(python, Ordering::Relaxed);
    NATIVE_WITHOUT_PYTHON.store(native_without_python, Ordering::Relaxed);
    COUNT.store(0, Ordering::Release);
}

/// Called once the trace is open: writes the current module map if native stacks are sampled
/// (a stack taken before it is done writes the modules it needs itself, see [`intern`]).
pub fn on_open() {
    if EVERY.load(Ordering::Relaxed) != 0 {
        scan_modules();
    }
}

/// Whether a record makes memory live (the calls whose Python frames are worth their cost).
fn allocates(kind: RecordKind) -> bool {
    use RecordKind::*;
    matches!(
        kind,
        Alloc
            | AllocAsync
            | ManagedAlloc
            | HostAlloc
            | PhysCreate
            | AddressReserve
            | PoolStreams
            | TensorAlloc
            | TensorOom
    )
}

/// The Python stack this thread recorded last, in the trace of `generation`: its id and frames.
/// A loop allocates from the same lines over and over; a stack equal to the last one (a
/// compare of its frames) takes its id without hashing it or looking it up in the shared table.
struct LastPython {
    generation: u32,
    id: u64,
    n: usize,
    frames: [u64; PYTHON_FRAMES],
}

thread_local! {
    static LAST_PYTHON: UnsafeCell<LastPython> = const {
        UnsafeCell::new(LastPython { generation: 0, id: 0, n: 0, frames: [0; PYTHON_FRAMES] })
    };
}

/// Records the calling thread's stack after its record (written at `now`): its Python frames
/// (allocations by a thread running Python), then its native frames if this call is sampled.
pub fn maybe_record(thread: u16, kind: RecordKind, now: u64) {
    let every = EVERY.load(Ordering::Relaxed);
    let python =
        PYTHON.load(Ordering::Relaxed) && allocates(kind) && !crate::trace::python::absent();
    let mut sampled = every != 0 && {
        let n = CALLS
            .try_with(|c| {
                let v = c.get().wrapping_add(1);
                c.set(v);
                v
            })
            .unwrap_or(0);
        n % every == 0
    };
    let fallback = NATIVE_WITHOUT_PYTHON.load(Ordering::Relaxed) && allocates(kind);
    if !python && !sampled && !fallback {
        return;
    }
    let mut frames = [0u64; MAX_FRAMES + 8];
    let mut py = if python {
        crate::trace::python::capture(&mut frames[..PYTHON_FRAMES])
    } else {
        0
    };
    // What ties a tensor to the autograd node of its forward: on a thread running Python, the
    // sequence number the op's node took just before it allocated its output; on the autograd
    // thread, the running node's own number + 1. Equal numbers join the two.
    let mut sequence = 0;
    if python && py == 0 {
        let (stand_in, s) = no_python_frame();
        if stand_in != 0 {
            frames[0] = stand_in;
            py = 1;
            sequence = s;
        }
    } else if py > 0 && kind == RecordKind::TensorAlloc {
        sequence = forward_sequence();
    }
    // A process that runs no CPython (known after its first capture looked; not one whose
    // frames are refused, whose tensors would each pay for an unwind): the allocating call's
    // native stack instead, where the unwinder takes no lock of the loader's.
    if fallback && !sampled && crate::trace::python::no_interpreter() && unwinder_takes_no_lock() {
        if SELF_END.load(Ordering::Relaxed) == 0 {
            scan_modules();
        }
        sampled = true;
    }
    if py == 0 && !sampled {
        return;
    }
    let mut total = py;
    if sampled {
        let room = &mut frames[py..py + NATIVE_FRAMES + 8];
        let n = native(room);
        let (lo, hi) = (
            SELF_START.load(Ordering::Relaxed),
            SELF_END.load(Ordering::Relaxed),
        );
        let first = room[..n]
            .iter()
            .position(|ip| !(lo..hi).contains(ip))
            .unwrap_or(n);
        let kept = (n - first).min(NATIVE_FRAMES);
        room.copy_within(first..first + kept, 0);
        total = py + kept;
    }
    if total == 0 {
        return;
    }
    let frames = &frames[..total];
    let t0 = crate::costs::start();
    let id = if sampled {
        intern(frames, py)
    } else {
        let generation = RECORDER.generation();
        LAST_PYTHON
            .try_with(|last| {
                // SAFETY: only this thread touches its LAST_PYTHON, never re-entrantly (the
                // hooks' guard keeps a capture from starting inside another, and the tracker
                // runs on the allocating thread under PyTorch's lock).
                let last = unsafe { &mut *last.get() };
                if last.generation == generation && last.id != 0 && last.frames[..last.n] == *frames
                {
                    return last.id;
                }
                let id = intern(frames, py);
                last.generation = generation;
                last.id = id;
                last.n = frames.len();
                last.frames[..frames.len()].copy_from_slice(frames);
                id
            })
            .unwrap_or_else(|_| intern(frames, py))
    };
    RECORDER.append(
        &crate::trace::Event::stack_ref(id, sequence_bits(frames.len(), sequence))
            .record(now, thread, 0),
    );
    crate::costs::end(crate::costs::Cost::Intern, t0);
}

/// The id of `frames` (its first `py` Python's) in the trace's table, the module map written
/// first when a new stack holds an address outside the known modules.
fn intern(frames: &[u64], py: usize) -> u64 {
    let (id, new) = RECORDER.intern_stack(frames);
    if new && frames[py..].iter().any(|&ip| !known(ip)) {
        scan_modules();
    }
    id
}

/// Records who called the shim for the thread's device allocation just recorded (a `Caller`
/// record): the first two return addresses outside the shim, so reports can name the library
/// that owns the memory (PyTorch, NCCL, cuBLAS, ...) with no stack recorded. The shim's own
/// range is learned from the module scan, made once here if stacks are off.
pub fn record_caller(thread: u16) {
    if !unwinder_takes_no_lock() {
        return;
    }
    if SELF_END.load(Ordering::Relaxed) == 0 {
        scan_modules();
    }
    let mut room = [0u64; DEPTH];
    let n = native(&mut room);
    let (lo, hi) = (
        SELF_START.load(Ordering::Relaxed),
        SELF_END.load(Ordering::Relaxed),
    );
    let mut outside = room[..n]
        .iter()
        .copied()
        .filter(|ip| !(lo..hi).contains(ip));
    let Some(first) = outside.next() else {
        return;
    };
    let second = outside.next().unwrap_or(0);
    if !known(first) || (second != 0 && !known(second)) {
        scan_modules();
    }
    RECORDER.append(&crate::trace::Event::caller(first, second).record(
        RECORDER.now_ns(),
        thread,
        0,
    ));
}

/// Whether the unwinder finds unwind tables without the dynamic loader's lock: glibc 2.35 and
/// later give it `_dl_find_object`. Before, it takes the lock on every frame, and a caller that
/// holds a lock of CUDA's while a thread in `dlopen` (holding the loader's) waits for it would
/// deadlock: on those systems allocations carry no owner, as with any call where Python frames
/// alone are recorded.
fn unwinder_takes_no_lock() -> bool {
    static ANSWER: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);
    match ANSWER.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
            let v = unsafe { core::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
            let mut parts = v.to_bytes().split(|&c| c == b'.').map(|x| {
                core::str::from_utf8(x)
                    .ok()
                    .and_then(|x| x.parse::<u32>().ok())
            });
            let version = (parts.next().flatten(), parts.next().flatten());
            let ok = matches!(version, (Some(major), Some(minor)) if (major, minor) >= (2, 35));
            ANSWER.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
            ok
        }
    }
}

/// Native frames captured in full, plus up to this many of the shim's own.
const DEPTH: usize = NATIVE_FRAMES + 8;
/// Stacks remembered per thread.
const REMEMBERED: usize = 8;

/// A stack this thread captured: where the capture started on the thread's stack, and each
/// frame's return address and canonical frame address.
#[derive(Clone, Copy)]
struct Known {
    anchor: usize,
    n: usize,
    ips: [u64; DEPTH],
    cfas: [u64; DEPTH],
}

const NONE_KNOWN: Known = Known {
    anchor: 0,
    n: 0,
    ips: [0; DEPTH],
    cfas: [0; DEPTH],
};

thread_local! {
    /// This thread's recent stacks, and the next slot to replace.
    static KNOWN: UnsafeCell<([Known; REMEMBERED], usize)> =
        const { UnsafeCell::new(([NONE_KNOWN; REMEMBERED], 0)) };
}

/// The calling thread's native stack (innermost first, the shim's own frames included),
/// written into `room`; returns how many frames.
///
/// Unwinding costs about 120 ns a frame (libgcc reads the DWARF rules of each). A stack seen
/// before is recognized instead (x86_64): the capture starts at the same place on the thread's
/// stack, and each remembered frame's return-address slot (just below the stack address the
/// frame stood at when it made its call) still holds the remembered return address. That is
/// exact: this function is the same code at the same stack position; and when the frames
/// inward of frame `i` are the same code at the same addresses, frame `i` stood at the same
/// address when it called, and what its slot holds now was written by the call that is live
/// now. Only slots above this function's frame are read: live stack, mapped.
#[inline(never)]
fn native(room: &mut [u64]) -> usize {
    let marker = 0u8;
    let anchor = core::hint::black_box(&marker) as *const u8 as usize;
    let len = room.len().min(DEPTH);
    let room = &mut room[..len];
    if cfg!(target_arch = "x86_64") {
        let hit = KNOWN.try_with(|k| {
            // SAFETY: only this thread touches its KNOWN, never re-entrantly (the hooks' guard
            // keeps a capture from starting inside another).
            let (known, _) = unsafe { &*k.get() };
            known
                .iter()
                .find(|s| s.anchor == anchor && s.n > 1 && still_there(s, anchor))
                .map(|s| {
                    room[..s.n].copy_from_slice(&s.ips[..s.n]);
                    s.n
                })
        });
        if let Ok(Some(n)) = hit {
            return n.min(room.len());
        }
    }
    let mut ips = [0u64; DEPTH];
    let mut cfas = [0u64; DEPTH];
    let n = unwind::capture_with_cfas(0, &mut ips, &mut cfas).min(room.len());
    room[..n].copy_from_slice(&ips[..n]);
    if cfg!(target_arch = "x86_64") {
        let _ = KNOWN.try_with(|k| {
            // SAFETY: as above.
            let (known, next) = unsafe { &mut *k.get() };
            known[*next] = Known {
                anchor,
                n,
                ips,
                cfas,
            };
            *next = (*next + 1) % REMEMBERED;
        });
    }
    n
}

/// Whether a remembered stack is the calling thread's stack now (see [`native`]). Frame `i`'s
/// recorded stack address is where its stack pointer stood at its call, so the return address
/// into frame `i` lies just below it. The frames from this function inward (the unwinder's,
/// which ran inside it, and this function's own call site) are the same code every time and are
/// not read: that memory belongs to calls made now.
fn still_there(s: &Known, anchor: usize) -> bool {
    let Some(own) = s.cfas[..s.n].iter().position(|&c| c > anchor as u64) else {
        return false;
    };
    let mut below = s.cfas[own];
    for i in own + 1..s.n {
        let sp = s.cfas[i];
        // Stack addresses rise towards the thread's first frame; anything else is not a stack
        // we can check, so it is unwound again.
        if sp < below + 8 {
            return false;
        }
        below = sp;
        // SAFETY: `sp - 8` lies in this thread's live stack, above this function's frame
        // (checked just above), so it is mapped and readable.
        let slot = unsafe { core::ptr::read_volatile((sp - 8) as *const u64) };
        if slot != s.ips[i] {
            return false;
        }
    }
    true
}
