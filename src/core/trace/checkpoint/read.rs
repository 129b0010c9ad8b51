//! A ring's checkpoint read back (the newest whole one, or the older where it leaves in detail
//! what the reports need), and what it says of itself.

use crate::trace::format::{self, RECORD_SIZE, Record, RecordKind, header};
use crate::trace::reader::head::le_u64;
use std::fs::File;

/// Which whole checkpoint of a ring trace to read back, and its descriptor and bodies. A
/// checkpoint whose checksum does not match (the process died while writing it) gives way to
/// the other one. `oldest_in_ring` is the oldest record the ring still holds; a checkpoint
/// that covers no less leaves every record after it in the ring, in detail.
/// - `longest`: of those, the one that leaves the most of the ring after it (the older).
/// - Otherwise the newest, but for a failure (an out-of-memory error) that only the newest
///   holds: then the older, so that the failure is read in detail (its steps, the kinds and
///   the request's line then) rather than as the newest kept it. A run that dies of its
///   failure writes, at its exit, a checkpoint that covers the failure's records too.
///
/// Else the newest whole one. One slot's bodies are held at a time (a slot may be as large as
/// the layout allows, 256 MiB): the older's failures are counted as it is read through in
/// pieces, and it is read whole only when it is the one.
pub(crate) fn read_checkpoint(
    file: &File,
    h: &[u8],
    file_len: u64,
    oldest_in_ring: u64,
    longest: bool,
) -> Option<(format::ring::Descriptor, Vec<[u8; RECORD_SIZE]>)> {
    if layout_lie(h).is_some() {
        return None;
    }
    let found = in_order(h, oldest_in_ring, longest);
    let in_ring = |d: &format::ring::Descriptor| d.covered >= oldest_in_ring;
    let read = |i: usize| {
        let (d, k) = found.get(i)?;
        read_slot(file, h, file_len, d, *k).map(|b| (*d, b))
    };
    let Some(first) = read(0) else {
        return read(1);
    };
    let failures = failures_in(&first.1);
    let older = found
        .get(1)
        .filter(|(d, _)| !longest && failures > 0 && in_ring(d));
    match older {
        Some((d, k))
            if failures_in_slot(file, h, file_len, d, *k).is_some_and(|n| n < failures) =>
        {
            drop(first);
            // Whole as it was counted, unless the file changed since: then the newest again.
            read(1).or_else(|| read(0))
        }
        _ => Some(first),
    }
}

/// The checkpoints the header describes (with their slots), in the order [`read_checkpoint`]
/// tries them: the newest first, or with `longest` those whose every later record the ring
/// holds, the least covered first, then the rest, newest first.
fn in_order(
    h: &[u8],
    oldest_in_ring: u64,
    longest: bool,
) -> Vec<(format::ring::Descriptor, usize)> {
    let mut found: Vec<(format::ring::Descriptor, usize)> = (0..2)
        .filter_map(|k| {
            let at = header::CHECKPOINTS + k * format::ring::DESCRIPTOR_BYTES;
            let d =
                format::ring::Descriptor::decode(h.get(at..at + format::ring::DESCRIPTOR_BYTES)?);
            Some((d, k))
        })
        .filter(|(d, _)| d.seq > 0)
        .collect();
    found.sort_by_key(|(d, _)| std::cmp::Reverse(d.seq));
    if longest {
        found.sort_by_key(|(d, _)| {
            if d.covered >= oldest_in_ring {
                (0, d.covered)
            } else {
                (1, u64::MAX - d.seq)
            }
        });
    }
    found
}

/// The checkpoint (its `seq`) a read for a replay ([`read_checkpoint`] with `longest`) tries
/// first: a read that chose the same one reads the records that read would.
pub(crate) fn longest_first(h: &[u8], oldest_in_ring: u64) -> Option<u64> {
    if layout_lie(h).is_some() {
        return None;
    }
    in_order(h, oldest_in_ring, true)
        .first()
        .map(|(d, _)| d.seq)
}

/// Where slot `k` lies in the file and its bytes, as descriptor `d` says, if that fits the
/// slot and the file and the slot begins with a checkpoint's `BEGIN` record.
fn slot_of(
    file: &File,
    h: &[u8],
    file_len: u64,
    d: &format::ring::Descriptor,
    k: usize,
) -> Option<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let area = le_u64(h, header::CHECKPOINT_AREA);
    let slot_bytes = le_u64(h, header::CHECKPOINT_SLOT_BYTES);
    let bytes = d.records.checked_mul(RECORD_SIZE as u64)?;
    let at = area.checked_add((k as u64).checked_mul(slot_bytes)?)?;
    if bytes == 0 || bytes > slot_bytes || at.checked_add(bytes)? > file_len {
        return None;
    }
    // A checkpoint begins with its BEGIN record: anything else is not one, read no further.
    let mut first = [0u8; RECORD_SIZE];
    let begins = file.read_exact_at(&mut first, at).is_ok()
        && Record::decode(&first)
            .is_some_and(|r| r.kind == RecordKind::Restore && r.status == format::restore::BEGIN);
    begins.then_some((at, bytes))
}

