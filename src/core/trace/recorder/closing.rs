//! Closing a trace: marked clean, the disk past what it holds given back, forgotten in a
//! forked child, unmapped when a test's recorder goes.

use super::*;

impl Recorder {
    /// Marks the trace as cleanly closed. Producers may still append afterwards (atexit
    /// handlers of other libraries can free memory): those records are still committed.
    pub fn mark_clean_exit(&self) {
        let base = self.chunks[0].load(Ordering::Acquire);
        if base.is_null() {
            return;
        }
        // SAFETY: the flags word is a 4-byte aligned header field of the mapped chunk 0.
        let flags = unsafe { AtomicU32::from_ptr(base.add(header::FLAGS).cast()) };
        flags.fetch_or(format::FLAG_CLEAN_EXIT, Ordering::Release);
        self.release_unused_tail();
    }

    /// Gives the disk back for the part of the file past the slots claimed so far (the chunks
    /// mapped ahead of the writers). A file with no checkpoint yet is cut to what it holds plus
    /// [`TAIL_KEPT`] (see `cut_to_claimed`); a ring's file with a checkpoint keeps its length
    /// and gets a hole punched between its last slot and the checkpoint area, where a record
    /// written later still lands, on a page allocated anew.
    pub fn release_unused_tail(&self) {
        let fd = self.fd.load(Ordering::Acquire);
        if fd < 0 {
            return;
        }
        // The grower maps and populates nothing more ahead; one at work finishes first (it
        // would give pages of the tail back to the file): a chunk's population can take tens of
        // milliseconds on a busy machine, so up to two seconds (the grower never blocks for
        // long: it only maps and populates).
        self.slow.ahead_stopped.store(true, Ordering::SeqCst);
        for i in 0..12_000u32 {
            if !self.slow.ahead_busy.load(Ordering::SeqCst) {
                break;
            }
            if i < 10_000 {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        let capacity = self.capacity.load(Ordering::Relaxed);
        let used = HEADER_SIZE as u64
            + self
                .claimed()
                .min(capacity)
                .saturating_mul(RECORD_SIZE as u64);
        // A ring's checkpoint area lies past its slots: never given back.
        let area = self.slow.checkpoint_area.load(Ordering::Relaxed);
        let from = used
            .div_ceil(TAIL_KEPT)
            .saturating_add(1)
            .saturating_mul(TAIL_KEPT);
        // SAFETY: an all-zero stat is a valid out-buffer for fstat on our own descriptor.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `fd` is the open trace; `st` a valid out-buffer.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return;
        }
        let size = st.st_size as u64;
        // A file with a checkpoint keeps it: past `area` lies the newest.
        let checkpointed = area > 0 && size > area;
        if !checkpointed && self.cut_to_claimed(fd, size) {
            return;
        }
        let end = if area > 0 { area.min(size) } else { size };
        if end <= from {
            return;
        }
        // SAFETY: punching a hole in our own file past every claimed slot frees its blocks and
        // keeps its size; mapped pages there read as zeros, as never-written slots do.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                from as libc::off_t,
                (end - from) as libc::off_t,
            )
        };
    }

    /// In a forked child: forget the parent's trace without touching it, so the child writes
    /// nothing into the parent's file and opens its own on its first event. Async-signal-safe:
    /// only atomic stores and `close`.
    pub fn forget_after_fork(&self) {
        for c in &self.chunks {
            c.store(ptr::null_mut(), Ordering::Relaxed);
        }
        let fd = self.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: the descriptor was inherited from the parent and is ours to close; the
            // parent's copy stays open.
            unsafe { libc::close(fd) };
        }
        self.slow.growing.store(false, Ordering::Relaxed);
        self.slow.ahead_stopped.store(false, Ordering::Relaxed);
        self.slow.ahead_busy.store(false, Ordering::Relaxed);
        self.state.store(CLOSED, Ordering::Release);
    }
}

impl Drop for Recorder {
    /// Unmaps the trace and closes it (tests and benchmarks; the shim's recorder is static and
    /// lives as long as the process).
    fn drop(&mut self) {
        for c in &self.chunks {
            let p = c.swap(ptr::null_mut(), Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: each non-null entry is a CHUNK_BYTES mapping we made; `&mut self`
                // means no producer can be using it.
                unsafe { libc::munmap(p.cast(), CHUNK_BYTES as usize) };
            }
        }
        let fd = self.fd.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
        }
    }
}
