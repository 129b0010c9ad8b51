//! A trace of any length: the ring's layout, its checkpoints, and the summarizer that writes
//! them (see `format::ring`).
//!
//! The summarizer runs on a helper thread of the traced process. Every 10 ms it reads the
//! records claimed before its previous look (writers commit within microseconds of their
//! claim; a block's unused tail is abandoned within 1 ms), feeds them to a [`Summarizer`], and,
//! once the ring is half full, writes a checkpoint every second and whenever the writers are
//! half a ring ahead of the last one. A checkpoint takes the newest's place while the older
//! lies within the ring's newest seven eighths, else the older's (so the older stays far back:
//! a replay from it has many records), then its descriptor's `seq` is stored last: a process
//! killed at any moment leaves a whole checkpoint at most a second old, and the ring still
//! holds every record after it unless the writers lapped the summarizer (then the records
//! between are counted in the header).

use super::*;
use crate::trace::format::ring::{DESCRIPTOR_BYTES, checksum};
use crate::trace::summary::{self, Summarizer};

/// How the file of `trace_max` bytes is laid out.
pub(super) struct Layout {
    /// Record slots.
    pub capacity: u64,
    /// Where the checkpoint area starts (0: no ring).
    pub checkpoint_area: u64,
    /// Bytes of one of its two slots (0: no ring).
    pub checkpoint_slot: u64,
}

/// The smallest checkpoint slot.
const MIN_CHECKPOINT_SLOT: u64 = 64 << 10;
/// The largest (a checkpoint of a million live allocations and 16,384 deep stacks fits).
use crate::trace::format::ring::MAX_CHECKPOINT_SLOT;

impl Layout {
    /// A ring gives an eighth of `trace_max` (256 MiB at most) to each checkpoint slot and the
    /// rest to records; otherwise every byte holds records.
    pub fn of(trace_max: u64, ring: bool) -> Layout {
        let records = |bytes: u64| bytes.saturating_sub(HEADER_SIZE as u64) / RECORD_SIZE as u64;
        let slot = (trace_max / 8 / 4096 * 4096).clamp(MIN_CHECKPOINT_SLOT, MAX_CHECKPOINT_SLOT);
        if !ring || trace_max < 8 * MIN_CHECKPOINT_SLOT {
            return Layout {
                capacity: records(trace_max),
                checkpoint_area: 0,
                checkpoint_slot: 0,
            };
        }
        let mut capacity = records(trace_max - 2 * slot);
        // A slot left from the lap before carries another commit word than this lap's record
        // only if the capacity is no multiple of the commit word's period.
        if capacity % 32768 == 0 {
            capacity -= 1;
        }
        let area = crate::trace::format::ring::checkpoint_area(capacity).unwrap_or(u64::MAX);
        Layout {
            capacity,
            checkpoint_area: area,
            checkpoint_slot: slot,
        }
    }
}

/// What the summarizer loop does between looks.
const LOOK_EVERY_MS: u64 = 10;
/// Between looks while the summarizer is behind: twice the age at which a writer abandons its
/// block (`MAX_BLOCK_AGE_NS`), so every slot claimed before the previous look is final.
const LOOK_BEHIND_MS: u64 = 2;
/// The older checkpoint is kept while it lies within the ring's newest this many sixteenths
/// (at the exit, [`OLDER_KEPT_AT_EXIT`]): more than the half a ring after which a checkpoint is
/// written whatever the time, so that a fast run's older one outlives a quiet last second (its
/// checkpoints come every half ring, and the older then lies a half to a whole ring back), and
/// an eighth of the ring left before a lap could take it while the newest's place is being
/// written (a slot takes milliseconds; a ring, a second at the least).
const OLDER_KEPT_WITHIN: u64 = 14;
/// At the exit no program thread writes on: the older is kept while the ring holds it, but for
/// a sixteenth. Three quarters had let the exit's checkpoint take the slot of an older one
/// still in the ring, leaving the older a second back (ViT-B/16 through 4 MiB: 1,150 records).
const OLDER_KEPT_AT_EXIT: u64 = 15;

/// A checkpoint at least this often once the ring is half full.
const CHECKPOINT_EVERY_NS: u64 = 1_000_000_000;
/// How long a slot found empty is looked at again before it is taken for an abandoned block's
/// unused tail: longer than a writer is held up but for the rarest preemption.
const HOLE_WAIT_NS: u64 = 200_000_000;
/// Empty slots kept for another look at most (the rest are taken for unused at once).
const HOLES_KEPT: usize = 1 << 16;

impl Recorder {
    /// Whether the file is laid out as a ring.
    pub fn is_ring(&self) -> bool {
        self.slow.checkpoint_slot.load(Ordering::Relaxed) > 0
    }

