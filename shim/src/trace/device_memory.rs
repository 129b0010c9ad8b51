//! The device's own figure (design contract 11): the memory NVML says this process uses on
//! each device, kept in the trace beside the allocations, so reports can say what no allocating
//! call made (the CUDA context, module code, local memory). NVML is read, never intercepted: a
//! helper thread loads `libnvidia-ml.so.1` itself and samples every [`EVERY_MS`], and soon
//! after the moments that matter (a device allocation or free, a segment reserved or released,
//! a failed request: the hooks [`poke`] it), at most once per [`SPACING_MS`]; a `device_memory`
//! record when a figure moved by a MiB or more. Nothing is asked of NVML at exit: its own
//! clean-up may have run by then. Where NVML does not list this process (another
//! PID namespace, as in some containers), the device's used memory is recorded instead, marked
//! as such.

use crate::cuda::real;
use crate::cuda::symbols::sig::{self, of};
use crate::trace;
use core::ffi::{c_int, c_uint, c_void};
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// How often the helper samples when nothing pokes it.
const EVERY_MS: u64 = 200;
/// The closest two samples come (NVML's process query is an ioctl; a program that allocates
/// without a cache pokes all the time).
const SPACING_MS: u64 = 50;
/// Devices sampled (NVML's indexes).
const MAX_DEVICES: usize = 16;
/// Processes asked of NVML per device at once.
const MAX_PROCESSES: usize = 64;
const MIB: u64 = 1 << 20;

#[repr(C)]
#[derive(Clone, Copy)]
struct ProcessInfo {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

#[repr(C)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

type Init = unsafe extern "C" fn() -> c_int;
type Count = unsafe extern "C" fn(*mut c_uint) -> c_int;
type Handle = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_int;
type Processes = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcessInfo) -> c_int;
type MemoryInfo = unsafe extern "C" fn(*mut c_void, *mut Memory) -> c_int;

struct Nvml {
    count: Count,
    handle: Handle,
    processes: Processes,
    memory: MemoryInfo,
}

/// The functions, found once (0: not yet; 1: not to be had).
static FUNCTIONS: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
static LOADED: AtomicBool = AtomicBool::new(false);
static STARTED: AtomicBool = AtomicBool::new(false);
/// Set in a forked child: NVML's state is the parent's, and CUDA is not usable there anyway.
static FORKED: AtomicBool = AtomicBool::new(false);
/// The last figure recorded per device (bytes + 1; 0: none yet).
static LAST: [AtomicU64; MAX_DEVICES] = [const { AtomicU64::new(0) }; MAX_DEVICES];
/// Set by [`poke`]: the device's memory may have moved since the last sample.
static MOVED: AtomicBool = AtomicBool::new(false);
/// The driver's functions the sampler asks CUDA's pools with (0: not yet; usize::MAX: none).
/// The last figures recorded per device and pool (default, graph, the program's own, as
/// `Event::cuda_pool` numbers them): reserved + 1, used + 1.
static LAST_POOL: [[AtomicU64; 6]; MAX_DEVICES] =
    [const { [const { AtomicU64::new(0) }; 6] }; MAX_DEVICES];

/// Pools the program created (`cuMemPoolCreate`) the sampler asks, by slot: the handle, its
/// device, and whose the slot is ([`CREATED_FREE`], [`CREATED_LIVE`], [`CREATED_ASKED`] while
/// the sampler asks it, [`CREATED_BUSY`] while a creation fills it or a destruction empties it).
/// A destruction waits for a question under way, so CUDA is never asked about a pool it
/// destroyed; past `MAX_CREATED` live pools, later ones are not asked.
const MAX_CREATED: usize = 64;
const CREATED_FREE: u8 = 0;
const CREATED_LIVE: u8 = 1;
const CREATED_ASKED: u8 = 2;
const CREATED_BUSY: u8 = 3;
static CREATED: [AtomicUsize; MAX_CREATED] = [const { AtomicUsize::new(0) }; MAX_CREATED];
static CREATED_DEVICE: [AtomicU8; MAX_CREATED] = [const { AtomicU8::new(0) }; MAX_CREATED];
static CREATED_STATE: [AtomicU8; MAX_CREATED] = [const { AtomicU8::new(0) }; MAX_CREATED];

