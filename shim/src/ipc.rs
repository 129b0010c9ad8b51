//! Legacy CUDA IPC of pooled memory (contract 2).
//!
//! CUDA's `cuIpcGetMemHandle` names an allocation, not a pointer: a handle taken for any address
//! inside an allocation is the handle of its base, and `cuIpcOpenMemHandle` in the peer maps
//! that base. A pooled block is a piece of a segment, so its real handle would give the peer the
//! segment's start. Blocks that start their segment are exported with the real handle (the peer
//! maps the segment and gets exactly the block's address). Any other block is exported as a
//! *ticket*: a handle-sized record that names a slot of a table in shared memory
//! (`/dev/shm/gpushim-ipc-<uid>`) holding the segment's real handle and the block's offset. A
//! peer under the shim opens the real handle and returns base + offset; a peer without the shim
//! hands the ticket to CUDA, which rejects it (`scripts/gpu-multi.sh` checks this on a GPU):
//! never the wrong memory.
//!
//! The opening side keeps a table of what it opened, one real mapping per (handle, context),
//! shared by every pointer returned for it: CUDA maps a handle once per context, and the
//! mapping is closed when the last pointer into it is closed.
//!
//! No heap: the table file is mapped once, the tables are fixed arrays behind a spin lock that
//! is held across the real open (IPC opens are rare and slow) but never across a runtime call.

use crate::pool::{self, SpinLock};
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering, fence};

pub const HANDLE: usize = 64;
pub type Handle = [u8; HANDLE];

/// First bytes of a ticket. CUDA's own handles never start with these (checked on a GPU).
const TICKET_MAGIC: [u8; 8] = *b"gpushim\x01";
/// First word of the shared table file.
const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"gsipc\x00\x00\x01");
const SLOTS: u64 = 1 << 16;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    next: AtomicU64,
}

/// One exported block. `seq` is a sequence lock: odd while being written, then the ticket's
/// sequence number.
#[repr(C)]
struct Slot {
    seq: AtomicU64,
    offset: AtomicU64,
    size: AtomicU64,
    pid: AtomicU64,
    handle: [AtomicU64; HANDLE / 8],
}

const TABLE_BYTES: usize =
    core::mem::size_of::<Header>() + SLOTS as usize * core::mem::size_of::<Slot>();

/// 0: not tried; 1: being mapped; 2: unavailable; else the mapping's address.
static TABLE: AtomicUsize = AtomicUsize::new(0);

fn table() -> Option<(&'static Header, &'static [Slot])> {
    let mut t = TABLE.load(Ordering::Acquire);
    if t == 0
        && TABLE
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        t = map_table().unwrap_or(2);
        TABLE.store(t, Ordering::Release);
    }
    while t == 1 {
        core::hint::spin_loop();
        t = TABLE.load(Ordering::Acquire);
    }
    if t == 2 {
        return None;
    }
    let header = t as *const Header;
    // SAFETY: `t` is a live shared mapping of TABLE_BYTES: a header, then SLOTS slots, all
    // atomics (any bit pattern is valid), never unmapped.
    unsafe {
        let slots = header.add(1) as *const Slot;
        Some((&*header, core::slice::from_raw_parts(slots, SLOTS as usize)))
    }
}

/// Maps the per-user table file, creating it on first use.
fn map_table() -> Option<usize> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let mut path = [0u8; 64];
    let mut w = gpushim_core::stackfmt::StackBuf::<64>::new();
    let _ = core::fmt::Write::write_fmt(&mut w, format_args!("/dev/shm/gpushim-ipc-{uid}"));
    let bytes = w.as_bytes();
    path[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `path` is NUL-terminated (zeroed past the text, which is under 64 bytes).
    let fd = unsafe {
        libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o600,
        )
    };
    if fd < 0 {
        return None;
    }
    let mapped = map_fd(fd, uid);
    // SAFETY: `fd` is ours; the mapping (if any) does not need it open.
    unsafe { libc::close(fd) };
    mapped
}

fn map_fd(fd: i32, uid: u32) -> Option<usize> {
    // SAFETY: an all-zero stat is a valid out-buffer; `fd` is open.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_uid != uid {
        return None;
    }
    // Two processes may both grow a new file; both grow it to the same length.
    // SAFETY: `fd` is open for writing.
    if (st.st_size as usize) < TABLE_BYTES
        && unsafe { libc::ftruncate(fd, TABLE_BYTES as libc::off_t) } != 0
    {
        return None;
    }
    // SAFETY: a fresh shared mapping of the file's first TABLE_BYTES.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            TABLE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    // SAFETY: the mapping starts with a Header of atomics.
    let header = unsafe { &*(p as *const Header) };
    let ok =
        match header
            .magic
            .compare_exchange(0, TABLE_MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(m) => m == TABLE_MAGIC,
        };
    if !ok {
        // SAFETY: unmapping what was just mapped.
        unsafe { libc::munmap(p, TABLE_BYTES) };
        return None;
    }
    Some(p as usize)
}

fn word(h: &Handle, i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[i * 8..i * 8 + 8]);
    u64::from_le_bytes(b)
}

