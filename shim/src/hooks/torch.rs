//! PyTorch's tensors under its own caching allocator (design contract 10).
//!
//! PyTorch's native caching allocator calls every *trace tracker* attached to it for every
//! tensor it hands out and frees, and for every segment it takes from CUDA or gives back, also
//! while its own memory history is off (`docs/cuda-facts.md`, "PyTorch's allocator trace"). The
//! shim attaches one the first time PyTorch's allocator takes a segment, and from then on records
//! each tensor with the Python line of the thread that asked for it. PyTorch's behaviour does not
//! change: its allocator, graphs, statistics and snapshots are its own.
//!
//! Nothing read from PyTorch is believed unchecked:
//! - the allocator object must be `NativeCachingAllocator` (its C++ type name, from the object's
//!   own type information): the `cudaMallocAsync` backend and pluggable allocators have no trace,
//!   and their tensors are the allocation calls the shim records anyway;
//! - the version must be one whose virtual-function slot and event layout are known (read from
//!   each version's headers, see [`SLOTS`]), and the function in that slot must lie in the same
//!   library;
//! - the first segment event must name exactly the allocation the shim just saw the same thread
//!   make (`cudaMalloc`, or the `cuMemMap` of an expandable segment). Until it does, tensor
//!   events are dropped; if it does not, tensors stay off.
//!
//! Whatever fails is said once on stderr and in the trace (a `tensors` record with the reason);
//! the reports then speak of segments.

