//! Record bodies read from the checkpoint, then the file (or the ring), and decoded: commit
//! words checked, definitions gathered from their data records, records put in time order in
//! the reorder window and handed on in batches, each with the definitions read while it was
//! gathered. A [`Decoder`] runs on a thread of its own when the machine has a second core,
//! while the reports read the batches before it (see [`super::source::Source`]).

use super::order::TimeOrder;
use super::*;

/// A definition read from the file, applied by the reader before the records of its batch.
#[derive(Clone)]
pub(super) enum Def {
    String(u64, String),
    Stack(u64, Vec<u64>),
    /// A module loaded at a base: its path's string id.
    Module(u64, u64),
    /// A module's build-id: the string id of its hex.
    BuildId(u64, u64),
    /// A backward function's stack joined to its forward's (see [`crate::trace::backward`]):
    /// the joined stack's id, the backward stack's and the forward's.
    Join(u64, u64, u64),
}

/// Records in time order and what the reader needs to know with them.
pub(super) struct Batch {
    pub defs: Vec<Def>,
    pub records: Vec<Record>,
    /// The records restore a checkpoint's state (filters do not apply to them).
    pub restoring: bool,
    pub stats: DecodeStats,
    /// The next record index to read, for progress.
    pub next: u64,
    /// The file is read to its end: no batch follows.
    pub last: bool,
}

impl Batch {
    /// A copy for a second reader, its records in a spare batch.
    pub(super) fn copy(&self, spares: &Spares) -> Batch {
        let mut records = spares.take(self.records.len());
        records.extend_from_slice(&self.records);
        Batch {
            defs: self.defs.clone(),
            records,
            restoring: self.restoring,
            stats: self.stats.clone(),
            next: self.next,
            last: self.last,
        }
    }
}

/// The decoding side of a reader: the file, the checkpoint, the reorder window.
pub(super) struct Decoder {
    /// Read in chunks of its own (a buffered reader's copy would be a second one).
    pub input: File,
    /// How it reads: windows mapped or not, on a thread of its own or not.
    pub mode: super::ReadMode,
    pub next: u64,
    pub end: u64,
    /// The first ring index read (records before it are in the checkpoint, or lost).
    pub start: u64,
    /// A ring's slots (0: the records lie one after the other).
    pub ring: u64,
    /// The checkpoint read first, its bodies; the next to read; and how many of them restore
    /// state (up to its `END`), which bypass the reorder window.
    pub ckpt: CheckpointRead,
    pub stats: DecodeStats,
    /// A definition whose data records are still being read: kind, id, byte length, bytes.
    pub pending: Option<(RecordKind, u64, usize, Vec<u8>)>,
    /// The reorder window (see [`REORDER_WINDOW_NS`]).
    pub order: Reorder,
    /// Whether the file has been read to its end.
    pub drained: bool,
    /// Reading a trace its program still writes (see [`super::follow`]): the slots below this
    /// index are final, and one at or past it not yet written is waited for, not skipped.
    pub follow: Option<u64>,
    /// Following: the records read so far were handed on as far as the reorder window lets
    /// them go, and more are to come at the next look.
    pub paused: bool,
    /// Where the first pass began and what it knew before its first record.
    pub first: FirstRead,
    /// Record bodies read from the file or mapped, the next to decode, and how many.
    pub chunk: Chunk,
    /// Definitions read since the last batch.
    pub defs: Vec<Def>,
    /// The last batch was handed on.
    pub finished: bool,
    /// The size of the last batch read from the file (see [`BATCH`]); 0 before the first.
    pub batch: usize,
    /// Batches the reader is done with, to be filled again.
    pub spares: std::sync::Arc<Spares>,
    /// The backward tensors' stacks joined to their forwards' (see [`Joining`]).
    pub joining: Joining,
}

pub use super::spares::Spares;

/// The checkpoint a decoder reads first: its record bodies, the next to read, and how many of
/// them restore state (up to its `END`), which bypass the reorder window.
pub(super) struct CheckpointRead {
    pub bodies: std::sync::Arc<Vec<[u8; RECORD_SIZE]>>,
    pub at: usize,
    pub prefix: usize,
    /// The restoring prefix when the first pass began (a rewind starts there again).
    pub first_prefix: usize,
}