    /// The ring's slots (0: the file is not a ring).
    pub fn ring_slots(&self) -> u64 {
        if self.is_ring() {
            self.capacity.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// Records one checkpoint slot holds.
    fn checkpoint_room(&self) -> usize {
        (self.slow.checkpoint_slot.load(Ordering::Relaxed) / RECORD_SIZE as u64) as usize
    }

    fn descriptor_word(&self, slot: usize, field: usize) -> Option<&AtomicU64> {
        self.header_word(header::CHECKPOINTS + slot * DESCRIPTOR_BYTES + field * 8)
    }

    /// Which slot the next checkpoint goes to: an empty one first; then the newest's, in its
    /// place, while the older still lies within [`OLDER_KEPT_WITHIN`] sixteenths of the ring's
    /// head; else the older's. So the older stays as far back as the ring allows, and a replay
    /// from it (PyTorch's allocator for `fit`, a failure in detail) has most of the ring,
    /// where alternating slots left it a second's: a run whose last second was no training (its
    /// evaluation, its teardown) gave `fit` nothing to replay. A slot being written holds no
    /// checkpoint (its `seq` is 0 until done), so the other must stay whole: the newest's
    /// place is taken only while the older is well inside the ring, and the older's only
    /// while the newest is there to read.
    fn slot_for_next(&self, s0: u64, s1: u64, exiting: bool) -> usize {
        if s0 == 0 || s1 == 0 {
            return usize::from(s0 != 0);
        }
        let (newest, older) = if s0 > s1 { (0, 1) } else { (1, 0) };
        let covered = self
            .descriptor_word(older, 2)
            .map_or(0, |w| w.load(Ordering::Relaxed));
        let capacity = self.capacity.load(Ordering::Relaxed);
        let behind = self.claimed().saturating_sub(covered);
        let within = if exiting {
            OLDER_KEPT_AT_EXIT
        } else {
            OLDER_KEPT_WITHIN
        };
        if behind < capacity / 16 * within {
            newest
        } else {
            older
        }
    }

    /// Writes a checkpoint of `bodies` (commit words put here) covering ring records before
    /// `covered`, into the slot [`Recorder::slot_for_next`] picks (`exiting`: the process's
    /// last). Returns false when it did not fit or could not be written.
    pub fn write_checkpoint(
        &self,
        bodies: &mut [[u8; RECORD_SIZE]],
        covered: u64,
        exiting: bool,
    ) -> bool {
        let fd = self.fd.load(Ordering::Acquire);
        let area = self.slow.checkpoint_area.load(Ordering::Relaxed);
        let slot_bytes = self.slow.checkpoint_slot.load(Ordering::Relaxed);
        let bytes = (bodies.len() as u64).saturating_mul(RECORD_SIZE as u64);
        if fd < 0 || slot_bytes == 0 || bytes > slot_bytes {
            return false;
        }
        let seq = |k: usize| {
            self.descriptor_word(k, 0)
                .map_or(0, |w| w.load(Ordering::Acquire))
        };
        let (s0, s1) = (seq(0), seq(1));
        let next_seq = s0.max(s1) + 1;
        let k = self.slot_for_next(s0, s1, exiting);
        let Some(seq_word) = self.descriptor_word(k, 0) else {
            return false;
        };
        // Empty first: a reader (or a crash) never pairs this descriptor with half-written data.
        seq_word.store(0, Ordering::SeqCst);
        summary::seal(bodies);
        // SAFETY: `bodies` is a slice of arrays of plain bytes, contiguous in memory.
        let raw =
            unsafe { core::slice::from_raw_parts(bodies.as_ptr().cast::<u8>(), bytes as usize) };
        let mut done = 0usize;
        let at = area + k as u64 * slot_bytes;
        while done < raw.len() {
            // SAFETY: `fd` is the open trace; the buffer is valid for the length given.
            let n = unsafe {
                libc::pwrite(
                    fd,
                    raw[done..].as_ptr().cast(),
                    raw.len() - done,
                    (at + done as u64) as libc::off_t,
                )
            };
            if n <= 0 {
                return false;
            }
            done += n as usize;
        }
        let sum = checksum(raw);
        for (field, v) in [(1, bodies.len() as u64), (2, covered), (3, sum)] {
            if let Some(w) = self.descriptor_word(k, field) {
                w.store(v, Ordering::Relaxed);
            }
        }
        seq_word.store(next_seq, Ordering::Release);
        true
    }

    /// Copies committed record `index` out of the ring, if it is there (committed, of this
    /// lap, not overwritten while copied).
    fn read_record(&self, index: u64) -> Option<[u8; RECORD_SIZE]> {
        let capacity = self.capacity.load(Ordering::Relaxed).max(1);
        let offset = HEADER_SIZE as u64 + (index % capacity) * RECORD_SIZE as u64;
        let base = self.chunks[(offset / CHUNK_BYTES) as usize].load(Ordering::Acquire);
        if base.is_null() {
            return None;
        }
        let tag = format::commit_tag(index);
        // SAFETY: the chunk maps CHUNK_BYTES of the file and the record lies inside it; the
        // commit word is read atomically before and after the body is copied, so a body that
        // a writer changed meanwhile is refused.
        unsafe {
            let src = base.add((offset % CHUNK_BYTES) as usize);
            let word = AtomicU16::from_ptr(src.cast());
            if word.load(Ordering::Acquire) != tag {
                return None;
            }
            let mut body = [0u8; RECORD_SIZE];
            ptr::copy_nonoverlapping(src, body.as_mut_ptr(), RECORD_SIZE);
            core::sync::atomic::fence(Ordering::Acquire);
            if word.load(Ordering::Relaxed) != tag {
                return None;
            }
            Some(body)
        }
    }

    /// Looks again at the slots found empty when passed (index, when): one written since is
    /// fed now (late, and counted); one a lap overwrote, or still empty after
    /// [`HOLE_WAIT_NS`], is dropped (an abandoned block's unused tail stays empty).
    fn revisit(
        &self,
        holes: &mut std::collections::VecDeque<(u64, u64)>,
        claimed: u64,
        capacity: u64,
        now: u64,
        s: &mut Summarizer,
    ) {
        let mut late = 0u64;
        holes.retain(|&(index, found)| {
            if claimed.saturating_sub(index) >= capacity {
                return false;
            }
            if let Some(body) = self.read_record(index) {
                s.feed(&body);
                late += 1;
                return false;
            }
            now.saturating_sub(found) < HOLE_WAIT_NS
        });
        if late > 0
            && let Some(w) = self.header_word(header::SUMMARY_LATE)
        {
            w.fetch_add(late, Ordering::Relaxed);
        }
    }

    /// Runs the summarizer until `stop` is set (then writes a last checkpoint if the ring has
    /// wrapped). Turns wrapping on first: from here on the trace never drops a record for want
    /// of room. A helper thread's body; it allocates.
    pub fn run_summarizer(&self, stop: &AtomicBool) {
        if !self.is_ring() || self.state.load(Ordering::Acquire) != READY {
            return;
        }
        self.ring_on.store(true, Ordering::Relaxed);
        let capacity = self.capacity.load(Ordering::Relaxed);
        let mut s = Summarizer::new();
        let mut next = 0u64;
        let mut seen_claimed = self.claimed();
        let mut last_covered = 0u64;
        let mut last_at = self.now_ns();
        let mut bodies: Vec<[u8; RECORD_SIZE]> = Vec::new();
        let mut defined = 0u64;
        // Slots found empty when passed, looked at again for a few looks: a writer held up
        // between claiming a slot and writing it (preempted) writes it after the look that
        // passed it. Most are the unused tails of abandoned blocks, which stay empty.
        let mut holes: std::collections::VecDeque<(u64, u64)> = std::collections::VecDeque::new();
        // The first looks come soon: a program's first records come fastest (start-up).
        let mut behind = true;
        loop {
            let stopping = stop.load(Ordering::Acquire);
            // Behind the writers (a look found more than a sixteenth of the ring to read): the
            // next look comes sooner, so that a fast program laps the summarizer less often,
            // but never before a thread's block of slots is used up or abandoned (1 ms).
            if !stopping {
                let ms = if behind {
                    LOOK_BEHIND_MS
                } else {
                    LOOK_EVERY_MS
                };
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            // Definitions first, from the log no lap overwrites.
            defined = self.read_definitions(defined, |body| s.feed_definition(body));
            s.keep_ring_definitions(!self.definitions_whole());
            let claimed = self.claimed();
            // Records claimed before the previous look are committed by now (all of them when
            // stopping: the process is at its exit).
            let upto = if stopping { claimed } else { seen_claimed };
            seen_claimed = claimed;
            behind = upto.saturating_sub(next) > capacity / 16;
            if claimed.saturating_sub(next) > capacity {
                let from = claimed - capacity;
                if let Some(w) = self.header_word(header::SUMMARY_LOST) {
                    w.fetch_add(from - next, Ordering::Relaxed);
                }
                next = from;
            }
            let found = self.now_ns();
            self.revisit(&mut holes, claimed, capacity, found, &mut s);
            while next < upto {
                match self.read_record(next) {
                    Some(body) => s.feed(&body),
                    None if holes.len() < HOLES_KEPT => holes.push_back((next, found)),
                    None => {}
                }
                next += 1;
            }
            s.drain(false);
            let now = self.now_ns();
            let wrapping = claimed > capacity / 2;
            let due = now.saturating_sub(last_at) >= CHECKPOINT_EVERY_NS && next > last_covered;
            let behind = claimed.saturating_sub(last_covered) > capacity / 2;
            if wrapping && (due || behind || (stopping && next > last_covered)) {
                bodies.clear();
                s.checkpoint(next, self.checkpoint_room(), &mut bodies);
                if self.write_checkpoint(&mut bodies, next, stopping) {
                    last_covered = next;
                } else if let Some(w) = self.header_word(header::CHECKPOINTS_FAILED) {
                    w.fetch_add(1, Ordering::Relaxed);
                }
                last_at = now;
                bodies.shrink_to(1 << 16);
            }
            if stopping {
                return;
            }
        }
    }
}
