//! The operating-system helpers every layer shares, none of which allocates: reading the
//! environment, one line on stderr, and a spin lock.

use core::ffi::{CStr, c_char};
use core::fmt::Write as _;
use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use gpushim_core::fixedfmt::FixedBuf;

unsafe extern "C" {
    /// glibc 2.17 and later; the `libc` crate does not declare it.
    fn secure_getenv(name: *const c_char) -> *mut c_char;
}

/// Reads an environment variable without allocating. `secure_getenv`: in a setuid or setgid
/// program (or one with file capabilities) every variable reads as unset, so an unprivileged
/// user can never make a privileged process create a trace file where they chose.
pub fn env(name: &CStr) -> Option<&'static CStr> {
    // SAFETY: secure_getenv with a NUL-terminated name; the result points into the
    // environment, which lives for the process (we never call setenv).
    let p = unsafe { secure_getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: getenv returns a NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p as *const c_char) })
    }
}

/// Whether a switch variable is on: set to anything but empty or `0`.
pub fn env_flag(name: &CStr) -> bool {
    env(name).is_some_and(|v| {
        let v = v.to_bytes();
        !v.is_empty() && v != b"0"
    })
}

/// One line on stderr, prefixed `gpushim: `, written in one call, without allocating.
pub fn say(args: core::fmt::Arguments<'_>) {
    let mut raw = FixedBuf::<1024>::new();
    let _ = raw.write_fmt(args);
    let mut b = FixedBuf::<4096>::new();
    let _ = b.write_str("gpushim: ");
    // What a message quotes (a setting's value, a path) is the user's or anyone's: control
    // characters and hidden ones reach the terminal escaped, the message's own line breaks kept.
    for (i, line) in raw.as_bytes().split(|&c| c == b'\n').enumerate() {
        if i > 0 {
            b.push_bytes(b"\n");
        }
        let _ = write!(b, "{}", gpushim_core::fixedfmt::Escaped(line));
    }
    b.push_bytes(b"\n");
    b.write_stderr();
}

/// A lock that spins briefly, then yields. Never held across a call into the CUDA runtime.
pub struct SpinLock(AtomicBool);

impl SpinLock {
    pub const fn new() -> SpinLock {
        SpinLock(AtomicBool::new(false))
    }

    /// Takes the lock until the guard is dropped: no path can leave it taken.
    pub fn lock(&self) -> SpinGuard<'_> {
        let mut spins = 0u32;
        while self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.0.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    core::hint::spin_loop();
                } else {
                    // SAFETY: sched_yield has no preconditions.
                    unsafe { libc::sched_yield() };
                }
            }
        }
        SpinGuard(self)
    }

    /// In a forked child only: a thread of the parent may have held the lock at the fork, and
    /// no guard of this process will ever let it go.
    pub fn reset_after_fork(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The lock of a [`SpinLock`], let go when dropped.
#[must_use = "the lock is let go as soon as the guard is dropped"]
pub struct SpinGuard<'a>(&'a SpinLock);

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        self.0.0.store(false, Ordering::Release);
    }
}

/// A yes or no decided on first use and kept: no allocation and no lock, so it can be asked
/// inside `dlsym`, constructors and hooks. Concurrent first uses may each decide; the first
/// decision stored is the one every later use sees.
pub struct LazyFlag(AtomicU8);

const UNDECIDED: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

impl LazyFlag {
    pub const fn new() -> LazyFlag {
        LazyFlag(AtomicU8::new(UNDECIDED))
    }

    /// The flag, decided by `decide` on first use.
    pub fn get(&self, decide: impl FnOnce() -> bool) -> bool {
        self.get_or(decide, |_| {})
    }

    /// As [`LazyFlag::get`], and `decided(value)` runs once, in the call whose decision stuck.
    pub fn get_or(&self, decide: impl FnOnce() -> bool, decided: impl FnOnce(bool)) -> bool {
        match self.0.load(Ordering::Relaxed) {
            YES => true,
            NO => false,
            _ => {
                let v = decide();
                let code = if v { YES } else { NO };
                match self
                    .0
                    .compare_exchange(UNDECIDED, code, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => {
                        decided(v);
                        v
                    }
                    Err(other) => other == YES,
                }
            }
        }
    }

    /// Decides it now, whatever it was.
    pub fn set(&self, v: bool) {
        self.0.store(if v { YES } else { NO }, Ordering::Relaxed);
    }

    /// Whether it was decided, and no.
    pub fn is_no(&self) -> bool {
        self.0.load(Ordering::Relaxed) == NO
    }
}
