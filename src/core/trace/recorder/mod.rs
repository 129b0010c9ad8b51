//! The trace writer: a lock-free multi-producer log in a `MAP_SHARED` file.
//!
//! The file is the buffer. A producer claims record index `i` with one relaxed `fetch_add` on the
//! header's `claimed` counter (which lives in the mapped file, so a crash leaves it behind too),
//! writes the record body with plain stores, then stores the commit word with `Release`. A reader
//! that loads the commit word with `Acquire` and finds the tag of `i` sees the whole body. Pages
//! of a `MAP_SHARED` file belong to the page cache, so every committed record survives SIGKILL,
//! a segfault or the OOM killer; only a kernel crash loses what was not yet written back.
//!
//! The file grows in chunks of [`CHUNK_BYTES`]. The producer that first touches a chunk maps it
//! (one `fallocate` and one `mmap`, once per 131,072 records) while holding a spin flag that only
//! this slow path takes; the common path makes no system call and takes no lock. Space is
//! reserved with `fallocate` before it is mapped, so a full disk ends recording (counted as lost)
//! instead of raising SIGBUS in the traced program. Records past `trace_max` are dropped and
//! counted in the header's `lost` counter.
//!
//! Nothing here allocates: the shim opens the trace inside the first intercepted CUDA call.
//!
//! Here: the recorder, opening, and the hot path (claiming and writing a record);
//! `chunks.rs` grows and maps the file, `intern.rs` gives strings, stacks and streams their
//! ids, `definitions.rs` keeps a ring's definitions where no lap overwrites them, `naming.rs`
//! expands the path pattern and words the errors, `opening.rs` creates the file and writes its
//! header, `closing.rs` marks it clean and gives back what it does not hold, `ring.rs` lays a
//! ring out and runs its summarizer.

mod chunks;
mod closing;
mod definitions;
mod intern;
mod naming;
mod opening;
mod ring;

use crate::trace::format::{self, HEADER_SIZE, RECORD_SIZE, Record, header};
use core::cell::{Cell, UnsafeCell};
use core::ptr;
use core::sync::atomic::{
    AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering,
};
pub use naming::{
    ErrnoText, OpenError, OpenOptions, PatternError, another_name, errno_text, expand_pattern,
    foreign_link, format_int, unguessable_word,
};

/// Bytes mapped at once. A multiple of every page size Linux uses (4 KiB to 64 KiB).
pub const CHUNK_BYTES: u64 = 4 << 20;
/// The most record slots one thread claims at once.
pub const MAX_BLOCK: u64 = 64;
/// A thread's block of slots is abandoned once this old, so that a record's place in the file
/// and its place in time are never further apart than this (plus preemption).
pub const MAX_BLOCK_AGE_NS: u64 = 1_000_000;

/// The state only the chunk-mapping slow path writes, on a cache line of its own.
#[repr(align(128))]
struct SlowPath {
    /// Bytes of the file reserved so far; only read and written under `growing`.
    file_len: AtomicU64,
    /// In a ring: where the checkpoint area starts, and the bytes of one of its two slots.
    checkpoint_area: AtomicU64,
    checkpoint_slot: AtomicU64,
    /// Taken by the one thread that maps a new chunk.
    growing: AtomicBool,
    /// Set once the unused tail was given back: the grower maps nothing ahead any more.
    ahead_stopped: AtomicBool,
    /// Set while the grower maps and populates chunks ahead.
    ahead_busy: AtomicBool,
    /// A ring's definitions, kept where no lap overwrites them (see `definitions`).
    definitions: definitions::DefinitionsLog,
}

/// A thread's claimed slots in one open trace.
#[derive(Clone, Copy)]
struct Block {
    /// Which open trace (see `Recorder::serial`): a block from another is never used.
    serial: u64,
    next: u64,
    end: u64,
    started_ns: u64,
    size: u64,
}

impl Block {
    const NONE: Block = Block {
        serial: 0,
        next: 0,
        end: 0,
        started_ns: 0,
        size: 0,
    };
}

