//! Python frames for the trace: when the allocating thread runs CPython (3.9 to 3.13, found in
//! the process at run time; nothing linked, no package, no code change), the file, line and
//! function of each of its frames, innermost first.
//!
//! A CUDA allocation usually comes from C code that released the GIL (PyTorch's operators do,
//! ctypes does), so the frames cannot be asked for through the C API, which needs the GIL, and
//! the GIL is never taken here (taking it inside an allocator deadlocks against a thread that
//! holds it and waits for the allocator). Instead the thread's own frame chain is read the way
//! py-spy reads it: the thread is inside a C call, so no Python code of its own runs and its
//! frames cannot change under us; another thread may only attach frame objects to them, which
//! the walk does not read. The layouts of the few fields read (`docs/cuda-facts.md` says where
//! they were measured) are per minor version, from CPython's own headers:
//!
//! - the thread state: `PyGILState_GetThisThreadState()`, the calling thread's own (never the
//!   GIL holder's); its current frame (`frame`, `cframe->current_frame` or `current_frame`);
//! - each frame's code object, instruction and caller (`PyFrameObject` up to 3.10,
//!   `_PyInterpreterFrame` from 3.11; frames owned by the C stack are skipped);
//! - each code object's file name, (qualified) name and line table, the line found with
//!   `PyCode_Addr2Line`, which only reads;
//! - string contents as CPython stores them (compact ASCII, or UTF-8 when cached, else UCS).
//!
//! Nothing is trusted: every code object and string must have CPython's own type object
//! (`PyCode_Type`, `PyUnicode_Type`), or the walk stops. The first captures of a process read
//! memory through a pipe (`write` answers EFAULT for an address that is not mapped, where a
//! load would crash); only after they validate does the walk read directly. A layout that does
//! not validate turns Python frames off for the process, said once. No Python frames either
//! while the interpreter starts or finalizes, in a process with sub-interpreters, on a thread
//! that has no thread state, or on free-threaded builds (3.13t).
//!
//! Costs are kept down by caches: per thread, the answers for the frames it captured before,
//! slotted by frame address (a loop allocates from the same outer frames over and over; here);
//! shared by all threads, code object -> interned `file\0function` and (code object,
//! instruction offset) -> line (`names`). A freed code object's address may be given to a new
//! one, so an entry names its code object by more than the address: from 3.12 by `co_version`,
//! which CPython gives no two code objects (one field, and exact unless an extension builds
//! code objects itself and copies it); before 3.12 by its file name and first line here, and
//! its name and line table too in `names`.

mod layout;
mod names;
mod seen;

use layout::{FRAME_OWNED_BY_CSTACK, Layout, layout};
use seen::*;

use crate::cuda::real;
use crate::os::say;
use core::cell::UnsafeCell;
use core::ffi::{CStr, c_char, c_int, c_void};
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use gpushim_core::trace::format::py_frame;
use names::{code_id, line_at};

type Getter = unsafe extern "C" fn() -> usize;
type Flag = unsafe extern "C" fn() -> c_int;

/// What the walk needs of the running CPython, found once.
#[derive(Clone, Copy)]
struct Api {
    minor: u32,
    layout: Layout,
    is_initialized: Flag,
    is_finalizing: Flag,
    this_thread: Getter,
    main_interpreter: Getter,
    head_interpreter: Getter,
    next_interpreter: unsafe extern "C" fn(usize) -> usize,
    addr2line: unsafe extern "C" fn(usize, c_int) -> c_int,
    code_type: usize,
    unicode_type: usize,
    frame_type: usize,
}

const UNKNOWN: u8 = 0;
const RESOLVING: u8 = 1;
const READY: u8 = 2;
const ABSENT: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
struct ApiCell(UnsafeCell<MaybeUninit<Api>>);
// SAFETY: written once by the thread that moves STATE from UNKNOWN to RESOLVING, read only
// after STATE is READY (Release/Acquire).
unsafe impl Sync for ApiCell {}
static API: ApiCell = ApiCell(UnsafeCell::new(MaybeUninit::uninit()));

static SAID: AtomicBool = AtomicBool::new(false);

/// Says once why Python frames are not recorded in this process.
fn refuse(why: core::fmt::Arguments<'_>) {
    if !SAID.swap(true, Ordering::Relaxed) {
        say(format_args!("Python frames are not recorded: {why}"));
    }
}

