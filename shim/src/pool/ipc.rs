//! Legacy CUDA IPC of pooled memory (contracts 2 and 9).
//!
//! CUDA's `cuIpcGetMemHandle` names an allocation, not a pointer: a handle taken for any address
//! inside an allocation is the handle of its base, and `cuIpcOpenMemHandle` in the peer maps
//! that base. A pooled block is a piece of a segment, so its real handle would give the peer the
//! segment's start. Blocks that start their segment are exported with the real handle (the peer
//! maps the segment and gets exactly the block's address). Any other block is exported as a
//! *ticket*: a handle-sized record naming a slot of this process's ticket table, which holds the
//! segment's real handle and the block's offset. A peer under the shim reads the slot and opens
//! the real handle plus the offset; a peer without the shim hands the ticket to CUDA, which
//! refuses it (checked on the GPU): never the wrong memory.
//!
//! What an adversary cannot do (docs/design.md, contract 9):
//! - **Open a freed block.** Exporting seals the block's segment in the pool: it hands out no
//!   more blocks and goes back to CUDA once nothing in it is allocated, so a stale real handle
//!   meets CUDA's own refusal, never a later allocation. Freeing an exported block revokes its
//!   tickets at once.
//! - **Forge a ticket.** Each ticket carries a 128-bit secret from the kernel's random source,
//!   checked against its slot; the table's name carries 64 more random bits.
//! - **Plant or read the table.** Each exporting process creates its own table file,
//!   `/dev/shm/gpushim-ipc-<uid>-<pid>-<random>`, with `O_CREAT | O_EXCL | O_NOFOLLOW` and mode
//!   0600: a name nobody can guess cannot be pre-created. A peer opens it only as a regular file
//!   owned by its own user, mode 0600, with one link. The file is written and read with
//!   `pwrite`/`pread`, never mapped, so truncating it can never raise SIGBUS in either process;
//!   it is removed when the exporter exits.
//!
//! The opening side keeps a table of what it opened, one real mapping per (handle, context),
//! shared by every pointer returned for it: CUDA maps a handle once per context, and the
//! mapping is closed when the last pointer into it is closed. It grows as needed (IPC hooks are
//! never reached from `dlsym` or a constructor, so they may allocate).

use super::context::current_context;
use crate::os::SpinLock;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};

pub const HANDLE: usize = 64;
pub type Handle = [u8; HANDLE];

/// First bytes of a ticket. CUDA's own handles never start with these (checked on a GPU).
const TICKET_MAGIC: [u8; 8] = *b"gpushim\x02";
/// Slots of one process's table: live exports at once.
const SLOTS: u32 = 1 << 16;
const SLOT_BYTES: usize = 128;

const FREE: u64 = 0;
const LIVE: u64 = 1;
const REVOKED: u64 = 2;

/// One slot as stored in the table file (little-endian).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    state: u64,
    generation: u64,
    secret: [u8; 16],
    offset: u64,
    size: u64,
    /// The exporter's block address (for revocation; meaningless to the peer).
    block: u64,
    handle: Handle,
}

impl Slot {
    fn encode(&self) -> [u8; SLOT_BYTES] {
        let mut b = [0u8; SLOT_BYTES];
        b[0..8].copy_from_slice(&self.state.to_le_bytes());
        b[8..16].copy_from_slice(&self.generation.to_le_bytes());
        b[16..32].copy_from_slice(&self.secret);
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.size.to_le_bytes());
        b[48..56].copy_from_slice(&self.block.to_le_bytes());
        b[56..120].copy_from_slice(&self.handle);
        b
    }

    fn decode(b: &[u8; SLOT_BYTES]) -> Slot {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&b[16..32]);
        let mut handle = [0u8; HANDLE];
        handle.copy_from_slice(&b[56..120]);
        Slot {
            state: word(0),
            generation: word(8),
            secret,
            offset: word(32),
            size: word(40),
            block: word(48),
            handle,
        }
    }
}

/// A ticket as handed to the program.
#[derive(Clone, Copy)]
struct Ticket {
    pid: u32,
    slot: u32,
    nonce: u64,
    generation: u64,
    secret: [u8; 16],
    offset: u64,
}