std::thread_local! {
    static BLOCK: Cell<Block> = const { Cell::new(Block::NONE) };
}

/// Every open of every recorder in the process gets a new serial.
static OPEN_SERIAL: AtomicU64 = AtomicU64::new(1);

/// What [`Recorder::release_unused_tail`] keeps on disk past the claimed slots (and the unit it
/// rounds to).
pub const TAIL_KEPT: u64 = 64 << 10;

/// Chunks kept mapped and populated ahead of the writers by [`Recorder::grow_ahead`].
pub const LOOKAHEAD_CHUNKS: usize = 4;
/// Chunks a trace may have: 16 GiB.
pub const MAX_CHUNKS: usize = 4096;
/// The smallest `trace_max` accepted: the header and one record.
pub const MIN_TRACE_BYTES: u64 = (HEADER_SIZE + RECORD_SIZE) as u64;
/// Longest trace path, including the terminating NUL.
pub const PATH_CAP: usize = 4096;
/// Distinct strings (NVTX messages, module paths, Python files and functions) the interning
/// table holds; later ones get
/// id 0.
pub const STRING_SLOTS: usize = 16384;
/// Distinct call stacks the interning table holds; later ones get id 0.
pub const STACK_SLOTS: usize = 16384;
/// Streams the interning table can name; later streams are recorded as [`STREAM_OVERFLOW`].
pub const STREAM_SLOTS: usize = 4096;
pub const STREAM_OVERFLOW: u16 = u16::MAX;

const CLOSED: u8 = 0;
const OPENING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

/// The trace writer. One static instance lives in the shim; tests make their own.
///
/// `repr(C)`, so that the fields every record reads (`state`, `generation`, `origin_ns`,
/// `serial`, `capacity`) share the first cache line: the program evicts the recorder from the
/// caches between two of its calls, and each further line read is a miss per record.
#[repr(C, align(64))]
pub struct Recorder {
    state: AtomicU8,
    fd: AtomicI32,
    /// Bumped at every open, so threads know to announce themselves in a new file.
    generation: AtomicU32,
    /// Next per-trace thread index.
    threads: AtomicU32,
    /// `CLOCK_MONOTONIC` at open; record times are ns since then.
    origin_ns: AtomicU64,
    /// This open's serial, never 0 once open (see [`OPEN_SERIAL`]).
    serial: AtomicU64,
    /// Records the file may hold (from `trace_max`, lowered when the disk fills up); in a
    /// ring, its slots.
    capacity: AtomicU64,
    /// Record indices from here on are counted as lost, not written: set when the file was
    /// cut to what it holds at a clean exit (`u64::MAX` until then). On the first cache line:
    /// every claim reads it, and the slow path's line is written by the grower.
    limit: AtomicU64,
    /// Set while a summarizer keeps the oldest records in checkpoints: indices past
    /// `capacity` wrap around instead of being lost.
    ring_on: AtomicBool,
    /// Why the file stopped growing before `trace_max` (an errno), 0 if it did not.
    grow_error: AtomicI32,
    path_len: AtomicU32,
    /// Chunk base addresses; chunk 0 holds the header.
    chunks: [AtomicPtr<u8>; MAX_CHUNKS],
    /// Whether the grower has populated a chunk's pages.
    populated: [AtomicBool; MAX_CHUNKS],
    /// Written only on the slow path, kept off the cache lines every producer reads.
    slow: SlowPath,
    /// Streams seen so far: slot `k` holds a stream handle, its index is `k + 1`.
    streams: [AtomicU64; STREAM_SLOTS],
    /// Strings seen so far, by hash (FNV-1a, low bit set; cleared while the definition is
    /// being written, see `intern`); their id is the slot index + 1.
    strings: [AtomicU64; STRING_SLOTS],
    /// Call stacks seen so far, likewise by hash; their id is the slot index + 1.
    stacks: [AtomicU64; STACK_SLOTS],
    path: UnsafeCell<[u8; PATH_CAP]>,
}

