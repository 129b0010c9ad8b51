//! Growing the trace file: mapping its chunks (on the slow path of a producer that reaches
//! one first, or ahead of the writers on the grower thread) and populating their pages.

use super::*;

impl Recorder {
    /// Whether `addr` lies in a chunk of the trace this recorder mapped. Lock-free and
    /// allocation-free: callable from a signal handler.
    pub fn maps(&self, addr: usize) -> bool {
        self.chunks.iter().any(|c| {
            let base = c.load(Ordering::Acquire) as usize;
            base != 0 && addr >= base && addr < base + CHUNK_BYTES as usize
        })
    }

    /// The file under the mapping was cut short (another process truncated it): every mapped
    /// chunk is replaced in place by anonymous memory, so writes already under way land
    /// harmlessly, and recording stops. Only system calls and atomics: callable from a SIGBUS
    /// handler. Returns whether any chunk was replaced.
    pub fn abandon_mappings(&self) -> bool {
        self.state.store(FAILED, Ordering::Release);
        let mut any = false;
        for c in &self.chunks {
            let base = c.load(Ordering::Acquire);
            if base.is_null() {
                continue;
            }
            // SAFETY: replaces our own mapping of CHUNK_BYTES at `base` with private anonymous
            // memory of the same size (MAP_FIXED over a range we own).
            let p = unsafe {
                libc::mmap(
                    base.cast(),
                    CHUNK_BYTES as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            any |= p != libc::MAP_FAILED;
        }
        any
    }

    /// Keeps the chunks just ahead of the writers mapped and their pages populated, so that
    /// producers neither make the `mmap` call nor take the page faults of a fresh file page
    /// (about 50 ns a record when they do). Runs on a helper thread, never on the hot path;
    /// returns whether it had work to do.
    pub fn grow_ahead(&self) -> bool {
        self.slow.ahead_busy.store(true, Ordering::SeqCst);
        let worked = !self.slow.ahead_stopped.load(Ordering::SeqCst) && self.grow_ahead_now();
        self.slow.ahead_busy.store(false, Ordering::SeqCst);
        worked
    }

    fn grow_ahead_now(&self) -> bool {
        if self.state.load(Ordering::Acquire) != READY {
            return false;
        }
        let claimed = self.claimed();
        let capacity = self.capacity.load(Ordering::Relaxed);
        let last = HEADER_SIZE as u64 + capacity.saturating_sub(1) * RECORD_SIZE as u64;
        let last_chunk = (last / CHUNK_BYTES) as usize;
        let slot = claimed.min(capacity.saturating_sub(1));
        let current = ((HEADER_SIZE as u64 + slot * RECORD_SIZE as u64) / CHUNK_BYTES) as usize;
        let mut worked = false;
        for c in current
            ..=(current + LOOKAHEAD_CHUNKS)
                .min(last_chunk)
                .min(MAX_CHUNKS - 1)
        {
            if !self.chunks[c].load(Ordering::Acquire).is_null() {
                continue;
            }
            let Ok(base) = self.map_chunk(c) else {
                return worked;
            };
            populate(base, CHUNK_BYTES as usize);
            worked = true;
        }
        worked
    }

    /// Calls [`Recorder::grow_ahead`] until `stop` is set, sleeping 1 ms between calls while the
    /// writers are busy and up to 64 ms while they are idle.
    pub fn run_grower(&self, stop: &AtomicBool) {
        let mut idle_ms = 1u64;
        while !stop.load(Ordering::Relaxed) {
            let before = self.claimed();
            if self.grow_ahead() {
                continue; // writers are fast: keep ahead of them before sleeping
            }
            std::thread::sleep(std::time::Duration::from_millis(idle_ms));
            idle_ms = if self.claimed() == before {
                (idle_ms * 2).min(64)
            } else {
                1
            };
        }
    }

    /// Maps chunk `c`, growing the file first. Slow path: one producer at a time.
    pub(super) fn map_chunk(&self, c: usize) -> Result<*mut u8, i32> {
        while self
            .slow
            .growing
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        let r = self.map_chunk_locked(c);
        self.slow.growing.store(false, Ordering::Release);
        r
    }

    /// At a clean exit, before any checkpoint was written: cuts the file to the slots claimed
    /// so far plus [`TAIL_KEPT`], so that `ls` shows what the trace holds, not the chunks mapped
    /// ahead of the writers. Records claimed later (an exit handler that frees memory) still
    /// land while they fit in the tail kept; past it they are counted as lost. The mappings past
    /// the new end are first replaced by anonymous memory, so no access can fault. Returns
    /// whether the file was cut.
    pub(super) fn cut_to_claimed(&self, fd: i32, file_size: u64) -> bool {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let slack = TAIL_KEPT / RECORD_SIZE as u64;
        let length_for = |slots: u64| {
            (HEADER_SIZE as u64)
                .saturating_add(slots.saturating_mul(RECORD_SIZE as u64))
                .div_ceil(TAIL_KEPT)
                .saturating_mul(TAIL_KEPT)
        };
        let limit = self.claimed().saturating_add(slack).min(capacity);
        // Worth it only where more than the tail kept would go.
        if length_for(limit.saturating_add(slack)) >= file_size {
            return false;
        }
        // SeqCst, paired with the claims: a claim this count misses sees the limit.
        self.limit.store(limit, Ordering::SeqCst);
        let claimed = self
            .header_word(header::CLAIMED)
            .map_or(0, |w| w.load(Ordering::SeqCst))
            .min(capacity);
        let len = length_for(limit.max(claimed));
        if len >= file_size {
            return false;
        }
        while self
            .slow
            .growing
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        }
        for (c, chunk) in self.chunks.iter().enumerate() {
            let base = chunk.load(Ordering::Acquire);
            let start = c as u64 * CHUNK_BYTES;
            if base.is_null() || start + CHUNK_BYTES <= len {
                continue;
            }
            let keep = len.saturating_sub(start) as usize;
            // SAFETY: replaces the part of our own chunk mapping past the new end of the file
            // (page-aligned: `len` is a multiple of TAIL_KEPT) with private anonymous memory.
            let p = unsafe {
                libc::mmap(
                    base.add(keep).cast(),
                    CHUNK_BYTES as usize - keep,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                self.slow.growing.store(false, Ordering::Release);
                return false;
            }
        }
        // SAFETY: `fd` is the open trace; nothing maps it past `len` any more.
        let cut = unsafe { libc::ftruncate(fd, len as libc::off_t) } == 0;
        if cut {
            self.slow.file_len.store(len, Ordering::Relaxed);
        }
        self.slow.growing.store(false, Ordering::Release);
        cut
    }

    fn map_chunk_locked(&self, c: usize) -> Result<*mut u8, i32> {
        let existing = self.chunks[c].load(Ordering::Acquire);
        if !existing.is_null() {
            return Ok(existing);
        }
        let fd = self.fd.load(Ordering::Relaxed);
        let start = c as u64 * CHUNK_BYTES;
        let end = start + CHUNK_BYTES;
        if self.slow.file_len.load(Ordering::Relaxed) < end {
            // SAFETY: `fd` is the open trace; fallocate with mode 0 only ever grows the file.
            let rc =
                unsafe { libc::fallocate(fd, 0, start as libc::off_t, CHUNK_BYTES as libc::off_t) };
            if rc != 0 {
                let e = last_errno();
                if e != libc::EOPNOTSUPP && e != libc::ENOSYS && e != libc::EINVAL {
                    return Err(self.stop_growing_at(c, e));
                }
                // File systems without fallocate: a sparse extension. We hold `growing`, so the
                // length only ever grows.
                // SAFETY: as above; `end` is larger than the current length.
                if unsafe { libc::ftruncate(fd, end as libc::off_t) } != 0 {
                    return Err(self.stop_growing_at(c, last_errno()));
                }
            }
            self.slow.file_len.store(end, Ordering::Relaxed);
        }
        // SAFETY: maps CHUNK_BYTES of our own file at a page-aligned offset; the result is
        // checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                CHUNK_BYTES as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                start as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(self.stop_growing_at(c, last_errno()));
        }
        let p = p.cast::<u8>();
        self.chunks[c].store(p, Ordering::Release);
        Ok(p)
    }

    /// The file cannot grow past chunk `c`: lower the capacity so later producers count their
    /// records as lost without trying again.
    fn stop_growing_at(&self, c: usize, errno: i32) -> i32 {
        self.grow_error.store(errno, Ordering::Relaxed);
        // A ring whose slots cannot all be had stops at its end instead of wrapping (its slots
        // are numbered modulo its capacity, which must not change).
        self.ring_on.store(false, Ordering::Relaxed);
        let cap =
            ((c as u64 * CHUNK_BYTES).saturating_sub(HEADER_SIZE as u64)) / RECORD_SIZE as u64;
        self.capacity.fetch_min(cap, Ordering::Relaxed);
        if let Some(w) = self.header_word(header::CAPACITY) {
            w.fetch_min(cap, Ordering::Relaxed);
        }
        errno
    }
}

/// Makes the pages of a fresh mapping present and writable without changing their contents:
/// `MADV_POPULATE_WRITE` (Linux 5.14), else a read of each page, which at least maps it.
fn populate(base: *mut u8, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: `base..base+len` is one of our mappings; the advice changes no data.
    if unsafe { libc::madvise(base.cast(), len, MADV_POPULATE_WRITE) } == 0 {
        return;
    }
    for off in (0..len).step_by(4096) {
        // SAFETY: reading inside our mapping; the value is discarded.
        unsafe { core::ptr::read_volatile(base.add(off)) };
    }
}
