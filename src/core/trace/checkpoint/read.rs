//! A ring's checkpoint read back: the newest whole one, and what it says of itself.

use crate::trace::format::{self, RECORD_SIZE, Record, RecordKind, header};
use crate::trace::reader::head::le_u64;
use std::fs::File;

/// The newest whole checkpoint of a ring trace: its descriptor and bodies. A checkpoint whose
/// checksum does not match (the process died while writing it) gives way to the other one.
/// With `oldest_in_ring` (the oldest record the ring still holds), the whole checkpoint that
/// leaves the most of the ring after it comes first: the older, if it covers no less than that.
pub(crate) fn read_checkpoint(
    file: &mut File,
    h: &[u8],
    file_len: u64,
    oldest_in_ring: Option<u64>,
) -> Option<(format::ring::Descriptor, Vec<[u8; RECORD_SIZE]>)> {
    use std::os::unix::fs::FileExt;
    let area = le_u64(h, header::CHECKPOINT_AREA);
    let slot_bytes = le_u64(h, header::CHECKPOINT_SLOT_BYTES);
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
    if let Some(oldest) = oldest_in_ring {
        // Those whose every later record the ring holds, the least covered first; then the
        // rest, newest first.
        found.sort_by_key(|(d, _)| {
            if d.covered >= oldest {
                (0, d.covered)
            } else {
                (1, u64::MAX - d.seq)
            }
        });
    }
    for (d, k) in found {
        let bytes = d.records.checked_mul(RECORD_SIZE as u64)?;
        let at = area.checked_add((k as u64).checked_mul(slot_bytes)?)?;
        if bytes > slot_bytes || at.checked_add(bytes)? > file_len {
            continue;
        }
        // A checkpoint begins with its BEGIN record: anything else is not one, read no further.
        let mut first = [0u8; RECORD_SIZE];
        if bytes == 0
            || file.read_exact_at(&mut first, at).is_err()
            || !Record::decode(&first).is_some_and(|r| {
                r.kind == RecordKind::Restore && r.status == format::restore::BEGIN
            })
        {
            continue;
        }
        let mut raw = vec![0u8; bytes as usize];
        if file.read_exact_at(&mut raw, at).is_err() || format::ring::checksum(&raw) != d.checksum {
            continue;
        }
        let bodies = raw
            .chunks_exact(RECORD_SIZE)
            .map(|c| c.try_into().unwrap_or([0; RECORD_SIZE]))
            .collect();
        return Some((d, bodies));
    }
    None
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