impl Ticket {
    fn encode(&self) -> Handle {
        let mut t = [0u8; HANDLE];
        t[..8].copy_from_slice(&TICKET_MAGIC);
        t[8..12].copy_from_slice(&self.pid.to_le_bytes());
        t[12..16].copy_from_slice(&self.slot.to_le_bytes());
        t[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        t[24..32].copy_from_slice(&self.generation.to_le_bytes());
        t[32..48].copy_from_slice(&self.secret);
        t[48..56].copy_from_slice(&self.offset.to_le_bytes());
        t
    }

    fn decode(h: &Handle) -> Option<Ticket> {
        if h[..8] != TICKET_MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
        let mut secret = [0u8; 16];
        secret.copy_from_slice(&h[32..48]);
        Some(Ticket {
            pid: u32_at(8),
            slot: u32_at(12),
            nonce: u64_at(16),
            generation: u64_at(24),
            secret,
            offset: u64_at(48),
        })
    }
}

/// Fills `buf` from the kernel's random source.
fn random(buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// The table file's path for (uid, pid, nonce), NUL-terminated.
fn table_path(uid: u32, pid: u32, nonce: u64, out: &mut [u8; 96]) {
    let mut w = gpushim_core::fixedfmt::FixedBuf::<96>::new();
    let _ = core::fmt::Write::write_fmt(
        &mut w,
        format_args!("/dev/shm/gpushim-ipc-{uid}-{pid}-{nonce:016x}"),
    );
    let bytes = w.as_bytes();
    let n = bytes.len().min(out.len() - 1);
    out.fill(0);
    out[..n].copy_from_slice(&bytes[..n]);
}

/// This process's ticket table: its file, name and what it exported.
struct Exports {
    fd: i32,
    nonce: u64,
    path: [u8; 96],
    /// Next slot never used; then `free_slots`.
    next: u32,
    free_slots: Vec<u32>,
    /// Live slots: (block address, slot, generation).
    live: Vec<(u64, u32, u64)>,
    generation: u64,
}

struct ExportCell(UnsafeCell<Option<Exports>>);
// SAFETY: only touched under EXPORT_LOCK.
unsafe impl Sync for ExportCell {}
static EXPORT_LOCK: SpinLock = SpinLock::new();
static EXPORTS: ExportCell = ExportCell(UnsafeCell::new(None));
/// Set once this process made a ticket: frees look for tickets to revoke only then.
static ANY_EXPORT: AtomicBool = AtomicBool::new(false);
/// The table could not be made (no /dev/shm, no randomness): tickets are refused.
static EXPORT_BROKEN: AtomicBool = AtomicBool::new(false);
/// The table's descriptor, for the exit handler.
static TABLE_FD: AtomicI32 = AtomicI32::new(-1);

fn exports<R>(f: impl FnOnce(&mut Option<Exports>) -> R) -> R {
    let _held = EXPORT_LOCK.lock();
    // SAFETY: EXPORT_LOCK is held, so this is the only reference.
    f(unsafe { &mut *EXPORTS.0.get() })
}

/// Removes this process's ticket table (at exit).
pub fn remove_table() {
    exports(|e| {
        if let Some(x) = e.take() {
            // SAFETY: the path is NUL-terminated; the descriptor is ours.
            unsafe {
                libc::unlink(x.path.as_ptr().cast());
                libc::close(x.fd);
            }
            TABLE_FD.store(-1, Ordering::Relaxed);
        }
    });
}

fn create_table() -> Option<Exports> {
    let mut n = [0u8; 8];
    if !random(&mut n) {
        return None;
    }
    let nonce = u64::from_le_bytes(n);
    // SAFETY: getuid and getpid have no preconditions.
    let (uid, pid) = unsafe { (libc::getuid(), libc::getpid() as u32) };
    let mut path = [0u8; 96];
    table_path(uid, pid, nonce, &mut path);
    // SAFETY: a NUL-terminated path; a new file only (O_EXCL), never through a link.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    TABLE_FD.store(fd, Ordering::Relaxed);
    crate::lifecycle::on_exit(remove_table);
    Some(Exports {
        fd,
        nonce,
        path,
        next: 0,
        free_slots: Vec::new(),
        live: Vec::new(),
        generation: 0,
    })
}

fn write_slot(fd: i32, slot: u32, s: &Slot) -> bool {
    let bytes = s.encode();
    let at = u64::from(slot) * SLOT_BYTES as u64;
    // SAFETY: writes SLOT_BYTES from a local buffer at a slot's offset of our own file.
    let n = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), SLOT_BYTES, at as libc::off_t) };
    n == SLOT_BYTES as isize
}

/// Why a ticket could not be made.
pub enum TicketError {
    /// The table file cannot be made (no usable /dev/shm, no randomness).
    NoTable,
    /// Every slot holds a live export.
    Full,
}