/// The program created `pool` on `device`: the sampler asks it from now on (once).
pub fn pool_created(pool: usize, device: u8) {
    if pool == 0 || CREATED.iter().any(|c| c.load(Ordering::Acquire) == pool) {
        return;
    }
    for (i, state) in CREATED_STATE.iter().enumerate() {
        if state
            .compare_exchange(
                CREATED_FREE,
                CREATED_BUSY,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            CREATED[i].store(pool, Ordering::Relaxed);
            CREATED_DEVICE[i].store(device, Ordering::Relaxed);
            state.store(CREATED_LIVE, Ordering::Release);
            return;
        }
    }
}

/// The program is about to destroy `pool`: once the sampler is not asking it, it is forgotten.
/// Waits at most for one question to CUDA about one pool.
pub fn pool_destroying(pool: usize) {
    for (i, state) in CREATED_STATE.iter().enumerate() {
        if pool == 0 || CREATED[i].load(Ordering::Acquire) != pool {
            continue;
        }
        loop {
            match state.compare_exchange(
                CREATED_LIVE,
                CREATED_BUSY,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    CREATED[i].store(0, Ordering::Relaxed);
                    state.store(CREATED_FREE, Ordering::Release);
                    break;
                }
                Err(CREATED_ASKED) => {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
                // Emptied or being filled by another thread meanwhile: not this pool's slot now.
                Err(_) => break,
            }
        }
    }
}

/// How CUDA's pools may be asked (a `fn(&mut dyn FnMut())` the pool registers once the program
/// allocates stream-ordered, so CUDA's own pools hold memory; 0 until then, and they are not
/// asked): it runs the questions only while no stream capture is under way, and keeps one from
/// beginning meanwhile, as nothing of the shim's may touch CUDA during one.
static ASK_THROUGH: AtomicUsize = AtomicUsize::new(0);

/// Registers how CUDA's pools may be asked.
pub fn ask_pools_through(f: fn(&mut dyn FnMut())) {
    ASK_THROUGH.store(f as usize, Ordering::Release);
}

/// Asks for a sample soon (device memory may have moved). A load on the hot path; a store only
/// once per sample.
pub fn poke() {
    if !MOVED.load(Ordering::Relaxed) {
        MOVED.store(true, Ordering::Relaxed);
    }
}

/// Starts the sampler (once per process; again in a forked child that traces).
pub fn start() {
    if FORKED.load(Ordering::Relaxed) || STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("gpushim-nvml".into())
        .spawn(|| {
            let _guard = crate::guard::Guard::enter();
            if nvml().is_none() {
                return;
            }
            loop {
                MOVED.store(false, Ordering::Relaxed);
                sample();
                let mut waited = 0;
                loop {
                    std::thread::sleep(std::time::Duration::from_millis(SPACING_MS));
                    waited += SPACING_MS;
                    if waited >= EVERY_MS || MOVED.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
        });
}

/// In a forked child: the parent's sampler is not here, and the child starts none (NVML's
/// state came from the parent; the child cannot use CUDA).
pub fn forget_after_fork() {
    FORKED.store(true, Ordering::Relaxed);
    for l in LAST.iter().chain(LAST_POOL.iter().flatten()) {
        l.store(0, Ordering::Relaxed);
    }
    for k in &DEVICES_KEPT {
        k.store(false, Ordering::Relaxed);
    }
}

fn nvml() -> Option<Nvml> {
    if !LOADED.load(Ordering::Acquire) {
        // SAFETY: a NUL-terminated name; the library stays loaded for the process.
        let h = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            )
        };
        if h.is_null() {
            return None;
        }
        let dlsym = real::real_dlsym()?;
        let names = [
            c"nvmlDeviceGetCount_v2",
            c"nvmlDeviceGetHandleByIndex_v2",
            c"nvmlDeviceGetComputeRunningProcesses_v3",
            c"nvmlDeviceGetMemoryInfo",
        ];
        for (slot, name) in FUNCTIONS.iter().zip(names) {
            // SAFETY: a handle and a NUL-terminated name.
            let f = unsafe { dlsym(h, name.as_ptr()) } as usize;
            if f == 0 {
                return None;
            }
            slot.store(f, Ordering::Release);
        }
        // SAFETY: as above.
        let init = unsafe { dlsym(h, c"nvmlInit_v2".as_ptr()) } as usize;
        // SAFETY: `init` is nvmlInit_v2, of type Init.
        if init == 0 || unsafe { core::mem::transmute::<usize, Init>(init)() } != 0 {
            return None;
        }
        LOADED.store(true, Ordering::Release);
    }
    let f = |i: usize| FUNCTIONS[i].load(Ordering::Acquire);
    // SAFETY: each address was resolved for the NVML function of that type.
    unsafe {
        Some(Nvml {
            count: core::mem::transmute::<usize, Count>(f(0)),
            handle: core::mem::transmute::<usize, Handle>(f(1)),
            processes: core::mem::transmute::<usize, Processes>(f(2)),
            memory: core::mem::transmute::<usize, MemoryInfo>(f(3)),
        })
    }
}