// Every claim reads `limit`: it must share the first cache line with `capacity`.
const _: () = assert!(core::mem::offset_of!(Recorder, limit) + 8 <= 64);

// SAFETY: every field but `path` is atomic. `path` is written only by the thread that moved
// `state` from CLOSED to OPENING, and read only after `state` was seen READY with Acquire, which
// pairs with the Release store that published it.
unsafe impl Sync for Recorder {}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub const fn new() -> Recorder {
        Recorder {
            state: AtomicU8::new(CLOSED),
            fd: AtomicI32::new(-1),
            chunks: [const { AtomicPtr::new(ptr::null_mut()) }; MAX_CHUNKS],
            populated: [const { AtomicBool::new(false) }; MAX_CHUNKS],
            capacity: AtomicU64::new(0),
            limit: AtomicU64::new(u64::MAX),
            ring_on: AtomicBool::new(false),
            grow_error: AtomicI32::new(0),
            slow: SlowPath {
                file_len: AtomicU64::new(0),
                checkpoint_area: AtomicU64::new(0),
                checkpoint_slot: AtomicU64::new(0),
                growing: AtomicBool::new(false),
                ahead_stopped: AtomicBool::new(false),
                ahead_busy: AtomicBool::new(false),
                definitions: definitions::DefinitionsLog::new(),
            },
            streams: [const { AtomicU64::new(0) }; STREAM_SLOTS],
            strings: [const { AtomicU64::new(0) }; STRING_SLOTS],
            stacks: [const { AtomicU64::new(0) }; STACK_SLOTS],
            threads: AtomicU32::new(0),
            generation: AtomicU32::new(0),
            path: UnsafeCell::new([0; PATH_CAP]),
            path_len: AtomicU32::new(0),
            origin_ns: AtomicU64::new(0),
            serial: AtomicU64::new(0),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.state.load(Ordering::Acquire) == READY
    }

    pub fn has_failed(&self) -> bool {
        self.state.load(Ordering::Acquire) == FAILED
    }

    /// Nanoseconds since the trace's clock origin.
    pub fn now_ns(&self) -> u64 {
        self.since_origin(clock_ns(libc::CLOCK_MONOTONIC))
    }

    /// A reading of `CLOCK_MONOTONIC` (nanoseconds) as the trace's time: since its origin.
    pub fn since_origin(&self, monotonic_ns: u64) -> u64 {
        monotonic_ns.saturating_sub(self.origin_ns.load(Ordering::Relaxed))
    }

    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Marks the trace as unusable, so callers stop trying to open it.
    pub fn fail(&self) {
        self.state.store(FAILED, Ordering::Release);
    }

