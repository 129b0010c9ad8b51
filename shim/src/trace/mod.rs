//! Recording from the hooks: the process's trace, opened on its first CUDA memory call.

pub mod device_memory;
mod event;
pub mod python;
pub mod stacks;

pub use event::Event;

use crate::cuda::real;
use crate::cuda::symbols::sig::{self, of};
use crate::os::say;
use crate::state;
use core::cell::{Cell, UnsafeCell};
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use gpushim_core::fixedfmt::Escaped;
use gpushim_core::trace::format::DEVICE_UNKNOWN;
use gpushim_core::trace::recorder::{self, OpenOptions, PATH_CAP, Recorder};

pub static RECORDER: Recorder = Recorder::new();

thread_local! {
    /// (trace generation, thread index in that trace). No destructor, const-initialized.
    static THREAD: Cell<(u32, u16)> = const { Cell::new((0, 0)) };
}

/// Appends one record, opening the trace first if this is the process's first event; then
/// what the event brings with it (its stream's name, its stack, the library that asked).
pub fn record(e: Event) {
    record_stamped(e, None);
}

/// As [`record`], the record stamped with `monotonic_ns` (a reading of `CLOCK_MONOTONIC` taken
/// earlier) rather than now: where an event happened before it could be written.
pub fn record_at(e: Event, monotonic_ns: u64) {
    record_stamped(e, Some(monotonic_ns));
}

fn record_stamped(e: Event, monotonic_ns: Option<u64>) {
    // GPUSHIM_DISABLE=1 writes nothing, whichever route (the pool's own notes, the pluggable
    // allocator) asks.
    if !state::enabled() || !ensure_open() {
        return;
    }
    let t0 = crate::costs::start();
    // One clock read for the record and what follows it (its stream's name, its stack): the
    // reader keeps records of equal time in file order, which is the order written here.
    let now = match monotonic_ns {
        Some(m) => RECORDER.since_origin(m),
        None => RECORDER.now_ns(),
    };
    let thread = thread_index(now);
    let mut stream_index = 0;
    if e.stream != 0 {
        let (i, new) = RECORDER.intern_stream(e.stream);
        if new {
            append(Event::stream_name(e.stream, i), now, thread, 0);
        }
        stream_index = i;
    }
    append(e, now, thread, stream_index);
    if e.moves_device_memory() {
        device_memory::poke();
    }
    if e.takes_stack() {
        crate::costs::measure(crate::costs::Cost::Stacks, || {
            crate::trace::stacks::maybe_record(thread, e.kind, now)
        });
        if e.names_caller() {
            crate::trace::stacks::record_caller(thread);
        }
        // A walk of the autograd graph its stack found due comes after the record is whole.
        crate::trace::stacks::after_stack();
    }
    crate::costs::end(crate::costs::Cost::Record, t0);
}

/// Keeps what CUDA device `device` is made of in the trace's header (see
/// `format::header::DEVICES`).
pub fn device(device: usize, multiprocessors: u32, threads_per_multiprocessor: u32, memory: u64) {
    if !state::enabled() || !ensure_open() {
        return;
    }
    RECORDER.set_device(device, multiprocessors, threads_per_multiprocessor);
    RECORDER.set_device_memory(device, memory);
}

fn append(e: Event, time_ns: u64, thread: u16, stream: u16) {
    RECORDER.append(&e.record(time_ns, thread, stream));
}

fn thread_index(now: u64) -> u16 {
    let generation = RECORDER.generation();
    let (g, i) = THREAD.try_with(|t| t.get()).unwrap_or((0, u16::MAX));
    if g == generation {
        return i;
    }
    let i = RECORDER.next_thread_index();
    let _ = THREAD.try_with(|t| t.set((generation, i)));
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    append(Event::thread_start(tid, i), now, i, 0);
    i
}

/// The device the calling thread's runtime is on, or `DEVICE_UNKNOWN`.
pub fn runtime_device() -> u8 {
    device_from(real::function::<of::CudaGetDevice>())
}

/// The device of the calling thread's current driver context, or `DEVICE_UNKNOWN`.
pub fn driver_device() -> u8 {
    device_from(real::function::<of::CuCtxGetDevice>())
}

/// Asks `cudaGetDevice` or `cuCtxGetDevice` (same signature) for the current device.
fn device_from(get: Option<sig::CudaGetDevice>) -> u8 {
    let Some(f) = get else {
        return DEVICE_UNKNOWN;
    };
    let mut d: c_int = 0;
    // SAFETY: `d` is a valid out-pointer.
    if unsafe { f(&mut d) } == 0 && (0..255).contains(&d) {
        d as u8
    } else {
        DEVICE_UNKNOWN
    }
}

