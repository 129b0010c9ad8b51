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
/// the layout allows, 256 MiB): the memory is no more than before the older could be chosen.
pub(crate) fn read_checkpoint(
    file: &mut File,
    h: &[u8],
    file_len: u64,
    oldest_in_ring: Option<u64>,
    longest: bool,
) -> Option<(format::ring::Descriptor, Vec<[u8; RECORD_SIZE]>)> {
    if layout_lie(h).is_some() {
        return None;
    }
    let mut found: Vec<(format::ring::Descriptor, usize)> = (0..2)
        .map(|k| {
            let at = header::CHECKPOINTS + k * format::ring::DESCRIPTOR_BYTES;
            (
                format::ring::Descriptor::decode(&h[at..at + format::ring::DESCRIPTOR_BYTES]),
                k,
            )
        })
        .filter(|(d, _)| d.seq > 0)
        .collect();
    found.sort_by_key(|(d, _)| std::cmp::Reverse(d.seq));
    let in_ring = |d: &format::ring::Descriptor| oldest_in_ring.is_some_and(|o| d.covered >= o);
    if longest {
        // Those whose every later record the ring holds, the least covered first; then the
        // rest, newest first.
        found.sort_by_key(|(d, _)| {
            if in_ring(d) {
                (0, d.covered)
            } else {
                (1, u64::MAX - d.seq)
            }
        });
    }
    // One slot held at a time (each may be as large as the layout allows): the newest is let
    // go before the older is read, and read again if it is the one after all.
    let mut read = |i: usize| {
        let (d, k) = found.get(i)?;
        read_slot(file, h, file_len, d, *k).map(|b| (*d, b))
    };
    let Some(first) = read(0) else {
        return read(1);
    };
    let failures = failures_in(&first.1);
    if longest || failures == 0 || !found.get(1).is_some_and(|(d, _)| in_ring(d)) {
        return Some(first);
    }
    drop(first);
    match read(1) {
        Some(older) if failures_in(&older.1) < failures => Some(older),
        older => read(0).or(older),
    }
}

/// Slot `k`'s bodies as descriptor `d` says, if they are a whole checkpoint (its `BEGIN`
/// record first, its checksum right).
fn read_slot(
    file: &mut File,
    h: &[u8],
    file_len: u64,
    d: &format::ring::Descriptor,
    k: usize,
) -> Option<Vec<[u8; RECORD_SIZE]>> {
    use std::os::unix::fs::FileExt;
    let area = le_u64(h, header::CHECKPOINT_AREA);
    let slot_bytes = le_u64(h, header::CHECKPOINT_SLOT_BYTES);
    let bytes = d.records.checked_mul(RECORD_SIZE as u64)?;
    let at = area.checked_add((k as u64).checked_mul(slot_bytes)?)?;
    if bytes > slot_bytes || at.checked_add(bytes)? > file_len {
        return None;
    }
    // A checkpoint begins with its BEGIN record: anything else is not one, read no further.
    let mut first = [0u8; RECORD_SIZE];
    if bytes == 0
        || file.read_exact_at(&mut first, at).is_err()
        || !Record::decode(&first)
            .is_some_and(|r| r.kind == RecordKind::Restore && r.status == format::restore::BEGIN)
    {
        return None;
    }
    let mut raw = vec![0u8; bytes as usize];
    if file.read_exact_at(&mut raw, at).is_err() || format::ring::checksum(&raw) != d.checksum {
        return None;
    }
    Some(
        raw.chunks_exact(RECORD_SIZE)
            .map(|c| c.try_into().unwrap_or([0; RECORD_SIZE]))
            .collect(),
    )
}

/// The failures a checkpoint keeps (each a snapshot of what was live then).
fn failures_in(bodies: &[[u8; RECORD_SIZE]]) -> usize {
    bodies
        .iter()
        .filter_map(Record::decode)
        .filter(|r| {
            r.kind == RecordKind::Restore && r.status == format::restore::SNAPSHOT && r.thread != 0
        })
        .count()
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
