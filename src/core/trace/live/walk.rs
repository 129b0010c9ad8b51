//! A trace replayed from its start: through a callback, up to a record, up to a moment.

use super::*;

/// Opens a trace, says where its damage is if any, and replays it through `f`.
pub fn replay_each(
    path: &Path,
    opts: &ReadOptions,
    mut f: impl FnMut(&TraceReader, &mut Replay, &Record, Change),
) -> Result<(TraceReader, Replay), ReadError> {
    let mut reader = TraceReader::open_with(path, opts)?;
    let mut replay = Replay::default();
    while let Some(r) = reader.next() {
        let c = replay.apply(&r);
        f(&reader, &mut replay, &r, c);
    }
    Ok((reader, replay))
}

/// Replays the first `at` records, then the stack references that follow within a short window
/// (a stack is recorded just after its allocation; other threads may come in between).
pub fn replay_until(reader: &mut TraceReader, at: u64) -> Replay {
    replay_until_seeing(reader, at, |_, _, _| {})
}

/// [`replay_until`], handing `seen` every record read, and whether it lies past `at` (in the
/// window read for the stack references).
pub fn replay_until_seeing(
    reader: &mut TraceReader,
    at: u64,
    mut seen: impl FnMut(&TraceReader, &Record, bool),
) -> Replay {
    let mut rp = Replay::default();
    while rp.index < at {
        let Some(r) = reader.next() else {
            return rp;
        };
        rp.apply(&r);
        seen(reader, &r, false);
    }
    for _ in 0..64 {
        let Some(r) = reader.next() else {
            break;
        };
        if r.kind == RecordKind::StackRef {
            let index = rp.index;
            rp.apply(&r);
            rp.index = index;
        }
        seen(reader, &r, true);
    }
    rp
}

/// The entries of `sorted` (by address) whose address is in `base..end`.
pub fn in_range<'a, 'b>(
    sorted: &'b [(u64, &'a Live)],
    base: u64,
    end: u64,
) -> &'b [(u64, &'a Live)] {
    let from = sorted.partition_point(|&(p, _)| p < base);
    let to = sorted.partition_point(|&(p, _)| p < end);
    &sorted[from..to.max(from)]
}
