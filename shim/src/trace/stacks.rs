//! Call stacks for the trace: raw return addresses with the shim's own frames dropped,
//! interned once per distinct stack, and the module map needed to symbolize them offline
//! (written at open, and again whenever a new stack holds an address outside the known
//! modules, which covers libraries loaded later without hooking `dlopen`).

use crate::trace::RECORDER;
use core::cell::Cell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use gpushim_core::trace::format::{Api, DEVICE_UNKNOWN, Record, RecordKind};
use gpushim_core::trace::stack::{self, MAX_FRAMES, NATIVE_FRAMES, PYTHON_FRAMES};

/// One memory call in this many gets its native stack; 0 for none. Set when the trace opens.
pub static EVERY: AtomicU32 = AtomicU32::new(0);
/// Whether allocations get their Python frames. Set when the trace opens.
pub static PYTHON: AtomicBool = AtomicBool::new(false);

const MAX_MODULES: usize = 1024;
/// Address ranges of the modules written to the trace: [start, end) pairs.
static RANGES: [AtomicU64; 2 * MAX_MODULES] = [const { AtomicU64::new(0) }; 2 * MAX_MODULES];
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Taken by the one thread that scans the module list (a slow path).
static SCANNING: AtomicBool = AtomicBool::new(false);
/// The shim's own address range, whose frames are dropped from stacks.
static SELF_START: AtomicU64 = AtomicU64::new(0);
static SELF_END: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CALLS: Cell<u32> = const { Cell::new(0) };
}

/// Called at trace open: forget the modules of any earlier trace (a forked child's parent)
/// and write the current module map if stacks are on.
pub fn on_open(every: u32, python: bool) {
    EVERY.store(every, Ordering::Relaxed);
    PYTHON.store(python, Ordering::Relaxed);
    COUNT.store(0, Ordering::Relaxed);
    if every != 0 {
        scan_modules();
    }
}

/// Whether a record makes memory live (the calls whose Python frames are worth their cost).
fn allocates(kind: RecordKind) -> bool {
    use RecordKind::*;
    matches!(
        kind,
        Alloc | AllocAsync | ManagedAlloc | HostAlloc | PhysCreate | AddressReserve
    )
}

/// Records the calling thread's stack after its record: its Python frames (allocations by a
/// thread running Python), then its native frames if this call is sampled.
pub fn maybe_record(thread: u16, kind: RecordKind) {
    let every = EVERY.load(Ordering::Relaxed);
    let python = PYTHON.load(Ordering::Relaxed) && allocates(kind);
    let native = every != 0 && {
        let n = CALLS
            .try_with(|c| {
                let v = c.get().wrapping_add(1);
                c.set(v);
                v
            })
            .unwrap_or(0);
        n % every == 0
    };
    if !python && !native {
        return;
    }
    let mut frames = [0u64; MAX_FRAMES + 8];
    let py = if python {
        crate::trace::python::capture(&mut frames[..PYTHON_FRAMES])
    } else {
        0
    };
    let mut total = py;
    if native {
        let room = &mut frames[py..py + NATIVE_FRAMES + 8];
        let n = stack::capture(0, room);
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
    let (id, new) = RECORDER.intern_stack(frames);
    if new && frames[py..].iter().any(|&ip| !known(ip)) {
        scan_modules();
    }
    RECORDER.append(&Record {
        kind: RecordKind::StackRef,
        api: Api::Shim,
        device: DEVICE_UNKNOWN,
        status: 0,
        thread,
        time_ns: RECORDER.now_ns(),
        ptr: id,
        size: frames.len() as u64,
        stream: 0,
    });
}

fn known(ip: u64) -> bool {
    let n = COUNT.load(Ordering::Acquire).min(MAX_MODULES);
    (0..n).any(|i| {
        let s = RANGES[2 * i].load(Ordering::Relaxed);
        let e = RANGES[2 * i + 1].load(Ordering::Relaxed);
        (s..e).contains(&ip)
    })
}

/// Writes a `Module` record for every loaded object not written yet. One scanner at a time;
/// a thread that finds a scan under way goes on without waiting.
fn scan_modules() {
    if SCANNING.swap(true, Ordering::Acquire) {
        return;
    }
    // SAFETY: dl_iterate_phdr calls `visit` with valid info for each loaded object.
    unsafe { libc::dl_iterate_phdr(Some(visit), core::ptr::null_mut()) };
    SCANNING.store(false, Ordering::Release);
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    _data: *mut c_void,
) -> c_int {
    // SAFETY: the loader passes a valid dl_phdr_info for the duration of the call.
    let info = unsafe { &*info };
    let base = info.dlpi_addr;
    let (mut start, mut end) = (u64::MAX, 0u64);
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD {
            start = start.min(base + ph.p_vaddr);
            end = end.max(base + ph.p_vaddr + ph.p_memsz);
        }
    }
    if start >= end || known(start) {
        return 0;
    }
    let own = visit as *const () as usize as u64;
    if (start..end).contains(&own) {
        SELF_START.store(start, Ordering::Relaxed);
        SELF_END.store(end, Ordering::Relaxed);
    }
    let mut exe = [0u8; 512];
    // SAFETY: dlpi_name is null or NUL-terminated.
    let mut name: &[u8] = if info.dlpi_name.is_null() {
        b""
    } else {
        // SAFETY: as above.
        unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if name.is_empty() {
        // The main program: its path from /proc.
        // SAFETY: readlink into our buffer, within its length.
        let n = unsafe {
            libc::readlink(
                c"/proc/self/exe".as_ptr(),
                exe.as_mut_ptr().cast(),
                exe.len(),
            )
        };
        if n > 0 {
            name = &exe[..n as usize];
        }
    }
    let path_id = RECORDER.intern_string(name);
    let k = COUNT.load(Ordering::Relaxed);
    if k < MAX_MODULES {
        RANGES[2 * k].store(start, Ordering::Relaxed);
        RANGES[2 * k + 1].store(end, Ordering::Relaxed);
        COUNT.store(k + 1, Ordering::Release);
    }
    RECORDER.append(&Record {
        kind: RecordKind::Module,
        api: Api::Shim,
        device: DEVICE_UNKNOWN,
        status: 0,
        thread: 0,
        time_ns: RECORDER.now_ns(),
        ptr: base,
        size: path_id,
        stream: 0,
    });
    0
}
