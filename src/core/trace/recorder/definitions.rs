//! Definitions kept apart from the ring: every string, stack and module definition written to
//! a ring is also copied into a log in the process's memory, which the summarizer reads instead
//! of hoping to find the ring's copy.
//!
//! A ring overwrites its oldest records. When the writers lap the summarizer, the records it
//! never read are gone, and with them any definition among them: every later record naming that
//! stack or string would lose its line for good (the stack is interned, so it is never written
//! again). The log is never overwritten, and the summarizer puts all of it into each
//! checkpoint, so what the reports need to name a line survives a lap. The log is anonymous
//! memory mapped at open (reserved, not committed: a page costs memory only once written),
//! claimed with one atomic add like the ring, each body committed by its commit word stored
//! last. It holds [`LOG_RECORDS`] bodies, more than the interning tables can define (16,384
//! stacks of 64 frames and 16,384 strings of 256 bytes take about 820,000); a definition that
//! does not fit is counted in the header (`DEFINITIONS_DROPPED`) and read from the ring as
//! before.

use super::*;

/// Bodies the log holds (32 MiB of address space).
pub const LOG_RECORDS: u64 = 1 << 20;

/// The log: its base (null: none), bodies claimed, and the mapping's length in bodies.
pub(super) struct DefinitionsLog {
    base: AtomicPtr<[u8; RECORD_SIZE]>,
    claimed: AtomicU64,
}

impl DefinitionsLog {
    pub const fn new() -> DefinitionsLog {
        DefinitionsLog {
            base: AtomicPtr::new(ptr::null_mut()),
            claimed: AtomicU64::new(0),
        }
    }
}

impl Recorder {
    /// At open: maps the log for a ring (kept mapped for later opens, emptied), or leaves it
    /// off. A log that cannot be mapped leaves definitions in the ring only, as before.
    pub(super) fn open_definitions_log(&self, ring: bool) {
        let log = &self.slow.definitions;
        log.claimed.store(0, Ordering::Relaxed);
        let old = log.base.load(Ordering::Relaxed);
        if !old.is_null() {
            // A later open (a forked child's trace): the earlier trace's bodies are dropped,
            // the pages read as zeros again, so no old commit word passes for a new one.
            // SAFETY: our own private anonymous mapping of this length.
            unsafe {
                libc::madvise(
                    old.cast(),
                    (LOG_RECORDS as usize) * RECORD_SIZE,
                    libc::MADV_DONTNEED,
                )
            };
            return;
        }
        if !ring {
            return;
        }
        // SAFETY: a new private anonymous mapping; no address is named, nothing is replaced.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                (LOG_RECORDS as usize) * RECORD_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            log.base.store(p.cast(), Ordering::Release);
        }
    }

    /// Copies a definition's bodies (a head and its data records, or one module record) into
    /// the log. Lock-free: one atomic add, then each body with its commit word stored last.
    pub(super) fn log_definition(&self, bodies: &[[u8; RECORD_SIZE]]) {
        let log = &self.slow.definitions;
        let base = log.base.load(Ordering::Acquire);
        if base.is_null() || bodies.is_empty() {
            return;
        }
        let n = bodies.len() as u64;
        let at = log.claimed.fetch_add(n, Ordering::Relaxed);
        if at.saturating_add(n) > LOG_RECORDS {
            if let Some(w) = self.header_word(header::DEFINITIONS_DROPPED) {
                w.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        for (i, body) in bodies.iter().enumerate() {
            let index = at + i as u64;
            // SAFETY: `index < LOG_RECORDS`, inside the mapping; the slot was claimed by this
            // caller alone, and the commit word (the first two bytes, 2-aligned) is written
            // last, atomically, so a reader never takes a half-written body.
            unsafe {
                let dst = base.add(index as usize).cast::<u8>();
                ptr::copy_nonoverlapping(body.as_ptr().add(2), dst.add(2), RECORD_SIZE - 2);
                AtomicU16::from_ptr(dst.cast()).store(format::commit_tag(index), Ordering::Release);
            }
        }
    }

    /// Whether the log holds every definition written so far (it is mapped and none was
    /// dropped for want of room).
    pub fn definitions_whole(&self) -> bool {
        !self.slow.definitions.base.load(Ordering::Acquire).is_null()
            && self
                .header_word(header::DEFINITIONS_DROPPED)
                .is_some_and(|w| w.load(Ordering::Relaxed) == 0)
    }

    /// Hands the log's committed bodies from `from` on to `take`, in order, and returns where
    /// to go on next time (the first body not yet committed, or the end).
    pub fn read_definitions(&self, from: u64, mut take: impl FnMut(&[u8; RECORD_SIZE])) -> u64 {
        let log = &self.slow.definitions;
        let base = log.base.load(Ordering::Acquire);
        if base.is_null() {
            return from;
        }
        let end = log.claimed.load(Ordering::Acquire).min(LOG_RECORDS);
        let mut next = from;
        while next < end {
            // SAFETY: `next < LOG_RECORDS`, inside the mapping; the body is copied only after
            // its commit word says it was written whole (Acquire pairs with the writer's
            // Release), and a committed body is never written again until the next open.
            let body = unsafe {
                let src = base.add(next as usize).cast::<u8>();
                if AtomicU16::from_ptr(src.cast()).load(Ordering::Acquire)
                    != format::commit_tag(next)
                {
                    break;
                }
                let mut body = [0u8; RECORD_SIZE];
                ptr::copy_nonoverlapping(src, body.as_mut_ptr(), RECORD_SIZE);
                body
            };
            take(&body);
            next += 1;
        }
        next
    }
}