/// Record bodies read from the file in one read (where no window of it is mapped), or the
/// window mapped in its place (see [`super::mapped`]); the next to decode, and how many.
#[derive(Default)]
pub(super) struct Chunk {
    pub bytes: Vec<u8>,
    pub mapped: Option<super::mapped::Window>,
    pub at: usize,
    pub len: usize,
}

/// Where the first pass began in the file and what it knew before its first record.
pub(super) struct FirstRead {
    pub offset: u64,
    pub stats: DecodeStats,
}

/// The reorder window: the records read but not handed on, sorted by time, and the latest
/// record time read from the file so far.
#[derive(Default)]
pub(super) struct Reorder {
    pub records: Vec<Record>,
    pub latest_ns: u64,
}

/// The backward tensors' stacks joined to their forwards', here rather than where the reports
/// read.
#[derive(Default)]
pub(super) struct Joining {
    /// The backward tensors' stacks joined to their forwards', here rather than where the
    /// reports read (a real model's trace: some 50 instructions a record off their threads).
    pub joins: crate::trace::backward::BackwardJoins,
    /// A record that may be joined was read in this pass: until one is, no batch is looked
    /// through for them (a C program's trace has none).
    pub joinable: bool,
}

impl Decoder {
    /// Back to the first record, through the same descriptor.
    pub fn rewind(&mut self) -> io::Result<()> {
        io::Seek::seek(&mut self.input, io::SeekFrom::Start(self.first.offset))?;
        self.next = self.start;
        self.ckpt.at = 0;
        self.ckpt.prefix = self.ckpt.first_prefix;
        self.stats = self.first.stats.clone();
        self.pending = None;
        self.order.records.clear();
        self.order.latest_ns = 0;
        self.drained = false;
        self.paused = false;
        (self.chunk.at, self.chunk.len) = (0, 0);
        self.chunk.mapped = None;
        self.defs.clear();
        self.finished = false;
        self.batch = 0;
        self.joining.joins = Default::default();
        self.joining.joinable = false;
        Ok(())
    }

    /// The next batch: a checkpoint's restoring records one at a time, in their own order;
    /// then the records the reorder window lets go, in time order; then a last, empty one.
    pub fn step(&mut self) -> Batch {
        let mut records = self.next_records();
        self.join(&mut records);
        let last = records.is_empty();
        self.finished = last;
        Batch {
            defs: std::mem::take(&mut self.defs),
            restoring: self.ckpt.at <= self.ckpt.prefix
                && self.ckpt.prefix > 0
                && self.next == self.start,
            stats: self.stats.clone(),
            next: self.next,
            last,
            records,
        }
    }

    /// The batch's backward stacks joined to their forwards', as the reader would join them
    /// once it has the batch's definitions: those told to the joins first, then each record in
    /// order; each joined stack made for the first time goes to the reader as a definition,
    /// after the batch's others.
    fn join(&mut self, records: &mut [Record]) {
        use crate::trace::backward::BackwardJoins;
        for d in &self.defs {
            match d {
                Def::String(id, text) => self.joining.joins.define_string(*id, text),
                Def::Stack(id, frames) => self.joining.joins.define_stack(*id, frames),
                _ => {}
            }
        }
        if !self.joining.joinable {
            return;
        }
        for r in records.iter_mut() {
            if BackwardJoins::may_join(r)
                && let Some(j) = self.joining.joins.apply(r)
            {
                self.defs.push(Def::Join(j.id, j.backward, j.forward));
            }
        }
    }