/// Whether the trace is open, opening it if nobody has yet.
fn ensure_open() -> bool {
    if RECORDER.is_ready() {
        return true;
    }
    if RECORDER.has_failed() {
        return false;
    }
    if RECORDER.begin_open() {
        open_trace();
        return RECORDER.is_ready();
    }
    // Another thread is opening it: wait, briefly (opening is a few system calls).
    for _ in 0..100_000 {
        if RECORDER.is_ready() {
            return true;
        }
        if RECORDER.has_failed() {
            return false;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
    false
}

static NEVER_STOP: AtomicBool = AtomicBool::new(false);
/// Asks the summarizer for its last checkpoint (at exit); it says when it is done.
static SUMMARIZER_STOP: AtomicBool = AtomicBool::new(false);
static SUMMARIZER_DONE: AtomicBool = AtomicBool::new(true);

/// At exit: the summarizer reads the last records and writes its last checkpoint, for at most
/// half a second (a process that exits while another thread still records loses nothing of
/// the ring; only what the summary would have said of records the ring then overwrites).
fn stop_summarizer() {
    SUMMARIZER_STOP.store(true, Ordering::Release);
    for _ in 0..500 {
        if SUMMARIZER_DONE.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[cold]
fn open_trace() {
    let pattern = state::settings().trace.map(|p| p.to_bytes());
    if pattern.is_some_and(|p| p.eq_ignore_ascii_case(b"off")) {
        RECORDER.fail();
        return;
    }
    let conf = state::conf();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let mut host = [0u8; 64];
    // SAFETY: the buffer is 64 bytes and we pass one less, so it stays NUL-terminated.
    unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) };
    let host_len = host.iter().position(|&b| b == 0).unwrap_or(0);
    let host = &host[..host_len];
    let rank = rank();
    let mut cmdline = [0u8; 2048];
    let cmd_len = read_cmdline(&mut cmdline);
    let cmdline = &cmdline[..cmd_len];
    let argv0 = cmdline.split(|&b| b == 0).next().unwrap_or(b"");
    let program = argv0.rsplit(|&b| b == b'/').next().unwrap_or(b"");
    let program = if program.is_empty() {
        b"process"
    } else {
        program
    };

    let mut path = [0u8; PATH_CAP];
    let mut len = 0;
    if let Some(p) = pattern.filter(|p| !p.is_empty()) {
        match recorder::expand_pattern(p, pid, host, rank, &mut path) {
            Ok(n) => len = n,
            Err(e) => say(format_args!(
                "GPUSHIM_TRACE: {e}; writing to the default gpushim-PROGRAM.PID.trace"
            )),
        }
    }
    if len == 0 {
        len = default_path(program, pid, &mut path);
    }
    let mut env = [0u8; 1024];
    let env_len = settings_kept(&mut env);
    let opts = OpenOptions {
        path: &path[..len],
        pid,
        rank,
        host,
        program,
        cmdline,
        env: &env[..env_len],
        trace_max: conf.trace_max,
        ring: true,
    };
    // Set before the trace is ready: another thread may record the moment it is.
    crate::trace::stacks::configure(
        conf.stacks.native_every(),
        conf.stacks.python(),
        conf.stacks.native_without_python(),
    );
    if let Err(e) = RECORDER.open(&opts) {
        say(format_args!(
            "cannot write the trace {}: {e}; recording is off for this process",
            Escaped(&path[..len])
        ));
        return;
    }
    if RECORDER.path() != &path[..len] {
        say(format_args!(
            "{} is taken (a file or a link of that name is there); the trace is written to {}",
            Escaped(&path[..len]),
            Escaped(RECORDER.path())
        ));
    }
    report_to_run(pid);
    crate::trace::stacks::on_open();
    install_sigbus_handler();
    // The grower keeps the next chunks of the file mapped and populated, so producers take no
    // page faults. Without it (spawn failed) producers map chunks themselves: slower, correct.
    let _ = std::thread::Builder::new()
        .name("gpushim-grow".into())
        .spawn(|| RECORDER.run_grower(&NEVER_STOP));
    // The summarizer keeps what the oldest records said in checkpoints, so the trace wraps
    // around at trace_max instead of dropping records. Without it (spawn failed) the trace
    // stops at trace_max, every record after counted as lost.
    SUMMARIZER_STOP.store(false, Ordering::Relaxed);
    SUMMARIZER_DONE.store(false, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("gpushim-sum".into())
        .spawn(|| {
            RECORDER.run_summarizer(&SUMMARIZER_STOP);
            SUMMARIZER_DONE.store(true, Ordering::Release);
        });
    if spawned.is_err() {
        SUMMARIZER_DONE.store(true, Ordering::Release);
    }
    device_memory::start();
    crate::lifecycle::on_exit(at_exit);
    crate::lifecycle::in_forked_child(forget_after_fork);
}

/// Under `gpushim run` (`GPUSHIM_RUN_REPORT=FOLDER`, a folder of the user's alone): leaves
/// in that folder a new file saying which trace this process wrote, as `DEV INO\nPATH` (the
/// path absolute), so that `run` reads this file and no other one that happens to lie in the
/// trace's folder. Fixed buffers, no allocation; a note that cannot be written costs only
/// `run`'s word on this trace.
fn report_to_run(pid: u32) {
    use core::fmt::Write;
    use gpushim_core::fixedfmt::FixedBuf;
    let Some(folder) = state::settings().run_report else {
        return;
    };
    let folder = folder.to_bytes();
    let Some((dev, ino)) = RECORDER.file_id() else {
        return;
    };
    if folder.is_empty() {
        return;
    }
    let mut name = FixedBuf::<PATH_CAP>::new();
    name.push_bytes(folder);
    let _ = write!(
        name,
        "/{pid}-{:08x}.trace-note\0",
        recorder::unguessable_word()
    );
    if name.as_bytes().last() != Some(&0) {
        return;
    }
    let mut note = FixedBuf::<{ 2 * PATH_CAP + 64 }>::new();
    let _ = writeln!(note, "{dev} {ino}");
    let trace = RECORDER.path();
    if trace.first() != Some(&b'/') {
        let mut cwd = [0u8; PATH_CAP];
        // SAFETY: `cwd` is PATH_CAP writable bytes; getcwd NUL-terminates what it writes.
        if unsafe { libc::getcwd(cwd.as_mut_ptr().cast(), cwd.len()) }.is_null() {
            return;
        }
        let n = cwd.iter().position(|&b| b == 0).unwrap_or(0);
        note.push_bytes(&cwd[..n]);
        note.push_bytes(b"/");
    }
    note.push_bytes(trace);
    // SAFETY: `name` is NUL-terminated (checked above); a new file only, never through a link.
    let fd = unsafe {
        libc::open(
            name.as_bytes().as_ptr().cast(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return;
    }
    let bytes = note.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        // SAFETY: `fd` is open for writing; the pointer and length lie within `bytes`.
        let n = unsafe { libc::write(fd, bytes[at..].as_ptr().cast(), bytes.len() - at) };
        if n <= 0 {
            break;
        }
        at += n as usize;
    }
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
}

/// The SIGBUS action in place before ours, to hand faults that are not ours to.
struct OldAction(UnsafeCell<libc::sigaction>);
// SAFETY: written once before the handler is installed, then only read.
unsafe impl Sync for OldAction {}
// SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags).
static OLD_SIGBUS: OldAction = OldAction(UnsafeCell::new(unsafe { core::mem::zeroed() }));
static SIGBUS_INSTALLED: AtomicBool = AtomicBool::new(false);
static TRUNCATED_SAID: AtomicBool = AtomicBool::new(false);

/// A trace file truncated by another process while mapped would kill the program with SIGBUS
/// at its next record. The handler recognizes faults inside the trace's mappings, replaces them
/// with anonymous memory (recording stops; the program goes on) and hands every other fault to
/// the action that was there before.
fn install_sigbus_handler() {
    if SIGBUS_INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: an all-zero sigaction is valid; we fill handler, mask and flags.
    let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: a valid mask; the old action is stored where the handler reads it, before the
    // handler can run.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGBUS, &act, OLD_SIGBUS.0.get());
    }
}

extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    if RECORDER.maps(addr) && RECORDER.abandon_mappings() {
        if !TRUNCATED_SAID.swap(true, Ordering::Relaxed) {
            say(format_args!(
                "the trace file was cut short by another process while this one wrote it; \
                 recording stopped, the program goes on"
            ));
        }
        // Returning retries the write, now into anonymous memory.
        return;
    }
    // Not ours: the previous action decides.
    // SAFETY: written before our handler was installed.
    let old = unsafe { &*OLD_SIGBUS.0.get() };
    if old.sa_flags & libc::SA_SIGINFO != 0 && old.sa_sigaction > 1 {
        // SAFETY: the previous handler, with the arguments the kernel gave us.
        let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut c_void) =
            unsafe { core::mem::transmute(old.sa_sigaction) };
        f(sig, info, ctx);
    } else if old.sa_sigaction > 1 {
        // SAFETY: a plain handler of the previous action.
        let f: extern "C" fn(i32) = unsafe { core::mem::transmute(old.sa_sigaction) };
        f(sig);
    } else {
        // SIG_DFL or SIG_IGN: put it back; returning re-raises the fault under it.
        // SAFETY: restores the previous action.
        unsafe { libc::sigaction(libc::SIGBUS, old, core::ptr::null_mut()) };
    }
}

fn default_path(program: &[u8], pid: u32, out: &mut [u8; PATH_CAP]) -> usize {
    let mut num = [0u8; 24];
    let parts: [&[u8]; 5] = [
        b"gpushim-",
        program,
        b".",
        recorder::format_int(i64::from(pid), &mut num),
        b".trace",
    ];
    let mut n = 0;
    for p in parts {
        let k = p.len().min(out.len() - 1 - n);
        out[n..n + k].copy_from_slice(&p[..k]);
        n += k;
    }
    n
}

/// `RANK`, else `LOCAL_RANK`, else -1.
fn rank() -> i32 {
    for var in [
        crate::options::Foreign::Rank,
        crate::options::Foreign::LocalRank,
    ] {
        if let Some(v) = var
            .value()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
        {
            return v;
        }
    }
    -1
}

/// PyTorch's allocator settings and the job's world size as `NAME=value\0` entries in `buf`; the
/// bytes written. An entry that does not fit is left out whole.
fn settings_kept(buf: &mut [u8]) -> usize {
    use crate::options::Foreign;
    let mut n = 0;
    for f in [
        Foreign::PytorchAllocConf,
        Foreign::PytorchCudaAllocConf,
        Foreign::CublasWorkspaceConfig,
        Foreign::CublasLtWorkspaceSize,
        Foreign::WorldSize,
    ] {
        let Some(v) = f.value() else {
            continue;
        };
        let (name, value) = (f.name().to_bytes(), v.to_bytes());
        let len = name.len() + 1 + value.len() + 1;
        // One NUL left over ends the list.
        if n + len >= buf.len() {
            continue;
        }
        buf[n..n + name.len()].copy_from_slice(name);
        buf[n + name.len()] = b'=';
        let at = n + name.len() + 1;
        buf[at..at + value.len()].copy_from_slice(value);
        buf[at + value.len()] = 0;
        n += len;
    }
    n
}

fn read_cmdline(buf: &mut [u8]) -> usize {
    // SAFETY: plain open/read/close on a NUL-terminated path into our own buffer.
    unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return 0;
        }
        let mut n = 0usize;
        while n < buf.len() {
            let r = libc::read(fd, buf.as_mut_ptr().add(n).cast(), buf.len() - n);
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        n
    }
}