/// A ticket naming `offset` bytes into the allocation whose real handle is `real`, for the
/// block at `block` of `size` bytes.
pub fn ticket(real: &Handle, block: u64, offset: u64, size: u64) -> Result<Handle, TicketError> {
    if EXPORT_BROKEN.load(Ordering::Relaxed) {
        return Err(TicketError::NoTable);
    }
    let mut secret = [0u8; 16];
    if !random(&mut secret) {
        return Err(TicketError::NoTable);
    }
    exports(|e| {
        if e.is_none() {
            *e = create_table();
            if e.is_none() {
                EXPORT_BROKEN.store(true, Ordering::Relaxed);
                return Err(TicketError::NoTable);
            }
        }
        let x = e.as_mut().ok_or(TicketError::NoTable)?;
        let slot = match x.free_slots.pop() {
            Some(s) => s,
            None if x.next < SLOTS => {
                x.next += 1;
                x.next - 1
            }
            None => return Err(TicketError::Full),
        };
        x.generation += 1;
        let s = Slot {
            state: LIVE,
            generation: x.generation,
            secret,
            offset,
            size,
            block,
            handle: *real,
        };
        if !write_slot(x.fd, slot, &s) {
            x.free_slots.push(slot);
            return Err(TicketError::NoTable);
        }
        x.live.push((block, slot, x.generation));
        ANY_EXPORT.store(true, Ordering::Release);
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        Ok(Ticket {
            pid,
            slot,
            nonce: x.nonce,
            generation: x.generation,
            secret,
            offset,
        }
        .encode())
    })
}

/// The block at `block` was freed: its tickets stop opening at once.
pub fn revoke(block: u64) {
    if !ANY_EXPORT.load(Ordering::Acquire) {
        return;
    }
    exports(|e| {
        let Some(x) = e.as_mut() else {
            return;
        };
        let mut i = 0;
        while i < x.live.len() {
            let (b, slot, _) = x.live[i];
            if b != block {
                i += 1;
                continue;
            }
            let state = REVOKED.to_le_bytes();
            let at = u64::from(slot) * SLOT_BYTES as u64;
            // SAFETY: writes the state word of one slot of our own file.
            unsafe { libc::pwrite(x.fd, state.as_ptr().cast(), 8, at as libc::off_t) };
            x.free_slots.push(slot);
            x.live.swap_remove(i);
        }
    });
}

/// What a handle handed to `cuIpcOpenMemHandle` names.
pub enum Named {
    /// A CUDA handle: open it as it is.
    Real,
    /// A ticket: open this real handle and add the offset.
    Ticket(Handle, u64),
    /// A ticket that cannot be opened: the code CUDA gives such a handle, and why (for the one
    /// line on stderr).
    Refused(i32, &'static str),
}

const FREED: &str = "the exporter freed the block it names";

/// Reads one slot of the table named by `t`, checking the file first.
fn read_slot(t: &Ticket) -> Result<Slot, &'static str> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut path = [0u8; 96];
    table_path(uid, t.pid, t.nonce, &mut path);
    // SAFETY: a NUL-terminated path; never a link, never blocking.
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err("its table is gone: the exporting process has exited, or the ticket is forged");
    }
    let r = read_checked(fd, t);
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    r
}

fn read_checked(fd: i32, t: &Ticket) -> Result<Slot, &'static str> {
    // SAFETY: an all-zero stat is a valid out-buffer; `fd` is open.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err("its table cannot be examined");
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || st.st_uid != uid
        || st.st_mode & 0o077 != 0
        || st.st_nlink != 1
    {
        return Err(
            "its table is not a private file of this user (not regular, another owner, open to \
             others, or hard-linked): refused",
        );
    }
    if t.slot >= SLOTS {
        return Err("the ticket names no slot: forged or damaged");
    }
    let at = (u64::from(t.slot) * SLOT_BYTES as u64) as libc::off_t;
    let mut a = [0u8; SLOT_BYTES];
    let mut b = [0u8; SLOT_BYTES];
    // Read twice: a slot being rewritten reads differently, and is refused.
    // SAFETY: reads SLOT_BYTES into local buffers.
    let (na, nb) = unsafe {
        (
            libc::pread(fd, a.as_mut_ptr().cast(), SLOT_BYTES, at),
            libc::pread(fd, b.as_mut_ptr().cast(), SLOT_BYTES, at),
        )
    };
    if na != SLOT_BYTES as isize || nb != SLOT_BYTES as isize || a != b {
        return Err("the ticket's slot is unreadable or changing");
    }
    let s = Slot::decode(&a);
    let mut diff = 0u8;
    for (x, y) in s.secret.iter().zip(&t.secret) {
        diff |= x ^ y;
    }
    if diff != 0 || s.generation != t.generation || s.offset != t.offset {
        return Err("the ticket does not match its slot: forged, or its slot was reused");
    }
    match s.state {
        LIVE => Ok(s),
        REVOKED | FREE => Err(FREED),
        _ => Err("the ticket's slot is damaged"),
    }
}

