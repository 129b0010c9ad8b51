//! Reading a trace while its program still writes it (`top`): one reader kept from a look to
//! the next, each look reading on from where the last one stopped, so a live view costs the
//! records written since its last refresh, not the whole trace again.
//!
//! What is read at a look: the header again, through the file first opened (the count of
//! slots claimed, whether the program ended), then the records up to that count. A slot
//! claimed but not yet written is waited for, not skipped as unused, unless it is final: a
//! writer abandons a block of slots older than `MAX_BLOCK_AGE_NS` (1 ms, after which its
//! unused slots stay zero), and writes a slot it claimed at once, so a slot claimed before a
//! look [`SETTLED_AFTER`] ago is written or never will be. That is the reorder window's
//! 20 ms, the time the reader already allows a writer between its clock read and its slot
//! (the ring's summarizer, inside the program, waits 2 ms: `recorder/ring.rs`; a reader of
//! another process on a busy host allows more). The reorder window keeps the records too new
//! to be in time order yet; once the program has ended, the last look reads to the end as a
//! whole read does. Where the ring laps past the records not yet read, the look says so
//! ([`Look::Lapped`]) and the caller reads the trace anew.

use super::*;

/// A slot claimed before a look this long ago is final (see the module's comment).
pub const SETTLED_AFTER: std::time::Duration = std::time::Duration::from_nanos(REORDER_WINDOW_NS);

/// What a followed reader knows of its earlier looks.
pub(super) struct Following {
    /// The slots claimed at the latest look that counts, and when it was made.
    claimed: u64,
    at: std::time::Instant,
    /// The slots below this are final (claimed before a look at least [`SETTLED_AFTER`] ago).
    settled: u64,
    /// Whether the program was still writing at the latest look.
    running: bool,
    /// The records the latest look let be read were all read (the first read's decoder, on a
    /// thread of its own, is taken back only then: batches on their way would be lost).
    pub(super) read_out: bool,
}

/// What a look at a followed trace found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// The records written since the last look are there to read (perhaps none).
    Read,
    /// The ring lapped past records not yet read: they are gone; read the trace anew.
    Lapped,
}

impl TraceReader {
    /// Whether the program writing the trace still ran at the latest look (a reader not
    /// opened to follow: whether it runs now). Once it did not, the reader reads to the end.
    pub fn writing(&self) -> bool {
        match &self.following {
            Some(f) => f.running,
            None => self.tables.info.still_running(),
        }
    }

    /// Opens a trace to read while its program writes it: [`TraceReader::look`] before each
    /// read reads on from where the last read stopped. The first read decodes on a thread of
    /// its own where there is a core for it (it reads the whole trace so far); the next ones
    /// in turn (each reads what a refresh's interval wrote).
    pub fn open_following(
        path: impl AsRef<Path>,
        opts: &ReadOptions,
    ) -> Result<TraceReader, ReadError> {
        let mut r = TraceReader::open_with(path, opts)?;
        r.following = Some(Following {
            claimed: r.info.claimed,
            at: std::time::Instant::now(),
            settled: 0,
            running: true,
            read_out: false,
        });
        // The slots claimed at the opening are final once a writer's block has aged past.
        std::thread::sleep(SETTLED_AFTER);
        r.look()?;
        Ok(r)
    }

    /// Looks at the trace again: the records its program has written since are read next.
    /// A reader not opened to follow has nothing more to look at.
    pub fn look(&mut self) -> Result<Look, ReadError> {
        let path = self.tables.info.path.clone();
        if self.following.is_none() {
            return Ok(Look::Read);
        }
        // The decoder back from its thread, if the last read had one (it ended with the read);
        // a read not finished goes on as it was.
        if let source::Source::Threaded { .. } = self.source {
            if !self.following.as_ref().is_some_and(|f| f.read_out) {
                return Ok(Look::Read);
            }
            self.source = match self.source.stop() {
                Some(d) => source::Source::Inline(d),
                None => return Ok(Look::Lapped),
            };
        }
        let (source::Source::Pending(d) | source::Source::Inline(d), Some(f)) =
            (&mut self.source, &mut self.following)
        else {
            return Ok(Look::Read);
        };
        f.read_out = false;
        let io_err = |e| ReadError::Io(path.clone(), e);
        let mut h = vec![0u8; HEADER_SIZE];
        std::os::unix::fs::FileExt::read_exact_at(&d.input, &mut h, 0).map_err(io_err)?;
        let file_len = d.input.metadata().map_err(io_err)?.len();
        let mut info = head::info_of(&h, path.clone(), file_len)?;
        if (info.pid, info.start_realtime_ns)
            != (self.tables.info.pid, self.tables.info.start_realtime_ns)
        {
            // Another run's header in the file: nothing read so far is its.
            return Ok(Look::Lapped);
        }
        let now = std::time::Instant::now();
        if now.duration_since(f.at) >= SETTLED_AFTER {
            f.settled = f.claimed;
            (f.claimed, f.at) = (info.claimed.max(f.claimed), now);
        }
        let (ring, capacity) = (info.ring, head::info_capacity(&h));
        let end = if ring {
            if info.claimed > capacity && info.claimed - capacity > d.next {
                return Ok(Look::Lapped);
            }
            info.claimed
        } else {
            info.claimed.min(capacity).min(head::slots_in(file_len))
        };
        let running = info.still_running();
        f.running = running;
        d.ring = if ring { capacity } else { 0 };
        d.end = d.end.max(end);
        // Once the program has ended, every slot is final: read to the end as a whole read.
        d.follow = running.then_some(f.settled);
        (d.finished, d.paused) = (false, false);
        self.end = d.end;
        // What the opening learnt from the checkpoint it read.
        info.summarized = self.tables.info.summarized;
        info.checkpoint_refused = self.tables.info.checkpoint_refused.take();
        self.tables.info = info;
        Ok(Look::Read)
    }
}