/// Records, for each device, what NVML says this process uses (status 0), or the device's
/// used memory where NVML does not list this process (status 1); `ptr` the bytes, `size` the
/// device's total. Only figures that moved by a MiB.
fn sample() {
    let Some(n) = nvml() else {
        return;
    };
    let mut count: c_uint = 0;
    // SAFETY: a valid out-pointer.
    if unsafe { (n.count)(&mut count) } != 0 {
        return;
    }
    // CUDA's pools first: a report of NVML's peak then has what they held at it.
    let through = ASK_THROUGH.load(Ordering::Acquire);
    if through != 0 {
        // SAFETY: only `ask_pools_through` stores here, always a `fn(&mut dyn FnMut())`.
        let through = unsafe { core::mem::transmute::<usize, fn(&mut dyn FnMut())>(through) };
        through(&mut || sample_pools((count as usize).min(MAX_DEVICES)));
    }
    // What each device is made of (no stream is asked: safe during a capture).
    ask_devices((count as usize).min(MAX_DEVICES));
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as c_uint;
    for (d, last_of) in LAST.iter().enumerate().take(count as usize) {
        let Some(((bytes, total, device_wide), at)) = quietly(|| read_device(&n, d, pid)) else {
            continue;
        };
        let last = last_of.load(Ordering::Relaxed);
        let moved = last == 0 || (last - 1).abs_diff(bytes) >= MIB;
        if moved {
            if bytes == 0 && last == 0 {
                continue;
            }
            last_of.store(bytes + 1, Ordering::Relaxed);
            trace::record_at(trace::Event::nvml(bytes, total, d as u8, device_wide), at);
        }
    }
}

/// NVML's figure for this process on device `d` (pid `pid`), the device's total, and whether
/// the figure is the device's (NVML does not list this process); `None` where NVML fails.
fn read_device(n: &Nvml, d: usize, pid: c_uint) -> Option<(u64, u64, bool)> {
    let mut h: *mut c_void = core::ptr::null_mut();
    // SAFETY: a valid out-pointer for an index NVML counted.
    if unsafe { (n.handle)(d as c_uint, &mut h) } != 0 {
        return None;
    }
    let mut mem = Memory {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: a handle NVML gave and a valid out-pointer.
    if unsafe { (n.memory)(h, &mut mem) } != 0 {
        return None;
    }
    let mut infos = [ProcessInfo {
        pid: 0,
        used: 0,
        gpu_instance: 0,
        compute_instance: 0,
    }; MAX_PROCESSES];
    let mut listed = MAX_PROCESSES as c_uint;
    // SAFETY: room for `listed` entries.
    let rc = unsafe { (n.processes)(h, &mut listed, infos.as_mut_ptr()) };
    let mine = (rc == 0).then(|| {
        infos[..(listed as usize).min(MAX_PROCESSES)]
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.used)
    });
    let (bytes, device_wide) = match mine {
        Some(Some(b)) => (b, false),
        // Listed nowhere: this process holds nothing there yet, when NVML could list.
        Some(None) if listed < MAX_PROCESSES as c_uint && listed > 0 => (0, false),
        _ => (mem.used, true),
    };
    Some((bytes, mem.total, device_wide))
}

