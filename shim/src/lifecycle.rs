//! The library's life in the process: the constructor, and the one exit handler and one fork
//! handler that run what each layer asked for. Layers above ask with [`on_exit`] and
//! [`in_forked_child`] when they start (the trace when it opens, the pool on first use, the IPC
//! table when made), so this layer calls none of them by name.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs when the library is loaded, before `main`: resolve glibc's `dlsym` (so the `dlsym`
/// trampoline can forward `RTLD_NEXT` with the caller's address intact) and read the off
/// switch. Allocates nothing and registers nothing (registering may allocate).
extern "C" fn constructor() {
    let _ = crate::cuda::real::real_dlsym();
    let _ = crate::state::enabled();
}

#[used]
#[unsafe(link_section = ".init_array")]
static CONSTRUCTOR: extern "C" fn() = constructor;

/// Room for every handler (the trace, the pool's split count, the IPC table, the cost
/// report), with two to spare.
const SLOTS: usize = 6;
static AT_EXIT: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static IN_CHILD: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Adds `f` to `table` unless it is there (first free slot; in registration order).
fn add(table: &[AtomicUsize; SLOTS], f: fn()) {
    let f = f as usize;
    for slot in table {
        match slot.compare_exchange(0, f, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => break,
            Err(existing) if existing == f => break,
            Err(_) => {}
        }
    }
    if !REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: both handlers are plain functions that live as long as the process (the
        // library is linked with -z nodelete).
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(in_child));
        }
    }
}

/// `f` runs at exit, after the handlers asked for before it.
pub fn on_exit(f: fn()) {
    add(&AT_EXIT, f);
}

/// `f` runs in a child made by `fork`, after the handlers asked for before it.
pub fn in_forked_child(f: fn()) {
    add(&IN_CHILD, f);
}

fn run(table: &[AtomicUsize; SLOTS]) {
    for slot in table {
        let f = slot.load(Ordering::Acquire);
        if f == 0 {
            break;
        }
        // SAFETY: only `fn()` values are stored in the tables (see `add`).
        let f: fn() = unsafe { core::mem::transmute::<usize, fn()>(f) };
        f();
    }
}

extern "C" fn at_exit() {
    run(&AT_EXIT);
}

extern "C" fn in_child() {
    run(&IN_CHILD);
}