/// Slot `k`'s bodies as descriptor `d` says, if they are a whole checkpoint (its `BEGIN`
/// record first, its checksum right).
fn read_slot(
    file: &File,
    h: &[u8],
    file_len: u64,
    d: &format::ring::Descriptor,
    k: usize,
) -> Option<Vec<[u8; RECORD_SIZE]>> {
    use std::os::unix::fs::FileExt;
    let (at, bytes) = slot_of(file, h, file_len, d, k)?;
    let mut raw = vec![0u8; usize::try_from(bytes).ok()?];
    if file.read_exact_at(&mut raw, at).is_err() || format::ring::checksum(&raw) != d.checksum {
        return None;
    }
    Some(
        raw.chunks_exact(RECORD_SIZE)
            .map(|c| c.try_into().unwrap_or([0; RECORD_SIZE]))
            .collect(),
    )
}

/// The failures slot `k` keeps, if it is a whole checkpoint: read through in pieces of
/// 64 KiB, none held whole, its checksum taken on the way.
fn failures_in_slot(
    file: &File,
    h: &[u8],
    file_len: u64,
    d: &format::ring::Descriptor,
    k: usize,
) -> Option<usize> {
    use std::os::unix::fs::FileExt;
    let (at, bytes) = slot_of(file, h, file_len, d, k)?;
    let mut piece = vec![0u8; 2048 * RECORD_SIZE];
    let (mut sum, mut failures, mut done) = (format::ring::CHECKSUM_START, 0, 0u64);
    while done < bytes {
        let n = (bytes - done).min(piece.len() as u64) as usize;
        let piece = &mut piece[..n];
        file.read_exact_at(piece, at + done).ok()?;
        sum = format::ring::checksum_on(sum, piece);
        failures += piece
            .chunks_exact(RECORD_SIZE)
            .filter_map(|c| {
                c.try_into()
                    .ok()
                    .and_then(|b: [u8; RECORD_SIZE]| Record::decode(&b))
            })
            .filter(is_failure_snapshot)
            .count();
        done += n as u64;
    }
    (sum == d.checksum).then_some(failures)
}

/// The failures a checkpoint keeps (each a snapshot of what was live then).
fn failures_in(bodies: &[[u8; RECORD_SIZE]]) -> usize {
    bodies
        .iter()
        .filter_map(Record::decode)
        .filter(is_failure_snapshot)
        .count()
}

/// Whether a checkpoint's record is the snapshot of a failure (a peak's says 0 in `thread`).
fn is_failure_snapshot(r: &Record) -> bool {
    r.kind == RecordKind::Restore && r.status == format::restore::SNAPSHOT && r.thread != 0
}

/// What is wrong with a ring header's checkpoint layout, if anything: the area must lie right
/// after the ring's records and the slots be no larger than a writer lays out. A header that
/// claims more (a sparse file of gigabytes behind it) never sizes what is read.
pub(crate) fn layout_lie(h: &[u8]) -> Option<String> {
    let area = le_u64(h, header::CHECKPOINT_AREA);
    let slot_bytes = le_u64(h, header::CHECKPOINT_SLOT_BYTES);
    let capacity = le_u64(h, header::CAPACITY);
    if slot_bytes > format::ring::MAX_CHECKPOINT_SLOT {
        return Some(format!(
            "the header (offset {}) claims checkpoint slots of {slot_bytes} bytes, more than \
             the {} a writer lays out",
            header::CHECKPOINT_SLOT_BYTES,
            format::ring::MAX_CHECKPOINT_SLOT
        ));
    }
    let want = format::ring::checkpoint_area(capacity);
    (want != Some(area)).then(|| {
        format!(
            "the header (offset {}) puts the checkpoint area at byte {area}, where a ring of \
             {capacity} records has it at {}",
            header::CHECKPOINT_AREA,
            want.map_or("no byte".to_string(), |w| w.to_string())
        )
    })
}

/// The records a checkpoint summarizes (its `BEGIN` record's `size`).
pub(crate) fn checkpoint_summarized(bodies: &[[u8; RECORD_SIZE]]) -> u64 {
    bodies
        .first()
        .and_then(Record::decode)
        .filter(|r| r.kind == RecordKind::Restore && r.status == format::restore::BEGIN)
        .map_or(0, |r| r.size)
}

/// The allocations and bytes a checkpoint summed by call site (its `SUMMED` records).
pub(crate) fn checkpoint_summed(bodies: &[[u8; RECORD_SIZE]]) -> (u64, u64) {
    bodies
        .iter()
        .filter_map(Record::decode)
        .filter(|r| r.kind == RecordKind::Restore && r.status == format::restore::SUMMED)
        .fold((0u64, 0u64), |(n, b), r| {
            (n.saturating_add(r.ptr), b.saturating_add(r.size))
        })
}

/// How many of a checkpoint's records restore state (up to and with its `END`): the reader
/// hands them on first, in their own order; 0 without an `END`.
pub(crate) fn restoring_prefix(bodies: &[[u8; RECORD_SIZE]]) -> usize {
    bodies
        .iter()
        .position(|b| {
            Record::decode(b)
                .is_some_and(|r| r.kind == RecordKind::Restore && r.status == format::restore::END)
        })
        .map_or(0, |i| i + 1)
}
