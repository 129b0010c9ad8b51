//! Opening a trace: the file created where no one else's file can be taken for it, the
//! recorder's tables emptied, the layout chosen, the header written.

use super::*;

impl Recorder {
    /// Creates the file (0600, `O_EXCL | O_NOFOLLOW`; under another name when the one asked for
    /// is taken, see [`naming::another_name`]), writes the header and maps the first chunk.
    /// The caller must have won [`Recorder::begin_open`].
    pub fn open(&self, o: &OpenOptions<'_>) -> Result<(), OpenError> {
        if self.state.load(Ordering::Relaxed) != OPENING {
            return Err(OpenError::Busy);
        }
        let r = self.open_inner(o);
        self.state
            .store(if r.is_ok() { READY } else { FAILED }, Ordering::Release);
        r
    }

    pub(super) fn open_inner(&self, o: &OpenOptions<'_>) -> Result<(), OpenError> {
        if o.path.len() >= PATH_CAP || o.path.contains(&0) {
            return Err(OpenError::PathTooLong);
        }
        if let Some(uid) = naming::foreign_link(o.path) {
            return Err(OpenError::ForeignLink(uid));
        }
        if let Some((owner, mode)) = naming::link_into_others(o.path) {
            return Err(OpenError::LinkIntoOthers { owner, mode });
        }
        // SAFETY: we hold the OPENING state, so no other thread reads or writes `path` now.
        let path = unsafe { &mut *self.path.get() };
        path[..o.path.len()].copy_from_slice(o.path);
        path[o.path.len()] = 0;
        self.path_len.store(o.path.len() as u32, Ordering::Relaxed);

        let create = |path: &[u8; PATH_CAP]| {
            // SAFETY: `path` is NUL-terminated; the flags create a new file or fail.
            unsafe {
                libc::open(
                    path.as_ptr().cast(),
                    libc::O_RDWR
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                )
            }
        };
        let mut fd = create(path);
        // A name already there (a file, a link, a name made in advance in a shared folder)
        // never turns recording off: the trace takes another, unguessable one beside it, which
        // `path()` then gives.
        let mut tries = 0;
        while fd < 0 && last_errno() == libc::EEXIST && tries < naming::OTHER_NAMES {
            tries += 1;
            let Some(n) = naming::another_name(o.path, naming::unguessable_word(), path) else {
                break;
            };
            self.path_len.store(n as u32, Ordering::Relaxed);
            fd = create(path);
        }
        if fd < 0 {
            return Err(OpenError::Create(last_errno()));
        }
        self.fd.store(fd, Ordering::Relaxed);
        for (c, p) in self.chunks.iter().zip(&self.populated) {
            c.store(ptr::null_mut(), Ordering::Relaxed);
            p.store(false, Ordering::Relaxed);
        }
        for s in &self.streams {
            s.store(0, Ordering::Relaxed);
        }
        for s in self.strings.iter().chain(&self.stacks) {
            s.store(0, Ordering::Relaxed);
        }
        self.threads.store(0, Ordering::Relaxed);
        self.slow.file_len.store(0, Ordering::Relaxed);
        let chunk_cap = (MAX_CHUNKS as u64 * CHUNK_BYTES - HEADER_SIZE as u64) / RECORD_SIZE as u64;
        let layout = ring::Layout::of(o.trace_max, o.ring);
        let capacity = layout.capacity.min(chunk_cap);
        self.capacity.store(capacity, Ordering::Relaxed);
        self.ring_on.store(false, Ordering::Relaxed);
        self.limit.store(u64::MAX, Ordering::Relaxed);
        self.slow
            .checkpoint_area
            .store(layout.checkpoint_area, Ordering::Relaxed);
        self.slow
            .checkpoint_slot
            .store(layout.checkpoint_slot, Ordering::Relaxed);
        self.open_definitions_log(layout.checkpoint_slot > 0);

        let base = match self.map_chunk(0) {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: `fd` is ours and open; `path` is the file we just created.
                unsafe {
                    libc::close(fd);
                    libc::unlink(path.as_ptr().cast());
                }
                return Err(OpenError::Map(e));
            }
        };
        // SAFETY: chunk 0 is mapped read-write and at least HEADER_SIZE bytes long; no producer
        // writes to the header before READY is published.
        let origin = unsafe { write_header(base, o, capacity, &layout) };
        self.origin_ns.store(origin, Ordering::Relaxed);
        self.serial.store(
            OPEN_SERIAL.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// Writes the header; returns the monotonic clock origin it recorded.
///
/// # Safety
/// `base` must point to at least HEADER_SIZE writable bytes that no other thread touches.
unsafe fn write_header(
    base: *mut u8,
    o: &OpenOptions<'_>,
    capacity: u64,
    layout: &ring::Layout,
) -> u64 {
    // SAFETY: the caller guarantees HEADER_SIZE writable bytes at `base`.
    let h = unsafe { core::slice::from_raw_parts_mut(base, HEADER_SIZE) };
    let put =
        |h: &mut [u8], off: usize, bytes: &[u8]| h[off..off + bytes.len()].copy_from_slice(bytes);
    put(h, header::VERSION, &format::VERSION.to_le_bytes());
    put(h, header::RECORD_SIZE, &(RECORD_SIZE as u32).to_le_bytes());
    put(h, header::HEADER_SIZE, &(HEADER_SIZE as u32).to_le_bytes());
    put(h, header::PID, &o.pid.to_le_bytes());
    put(h, header::RANK, &o.rank.to_le_bytes());
    put(
        h,
        header::START_REALTIME_NS,
        &clock_ns(libc::CLOCK_REALTIME).to_le_bytes(),
    );
    let origin = clock_ns(libc::CLOCK_MONOTONIC);
    put(h, header::START_MONOTONIC_NS, &origin.to_le_bytes());
    put(h, header::CAPACITY, &capacity.to_le_bytes());
    if layout.checkpoint_slot > 0 {
        put(h, header::RING, &1u64.to_le_bytes());
        put(
            h,
            header::CHECKPOINT_AREA,
            &layout.checkpoint_area.to_le_bytes(),
        );
        put(
            h,
            header::CHECKPOINT_SLOT_BYTES,
            &layout.checkpoint_slot.to_le_bytes(),
        );
    }
    let clip = |b: &[u8], n: usize| b.len().min(n - 1);
    let n = clip(o.host, header::HOST_LEN);
    put(h, header::HOST, &o.host[..n]);
    let n = clip(o.program, header::PROGRAM_LEN);
    put(h, header::PROGRAM, &o.program[..n]);
    let n = clip(o.cmdline, header::CMDLINE_LEN);
    put(h, header::CMDLINE, &o.cmdline[..n]);
    let n = clip(o.env, header::ENV_LEN);
    put(h, header::ENV, &o.env[..n]);
    // The magic last: a reader (`gpushim top` on a process just starting) that sees it sees
    // the whole header.
    core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
    put(h, header::MAGIC, &format::MAGIC);
    origin
}
