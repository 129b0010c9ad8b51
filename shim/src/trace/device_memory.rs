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
use crate::trace;
use core::ffi::{c_int, c_uint, c_void};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use gpushim_core::trace::format::{Api, RecordKind};

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
    for l in &LAST {
        l.store(0, Ordering::Relaxed);
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
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as c_uint;
    for (d, last_of) in LAST.iter().enumerate().take(count as usize) {
        let mut h: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer for an index NVML counted.
        if unsafe { (n.handle)(d as c_uint, &mut h) } != 0 {
            continue;
        }
        let mut mem = Memory {
            total: 0,
            free: 0,
            used: 0,
        };
        // SAFETY: a handle NVML gave and a valid out-pointer.
        if unsafe { (n.memory)(h, &mut mem) } != 0 {
            continue;
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
        let last = last_of.load(Ordering::Relaxed);
        let moved = last == 0 || (last - 1).abs_diff(bytes) >= MIB;
        if moved {
            if bytes == 0 && last == 0 {
                continue;
            }
            last_of.store(bytes + 1, Ordering::Relaxed);
            trace::record(
                RecordKind::DeviceMemory,
                Api::Shim,
                i32::from(device_wide),
                bytes,
                mem.total,
                d as u8,
                0,
            );
        }
    }
}