/// The API, found on first use; `None` when the process runs no CPython we can read. A
/// reference: the table is a few hundred bytes, which a copy per capture would read and write.
fn api() -> Option<&'static Api> {
    match STATE.load(Ordering::Acquire) {
        // SAFETY: READY is published after the write (Release), read here with Acquire; the
        // table is never written again.
        READY => Some(unsafe { (*API.0.get()).assume_init_ref() }),
        ABSENT => None,
        RESOLVING => {
            // Another thread is looking the functions up (a few dlsym calls, microseconds):
            // wait for it, spinning first, then giving the processor up (it may have been
            // preempted on a loaded machine); boundedly, as it may need the loader's lock,
            // which this thread might hold.
            for i in 0..200_000u32 {
                match STATE.load(Ordering::Acquire) {
                    RESOLVING if i < 1_000 => core::hint::spin_loop(),
                    // SAFETY: sched_yield has no preconditions.
                    RESOLVING => unsafe {
                        libc::sched_yield();
                    },
                    // SAFETY: as above.
                    READY => return Some(unsafe { (*API.0.get()).assume_init_ref() }),
                    _ => return None,
                }
            }
            None
        }
        _ => {
            if STATE
                .compare_exchange(UNKNOWN, RESOLVING, Ordering::Acquire, Ordering::Acquire)
                .is_err()
            {
                return None;
            }
            match resolve() {
                Some(a) => {
                    // SAFETY: we own the RESOLVING state; nobody reads API before READY, and
                    // nobody writes it after.
                    let a = unsafe { (*API.0.get()).write(a) };
                    STATE.store(READY, Ordering::Release);
                    Some(a)
                }
                None => {
                    STATE.store(ABSENT, Ordering::Release);
                    None
                }
            }
        }
    }
}

/// Whether the process is known to have no CPython we can read (then nothing is asked again).
pub fn absent() -> bool {
    STATE.load(Ordering::Relaxed) == ABSENT
}

/// Set when the process was found to run no CPython at all (not one whose frames are refused).
static NO_INTERPRETER: AtomicBool = AtomicBool::new(false);

/// Whether the process is known to run no CPython at all: a C or C++ program (a CPython whose
/// frames cannot be read, free-threaded or with sub-interpreters, is not one).
pub fn no_interpreter() -> bool {
    NO_INTERPRETER.load(Ordering::Relaxed)
}

/// Python frames are off for the rest of the process.
fn turn_off() {
    STATE.store(ABSENT, Ordering::Release);
}