    /// Claims the right to open the trace. Exactly one caller gets `true`; it must then call
    /// [`Recorder::open`] (which publishes READY or FAILED).
    pub fn begin_open(&self) -> bool {
        self.state
            .compare_exchange(CLOSED, OPENING, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// The device and inode of the open trace's file (what `gpushim run` checks the file it
    /// reads against), or `None` when it is not open.
    pub fn file_id(&self) -> Option<(u64, u64)> {
        if !self.is_ready() {
            return None;
        }
        // SAFETY: an all-zero stat is a valid out-value.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: `fd` is the trace's open descriptor; `st` is a valid out-pointer.
        if unsafe { libc::fstat(self.fd.load(Ordering::Relaxed), &mut st) } != 0 {
            return None;
        }
        Some((st.st_dev, st.st_ino))
    }

    /// The path of the open trace (empty before it was opened).
    pub fn path(&self) -> &[u8] {
        if self.state.load(Ordering::Acquire) == CLOSED {
            return &[];
        }
        let len = self.path_len.load(Ordering::Relaxed) as usize;
        // SAFETY: the path was written before the state left OPENING (Release/Acquire above)
        // and is never written again until a reset, which only happens in a forked child that
        // has a single thread.
        unsafe { &(&*self.path.get())[..len] }
    }

    fn header_word(&self, offset: usize) -> Option<&AtomicU64> {
        let base = self.chunks[0].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        // SAFETY: chunk 0 stays mapped for the life of the trace; `offset` is one of the 8-byte
        // aligned header fields, and the header is only accessed atomically after open.
        Some(unsafe { AtomicU64::from_ptr(base.add(offset).cast()) })
    }

    /// Keeps what device `device` (a CUDA ordinal) is made of in the header: its streaming
    /// multiprocessors and the most threads one runs at once. Devices past
    /// [`header::DEVICES_MAX`] are not kept. Lock-free.
    pub fn set_device(&self, device: usize, multiprocessors: u32, threads_per_multiprocessor: u32) {
        if device >= header::DEVICES_MAX {
            return;
        }
        if let Some(w) = self.header_word(header::DEVICES + 8 * device) {
            let word = u64::from(multiprocessors) | u64::from(threads_per_multiprocessor) << 32;
            w.store(word, Ordering::Relaxed);
        }
    }

    /// Keeps device `device`'s memory as CUDA counts it in the header.
    pub fn set_device_memory(&self, device: usize, bytes: u64) {
        if device >= header::DEVICES_MAX {
            return;
        }
        if let Some(w) = self.header_word(header::DEVICE_MEMORY + 8 * device) {
            w.store(bytes, Ordering::Relaxed);
        }
    }

    /// Appends one record. Returns `false` when it was not written (not open, or lost: then it
    /// is counted in the header). Lock-free; no system call except when a new chunk is mapped.
    pub fn append(&self, rec: &Record) -> bool {
        let Some(index) = self.next_index(rec.time_ns) else {
            return false;
        };
        let mut body = [0u8; RECORD_SIZE];
        rec.encode_body(&mut body);
        self.write_slot(index, &body)
    }

    /// The index for one record of this thread: the next slot of the thread's block, or the
    /// first of a new block. A thread claims 1 slot at a time while its records are sparse and
    /// up to [`MAX_BLOCK`] at once while they come fast (each block used up within
    /// [`MAX_BLOCK_AGE_NS`] doubles the next one), so 16 busy threads do not all contend on the
    /// one counter, and a slow thread wastes no space. A block older than `MAX_BLOCK_AGE_NS` is
    /// abandoned (its unused slots stay zero and the reader skips them), which bounds how far a
    /// record's position in the file can be from its place in time.
    fn next_index(&self, now_ns: u64) -> Option<u64> {
        if self.state.load(Ordering::Acquire) != READY {
            return None;
        }
        let serial = self.serial.load(Ordering::Relaxed);
        let b = BLOCK.try_with(Cell::get).unwrap_or(Block::NONE);
        let mine = b.serial == serial;
        let fresh = now_ns.wrapping_sub(b.started_ns) <= MAX_BLOCK_AGE_NS;
        if mine && b.next < b.end && fresh {
            let _ = BLOCK.try_with(|c| {
                c.set(Block {
                    next: b.next + 1,
                    ..b
                })
            });
            return Some(b.next);
        }
        let size = if mine && b.next >= b.end && fresh {
            (b.size * 2).min(MAX_BLOCK)
        } else {
            1
        };
        let claimed = self.header_word(header::CLAIMED)?;
        let capacity = if self.ring_on.load(Ordering::Relaxed) {
            u64::MAX
        } else {
            self.capacity.load(Ordering::Relaxed)
        };
        // Full: count without touching the shared counter again.
        if claimed.load(Ordering::Relaxed) >= capacity {
            self.count_lost(1);
            return None;
        }
        // SeqCst, paired with `cut_to_claimed`: either this claim is counted in the length the
        // file is cut to, or the limit set before that count is seen here.
        let start = claimed.fetch_add(size, Ordering::SeqCst);
        let capacity = capacity.min(self.limit.load(Ordering::SeqCst));
        if start >= capacity {
            self.count_lost(1);
            return None;
        }
        let block = Block {
            serial,
            next: start + 1,
            end: start.saturating_add(size).min(capacity),
            started_ns: now_ns,
            size,
        };
        let _ = BLOCK.try_with(|c| c.set(block));
        Some(start)
    }

    /// Claims `n` consecutive record indices, or counts them lost.
    fn claim(&self, n: u64) -> Option<u64> {
        if self.state.load(Ordering::Acquire) != READY {
            return None;
        }
        let claimed = self.header_word(header::CLAIMED)?;
        let index = claimed.fetch_add(n, Ordering::SeqCst);
        let capacity = self.capacity.load(Ordering::Relaxed);
        let past_limit = index.saturating_add(n) > self.limit.load(Ordering::SeqCst);
        let full = past_limit
            || if self.ring_on.load(Ordering::Relaxed) {
                n > capacity
            } else {
                index + n > capacity
            };
        if full {
            self.count_lost(n);
            return None;
        }
        Some(index)
    }

    /// Writes a claimed record: the body, then the commit word with Release.
    fn write_slot(&self, index: u64, body: &[u8; RECORD_SIZE]) -> bool {
        let capacity = self.capacity.load(Ordering::Relaxed);
        // In a ring, past the first lap: the slot holds a record of an earlier lap.
        let again = index >= capacity;
        let slot = if again {
            index % capacity.max(1)
        } else {
            index
        };
        let offset = HEADER_SIZE as u64 + slot * RECORD_SIZE as u64;
        let chunk = (offset / CHUNK_BYTES) as usize;
        let mut base = self.chunks[chunk].load(Ordering::Acquire);
        if base.is_null() {
            base = match self.map_chunk(chunk) {
                Ok(b) => b,
                Err(_) => {
                    self.count_lost(1);
                    return false;
                }
            };
        }
        let within = (offset % CHUNK_BYTES) as usize;
        // SAFETY: `base` maps CHUNK_BYTES bytes of the file read-write, `within + RECORD_SIZE`
        // fits in it (records are 32-byte aligned and chunks a multiple of 32), and `index` was
        // claimed by this caller alone, so no other producer writes these bytes.
        unsafe {
            let dst = base.add(within);
            // The thread's next records go to the slots after this one (its block): their line
            // is asked for now, so that writing them later finds it (the file's pages are far
            // too many to stay cached). A prefetch never faults.
            #[cfg(target_arch = "x86_64")]
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                dst.wrapping_add(256).cast(),
            );
            if again {
                // The earlier lap's commit word goes first: a writer that dies now leaves a
                // torn record, not an old one that reads as this one.
                AtomicU16::from_ptr(dst.cast()).store(0, Ordering::Relaxed);
                core::sync::atomic::fence(Ordering::Release);
            }
            ptr::copy_nonoverlapping(body.as_ptr().add(2), dst.add(2), RECORD_SIZE - 2);
            // Release: a reader that sees the tag with Acquire also sees the body above.
            AtomicU16::from_ptr(dst.cast()).store(format::commit_tag(index), Ordering::Release);
        }
        true
    }

    /// Counts records that could not be written.
    pub fn count_lost(&self, n: u64) {
        if let Some(lost) = self.header_word(header::LOST) {
            lost.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn claimed(&self) -> u64 {
        self.header_word(header::CLAIMED)
            .map_or(0, |w| w.load(Ordering::Relaxed))
    }

    /// Why the file stopped growing before `trace_max` (an errno: a full disk, say), if it did.
    pub fn grow_error(&self) -> Option<i32> {
        match self.grow_error.load(Ordering::Relaxed) {
            0 => None,
            e => Some(e),
        }
    }

    pub fn lost(&self) -> u64 {
        self.header_word(header::LOST)
            .map_or(0, |w| w.load(Ordering::Relaxed))
    }

    /// A fresh per-trace thread index.
    pub fn next_thread_index(&self) -> u16 {
        let n = self.threads.fetch_add(1, Ordering::Relaxed);
        n.min(u16::MAX as u32) as u16
    }
}

/// Nanoseconds on `clock` (through the vDSO: no system call).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn last_errno() -> i32 {
    // SAFETY: __errno_location always returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

#[cfg(test)]
mod tests;