/// At exit: marks the trace complete and says where it is and what was lost.
/// What a hook records at exit before the trace is marked clean (PyTorch's last free
/// requests not yet recorded): set by [`before_exit`]; 0 for nothing.
static BEFORE_EXIT: AtomicUsize = AtomicUsize::new(0);

/// `f` records what it holds at exit, before the trace is marked clean (one such function).
pub fn before_exit(f: fn()) {
    BEFORE_EXIT.store(f as usize, Ordering::Release);
}

pub fn at_exit() {
    if !RECORDER.is_ready() {
        return;
    }
    let before = BEFORE_EXIT.load(Ordering::Acquire);
    if before != 0 {
        // SAFETY: only `fn()` values are stored in `BEFORE_EXIT` (see `before_exit`).
        let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(before) };
        f();
    }
    stop_summarizer();
    RECORDER.mark_clean_exit();
    let path = Escaped(RECORDER.path());
    let lost = RECORDER.lost();
    if lost > 0 {
        match RECORDER.grow_error() {
            Some(e) => say(format_args!(
                "trace written to {path} ({} records claimed, {lost} lost: the file could not \
                 grow: {})",
                RECORDER.claimed(),
                gpushim_core::trace::recorder::ErrnoText(e)
            )),
            None => say(format_args!(
                "trace written to {path} ({} records claimed, {lost} lost: the trace reached \
                 trace_max; raise it in GPUSHIM_CONF)",
                RECORDER.claimed()
            )),
        }
    } else if state::settings().run_report.is_none() {
        // Under `gpushim run`, which names every trace when the command ends.
        say(format_args!("trace written to {path}"));
    }
}

/// In a forked child: never write into the parent's file. A child that makes a CUDA memory
/// call opens a trace of its own (its own pid); one that does not leaves no file.
/// In a forked child: the parent's trace is not ours.
pub fn forget_after_fork() {
    // The parent's summarizer thread is not in the child.
    SUMMARIZER_DONE.store(true, Ordering::Relaxed);
    RECORDER.forget_after_fork();
    device_memory::forget_after_fork();
}

/// Records an NVTX event: `text` (if not empty) is interned and `event` makes the record from
/// its string id (0: none).
pub fn record_nvtx(text: &[u8], event: impl FnOnce(u64) -> Event) {
    if !state::enabled() || !ensure_open() {
        return;
    }
    let id = if text.is_empty() {
        0
    } else {
        RECORDER.intern_string(text)
    };
    record(event(id));
}
