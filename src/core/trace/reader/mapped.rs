//! The file's records read where the page cache holds them: a window of the file mapped
//! read-only at a time, in place of a copy of it into a buffer of our own.
//!
//! Why: copying a trace in the page cache into a buffer (what `read` does) costs a third of the
//! decoder's CPU; mapped, the same pages cost only the faults that map them (the figures:
//! `docs/changelog.md`).
//!
//! What can go wrong: a mapped page past the end of the file raises SIGBUS when touched. The
//! file may shrink while it is read: a running program's trace is cut to its length when the
//! program ends, and a file in a shared folder can be cut by its owner at any time. So every
//! window is registered before it is read, and a SIGBUS at an address inside one maps a page of
//! zeros over the faulting page (the access then reads zeros: slots never written, where the
//! decoder stops) and marks the window cut; the decoder asks [`Window::cut`] where it meets
//! such a slot and says the file shrank, as a short `read` would have. A SIGBUS anywhere else
//! goes to the disposition there was before ours, as if ours were never there. The handler
//! allocates nothing and takes no lock: atomics and one `mmap` call (async-signal-safe).
//!
//! A window is 4 MiB at most (mapped file pages count in the process's resident memory while
//! mapped, and the reader's memory is not to grow with the file). Where a window cannot be
//! mapped (a file system without `mmap`, no free guard slot, `ReadMode::map` off) the decoder
//! reads into its buffer as before.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Records a window holds at most (4 MiB).
pub(super) const WINDOW_RECORDS: usize = 1 << 17;

/// One registered window: its address range while mapped (`start == 0`: the slot is free), and
/// whether a page of it was found past the file's end.
struct Guard {
    start: AtomicUsize,
    end: AtomicUsize,
    cut: AtomicBool,
}

/// Windows mapped at once, at most: one a decoder, and a job reads a trace a core.
const GUARDS: usize = 256;

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Guard = Guard {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    cut: AtomicBool::new(false),
};
static GUARDS_TABLE: [Guard; GUARDS] = [FREE; GUARDS];

/// The system's page size, once the handler is installed (0: not installed, or it failed).
static PAGE: AtomicUsize = AtomicUsize::new(0);

/// The disposition of SIGBUS before ours, for a fault that is not a window's.
struct Previous(std::cell::UnsafeCell<libc::sigaction>);
// SAFETY: written once, inside `INSTALL`'s `call_once`, before the handler that reads it is
// installed; read-only after.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(std::cell::UnsafeCell::new(
    // SAFETY: sigaction is a plain C struct; all zeros is SIG_DFL with an empty mask.
    unsafe { std::mem::zeroed() },
));
static INSTALL: std::sync::Once = std::sync::Once::new();

/// Our SIGBUS handler is installed (once a process); `false` where it could not be.
fn installed() -> bool {
    INSTALL.call_once(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return;
        };
        if page == 0 || !page.is_power_of_two() {
            return;
        }
        // SAFETY: a zeroed sigaction is valid; we fill its handler, flags and mask, then hand
        // sigaction a pointer to it and to PREVIOUS's cell, which nothing else reads until
        // PAGE is set below (the handler checks only windows, registered after that).
        let ok = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, &act, PREVIOUS.0.get()) == 0
        };
        if ok {
            PAGE.store(page, Ordering::Release);
        }
    });
    PAGE.load(Ordering::Acquire) != 0
}

/// A SIGBUS: inside a registered window, a page of zeros mapped over the faulting page and the
/// window marked cut; elsewhere, the previous disposition put back, under which the faulting
/// access raises it again as it would have without us.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a SA_SIGINFO handler a valid siginfo; si_addr is the faulting
    // address for SIGBUS.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Acquire);
    for g in &GUARDS_TABLE {
        let start = g.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr >= g.end.load(Ordering::Acquire) || page == 0 {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: `at` is a page inside our own read-only mapping of the window (registered
        // while mapped, released before it is unmapped): replaced by private zeros, which the
        // window's reader then reads. mmap is async-signal-safe.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            g.cut.store(true, Ordering::Release);
            return;
        }
        break;
    }
    // SAFETY: PREVIOUS holds the disposition sigaction returned when ours was installed;
    // sigaction is async-signal-safe. Returning re-runs the faulting access under it.
    unsafe {
        libc::sigaction(libc::SIGBUS, PREVIOUS.0.get(), std::ptr::null_mut());
    }
}