/// A symbol of the running Python, by name; 0 when absent.
fn symbol(name: &CStr) -> usize {
    let Some(dlsym) = real::real_dlsym() else {
        return 0;
    };
    // SAFETY: glibc's dlsym with RTLD_DEFAULT and a NUL-terminated name.
    unsafe { dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

/// `symbol(name)` as a function of type `F`.
///
/// # Safety
/// `F` must be the C signature of `name` in every CPython version that gets here.
unsafe fn function<F: Copy>(name: &CStr) -> Option<F> {
    // SAFETY: the caller names the signature.
    unsafe { real::as_fn::<F>(symbol(name)) }
}

/// The running CPython's minor version, and whether it is a free-threaded build, from
/// `Py_GetVersion()` ("3.12.1 (main, ...)"); `None` without CPython 3.
fn version() -> Option<(u32, bool)> {
    // SAFETY: Py_GetVersion takes nothing and returns a static NUL-terminated string.
    let get = unsafe { function::<unsafe extern "C" fn() -> *const c_char>(c"Py_GetVersion") }?;
    // SAFETY: as above.
    let text = unsafe { CStr::from_ptr(get()) }.to_bytes();
    let rest = text.strip_prefix(b"3.")?;
    let digits = rest.iter().take_while(|c| c.is_ascii_digit()).count();
    let minor = core::str::from_utf8(&rest[..digits]).ok()?.parse().ok()?;
    let free_threaded = text.windows(14).any(|w| w == b"free-threading");
    Some((minor, free_threaded))
}

#[cold]
fn resolve() -> Option<Api> {
    let Some((minor, free_threaded)) = version() else {
        NO_INTERPRETER.store(true, Ordering::Relaxed);
        return None;
    };
    if free_threaded {
        refuse(format_args!("this CPython is free-threaded"));
        return None;
    }
    let Some(layout) = layout(minor) else {
        refuse(format_args!(
            "CPython 3.{minor} is not one of the versions read (3.9 to 3.13)"
        ));
        return None;
    };
    // SAFETY: each name is given the C signature it has in CPython 3.9 to 3.13
    // (Include/pylifecycle.h, pystate.h, code.h).
    unsafe {
        Some(Api {
            minor,
            layout,
            is_initialized: function(c"Py_IsInitialized")?,
            is_finalizing: if minor >= 13 {
                function(c"Py_IsFinalizing")?
            } else {
                function(c"_Py_IsFinalizing")?
            },
            this_thread: function(c"PyGILState_GetThisThreadState")?,
            main_interpreter: function(c"PyInterpreterState_Main")?,
            head_interpreter: function(c"PyInterpreterState_Head")?,
            next_interpreter: function(c"PyInterpreterState_Next")?,
            addr2line: function(c"PyCode_Addr2Line")?,
            code_type: nonzero(symbol(c"PyCode_Type"))?,
            unicode_type: nonzero(symbol(c"PyUnicode_Type"))?,
            frame_type: nonzero(symbol(c"PyFrame_Type"))?,
        })
    }
}

fn nonzero(p: usize) -> Option<usize> {
    (p != 0).then_some(p)
}

/// Captures made with checked reads before the walk trusts the layout.
const PROBATION: u32 = 16;
static PROVEN: AtomicU32 = AtomicU32::new(0);

/// How the walk reads memory: directly once the layout is proven, else through a pipe, which
/// fails (EFAULT) where a load would crash.
#[derive(Clone, Copy)]
enum Reader {
    Direct,
    /// The write end and read end of a pipe.
    Checked(c_int, c_int),
}

impl Reader {
    /// Reads a `T` at `addr`; `None` when the address is not readable (checked reads only).
    #[inline(always)]
    fn read<T: Copy>(self, addr: usize) -> Option<T> {
        // Nothing of CPython's lies in the first 64 KiB (never mapped on Linux): a pointer
        // there is not one to follow.
        if addr < 0x1_0000 {
            return None;
        }
        match self {
            // SAFETY: the layout is proven (PROBATION checked walks validated it) and `addr`
            // was derived from this thread's own frame chain, which cannot change while the
            // thread is inside this C call; CPython's objects are suitably aligned.
            Reader::Direct => Some(unsafe { core::ptr::read_unaligned(addr as *const T) }),
            Reader::Checked(w, r) => {
                let mut v = MaybeUninit::<T>::uninit();
                let n = core::mem::size_of::<T>();
                // SAFETY: write() reads `n` bytes at `addr` in the kernel, which answers EFAULT
                // instead of faulting; read() fills our own buffer of `n` bytes.
                unsafe {
                    if libc::write(w, addr as *const c_void, n) != n as isize {
                        return None;
                    }
                    if libc::read(r, v.as_mut_ptr().cast(), n) != n as isize {
                        return None;
                    }
                    Some(v.assume_init())
                }
            }
        }
    }

    #[inline(always)]
    fn ptr(self, addr: usize) -> Option<usize> {
        self.read::<usize>(addr)
    }

    /// Reads a `T` at `offset` from `base`, a pointer already checked to lie above the first
    /// 64 KiB (a direct read checks nothing more; a checked one, everything).
    #[inline(always)]
    fn field<T: Copy>(self, base: usize, offset: usize) -> Option<T> {
        match self {
            Reader::Direct => {
                // SAFETY: as in `read`; `base` was checked by the caller, and `offset` is a
                // field offset within the object.
                Some(unsafe { core::ptr::read_unaligned(base.wrapping_add(offset) as *const T) })
            }
            Reader::Checked(..) => self.read(base.wrapping_add(offset)),
        }
    }

    /// Copies `into.len()` bytes at `addr` (at most a pipe's capacity when checked).
    fn copy(self, addr: usize, into: &mut [u8]) -> Option<()> {
        if into.is_empty() {
            return Some(());
        }
        if addr < 0x1_0000 {
            return None;
        }
        match self {
            // SAFETY: as in `read`: the bytes of a string held by a live code object.
            Reader::Direct => unsafe {
                core::ptr::copy_nonoverlapping(addr as *const u8, into.as_mut_ptr(), into.len());
            },
            // SAFETY: as in `read`.
            Reader::Checked(w, r) => unsafe {
                let n = into.len();
                if libc::write(w, addr as *const c_void, n) != n as isize
                    || libc::read(r, into.as_mut_ptr().cast(), n) != n as isize
                {
                    return None;
                }
            },
        }
        Some(())
    }
}

/// Writes the calling thread's Python frames, innermost first, into `out` as trace frames
/// ([`py_frame`]) and returns how many; 0 when the thread runs no Python or its frames cannot
/// be read safely.
pub fn capture(out: &mut [u64]) -> usize {
    if out.is_empty() {
        return 0;
    }
    let Some(a) = api() else {
        return 0;
    };
    // SAFETY: none of these functions has a precondition or needs the GIL: each reads one
    // runtime field (the interpreter list's head and links are read racily, as py-spy does;
    // a wrong answer only leaves frames out).
    let tstate = unsafe {
        if (a.is_initialized)() == 0 || (a.is_finalizing)() != 0 {
            return 0;
        }
        // A thread with no Python thread state (PyTorch's autograd thread makes half of a
        // training step's allocations) has no frames: asked before the interpreter list is
        // read, such a thread costs three calls into CPython instead of six.
        let tstate = (a.this_thread)();
        if tstate == 0 {
            return 0;
        }
        // New interpreters go to the head of the list; the main one is the oldest.
        let head = (a.head_interpreter)();
        if head != (a.main_interpreter)() || (a.next_interpreter)(head) != 0 {
            refuse(format_args!("the process has sub-interpreters"));
            return 0;
        }
        tstate
    };
    if PROVEN.load(Ordering::Relaxed) >= PROBATION {
        let t0 = crate::costs::start();
        let n = walk::<true>(a, Reader::Direct, tstate, out).unwrap_or(0);
        crate::costs::end(crate::costs::Cost::PyWalk, t0);
        crate::costs::add(crate::costs::Cost::PyFrames, n as u64);
        return n;
    }
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 with a valid two-int buffer.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return 0;
    }
    let got = walk::<false>(a, Reader::Checked(fds[1], fds[0]), tstate, out);
    // SAFETY: both descriptors are ours.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    match got {
        Some(n) => {
            if n > 0 {
                PROVEN.fetch_add(1, Ordering::Relaxed);
            }
            n
        }
        None => {
            turn_off();
            refuse(format_args!(
                "the frames of this CPython 3.{} are not laid out as expected",
                a.minor
            ));
            0
        }
    }
}