/// The ticket naming `offset` bytes into the allocation whose real handle is `real`, for a
/// block of `size` bytes; None when the shared table cannot be used.
pub fn ticket(real: &Handle, offset: u64, size: u64) -> Option<Handle> {
    let (header, slots) = table()?;
    let n = header.next.fetch_add(1, Ordering::Relaxed);
    let slot = &slots[(n % SLOTS) as usize];
    let seq = (n + 1) * 2;
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    slot.seq.store(seq - 1, Ordering::Relaxed);
    fence(Ordering::Release);
    slot.offset.store(offset, Ordering::Relaxed);
    slot.size.store(size, Ordering::Relaxed);
    slot.pid.store(pid, Ordering::Relaxed);
    for (i, w) in slot.handle.iter().enumerate() {
        w.store(word(real, i), Ordering::Relaxed);
    }
    slot.seq.store(seq, Ordering::Release);
    let mut t = [0u8; HANDLE];
    t[..8].copy_from_slice(&TICKET_MAGIC);
    t[8..16].copy_from_slice(&seq.to_le_bytes());
    t[16..24].copy_from_slice(&offset.to_le_bytes());
    t[24..32].copy_from_slice(&size.to_le_bytes());
    t[32..40].copy_from_slice(&pid.to_le_bytes());
    Some(t)
}

/// What a handle handed to `cuIpcOpenMemHandle` names.
pub enum Named {
    /// A CUDA handle: open it as it is.
    Real,
    /// A ticket: open this real handle and add the offset.
    Ticket(Handle, u64),
    /// A ticket whose slot was reused or that this machine's table never held.
    Stale,
}

pub fn read(h: &Handle) -> Named {
    if h[..8] != TICKET_MAGIC {
        return Named::Real;
    }
    let seq = word(h, 1);
    let (offset, pid) = (word(h, 2), word(h, 4));
    let Some((_, slots)) = table() else {
        return Named::Stale;
    };
    if seq < 2 {
        return Named::Stale;
    }
    let slot = &slots[((seq / 2 - 1) % SLOTS) as usize];
    if slot.seq.load(Ordering::Acquire) != seq {
        return Named::Stale;
    }
    let mut real = [0u8; HANDLE];
    for (i, w) in slot.handle.iter().enumerate() {
        real[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    let same =
        slot.offset.load(Ordering::Relaxed) == offset && slot.pid.load(Ordering::Relaxed) == pid;
    fence(Ordering::Acquire);
    if !same || slot.seq.load(Ordering::Relaxed) != seq {
        return Named::Stale;
    }
    Named::Ticket(real, offset)
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
    mapping: u16,
}

const MAPPINGS: usize = 1024;
const GIVEN: usize = 4096;

struct Opened {
    mappings: [Option<Mapping>; MAPPINGS],
    given: [Option<Given>; GIVEN],
}

struct Shared(UnsafeCell<Opened>);
// SAFETY: only touched under LOCK.
unsafe impl Sync for Shared {}

static LOCK: SpinLock = SpinLock::new();
static OPENED: Shared = Shared(UnsafeCell::new(Opened {
    mappings: [None; MAPPINGS],
    given: [None; GIVEN],
}));
/// Set once the process opened anything through the table: closes look only then.
static ANY: AtomicU8 = AtomicU8::new(0);

/// In a forked child: a parent thread may have held the lock at the fork.
pub fn forget_after_fork() {
    LOCK.unlock();
}

fn locked<R>(f: impl FnOnce(&mut Opened) -> R) -> R {
    LOCK.lock();
    // SAFETY: LOCK is held, so this is the only reference.
    let r = f(unsafe { &mut *OPENED.0.get() });
    LOCK.unlock();
    r
}

/// Opens `real` (in the current context) through the table and returns `offset` past its
/// base. `open` is the real `cuIpcOpenMemHandle` (writes the base, returns a CUresult).
pub fn open(real: &Handle, offset: u64, open: impl FnOnce(&mut u64) -> i32) -> Result<u64, i32> {
    let ctx = pool::current_context().unwrap_or(0);
    ANY.store(1, Ordering::Release);
    locked(|o| {
        let Some(g) = o.given.iter().position(Option::is_none) else {
            return Err(crate::ffi::ERROR_OUT_OF_MEMORY);
        };
        let found = o
            .mappings
            .iter()
            .position(|m| m.is_some_and(|m| m.handle == *real && m.ctx == ctx));
        let m = match found {
            Some(m) => m,
            None => {
                let Some(m) = o.mappings.iter().position(Option::is_none) else {
                    return Err(crate::ffi::ERROR_OUT_OF_MEMORY);
                };
                let mut base = 0u64;
                let rc = open(&mut base);
                if rc != 0 {
                    return Err(rc);
                }
                o.mappings[m] = Some(Mapping {
                    handle: *real,
                    ctx,
                    base,
                    refs: 0,
                });
                m
            }
        };
        let mapping = o.mappings[m].as_mut().map(|x| {
            x.refs += 1;
            x.base
        });
        let ptr = mapping.unwrap_or(0) + offset;
        o.given[g] = Some(Given {
            ptr,
            mapping: m as u16,
        });
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
        let Some(g) = o.given.iter().position(|g| g.is_some_and(|g| g.ptr == ptr)) else {
            return Close::PassThrough;
        };
        let m = o.given[g].map_or(0, |g| g.mapping as usize);
        o.given[g] = None;
        let Some(mapping) = o.mappings[m].as_mut() else {
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
