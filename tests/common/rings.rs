//! Traces of `tests/data/torch` recorded again through an in-process ring with its summarizer
//! running, where the tests want the ring to begin and its checkpoints to fall, and the ring
//! trace's header read back as a reader reads it.

use std::path::Path;

/// The trace `name` of `tests/data/torch` recorded again through a ring of `trace_max` bytes with its summarizer running, as a
/// run longer than its trace is: the ring begins after the run's first tensors, which only the
/// checkpoint keeps. Stacks are left out (the replay needs none); `marks(record, last)` NVTX
/// marks follow each record, so that runs of a few thousand records lap the smallest ring
/// (1 MiB), and the ring begins where the test wants. A recording whose summarizer the writer
/// lapped (a loaded machine can keep its thread off the CPU for longer than the ring lasts) is
/// made again: these tests are of the replay from a checkpoint, which such a trace lacks, and
/// the reports say so of it (`long_runs` holds that).
pub fn through_ring(
    name: &str,
    marks: impl Fn(&gpushim::trace::format::Record, bool) -> usize,
    path: &Path,
) {
    through_ring_from(name, &marks, None, path)
}

/// [`through_ring`], with a checkpoint taken right before record `from` (of those recorded):
/// marks are written there until the ring has lapped and then until the summarizer takes one,
/// so the ring's replay begins at that record whatever the machine's timing (the summarizer
/// checkpoints each half ring it reads).
/// The records from there on are written without marks, and must fill less than half the ring;
/// then a few marks a while later, as a run's exit writes, and the summarizer's next
/// checkpoint, which covers them all, is waited for.
pub fn through_ring_from(
    name: &str,
    marks: impl Fn(&gpushim::trace::format::Record, bool) -> usize,
    from: Option<usize>,
    path: &Path,
) {
    for _ in 0..8 {
        let _ = std::fs::remove_file(path);
        record_through_ring(name, &marks, from, path);
        let mut r = gpushim::trace::reader::TraceReader::open(path).unwrap();
        r.by_ref().for_each(drop);
        let s = r.stats();
        if s.unsummarized == 0 && s.lost == 0 {
            return;
        }
    }
    panic!("{name}: the summarizer was lapped in 8 recordings out of 8");
}