/// Walks the thread's frames; `None` when something read is not what CPython would hold there
/// (the layout is wrong), else the number of frames written. `DIRECT` says `m` is
/// [`Reader::Direct`]: that walk is compiled on its own, its reads plain loads.
///
/// A training step walks twenty to forty frames per tensor, so the loop is kept short: each
/// pointer followed is checked once (a frame, a code object), the fields read at fixed offsets
/// from it, and a frame this thread saw before costs a compare with its cache entry; what the
/// cache does not know is looked up out of line ([`miss`]).
fn walk<const DIRECT: bool>(a: &Api, m: Reader, tstate: usize, out: &mut [u64]) -> Option<usize> {
    let m = if DIRECT { Reader::Direct } else { m };
    let l = a.layout;
    // This thread's cache, found once per walk (a thread-local's address costs a call into the
    // loader from a shared library); none for checked walks, whose answers are not kept.
    let mut cache = if DIRECT { cache() } else { None };
    if let Some(c) = cache.as_deref() {
        prefetch_trail(c, &l);
    }
    let mut frame = m.ptr(tstate + l.tstate_frame).unwrap_or(0);
    if let Some(off) = l.cframe_frame {
        // 3.11 and 3.12: the thread state points at a C frame that points at the frame.
        frame = if frame == 0 { 0 } else { m.ptr(frame + off)? };
    }
    // Entry frames (owned by the C stack) are CPython's own from 3.12, not Python code.
    let entry_frames = a.minor >= 12;
    let mut n = 0;
    // A chain longer than this is damaged (CPython's recursion limit keeps real ones shorter
    // than the frames shown, which are the innermost).
    for step in 0..100_000u32 {
        if frame == 0 || n == out.len() {
            return Some(n);
        }
        // Nothing of CPython's lies in the first 64 KiB (never mapped on Linux): not a frame.
        if frame < 0x1_0000 {
            return None;
        }
        // CPython frees the thread states of daemon threads right after it starts finalizing
        // (after clearing each one's objects, microseconds of work); asking before every
        // fourth frame keeps the walk off freed memory but for a window of four frames' reads,
        // about 10 ns (README, "Limits").
        // SAFETY: no precondition; reads one runtime field.
        if step % 4 == 3 && unsafe { (a.is_finalizing)() } != 0 {
            return Some(n);
        }
        if l.frame_owner.is_none() && m.field::<usize>(frame, 8)? != a.frame_type {
            return None;
        }
        let code = m.field::<usize>(frame, l.frame_code)?;
        let back = m.field::<usize>(frame, l.frame_back).unwrap_or(0);
        let offset = match l.frame_owner {
            Some(off) => {
                if entry_frames && m.field::<u8>(frame, off)? == FRAME_OWNED_BY_CSTACK {
                    frame = back;
                    continue;
                }
                let instr = m.field::<usize>(frame, l.frame_instr)?;
                let start = code.wrapping_add(l.code_adaptive);
                c_int::try_from(instr.wrapping_sub(start) as isize).unwrap_or(-1)
            }
            // 3.9 counts f_lasti in bytes, 3.10 in 2-byte code units.
            None => {
                let lasti = m.field::<c_int>(frame, l.frame_instr)?;
                if a.minor == 10 {
                    lasti.saturating_mul(2)
                } else {
                    lasti
                }
            }
        };
        if code < 0x1_0000 {
            return None;
        }
        // What this thread found for this code object at this instruction before, if the
        // code object at `code` is still that one: from 3.12 its `co_version` says so (one
        // field, and exact: a code object CPython made since at a recycled address has
        // another); before, its file name and first line (one cache line of it, not its
        // header; its type was checked when the entry was made).
        let slot = seen_slot(frame);
        let hit = match cache.as_deref() {
            Some(c) if DIRECT => {
                let e = &c.seen[slot];
                let same = e.code == code
                    && e.offset == offset
                    && match l.code_version {
                        Some(at) => e.ident != 0 && m.field::<u32>(code, at) == Some(e.ident),
                        None => {
                            m.field::<usize>(code, l.code_filename) == Some(e.filename)
                                && m.field::<u32>(code, l.code_firstlineno) == Some(e.ident)
                        }
                    };
                same.then_some(e.answer)
            }
            _ => None,
        };
        out[n] = match hit {
            Some(f) => f,
            None => {
                let e = miss(a, m, code, offset)?;
                if let (true, Some(c)) = (DIRECT, cache.as_deref_mut()) {
                    c.seen[slot] = e;
                }
                e.answer
            }
        };
        if let (true, Some(c)) = (DIRECT, cache.as_deref_mut())
            && n < TRAIL
        {
            c.trail[n] = (frame, code);
            c.trail_len = n + 1;
        }
        n += 1;
        frame = back;
    }
    None
}

/// The trace frame of `code` at `offset`, looked up in the shared tables (the thread's cache did
/// not know it), as the cache entry that remembers it; `None` when `code` is not a code object.
#[cold]
#[inline(never)]
fn miss(a: &Api, m: Reader, code: usize, offset: c_int) -> Option<Seen> {
    let t0 = crate::costs::start();
    let l = &a.layout;
    if m.field::<usize>(code, 8)? != a.code_type {
        return None;
    }
    let (id, key) = code_id(a, m, code)?;
    let (filename, ident) = match l.code_version {
        Some(at) => (0, m.field::<u32>(code, at)?),
        None => (key.filename, key.firstlineno),
    };
    let answer = py_frame(id, line_at(a, code, key, offset).max(0) as u32);
    crate::costs::end(crate::costs::Cost::PyFrameMiss, t0);
    Some(Seen {
        code,
        answer,
        offset,
        ident,
        filename,
    })
}