/// A part of a trace file mapped read-only, registered with the SIGBUS guard while mapped.
pub(super) struct Window {
    base: *mut libc::c_void,
    map_len: usize,
    /// Bytes from `base` to the first byte asked for, and how many were asked for.
    skip: usize,
    len: usize,
    guard: usize,
}

// SAFETY: the window is a read-only mapping owned by one decoder, which moves between threads
// whole; nothing else unmaps it.
unsafe impl Send for Window {}
// SAFETY: shared, a window is only read (`bytes`, `cut`); only its owner's drop unmaps it.
unsafe impl Sync for Window {}

impl Window {
    /// `len` bytes of `file` from `offset`, mapped; `None` where they cannot be (the caller
    /// reads them instead). A decoder asked to read without mapping (`ReadMode::map`) never
    /// calls it.
    pub(super) fn map(file: &std::fs::File, offset: u64, len: usize) -> Option<Window> {
        use std::os::fd::AsRawFd;
        if len == 0 || !installed() {
            return None;
        }
        let page = PAGE.load(Ordering::Acquire) as u64;
        let aligned = offset & !(page - 1);
        let skip = usize::try_from(offset - aligned).ok()?;
        let map_len = skip.checked_add(len)?;
        let at = libc::off_t::try_from(aligned).ok()?;
        let guard = claim()?;
        // SAFETY: a fresh read-only shared mapping of our open file; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                at,
            )
        };
        if base == libc::MAP_FAILED {
            GUARDS_TABLE[guard].start.store(0, Ordering::Release);
            return None;
        }
        let g = &GUARDS_TABLE[guard];
        g.cut.store(false, Ordering::Relaxed);
        g.end.store(base as usize + map_len, Ordering::Release);
        g.start.store(base as usize, Ordering::Release);
        Some(Window {
            base,
            map_len,
            skip,
            len,
            guard,
        })
    }

    /// The bytes asked for (zeros where the file no longer has them).
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: `base + skip .. + len` lies inside our mapping, alive until drop; a page of
        // it past the file's end reads zeros (the SIGBUS guard maps them over it).
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>().add(self.skip), self.len) }
    }

    /// Whether some page of the window was found past the file's end (the file shrank).
    pub(super) fn cut(&self) -> bool {
        GUARDS_TABLE[self.guard].cut.load(Ordering::Acquire)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        let g = &GUARDS_TABLE[self.guard];
        // Released before the pages go: a fault at these addresses after is not ours.
        g.start.store(0, Ordering::Release);
        // SAFETY: unmaps exactly the mapping `map` made, once.
        unsafe {
            libc::munmap(self.base, self.map_len);
        }
        g.end.store(0, Ordering::Release);
    }
}

/// A free guard slot, claimed (its start set to a placeholder until the mapping's is known).
fn claim() -> Option<usize> {
    GUARDS_TABLE.iter().position(|g| {
        g.end.load(Ordering::Relaxed) == 0
            && g.start
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_window_of_a_file_cut_short_while_mapped_reads_zeros_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let mut f = std::fs::File::create(&path).unwrap();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page).unwrap().max(4096);
        f.write_all(&vec![7u8; 4 * page]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let w = Window::map(&f, 100, 3 * page).expect("a regular file maps");
        assert!(w.bytes().iter().all(|&b| b == 7));
        assert!(!w.cut());
        // Cut to one page and a half: the pages after the one holding the end fault.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len((page + page / 2) as u64)
            .unwrap();
        let b = w.bytes();
        let whole = b.len();
        assert_eq!(b[0], 7);
        // Past the page that holds the new end: zeros, and the window says it was cut.
        let past = 2 * page - 100;
        assert!(b[past..whole].iter().all(|&x| x == 0));
        assert!(w.cut());
        drop(w);
        // The slot is free again and a fresh window is whole.
        let w = Window::map(&f, 0, page).unwrap();
        assert!(!w.cut());
        assert!(w.bytes().iter().all(|&b| b == 7));
    }
}