fn record_through_ring(
    name: &str,
    marks: impl Fn(&gpushim::trace::format::Record, bool) -> usize,
    from: Option<usize>,
    path: &Path,
) {
    let trace_max = 1 << 20;
    use gpushim::trace::format::RecordKind;
    use std::sync::atomic::{AtomicBool, Ordering};
    let records = recorded(name);
    let r = crate::common::ring_recorder(path, trace_max);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        // Paced so that the summarizer keeps up: a sixteenth of the ring, then a pause.
        let chunk = trace_max / 32 / 16;
        let mut written = 0u64;
        // Each record at the recorder's own clock, as the shim writes them: a thread's block
        // of slots is abandoned by that clock, and the summarizer reads a slot only once its
        // block must have been (the run's own times, far apart or close together, would keep a
        // block open across the writer's pauses and its records unread).
        let mut append = |rec: &gpushim::trace::format::Record| {
            r.append(&gpushim::trace::format::Record {
                time_ns: r.now_ns(),
                ..*rec
            });
            written += 1;
            if written % chunk == 0 {
                std::thread::sleep(std::time::Duration::from_millis(4));
            }
        };
        let mark = |rec: &gpushim::trace::format::Record| gpushim::trace::format::Record {
            kind: RecordKind::Mark,
            api: gpushim::trace::format::Api::Nvtx,
            ptr: 0,
            size: 0,
            device: gpushim::trace::format::DEVICE_UNKNOWN,
            ..*rec
        };
        for (i, rec) in records.iter().enumerate() {
            if Some(i) == from {
                // The ring lapped first (a ring that began late), then a checkpoint after it.
                while r.claimed() < ring_capacity(path) {
                    append(&mark(rec));
                }
                let seq = newest_checkpoint(path);
                let mut more = 0u64;
                while newest_checkpoint(path) == seq {
                    append(&mark(rec));
                    more += 1;
                    assert!(more < trace_max, "{name}: no checkpoint after {more} marks");
                }
            }
            append(rec);
            // From `from` on, bare.
            let n = if from.is_some_and(|f| i >= f) {
                0
            } else {
                marks(rec, i + 1 == records.len())
            };
            for _ in 0..n {
                append(&mark(rec));
            }
        }
        if let Some(last) = records.last().filter(|_| from.is_some()) {
            // What a run writes as it exits comes a while later (the summarizer keeps the
            // last 2 ms of records back, in time order, and applies the rest); then nothing:
            // the summarizer's next checkpoint (a second after the one before `from`) covers
            // every record, as the one a run writes at its exit does.
            std::thread::sleep(std::time::Duration::from_millis(20));
            for _ in 0..8 {
                append(&mark(last));
            }
            let seq = newest_checkpoint(path);
            let waited = std::time::Instant::now();
            while newest_checkpoint(path) == seq {
                assert!(
                    waited.elapsed().as_secs() < 10,
                    "{name}: no last checkpoint"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        stop.store(true, Ordering::Release);
    });
}

/// The records of the trace `name` of `tests/data/torch` that a ring recording writes again:
/// all but the stacks and callers.
pub fn recorded(name: &str) -> Vec<gpushim::trace::format::Record> {
    use gpushim::trace::format::RecordKind;
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(name);
    gpushim::trace::reader::TraceReader::open(data)
        .unwrap()
        .filter(|r| !matches!(r.kind, RecordKind::StackRef | RecordKind::Caller))
        .collect()
}

/// The word at `at` of the header of the trace at `path`.
pub fn header_word(path: &Path, at: usize) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut w = [0u8; 8];
    let f = std::fs::File::open(path).unwrap();
    f.read_exact_at(&mut w, at as u64).unwrap();
    u64::from_le_bytes(w)
}

/// The records the ring trace at `path` holds before it laps, from the file's header.
fn ring_capacity(path: &Path) -> u64 {
    header_word(path, gpushim::trace::format::header::CAPACITY)
}

/// The two checkpoint descriptors of the ring trace at `path`, read from its header as a
/// reader would (`seq` 0: none written there yet).
pub fn checkpoints(path: &Path) -> [gpushim::trace::format::ring::Descriptor; 2] {
    use gpushim::trace::format::{header, ring};
    [0, 1].map(|k| {
        let at = header::CHECKPOINTS + k * ring::DESCRIPTOR_BYTES;
        let mut d = [0u8; ring::DESCRIPTOR_BYTES];
        for (i, w) in d.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&header_word(path, at + 8 * i).to_le_bytes());
        }
        ring::Descriptor::decode(&d)
    })
}

/// How many of the ring trace's records `from..to` (ring indices) were written: a writer that
/// held a block of slots past its time (a busy machine preempts it) leaves the block's tail
/// unused, and the reader skips those slots.
pub fn written_between(path: &Path, from: u64, to: u64) -> u64 {
    use gpushim::trace::format::{HEADER_SIZE, RECORD_SIZE, Record, commit_tag};
    use std::os::unix::fs::FileExt;
    let ring = ring_capacity(path);
    let f = std::fs::File::open(path).unwrap();
    let mut body = [0u8; RECORD_SIZE];
    (from..to)
        .filter(|&i| {
            let at = HEADER_SIZE as u64 + (i % ring) * RECORD_SIZE as u64;
            f.read_exact_at(&mut body, at).unwrap();
            Record::commit_of(&body) == commit_tag(i)
        })
        .count() as u64
}

/// The sequence number of the newest checkpoint the ring trace at `path` holds (0: none yet).
fn newest_checkpoint(path: &Path) -> u64 {
    checkpoints(path)
        .map(|d| d.seq)
        .into_iter()
        .max()
        .unwrap_or(0)
}