pub fn read(h: &Handle) -> Named {
    let Some(t) = Ticket::decode(h) else {
        return Named::Real;
    };
    match read_slot(&t) {
        Ok(s) => Named::Ticket(s.handle, s.offset),
        Err(why) => Named::Refused(
            // A handle of memory its exporter freed: CUDA answers 800 (measured); a handle CUDA
            // never made: 1.
            if why == FREED {
                crate::cuda::ffi::ERROR_NOT_PERMITTED
            } else {
                crate::cuda::ffi::ERROR_INVALID_VALUE
            },
            why,
        ),
    }
}

/// A real mapping this process opened: its handle, context, base and how many returned
/// pointers lean on it.
#[derive(Clone, Copy)]
struct Mapping {
    handle: Handle,
    ctx: usize,
    base: u64,
    refs: u32,
}

/// A pointer handed to the program and the mapping it lies in.
#[derive(Clone, Copy)]
struct Given {
    ptr: u64,
    mapping: usize,
}

struct Opened {
    mappings: Vec<Option<Mapping>>,
    given: Vec<Given>,
}

struct Shared(UnsafeCell<Opened>);
// SAFETY: only touched under LOCK.
unsafe impl Sync for Shared {}

static LOCK: SpinLock = SpinLock::new();
static OPENED: Shared = Shared(UnsafeCell::new(Opened {
    mappings: Vec::new(),
    given: Vec::new(),
}));
/// Set once the process opened anything through the table: closes look only then.
static ANY: AtomicU8 = AtomicU8::new(0);

/// In a forked child: a parent thread may have held a lock at the fork, and the parent's
/// table is the parent's.
pub fn forget_after_fork() {
    LOCK.reset_after_fork();
    EXPORT_LOCK.reset_after_fork();
    // SAFETY: the child is single-threaded here; the parent's file stays the parent's (the
    // descriptor is closed in the child, never unlinked).
    unsafe {
        if let Some(x) = (*EXPORTS.0.get()).take() {
            libc::close(x.fd);
        }
    }
    ANY_EXPORT.store(false, Ordering::Relaxed);
    EXPORT_BROKEN.store(false, Ordering::Relaxed);
}

fn locked<R>(f: impl FnOnce(&mut Opened) -> R) -> R {
    let _held = LOCK.lock();
    // SAFETY: LOCK is held, so this is the only reference.
    f(unsafe { &mut *OPENED.0.get() })
}

/// Opens `real` (in the current context) through the table and returns `offset` past its
/// base. `open` is the real `cuIpcOpenMemHandle` (writes the base, returns a CUresult).
pub fn open(real: &Handle, offset: u64, open: impl FnOnce(&mut u64) -> i32) -> Result<u64, i32> {
    let ctx = current_context().unwrap_or(0);
    ANY.store(1, Ordering::Release);
    locked(|o| {
        let found = o
            .mappings
            .iter()
            .position(|m| m.is_some_and(|m| m.handle == *real && m.ctx == ctx));
        let m = match found {
            Some(m) => m,
            None => {
                let mut base = 0u64;
                let rc = open(&mut base);
                if rc != 0 {
                    return Err(rc);
                }
                let mapping = Some(Mapping {
                    handle: *real,
                    ctx,
                    base,
                    refs: 0,
                });
                match o.mappings.iter().position(Option::is_none) {
                    Some(i) => {
                        o.mappings[i] = mapping;
                        i
                    }
                    None => {
                        o.mappings.push(mapping);
                        o.mappings.len() - 1
                    }
                }
            }
        };
        let base = o.mappings[m].as_mut().map_or(0, |x| {
            x.refs += 1;
            x.base
        });
        let ptr = base.saturating_add(offset);
        o.given.push(Given { ptr, mapping: m });
        Ok(ptr)
    })
}

/// What closing `ptr` should do.
pub enum Close {
    /// Not opened through the table: pass to CUDA as it is.
    PassThrough,
    /// Other pointers still use the mapping: nothing to close.
    Kept,
    /// The last pointer into the mapping: close the mapping's base.
    Base(u64),
}

pub fn close(ptr: u64) -> Close {
    if ANY.load(Ordering::Acquire) == 0 {
        return Close::PassThrough;
    }
    locked(|o| {
        let Some(g) = o.given.iter().position(|g| g.ptr == ptr) else {
            return Close::PassThrough;
        };
        let m = o.given.swap_remove(g).mapping;
        let Some(mapping) = o.mappings.get_mut(m).and_then(Option::as_mut) else {
            return Close::PassThrough;
        };
        mapping.refs -= 1;
        if mapping.refs > 0 {
            return Close::Kept;
        }
        let base = mapping.base;
        o.mappings[m] = None;
        Close::Base(base)
    })
}