use crate::os::say;
use crate::{state, trace};
use core::cell::Cell;
use core::ffi::{CStr, c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use gpushim_core::trace::format::tensors_off;

const UNDECIDED: u8 = 0;
const ATTACHING: u8 = 1;
/// Attached; waiting for the first segment event to check the layout.
const TRIAL: u8 = 2;
const ON: u8 = 3;
const OFF: u8 = 4;
static STATE: AtomicU8 = AtomicU8::new(UNDECIDED);
/// When to look for PyTorch's library next (CLOCK_MONOTONIC ns): a program without PyTorch
/// pays one look per this interval at most, and only on allocation calls.
static NEXT_LOOK_NS: AtomicU64 = AtomicU64::new(0);
const LOOK_EVERY_NS: u64 = 100_000_000;

thread_local! {
    /// The device allocation this thread made last: address, size, and whether it was a VMM
    /// mapping (`cuMemMap`) rather than a whole allocation.
    static LAST: Cell<(u64, u64, bool)> = const { Cell::new((0, 0, false)) };
}

/// `torch::autograd::get_current_node()` (libtorch_cpu.so): the backward function PyTorch's
/// autograd engine runs on the calling thread, as a `std::shared_ptr<Node>` (empty elsewhere).
const CURRENT_NODE: &CStr = c"_ZN5torch8autograd16get_current_nodeEv";
static CURRENT_NODE_FN: AtomicUsize = AtomicUsize::new(0);
/// `at::sequence_number::peek()`: the sequence number the calling thread's next autograd node
/// takes. An op of the forward makes its node, then allocates its output: a tensor allocated
/// with this number belongs to the node numbered one less.
const SEQUENCE_PEEK: &CStr = c"_ZN2at15sequence_number4peekEv";

/// The C++ type name of PyTorch's native caching allocator (Itanium mangling, as the type
/// information holds it).
const NATIVE: &[u8] = b"N3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocatorE";
/// `c10::cuda::CUDACachingAllocator::allocator`, the `std::atomic<CUDAAllocator*>` that names the
/// allocator in use (exported by `libc10_cuda.so` in every version).
const ALLOCATOR: &CStr = c"_ZN3c104cuda20CUDACachingAllocator9allocatorE";

/// The vtable slot of `CUDAAllocator::attachAllocatorTraceTracker` by torch version (major,
/// minor), found by compiling a pointer to that member against each version's own headers
/// (`scripts/torch-layout.sh`). The event's fields lie at the same offsets in all of them:
/// `action_` (int) at 0, `device_` at 4, `addr_` at 8, `stream_` at 32, `size_` at 40.
const SLOTS: &[((u32, u32), usize)] = &[
    ((2, 4), 28),
    ((2, 5), 30),
    ((2, 6), 35),
    ((2, 7), 35),
    ((2, 8), 38),
    ((2, 9), 39),
    ((2, 10), 44),
    ((2, 11), 44),
];

/// Offsets in `TraceEntry`.
const ACTION: usize = 0;
const DEVICE: usize = 4;
const ADDR: usize = 8;
const STREAM: usize = 32;
const SIZE: usize = 40;
/// `mempool_`, the id of the pool the event belongs to (a pair of `unsigned long long`; {0, 0}
/// for the default pools), from torch 2.8 on: 2.4 to 2.7 have no such field and keep `time_`
/// here (read from each version's headers, as `SLOTS`).
const MEMPOOL: usize = 48;
const MEMPOOL_SINCE: (u32, u32) = (2, 8);

/// Whether the events of the attached allocator carry `mempool_` (its version is 2.8 or later).
static MEMPOOL_KNOWN: AtomicBool = AtomicBool::new(false);

/// `TraceEntry::Action`.
const ALLOC: i32 = 0;
const FREE_REQUESTED: i32 = 1;
const FREE_COMPLETED: i32 = 2;
const SEGMENT_ALLOC: i32 = 3;
const SEGMENT_FREE: i32 = 4;
const SEGMENT_MAP: i32 = 5;
const SEGMENT_UNMAP: i32 = 6;
const SNAPSHOT: i32 = 7;
const OOM: i32 = 8;

/// A device allocation (`cudaMalloc`, pooled or not) succeeded on this thread.
pub fn after_device_alloc(ptr: u64, size: u64) {
    note(ptr, size, false);
}

/// A VMM mapping (`cuMemMap`) succeeded on this thread.
pub fn after_map(ptr: u64, size: u64) {
    note(ptr, size, true);
}

fn note(ptr: u64, size: u64, map: bool) {
    let st = STATE.load(Ordering::Relaxed);
    if st == OFF || st == ON {
        return;
    }
    let _ = LAST.try_with(|l| l.set((ptr, size, map)));
    if st == UNDECIDED {
        maybe_attach();
    }
}

/// Looks for PyTorch's allocator (at most once per [`LOOK_EVERY_NS`]) and attaches the tracker.
#[cold]
fn maybe_attach() {
    let now = gpushim_core::trace::recorder::clock_ns(libc::CLOCK_MONOTONIC);
    let next = NEXT_LOOK_NS.load(Ordering::Relaxed);
    if now < next
        || NEXT_LOOK_NS
            .compare_exchange(
                next,
                now + LOOK_EVERY_NS,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
    {
        return;
    }
    let conf = state::conf();
    if !conf.tensors {
        off(tensors_off::CONFIGURED);
        return;
    }
    super::graph::configure(conf.graph);
    // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a library already loaded.
    let h = unsafe {
        libc::dlopen(
            c"libc10_cuda.so".as_ptr(),
            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
        )
    };
    if h.is_null() {
        return;
    }
    if STATE
        .compare_exchange(UNDECIDED, ATTACHING, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        // SAFETY: `h` is the loaded library's handle.
        match unsafe { attach(h) } {
            Ok(()) => STATE.store(TRIAL, Ordering::Release),
            Err(None) => STATE.store(UNDECIDED, Ordering::Release),
            Err(Some(code)) => off(code),
        }
    }
    if let Some(close) = crate::cuda::real::real_dlclose() {
        // SAFETY: balances the dlopen above.
        unsafe { close(h) };
    }
}

/// libstdc++'s `std::function` (32 bytes): the stored functor, the manager, the invoker.
#[repr(C)]
struct StdFunction {
    functor: [usize; 2],
    manager: unsafe extern "C" fn(*mut [usize; 2], *const [usize; 2], c_int) -> bool,
    invoker: unsafe extern "C" fn(*const [usize; 2], *const u8),
}

/// `typeid(void)`, what the manager answers when asked for the functor's type.
static TYPEINFO_VOID: AtomicUsize = AtomicUsize::new(0);

/// The manager of our `std::function`: it holds no state, so copies are bitwise and nothing
/// is destroyed.
unsafe extern "C" fn manage(dest: *mut [usize; 2], src: *const [usize; 2], op: c_int) -> bool {
    // SAFETY: libstdc++ passes valid `_Any_data` storage for both.
    unsafe {
        match op {
            // __get_type_info
            0 => (*dest)[0] = TYPEINFO_VOID.load(Ordering::Relaxed),
            // __get_functor_ptr
            1 => (*dest)[0] = src as usize,
            // __clone_functor
            2 => *dest = *src,
            // __destroy_functor
            _ => {}
        }
    }
    false
}

/// Attaches the tracker to the allocator of the library `h`. `Err(None)`: not ready yet (no
/// allocator); `Err(Some(code))`: tensors stay off for the reason `code`.
///
/// # Safety
/// `h` must be the handle of the loaded `libc10_cuda.so`.
unsafe fn attach(h: *mut c_void) -> Result<(), Option<u64>> {
    let Some(dlsym) = crate::cuda::real::real_dlsym() else {
        return Err(None);
    };
    // SAFETY: a handle and a NUL-terminated name.
    let cell = unsafe { dlsym(h, ALLOCATOR.as_ptr()) } as *const AtomicUsize;
    if cell.is_null() {
        return Err(Some(tensors_off::UNKNOWN_VERSION));
    }
    // SAFETY: the exported `std::atomic<CUDAAllocator*>`, a pointer-sized atomic.
    let obj = unsafe { (*cell).load(Ordering::Acquire) };
    if obj == 0 {
        return Err(None);
    }
    // SAFETY: `obj` is a live polymorphic C++ object: its first word is its vtable pointer, and
    // the word before the vtable's first function is its type information, whose second word is
    // the type's mangled name (Itanium C++ ABI).
    let name = unsafe {
        let vptr = *(obj as *const *const usize);
        let typeinfo = *vptr.sub(1) as *const *const c_char;
        CStr::from_ptr(*typeinfo.add(1))
    };
    let name = name.to_bytes();
    if name.strip_prefix(b"*").unwrap_or(name) != NATIVE {
        return Err(Some(tensors_off::OTHER_BACKEND));
    }
    let lib = library_of(cell as usize).ok_or(Some(tensors_off::UNKNOWN_VERSION))?;
    let version = torch_version(&lib.1).ok_or(Some(tensors_off::UNKNOWN_VERSION))?;
    let slot = SLOTS
        .iter()
        .find(|(v, _)| *v == version)
        .map(|&(_, s)| s)
        .ok_or(Some(tensors_off::UNKNOWN_VERSION))?;
    MEMPOOL_KNOWN.store(version >= MEMPOOL_SINCE, Ordering::Relaxed);
    // SAFETY: as above; the vtable of this version has at least `slot + 1` functions.
    let f = unsafe { *(*(obj as *const *const usize)).add(slot) };
    if library_of(f).map(|l| l.0) != Some(lib.0) {
        return Err(Some(tensors_off::UNKNOWN_VERSION));
    }
    // SAFETY: a NUL-terminated name; `typeid(void)` lives in libstdc++ if it is loaded.
    let ti = unsafe { dlsym(libc::RTLD_DEFAULT, c"_ZTIv".as_ptr()) };
    TYPEINFO_VOID.store(ti as usize, Ordering::Relaxed);
    let mut tracker = StdFunction {
        functor: [0; 2],
        manager: manage,
        invoker: invoke,
    };
    type Attach = unsafe extern "C" fn(usize, *mut StdFunction);
    // SAFETY: `f` is `NativeCachingAllocator::attachAllocatorTraceTracker(AllocatorTraceTracker)`
    // of this version: `this`, then the by-value `std::function` passed by address (Itanium
    // C++ ABI). It copies or moves it; ours needs no destruction.
    unsafe {
        let attach: Attach = core::mem::transmute::<usize, Attach>(f);
        attach(obj, &mut tracker);
    }
    find_current_node();
    Ok(())
}

/// Finds `get_current_node` in the loaded libtorch_cpu.so, so that a tensor PyTorch's autograd
/// thread allocates (no Python runs there) is named by the backward function that asked.
fn find_current_node() {
    let Some([f, peek]) =
        crate::cuda::real::loaded_symbols(c"libtorch_cpu.so", [CURRENT_NODE, SEQUENCE_PEEK])
    else {
        return;
    };
    if f != 0 {
        CURRENT_NODE_FN.store(f, Ordering::Release);
        trace::stacks::set_no_python_frame(autograd_frame);
        trace::stacks::set_after_stack(super::graph::walk_pending);
    }
    if peek != 0 && f != 0 {
        // SAFETY: `peek` is `uint64_t at::sequence_number::peek()`: no arguments, an integer
        // back (the C ABI's), reading one thread-local.
        let peek = unsafe { core::mem::transmute::<usize, unsafe extern "C" fn() -> u64>(peek) };
        trace::stacks::set_forward_sequence(peek);
    }
}

thread_local! {
    /// Backward functions named on this thread: (vtable, trace generation, frame), by vtable.
    static NODE_FRAMES: [Cell<(usize, u32, u64)>; 64] =
        const { [const { Cell::new((0, 0, 0)) }; 64] };
}

/// Where a `Node`'s fields lie (PyTorch's `torch::autograd::Node`: its vtable pointer, the
/// `enable_shared_from_this` weak pointer, then `sequence_nr_`, `topological_nr_`,
/// `has_parent_` and `thread_id_`, the same in every 2.x release).
const NODE_SEQUENCE: usize = 24;
const NODE_HAS_PARENT: usize = 40;
const NODE_THREAD: usize = 48;

/// The running node's sequence number + 1 (what a forward tensor of its op recorded), or 0
/// where the fields do not read as a node's (then nothing is joined).
///
/// # Safety
/// `node` is a live `Node`, which is larger than the fields read.
unsafe fn node_sequence(node: usize) -> u64 {
    // SAFETY: reads inside the live node (the caller's promise); integers of any value.
    let (sequence, has_parent, thread) = unsafe {
        (
            (node as *const u8).add(NODE_SEQUENCE).cast::<u64>().read(),
            (node as *const u8).add(NODE_HAS_PARENT).read(),
            (node as *const u8).add(NODE_THREAD).cast::<u64>().read(),
        )
    };
    // `AccumulateGrad` takes u64::MAX (it has no forward op); a number past 2^40 or a thread id
    // past 2^32 is no layout PyTorch has.
    let plausible = sequence < 1 << 40 && has_parent <= 1 && thread != 0 && thread < 1 << 32;
    if plausible { sequence + 1 } else { 0 }
}

/// The frame that names the backward function this thread runs now: a Python-style frame of
/// file `<backward>` and the function's class name (`MmBackward0`), with the sequence number
/// that joins it to its forward ([`node_sequence`]); (0, 0) when none runs.
fn autograd_frame() -> (u64, u64) {
    let f = CURRENT_NODE_FN.load(Ordering::Acquire);
    if f == 0 {
        return (0, 0);
    }
    let mut out = [0usize; 2];
    type Get = unsafe extern "C" fn(*mut [usize; 2]) -> *mut [usize; 2];
    // SAFETY: `f` is `std::shared_ptr<Node> get_current_node()`: a class with a non-trivial
    // destructor comes back through a hidden pointer to its storage, the first argument
    // (Itanium C++ ABI); libstdc++'s shared_ptr is (object, control block). It copies a
    // thread-local shared_ptr and takes no lock.
    unsafe { core::mem::transmute::<usize, Get>(f)(&mut out) };
    let (node, control) = (out[0], out[1]);
    if control != 0 {
        // SAFETY: libstdc++'s control block holds its use count (an int) after its vtable
        // pointer. The engine holds the node while it runs it, so ours is never the last
        // reference; were it, the count goes back up (the node is kept rather than freed here).
        let count = unsafe { &*((control + 8) as *const core::sync::atomic::AtomicI32) };
        if count.fetch_sub(1, Ordering::AcqRel) == 1 {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
    if node == 0 {
        return (0, 0);
    }
    // SAFETY: the engine holds the node it runs.
    let sequence = unsafe { node_sequence(node) };
    super::graph::on_backward(node, sequence);
    // SAFETY: a live `Node`, a polymorphic class with no polymorphic base: its vtable pointer
    // is its first word.
    let vptr = unsafe { *(node as *const usize) };
    let generation = trace::RECORDER.generation();
    let slot = (vptr >> 4) % 64;
    if let Ok((v, g, frame)) = NODE_FRAMES.try_with(|c| c[slot].get())
        && v == vptr
        && g == generation
    {
        return (frame, sequence);
    }
    // SAFETY: the word before a vtable's first function is its type information, whose second
    // word is the type's mangled name, NUL-terminated (Itanium C++ ABI).
    let mangled = unsafe {
        let typeinfo = *(vptr as *const *const *const c_char).sub(1);
        CStr::from_ptr(*typeinfo.add(1))
    };
    let Some(name) = class_name(mangled.to_bytes()) else {
        return (0, 0);
    };
    let mut text = [0u8; 140];
    const FILE: &[u8] = b"<backward>\0";
    text[..FILE.len()].copy_from_slice(FILE);
    text[FILE.len()..FILE.len() + name.len()].copy_from_slice(name);
    let id = trace::RECORDER.intern_string(&text[..FILE.len() + name.len()]);
    if id == 0 {
        return (0, 0);
    }
    let frame = gpushim_core::trace::format::py_frame(id, 0);
    let _ = NODE_FRAMES.try_with(|c| c[slot].set((vptr, generation, frame)));
    (frame, sequence)
}

/// The innermost name of a mangled class name (`N5torch8autograd9generated11MmBackward0E` is
/// `MmBackward0`), if it reads as one: lengths and identifiers, at most 128 bytes.
pub(super) fn class_name(m: &[u8]) -> Option<&[u8]> {
    let nested = m.first() == Some(&b'N');
    let mut rest = if nested { &m[1..] } else { m };
    let mut last: Option<&[u8]> = None;
    loop {
        if rest.is_empty() || (nested && rest == b"E") {
            break;
        }
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || digits > 3 {
            return None;
        }
        let len: usize = core::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
        let name = rest.get(digits..digits + len)?;
        if name.is_empty() || !name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_') {
            return None;
        }
        last = Some(name);
        rest = &rest[digits + len..];
    }
    last.filter(|n| n.len() <= 128)
}

/// The load base and path of the library holding address `p`.
fn library_of(p: usize) -> Option<(usize, std::path::PathBuf)> {
    // SAFETY: an all-zero Dl_info is a valid out-buffer; dladdr only reads the loader's tables.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(p as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr's file name is NUL-terminated and owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes())).to_path_buf();
    Some((info.dli_fbase as usize, path))
}

/// The (major, minor) version of the torch package whose `lib/` holds `lib`, from its
/// `version.py` (`__version__ = '2.11.0+cu130'`).
fn torch_version(lib: &std::path::Path) -> Option<(u32, u32)> {
    let file = lib.parent()?.parent()?.join("version.py");
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with("__version__"))?;
    let v = line.split(['\'', '"']).nth(1)?;
    let mut parts = v.split(['.', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Tensors stay off for the reason `code`: said once (unless turned off on purpose), and
/// recorded.
fn off(code: u64) {
    if STATE.swap(OFF, Ordering::AcqRel) == OFF {
        return;
    }
    trace::record(trace::Event::tensors(false, code));
    if code != tensors_off::CONFIGURED {
        say(format_args!(
            "tensors are not recorded: {}; reports show PyTorch's segments",
            tensors_off::reason(code)
        ));
    }
}

/// The tracker: PyTorch calls it on the thread that asked, under its allocator's lock, for
/// every event. It records; it never calls PyTorch or CUDA.
unsafe extern "C" fn invoke(_functor: *const [usize; 2], e: *const u8) {
    let t0 = crate::costs::start();
    // SAFETY: as this function's own.
    unsafe { tracked(e) };
    crate::costs::end(crate::costs::Cost::Tensor, t0);
}

/// What the tracker does with one event.
///
/// # Safety
/// `e` is PyTorch's `TraceEntry` for this call.
unsafe fn tracked(e: *const u8) {
    let st = STATE.load(Ordering::Acquire);
    if st != TRIAL && st != ON {
        return;
    }
    // SAFETY: PyTorch passes its `TraceEntry`, whose fields lie at these offsets in every known
    // version (checked by the trial below before anything is believed).
    let (action, device, addr, stream, size) = unsafe {
        (
            e.add(ACTION).cast::<i32>().read_unaligned(),
            e.add(DEVICE).read(),
            e.add(ADDR).cast::<u64>().read_unaligned(),
            e.add(STREAM).cast::<u64>().read_unaligned(),
            e.add(SIZE).cast::<u64>().read_unaligned(),
        )
    };
    if st == TRIAL {
        let (ptr, len, map) = LAST.try_with(Cell::get).unwrap_or((0, 0, false));
        let matches = match action {
            SEGMENT_ALLOC => !map && ptr == addr && len == size,
            SEGMENT_MAP => map && ptr >= addr && ptr.checked_add(len) <= addr.checked_add(size),
            ALLOC | FREE_REQUESTED | FREE_COMPLETED | SEGMENT_FREE | SEGMENT_UNMAP | SNAPSHOT
            | OOM => return,
            _ => {
                off(tensors_off::UNKNOWN_EVENT);
                return;
            }
        };
        if !matches {
            off(tensors_off::MISMATCH);
            return;
        }
        if STATE
            .compare_exchange(TRIAL, ON, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            trace::record(trace::Event::tensors(true, 0));
            trace::before_exit(super::requested::record_at_exit);
        }
    }
    let pending = super::requested::take(device);
    if action == FREE_COMPLETED && pending.0 == addr {
        trace::record(trace::Event::tensor_free(addr, size, device).on(stream));
        return;
    }
    if pending.0 != 0 {
        let (p, n, s) = pending;
        trace::record(trace::Event::tensor_free_requested(p, n, device).on(s));
    }
    if action == FREE_REQUESTED && super::requested::hold(device, addr, size, stream) {
        return;
    }
    // The pool of a tensor, a segment or a failure: a private one (a CUDA graph's, a
    // `torch.cuda.MemPool`) says so after the event. Frees need none: they name their tensor.
    let pool = if MEMPOOL_KNOWN.load(Ordering::Relaxed)
        && matches!(
            action,
            ALLOC | SEGMENT_ALLOC | SEGMENT_MAP | SEGMENT_FREE | SEGMENT_UNMAP | OOM
        ) {
        // SAFETY: this version's `TraceEntry` has `mempool_`, two 8-byte words at `MEMPOOL`.
        unsafe {
            (
                e.add(MEMPOOL).cast::<u64>().read_unaligned(),
                e.add(MEMPOOL + 8).cast::<u64>().read_unaligned(),
            )
        }
    } else {
        (0, 0)
    };
    // A segment of pages mapped or unmapped (expandable segments) says so.
    let pages = matches!(action, SEGMENT_MAP | SEGMENT_UNMAP);
    let e = match action {
        ALLOC => trace::Event::tensor_alloc(addr, size, device),
        FREE_REQUESTED => trace::Event::tensor_free_requested(addr, size, device),
        FREE_COMPLETED => trace::Event::tensor_free(addr, size, device),
        SEGMENT_ALLOC | SEGMENT_MAP => {
            trace::Event::framework_segment_reserve(addr, size, device, pages)
        }
        SEGMENT_FREE | SEGMENT_UNMAP => {
            trace::Event::framework_segment_release(addr, size, device, pages)
        }
        // For an OOM, `addr_` is the free memory CUDA reported.
        OOM => trace::Event::tensor_oom(addr, size, device),
        SNAPSHOT => return,
        _ => {
            off(tensors_off::UNKNOWN_EVENT);
            return;
        }
    };
    trace::record(e.on(stream));
    if pool != (0, 0) {
        trace::record(trace::Event::tensor_pool(pool.0, pool.1, device));
    }
}

#[cfg(test)]
mod tests {
    use super::class_name;

    #[test]
    fn a_backward_functions_class_name_is_its_innermost_name() {
        assert_eq!(
            class_name(b"N5torch8autograd9generated11MmBackward0E"),
            Some(&b"MmBackward0"[..])
        );
        assert_eq!(
            class_name(b"N5torch8autograd6PyNodeE"),
            Some(&b"PyNode"[..])
        );
        assert_eq!(class_name(b"14AccumulateGr"), None);
        assert_eq!(class_name(b"3Foo"), Some(&b"Foo"[..]));
        assert_eq!(class_name(b"N5torch2$xE"), None);
        assert_eq!(class_name(b""), None);
    }
}