    /// Each refill reads a batch from the file behind the records the window holds (at least
    /// as many, so each record is copied a bounded number of times), each record put in time
    /// order as it comes (moved back past the later ones before it, few in a trace: one
    /// thread's records come in order; past a budget of moves, a stable sort at the end), hands
    /// on the records older than the window, and keeps the rest. The records are decoded
    /// straight behind the window's, and only the window's are copied, once a refill.
    fn next_records(&mut self) -> Vec<Record> {
        // A checkpoint's records up to its END restore state: in their own order, first.
        while self.ckpt.at < self.ckpt.prefix {
            if let Some(r) = self.next_in_file() {
                self.joining.joinable |= crate::trace::backward::BackwardJoins::may_join(&r);
                return vec![r];
            }
        }
        loop {
            if (self.drained && self.order.records.is_empty()) || self.paused {
                return Vec::new();
            }
            // Small batches first (a pass that stops early, or a second reader of the first
            // part, decodes little past what it needs), doubling to BATCH.
            self.batch = self.batch.clamp(BATCH_FIRST, BATCH / 2) * 2;
            let want = self.batch.max(self.order.records.len());
            let mut out = std::mem::take(&mut self.order.records);
            out.reserve(want);
            let mut order = TimeOrder::new(out.len() + want);
            let mut got = 0;
            while got < want {
                // Most records are plain: decoded straight from the chunk, in a tight loop.
                got += self.plain_run(&mut out, want - got, &mut order);
                if got == want {
                    break;
                }
                match self.next_in_file() {
                    Some(r) => {
                        self.joining.joinable |=
                            crate::trace::backward::BackwardJoins::may_join(&r);
                        order.add(&mut out, r, &mut self.order.latest_ns);
                        got += 1;
                    }
                    // Following, the end for now: the window keeps what is not yet old enough.
                    None if self.follow.is_some() => {
                        self.paused = true;
                        break;
                    }
                    None => {
                        self.drained = true;
                        break;
                    }
                }
            }
            order.finish(&mut out);
            let old = if self.drained {
                out.len()
            } else {
                let cut = self.order.latest_ns.saturating_sub(REORDER_WINDOW_NS);
                let by_time = out.partition_point(|r| r.time_ns < cut);
                by_time.max(out.len().saturating_sub(REORDER_MAX))
            };
            // Room for the next refill behind it, so that it is not moved again.
            let tail = out.len() - old;
            let mut window = self.spares.take(tail + tail.max(BATCH));
            window.extend_from_slice(&out[old..]);
            self.order.records = window;
            out.truncate(old);
            if old > 0 || self.paused {
                return out;
            }
            self.spares.give(out);
        }
    }

    /// The next record body: the checkpoint's first, then the file's (or the ring's).
    pub(super) fn next_body(&mut self, buf: &mut [u8; RECORD_SIZE]) -> Option<(u64, bool)> {
        if self.ckpt.at < self.ckpt.bodies.len() {
            *buf = self.ckpt.bodies[self.ckpt.at];
            self.ckpt.at += 1;
            return Some(((self.ckpt.at - 1) as u64, true));
        }
        if self.chunk.at == self.chunk.len && !self.refill() {
            return None;
        }
        let at = self.chunk.at * RECORD_SIZE;
        buf.copy_from_slice(&self.bodies()[at..at + RECORD_SIZE]);
        self.chunk.at += 1;
        let index = self.next;
        self.next += 1;
        Some((index, false))
    }

    /// The record bodies of the chunk: the mapped window's, or those read into the buffer.
    #[inline]
    fn bodies(&self) -> &[u8] {
        match &self.chunk.mapped {
            Some(w) => w.bytes(),
            None => &self.chunk.bytes,
        }
    }

