//! The per-thread cache of what each frame named, slotted by frame address.

use super::*;

/// What a thread found for a code object at an instruction: the trace frame, and what names
/// the code object beyond its address. Half a cache line, so that the entries of neighbouring
/// frames share lines.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(32))]
pub(super) struct Seen {
    pub(super) code: usize,
    pub(super) answer: u64,
    pub(super) offset: c_int,
    /// `co_version` from 3.12 (0, which several code objects may have, never matches); the
    /// first line before.
    pub(super) ident: u32,
    /// The file name's object before 3.12; 0 from 3.12.
    pub(super) filename: usize,
}

pub(super) const NOTHING: Seen = Seen {
    code: 0,
    answer: 0,
    offset: 0,
    ident: 0,
    filename: 0,
};

/// Entries per thread, slotted by frame address. A training loop allocates from the same
/// outer frames over and over (the loop, the model's forward, each block's call), each at
/// the address its depth gives it; only the innermost frames differ between allocations.
/// The slot is the frame's address in 64-byte units: CPython's frames (72 bytes and more)
/// each get their own, and a chain of frames, laid out one after another on the thread's
/// frame stack, reads neighbouring slots, which the hardware prefetches, where a hash of the
/// address scattered them over the table. An entry answers for its code object and
/// instruction whichever frame runs them.
pub(super) const SEEN_SLOTS: usize = 256;

/// Frames of the last walk remembered for the next one's prefetch.
pub(super) const TRAIL: usize = 48;

/// A thread's cache: what it found for the frames it walked ([`Seen`], by frame address), and
/// where the frames of its last walk and their code objects lay.
///
/// The walk follows a chain of pointers, frame to frame, so each frame's memory is asked for only
/// once the one before it has arrived; between two allocations the program's own work has pushed
/// those lines out of the nearest caches. The next walk over the same frames (nearly all of
/// them, in a loop) asks for all of them at once, up front: a prefetch of an address no longer
/// in use costs nothing and never faults.
pub(super) struct Cache {
    pub(super) seen: [Seen; SEEN_SLOTS],
    /// (frame, code object) of each frame written by the last walk.
    pub(super) trail: [(usize, usize); TRAIL],
    pub(super) trail_len: usize,
}

thread_local! {
    static CACHE: UnsafeCell<Cache> = const {
        UnsafeCell::new(Cache { seen: [NOTHING; SEEN_SLOTS], trail: [(0, 0); TRAIL], trail_len: 0 })
    };
}

pub(super) fn seen_slot(frame: usize) -> usize {
    (frame >> 6) % SEEN_SLOTS
}

/// This thread's cache.
pub(super) fn cache() -> Option<&'static mut Cache> {
    CACHE
        .try_with(|t| {
            // SAFETY: only this thread touches its cache, and never re-entrantly (the hooks'
            // guard keeps a capture from starting inside another); the reference is used within
            // one walk, on this thread, which outlives it.
            unsafe { &mut *t.get() }
        })
        .ok()
}

/// Asks for the memory the last walk read (each frame, its code object's identity field, its
/// cache entry), all at once, before the walk reads it one pointer after another.
#[inline(always)]
pub(super) fn prefetch_trail(c: &Cache, l: &Layout) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let ident = l.code_version.unwrap_or(l.code_firstlineno);
        for &(frame, code) in &c.trail[..c.trail_len.min(TRAIL)] {
            // SAFETY: a prefetch only hints the cache; it reads nothing and never faults, whatever
            // the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(frame as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(frame.wrapping_add(l.frame_instr) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(code.wrapping_add(ident) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>((&c.seen[seen_slot(frame)] as *const Seen).cast());
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (c, l);
}