/// Calls that may move device memory, begun and ended (their record written): every recorded
/// hook's and every visit to the shim's pool count here ([`InCall`]).
static BEGUN: AtomicU64 = AtomicU64::new(0);
static ENDED: AtomicU64 = AtomicU64::new(0);
/// How long a sample looks for a moment with no such call under way before it reads NVML
/// anyway (a call that has not returned for a second, or a program that never pauses between
/// calls for as long), and how far apart it looks at most (a millisecond apart at first): a
/// program of back-to-back calls still pauses between them, and a look every few milliseconds
/// finds such a moment. A read during a call would be wrong either way: NVML may count an
/// allocation whose record is not yet written (found under load, where a sampler that read
/// after 20 ms among calls that kept ending split NVML's peak as if the allocation under way
/// were no one's).
const QUIET_WAIT_MS: u64 = 1000;
const LOOK_MS: u64 = 5;

/// A call that may move device memory, under way until dropped (after its record is written).
/// Two atomic additions; no lock, no allocation.
pub struct InCall(());

impl InCall {
    pub fn begin() -> InCall {
        BEGUN.fetch_add(1, Ordering::SeqCst);
        InCall(())
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        ENDED.fetch_add(1, Ordering::SeqCst);
    }
}

/// `read()` at a moment when no call that may move device memory is under way, with that moment
/// (`CLOCK_MONOTONIC`, taken after the read): every such call recorded before that time had
/// ended before the read, and every one recorded after it began after the read. So a figure
/// and the records around it agree: an allocation is never recorded after a sample that
/// already counts it, which would split NVML's figure as if its bytes were no one's. Tried
/// for as long as [`QUIET_WAIT_MS`] says; then read as it comes.
fn quietly<T>(mut read: impl FnMut() -> Option<T>) -> Option<(T, u64)> {
    let (mut waited, mut pause) = (0u64, 1u64);
    loop {
        // Ended first: equal counts then mean no call was under way between the two loads.
        let ended = ENDED.load(Ordering::SeqCst);
        let begun = BEGUN.load(Ordering::SeqCst);
        let last = waited >= QUIET_WAIT_MS;
        if ended == begun || last {
            let v = read()?;
            let at = gpushim_core::trace::recorder::clock_ns(libc::CLOCK_MONOTONIC);
            if last || BEGUN.load(Ordering::SeqCst) == begun {
                return Some((v, at));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(pause));
        waited += pause;
        pause = (pause * 2).min(LOOK_MS);
    }
}

/// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`, `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR`.
const MULTIPROCESSORS: c_int = 16;
const THREADS_PER_MULTIPROCESSOR: c_int = 39;
/// The devices (CUDA's ordinals) whose make-up the trace's header holds.
static DEVICES_KEPT: [AtomicBool; MAX_DEVICES] = [const { AtomicBool::new(false) }; MAX_DEVICES];

/// Keeps, once per device, its multiprocessors and threads per multiprocessor in the trace's
/// header (PyTorch's reductions size their grids, and their scratch buffers, by them), and its
/// memory as CUDA counts it (the most a process can have: NVML's total less what the driver
/// keeps); asked again at later samples until CUDA, once initialized, answers.
fn ask_devices(devices: usize) {
    let (Some(device_get), Some(attribute)) = (
        real::function::<of::CuDeviceGet>(),
        real::function::<of::CuDeviceGetAttribute>(),
    ) else {
        return;
    };
    for (d, kept) in DEVICES_KEPT.iter().enumerate().take(devices) {
        if kept.load(Ordering::Relaxed) {
            continue;
        }
        let (mut dev, mut sms, mut threads): (c_int, c_int, c_int) = (0, 0, 0);
        // SAFETY: valid out-pointers; CUDA answers an ordinal it does not have (or before its
        // initialization) with an error, and the device waits for a later sample.
        let ok = unsafe {
            device_get(&mut dev, d as c_int) == 0
                && attribute(&mut sms, MULTIPROCESSORS, dev) == 0
                && attribute(&mut threads, THREADS_PER_MULTIPROCESSOR, dev) == 0
        };
        if ok && sms > 0 && threads > 0 {
            let mut memory: usize = 0;
            if let Some(total) = real::function::<of::CuDeviceTotalMemV2>() {
                // SAFETY: a valid out-pointer and a device CUDA just named; on an error the
                // figure stays 0 (not known).
                if unsafe { total(&mut memory, dev) } != 0 {
                    memory = 0;
                }
            }
            kept.store(true, Ordering::Relaxed);
            trace::device(d, sms as u32, threads as u32, memory as u64);
        }
    }
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`, `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
const POOL_RESERVED: c_int = 5;
const POOL_USED: c_int = 7;
/// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`, `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`.
const GRAPH_RESERVED: c_int = 2;
const GRAPH_USED: c_int = 0;

/// The driver's functions the pool questions need, rows of the one table of CUDA functions
/// (`cuda::functions`; none of them hooked), resolved from the libcuda.so.1 the program
/// loaded; `None` until it has.
struct PoolFunctions {
    device_get: sig::CuDeviceGet,
    default_pool: sig::CuDeviceGetDefaultMemPool,
    pool_attr: sig::CuMemPoolGetAttribute,
    graph_attr: sig::CuDeviceGetGraphMemAttribute,
    primary_state: sig::CuDevicePrimaryCtxGetState,
    primary_retain: sig::CuDevicePrimaryCtxRetain,
    set_current: sig::CuCtxSetCurrent,
    primary_release: sig::CuDevicePrimaryCtxReleaseV2,
}

fn pool_functions() -> Option<PoolFunctions> {
    Some(PoolFunctions {
        device_get: real::function::<of::CuDeviceGet>()?,
        default_pool: real::function::<of::CuDeviceGetDefaultMemPool>()?,
        pool_attr: real::function::<of::CuMemPoolGetAttribute>()?,
        graph_attr: real::function::<of::CuDeviceGetGraphMemAttribute>()?,
        primary_state: real::function::<of::CuDevicePrimaryCtxGetState>()?,
        primary_retain: real::function::<of::CuDevicePrimaryCtxRetain>()?,
        set_current: real::function::<of::CuCtxSetCurrent>()?,
        primary_release: real::function::<of::CuDevicePrimaryCtxReleaseV2>()?,
    })
}

/// Runs `ask` with the device's primary context current on this thread, if the program has made
/// it (it is retained meanwhile and released after, and the thread left with none).
fn with_primary_context(f: &PoolFunctions, dev: c_int, ask: impl FnOnce() -> bool) -> bool {
    let (mut flags, mut active): (u32, c_int) = (0, 0);
    let mut ctx: usize = 0;
    // SAFETY: valid out-pointers; the context is retained only while it is active (so never
    // made here), made current on this thread alone, and released once.
    unsafe {
        if (f.primary_state)(dev, &mut flags, &mut active) != 0
            || active == 0
            || (f.primary_retain)(&mut ctx, dev) != 0
        {
            return false;
        }
        let answered = (f.set_current)(ctx) == 0 && ask();
        (f.set_current)(0);
        (f.primary_release)(dev);
        answered
    }
}

/// What the pools the program created on device `d` reserve and use, together; whether it has
/// any that answered.
fn ask_created(d: u8, pool_attr: sig::CuMemPoolGetAttribute) -> (bool, u64, u64) {
    let (mut any, mut reserved, mut used) = (false, 0u64, 0u64);
    for (i, state) in CREATED_STATE.iter().enumerate() {
        if CREATED_DEVICE[i].load(Ordering::Relaxed) != d
            || state
                .compare_exchange(
                    CREATED_LIVE,
                    CREATED_ASKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            continue;
        }
        let pool = CREATED[i].load(Ordering::Relaxed) as *mut c_void;
        let (mut r, mut u) = (0u64, 0u64);
        // SAFETY: a pool the program created and has not begun to destroy (its destruction
        // waits while the slot is ours); valid out-pointers of the attributes' 64-bit size.
        let ok = unsafe {
            pool_attr(pool, POOL_RESERVED, (&raw mut r).cast()) == 0
                && pool_attr(pool, POOL_USED, (&raw mut u).cast()) == 0
        };
        state.store(CREATED_LIVE, Ordering::Release);
        if ok {
            any = true;
            reserved = reserved.saturating_add(r);
            used = used.saturating_add(u);
        }
    }
    (any, reserved, used)
}

/// Records what CUDA's default pool and its graph memory reserve and use on each of the first
/// `devices` devices (taken for CUDA's ordinals, as NVML's indexes are), when a figure moved by
/// a MiB.
fn sample_pools(devices: usize) {
    let Some(f) = pool_functions() else {
        return;
    };
    let (device_get, default_pool, pool_attr, graph_attr) =
        (f.device_get, f.default_pool, f.pool_attr, f.graph_attr);
    for (d, last) in LAST_POOL.iter().enumerate().take(devices) {
        let mut dev: c_int = 0;
        // SAFETY: a valid out-pointer; a failure (no such ordinal) leaves the device out.
        if unsafe { device_get(&mut dev, d as c_int) } != 0 {
            continue;
        }
        let (mut r, mut u, mut gr, mut gu) = (0u64, 0u64, 0u64, 0u64);
        let mut pool: *mut c_void = core::ptr::null_mut();
        // SAFETY: valid out-pointers of the sizes the attributes write (a 64-bit figure each).
        let pool_ok = unsafe {
            default_pool(&mut pool, dev) == 0
                && pool_attr(pool, POOL_RESERVED, (&raw mut r).cast()) == 0
                && pool_attr(pool, POOL_USED, (&raw mut u).cast()) == 0
        };
        // SAFETY: as above.
        let graph = |gr: &mut u64, gu: &mut u64| unsafe {
            graph_attr(dev, GRAPH_RESERVED, (gr as *mut u64).cast()) == 0
                && graph_attr(dev, GRAPH_USED, (gu as *mut u64).cast()) == 0
        };
        // Graph memory is asked of the device's context: the sampler's thread borrows the
        // primary context while the program has it (never making one).
        let graph_ok =
            graph(&mut gr, &mut gu) || with_primary_context(&f, dev, || graph(&mut gr, &mut gu));
        // Once the program's pools were recorded, none left answering records zeros.
        let (created_ok, cr, cu) = ask_created(d as u8, pool_attr);
        let created_ok = created_ok || last[4].load(Ordering::Relaxed) != 0;
        for (which, ok, reserved, used) in [
            (0usize, pool_ok, r, u),
            (1, graph_ok, gr, gu),
            (2, created_ok, cr, cu),
        ] {
            if !ok {
                continue;
            }
            let (lr, lu) = (&last[2 * which], &last[2 * which + 1]);
            let moved = |l: &AtomicU64, v: u64| {
                let was = l.load(Ordering::Relaxed);
                was == 0 && v > 0 || was != 0 && (was - 1).abs_diff(v) >= MIB
            };
            if moved(lr, reserved) || moved(lu, used) {
                lr.store(reserved + 1, Ordering::Relaxed);
                lu.store(used + 1, Ordering::Relaxed);
                trace::record(trace::Event::cuda_pool(
                    which as u8,
                    reserved,
                    used,
                    d as u8,
                ));
            }
        }
    }
}