    /// The next records of the file, no further than the ring's end (where the next lap
    /// begins at the first slot): a window of the file mapped (see [`super::mapped`]), or as
    /// many as the chunk holds read into it. `false` at the end, or where the file cannot be
    /// read (said as damage).
    fn refill(&mut self) -> bool {
        if self.next >= self.end {
            return false;
        }
        let index = self.next;
        let mut n = self.end - index;
        let slot = if self.ring > 0 {
            n = n.min(self.ring - index % self.ring);
            index % self.ring
        } else {
            index
        };
        let offset = (HEADER_SIZE as u64).saturating_add(slot.saturating_mul(RECORD_SIZE as u64));
        self.chunk.mapped = None;
        // Mapped, no further than the whole records the file holds now (a file cut since it
        // was opened is read to where it ends; one cut while mapped, see `next_in_file`).
        let now = self.input.metadata().map_or(0, |m| m.len());
        let whole = now.saturating_sub(offset) / RECORD_SIZE as u64;
        let in_window = n.min(whole).min(super::mapped::WINDOW_RECORDS as u64) as usize;
        let mapped = self.mode.map;
        let window = || super::mapped::Window::map(&self.input, offset, in_window * RECORD_SIZE);
        if let Some(w) = mapped.then(window).flatten() {
            self.chunk.mapped = Some(w);
            (self.chunk.at, self.chunk.len) = (0, in_window);
            return true;
        }
        let want = n.min(CHUNK_RECORDS as u64) as usize * RECORD_SIZE;
        self.chunk.bytes.resize(CHUNK_RECORDS * RECORD_SIZE, 0);
        let mut got = 0;
        while got < want {
            use std::os::unix::fs::FileExt;
            match self
                .input
                .read_at(&mut self.chunk.bytes[got..want], offset + got as u64)
            {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.next += 1;
                    self.stop(format!("read failed: {e}"));
                    return false;
                }
            }
        }
        (self.chunk.at, self.chunk.len) = (0, got / RECORD_SIZE);
        if self.chunk.len == 0 {
            self.next += 1;
            self.stop(SHRANK.into());
            return false;
        }
        true
    }

    /// Decodes up to `most` plain records (committed, in the chunk, no definition under way,
    /// not a definition themselves: most records) from the chunk behind `out`, each in time
    /// order ([`TimeOrder`]), stopping at the first that is not; how many. The rest go through
    /// [`Decoder::next_in_file`].
    fn plain_run(&mut self, out: &mut Vec<Record>, most: usize, order: &mut TimeOrder) -> usize {
        if self.ckpt.at < self.ckpt.bodies.len() || self.pending.is_some() {
            return 0;
        }
        let end = self.chunk.len.min(self.chunk.at.saturating_add(most));
        let start = self.chunk.at;
        let bodies = match &self.chunk.mapped {
            Some(w) => w.bytes(),
            None => &self.chunk.bytes,
        };
        let mut latest = self.order.latest_ns;
        let mut joinable = false;
        let mut next = self.next;
        let mut at = start;
        while at < end {
            let o = at * RECORD_SIZE;
            crate::prefetch::ahead(bodies, o);
            let Some(body) = bodies
                .get(o..o + RECORD_SIZE)
                .and_then(|b| <&[u8; RECORD_SIZE]>::try_from(b).ok())
            else {
                break;
            };
            if Record::commit_of(body) != format::commit_tag(next) {
                break;
            }
            let Some(r) = Record::decode(body) else {
                break;
            };
            if r.kind.is_definition() && r.kind != RecordKind::Caller {
                break;
            }
            joinable |= crate::trace::backward::BackwardJoins::may_join(&r);
            order.add(out, r, &mut latest);
            at += 1;
            next += 1;
        }
        let n = at - start;
        self.chunk.at = at;
        self.next = next;
        self.order.latest_ns = latest;
        self.joining.joinable |= joinable;
        self.stats.committed += n as u64;
        n
    }

    /// The next record from the checkpoint or the file, whatever it is: definitions gathered,
    /// slots left unused skipped, damage said.
    pub(super) fn next_in_file(&mut self) -> Option<Record> {
        let mut buf = [0u8; RECORD_SIZE];
        while let Some((index, in_checkpoint)) = self.next_body(&mut buf) {
            let commit = Record::commit_of(&buf);
            let written = commit != 0 && (commit == format::commit_tag(index) || self.ring == 0);
            if !written && !in_checkpoint && self.follow.is_some_and(|settled| index >= settled) {
                // Claimed but not yet written by a program still writing: read again from
                // here at the next look (the chunk too: a buffer's copy would be stale).
                self.next = index;
                (self.chunk.at, self.chunk.len) = (0, 0);
                self.chunk.mapped = None;
                return None;
            }
            if commit == 0 {
                if buf.iter().all(|&b| b == 0) {
                    if !in_checkpoint && self.chunk.mapped.as_ref().is_some_and(|w| w.cut()) {
                        // Past the end of a file that shrank while mapped: zeros the guard
                        // put there, not slots left unused.
                        self.stop(SHRANK.into());
                        return None;
                    }
                    self.stats.unused += 1;
                } else {
                    self.stats.torn += 1;
                }
                continue;
            }
            if commit != format::commit_tag(index) && self.ring > 0 && !in_checkpoint {
                // A slot this lap's writer claimed and left unused: an earlier lap's record.
                self.stats.unused += 1;
                continue;
            }
            if commit != format::commit_tag(index) {
                if in_checkpoint {
                    // The checkpoint's checksum matched: it cannot be damaged; skip it whole.
                    self.ckpt.at = self.ckpt.bodies.len();
                    self.ckpt.prefix = 0;
                    continue;
                }
                self.stop(format!(
                    "commit word {commit:#06x} does not belong to record {index} \
                     (expected {:#06x}): the file is damaged here",
                    format::commit_tag(index)
                ));
                return None;
            }
            match Record::decode(&buf) {
                Some(r) if matches!(r.kind, RecordKind::StringData | RecordKind::StackData) => {
                    self.stats.committed += 1;
                    if let Some((kind, id, len, mut bytes)) = self.pending.take() {
                        let at = format::record::TIME_NS;
                        bytes.extend_from_slice(&buf[at..at + format::STRING_BYTES_PER_RECORD]);
                        if bytes.len() < len {
                            self.pending = Some((kind, id, len, bytes));
                        } else {
                            bytes.truncate(len);
                            self.define(kind, id, bytes);
                        }
                    }
                }
                Some(r) => {
                    self.stats.committed += 1;
                    let len = match r.kind {
                        RecordKind::String => (r.size as usize).min(format::STRING_MAX),
                        RecordKind::Stack => {
                            (r.size as usize).min(crate::trace::unwind::MAX_FRAMES) * 8
                        }
                        RecordKind::Module => {
                            // Another module at this base: its build-id, if any, follows.
                            self.defs.push(Def::Module(r.ptr, r.size));
                            0
                        }
                        RecordKind::ModuleBuildId => {
                            self.defs.push(Def::BuildId(r.ptr, r.size));
                            0
                        }
                        _ => 0,
                    };
                    if matches!(r.kind, RecordKind::String | RecordKind::Stack) {
                        if len == 0 {
                            self.define(r.kind, r.ptr, Vec::new());
                        } else {
                            self.pending = Some((r.kind, r.ptr, len, Vec::with_capacity(len)));
                        }
                    }
                    return Some(r);
                }
                None => {
                    self.stop(format!(
                        "record {index} has an unknown kind ({}) or API ({}): the file is damaged \
                         here or was written by a newer gpushim",
                        buf[format::record::KIND],
                        buf[format::record::API]
                    ));
                    return None;
                }
            }
        }
        None
    }

    fn define(&mut self, kind: RecordKind, id: u64, bytes: Vec<u8>) {
        if kind == RecordKind::Stack {
            let frames: Vec<u64> = bytes
                .chunks_exact(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(c);
                    u64::from_le_bytes(w)
                })
                .collect();
            self.defs.push(Def::Stack(id, frames));
        } else {
            self.defs.push(Def::String(id, printable(&bytes)));
        }
    }

    fn stop(&mut self, reason: String) {
        let index = self.next.saturating_sub(1);
        // Where the record lies in the file: a ring's index wraps at its capacity. A damaged
        // header can claim any count, so the arithmetic saturates.
        let slot = if self.ring > 0 {
            index % self.ring
        } else {
            index
        };
        self.stats.damage = Some(Damage {
            offset: (HEADER_SIZE as u64).saturating_add(slot.saturating_mul(RECORD_SIZE as u64)),
            index,
            reason,
            skipped: self.end - self.next,
        });
        self.next = self.end;
        (self.chunk.at, self.chunk.len) = (0, 0);
    }
}

/// Why a read stopped where the file ended before the extent its header and length gave when
/// opened.
const SHRANK: &str = "read failed: the file ends early (it shrank while being read)";

/// Records read from the file per refill of the window, at least (a batch of them, 1.3 MB,
/// stays in the cache between its decoding and its reading).
pub(super) const BATCH: usize = 1 << 15;
/// The first batch of a pass.
const BATCH_FIRST: usize = 1 << 11;

/// Batches decoded ahead of the reports on the decoder's thread.
pub(super) const AHEAD: usize = 4;
