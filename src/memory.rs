//! The command's allocator: the system's, except that a request it cannot serve ends the
//! command with one line saying so (and exit status 2, as for any other error), where Rust's
//! own handler prints a backtrace and aborts, leaving a core file on hosts that keep them. A
//! report whose memory grows with the trace (`fit` holds every tensor event of the run it
//! replays) may meet a limit on the address space (`ulimit -v`, a batch system's) or the
//! machine's end; what it could not have is said, not a crash.
//!
//! Where the code asks fallibly ([`fallible`] around a `Vec::try_reserve`) the failure is
//! handed back to it instead, to say what it was gathering. Only the `gpushim` binary installs
//! [`Alloc`]: the library's users (the tests, a program linking it) keep their own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

std::thread_local! {
    /// This thread is inside [`fallible`]: a failed request is the caller's to handle.
    static FALLIBLE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, handing the allocations it cannot have back to it as failures (a
/// `try_reserve`'s `Err`) rather than ending the command.
pub fn fallible<T>(f: impl FnOnce() -> T) -> T {
    let was = FALLIBLE.with(|c| c.replace(true));
    let out = f();
    FALLIBLE.with(|c| c.set(was));
    out
}

/// The system's allocator; a request it cannot serve outside [`fallible`] ends the command.
pub struct Alloc;

// SAFETY: every method hands the request to `System` unchanged and returns what it returned
// (or does not return at all), so `System`'s guarantees are this allocator's.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout` are passed on as they are.
        let p = unsafe { System.alloc(layout) };
        served(p, layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        served(p, layout.size())
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (every allocation here is) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `dealloc`, and the caller's guarantees for `new_size` passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        served(p, new_size)
    }
}

/// `p` where the request was served or the caller handles a failure; else the command ends.
fn served(p: *mut u8, size: usize) -> *mut u8 {
    // `try_with`: a thread being torn down has no flag left; its failures end the command.
    if !p.is_null() || FALLIBLE.try_with(Cell::get).unwrap_or(false) {
        return p;
    }
    out_of_memory(size)
}

/// Says that `size` more bytes could not be had, and ends the command with status 2. Nothing
/// here allocates: the line is put together on the stack and written straight to stderr.
fn out_of_memory(size: usize) -> ! {
    let mut line = [0u8; 320];
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        let end = (at + bytes.len()).min(line.len());
        line[at..end].copy_from_slice(&bytes[..end - at]);
        at = end;
    };
    put(b"gpushim: out of memory: ");
    put(itoa::Buffer::new().format(size).as_bytes());
    put(
        b" bytes more could not be had (a limit on this process's memory, as `ulimit -v` \
          sets, or the machine's end); run it where it may have more\n",
    );
    // SAFETY: `line[..at]` is initialized memory of this frame; fd 2 is only written to.
    unsafe {
        libc::write(2, line.as_ptr().cast(), at);
        libc::_exit(2)
    }
}
