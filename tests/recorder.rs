//! The trace writer and reader together: no record lost without being counted, torn records
//! reported, damage located, and no input that makes the reader panic.

use crate::common::{TestFile, XorShift, tempdir};
use gpushim::trace::format::{self, Api, HEADER_SIZE, RECORD_SIZE, Record, RecordKind};
use gpushim::trace::reader::{ReadError, TraceReader};
use gpushim::trace::recorder::{OpenOptions, Recorder};
use std::collections::HashSet;
use std::path::Path;

fn open(path: &Path, trace_max: u64) -> Box<Recorder> {
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path: path.to_str().unwrap().as_bytes(),
        pid: 4242,
        rank: 3,
        host: b"testhost",
        program: b"recorder-test",
        cmdline: b"recorder-test\0--flag\0",
        env: b"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\0",
        trace_max,
        ring: false,
    })
    .unwrap();
    r
}

/// A record whose pointer encodes (thread, sequence), so every decoded record can be checked.
fn tagged(thread: u16, seq: u64) -> Record {
    Record {
        kind: RecordKind::Alloc,
        api: Api::CudaMalloc,
        device: 0,
        status: 0,
        thread,
        time_ns: seq,
        ptr: (u64::from(thread) << 32) | seq,
        size: seq + 1,
        stream: 0,
    }
}

fn produce(r: &Recorder, threads: u16, per_thread: u64) {
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..per_thread {
                    r.append(&tagged(t, i));
                }
            });
        }
    });
}

/// Decodes a trace, checks every record is one that was produced and appears once.
fn decode_tagged(
    path: &Path,
    threads: u16,
    per_thread: u64,
) -> (u64, gpushim::trace::reader::DecodeStats) {
    let mut reader = TraceReader::open(path).unwrap();
    let mut seen = HashSet::new();
    let mut last_seq = vec![None::<u64>; threads as usize];
    for rec in reader.by_ref() {
        let t = (rec.ptr >> 32) as u16;
        let seq = rec.ptr & 0xffff_ffff;
        assert!(t < threads && seq < per_thread, "garbage decoded: {rec:?}");
        assert_eq!(
            (rec.thread, rec.size, rec.time_ns),
            (t, seq + 1, seq),
            "mixed fields: {rec:?}"
        );
        assert!(seen.insert(rec.ptr), "record decoded twice: {rec:?}");
        // One producer's records are claimed in its program order.
        if let Some(prev) = last_seq[t as usize] {
            assert!(seq > prev, "thread {t}: {seq} after {prev}");
        }
        last_seq[t as usize] = Some(seq);
    }
    (seen.len() as u64, reader.stats().clone())
}

#[test]
fn eight_threads_into_a_too_small_trace_lose_exactly_what_they_do_not_write() {
    let dir = tempdir("small");
    let path = dir.join("t.trace");
    let capacity = 50_000u64;
    let r = open(&path, HEADER_SIZE as u64 + capacity * RECORD_SIZE as u64);
    produce(&r, 8, 100_000);
    let (decoded, stats) = decode_tagged(&path, 8, 100_000);
    // Every slot is a record or the unused tail of a thread's block.
    assert_eq!(decoded + stats.unused, capacity);
    assert_eq!(stats.lost, 800_000 - decoded);
    assert_eq!(
        decoded + stats.lost,
        800_000,
        "decoded plus counted-lost equals produced"
    );
    assert_eq!((stats.torn, stats.truncated, stats.damage), (0, 0, None));
}

#[test]
fn every_record_arrives_across_many_chunks_when_the_trace_is_large_enough() {
    let dir = tempdir("large");
    let path = dir.join("t.trace");
    let r = open(&path, 1 << 30);
    produce(&r, 8, 100_000); // 25.6 MB: seven 4 MiB chunks mapped while producers race
    let (decoded, stats) = decode_tagged(&path, 8, 100_000);
    assert_eq!(decoded, 800_000);
    assert_eq!((stats.lost, stats.torn, stats.damage), (0, 0, None));
    let info = TraceReader::open(&path).unwrap().info().clone();
    assert_eq!(
        (info.pid, info.rank, info.host.as_str()),
        (4242, 3, "testhost")
    );
    assert_eq!(info.cmdline, ["recorder-test", "--flag"]);
    assert_eq!(
        info.env,
        ["PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]
    );
    assert!(!info.clean_exit);
    r.mark_clean_exit();
    assert!(TraceReader::open(&path).unwrap().info().clean_exit);
}

#[test]
fn a_clean_exit_cuts_the_file_to_what_it_holds_and_later_records_land_or_are_counted() {
    let dir = tempdir("cut");
    let path = dir.join("t.trace");
    let r = open(&path, 1 << 30);
    produce(&r, 8, 1_000);
    let mapped = std::fs::metadata(&path).unwrap().len();
    assert!(
        mapped >= 4 << 20,
        "{mapped}: the first chunk is mapped whole"
    );
    r.mark_clean_exit();
    let tail = gpushim::trace::recorder::TAIL_KEPT;
    let held = (HEADER_SIZE + 8_000 * RECORD_SIZE) as u64;
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(
        len >= held && len <= held + 3 * tail,
        "{len} bytes for {held} bytes of records"
    );
    // Exit handlers of other libraries keep recording: what fits the tail lands, the rest is
    // counted, and the file neither grows nor faults.
    std::thread::scope(|s| {
        for t in 0..8u16 {
            let r = &r;
            s.spawn(move || {
                for i in 1_000..11_000 {
                    r.append(&tagged(t, i));
                }
            });
        }
    });
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let (decoded, stats) = decode_tagged(&path, 8, 11_000);
    assert!(
        decoded >= 8_000 + tail / RECORD_SIZE as u64 - 8 * 64,
        "{decoded}"
    );
    assert_eq!(decoded + stats.lost, 88_000, "decoded plus counted-lost");
    assert_eq!((stats.torn, stats.damage), (0, None));
}

fn small_trace(n: u64) -> (TestFile, Box<Recorder>) {
    let path = tempdir("edit").file("t.trace");
    let r = open(&path, 1 << 24);
    for i in 0..n {
        assert!(r.append(&tagged(0, i)));
    }
    (path, r)
}

fn record_offset(i: u64) -> u64 {
    HEADER_SIZE as u64 + i * RECORD_SIZE as u64
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn a_claimed_record_never_committed_is_counted_torn_and_decoding_goes_on() {
    let (path, _r) = small_trace(10);
    patch(&path, record_offset(5), &[0, 0]); // the writer died before its commit store
    let (decoded, stats) = decode_tagged(&path, 1, 10);
    assert_eq!((decoded, stats.torn, stats.damage), (9, 1, None));
}

#[test]
fn a_wrong_commit_word_stops_decoding_and_says_where() {
    let (path, _r) = small_trace(10);
    patch(
        &path,
        record_offset(7),
        &format::commit_tag(3).to_le_bytes(),
    );
    let mut reader = TraceReader::open(&path).unwrap();
    assert_eq!(reader.by_ref().count(), 7);
    let d = reader.stats().damage.clone().expect("damage reported");
    let claimed = reader.info().claimed; // slots, blocks included
    assert_eq!(
        (d.offset, d.index, d.skipped),
        (record_offset(7), 7, claimed - 8)
    );
    assert!(d.reason.contains("record 7"), "{}", d.reason);
}

#[test]
fn a_file_cut_short_decodes_to_its_end_and_counts_what_is_missing() {
    let (path, _r) = small_trace(10);
    let len = record_offset(6) + 17; // in the middle of record 6
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    let (decoded, stats) = decode_tagged(&path, 1, 10);
    let claimed = TraceReader::open(&path).unwrap().info().claimed;
    assert_eq!(
        (decoded, stats.truncated, stats.damage),
        (6, claimed - 6, None)
    );
}

#[test]
fn files_that_are_not_traces_get_errors_that_name_the_offset() {
    let dir = tempdir("notrace");
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let e = TraceReader::open(&empty).err().unwrap();
    assert!(matches!(e, ReadError::TooShort { len: 0, .. }));
    assert!(e.to_string().contains("offset 0"), "{e}");
    let zeros = dir.join("zeros");
    std::fs::write(&zeros, vec![0u8; 1 << 16]).unwrap();
    let e = TraceReader::open(&zeros).err().unwrap();
    assert!(matches!(e, ReadError::BadMagic { .. }));
    assert!(e.to_string().contains("offset 0"), "{e}");
    let missing = dir.join("missing");
    assert!(matches!(
        TraceReader::open(&missing),
        Err(ReadError::Io(..))
    ));
}

#[test]
fn random_and_mutated_files_never_make_the_reader_panic_or_loop() {
    let (good, _r) = small_trace(300);
    let original = std::fs::read(&good).unwrap();
    let dir = tempdir("fuzz");
    let path = dir.join("f");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for round in 0..1500 {
        let bytes: Vec<u8> = match round % 3 {
            // Pure noise, sometimes behind a valid magic.
            0 => {
                let n = (rng.next() % 20_000) as usize;
                let mut b: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                if round % 2 == 0 && b.len() >= 8 {
                    b[..8].copy_from_slice(&format::MAGIC);
                }
                b
            }
            // A valid trace with random bytes flipped, including in the header.
            1 => {
                let mut b = original.clone();
                for _ in 0..(1 + rng.next() % 16) {
                    let i = (rng.next() as usize) % b.len();
                    b[i] ^= 1 << (rng.next() % 8);
                }
                b
            }
            // A valid trace cut anywhere.
            _ => original[..(rng.next() as usize) % original.len()].to_vec(),
        };
        std::fs::write(&path, &bytes).unwrap();
        match TraceReader::open(&path) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(mut r) => {
                let max = (bytes.len().saturating_sub(HEADER_SIZE) / RECORD_SIZE) as u64;
                let n = r.by_ref().count() as u64;
                let s = r.stats();
                assert!(
                    n <= max,
                    "round {round}: decoded {n} records from {max} slots"
                );
                assert_eq!(n, s.committed);
            }
        }
    }
}

#[test]
fn threads_racing_to_intern_the_same_stacks_agree_on_ids_and_write_each_definition_once() {
    let dir = tempdir("intern-race");
    let path = dir.file("race.trace");
    let r = open(&path, 64 << 20);
    const STACKS: u64 = 200;
    const THREADS: u64 = 8;
    let frames =
        |s: u64| -> Vec<u64> { (0..1 + s % 7).map(|f| 0x7f00_0000 + s * 64 + f).collect() };
    let start = std::sync::Barrier::new(THREADS as usize);
    // The threads start together and intern every stack in the same order, so they meet on a
    // stack while its first writer is still writing; then again in orders of their own.
    // Each returns (stack, id, new) for every call.
    let got: Vec<Vec<(u64, u64, bool)>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (r, start) = (&*r, &start);
                sc.spawn(move || {
                    start.wait();
                    let mut out = Vec::new();
                    for round in 0..2 {
                        for i in 0..STACKS {
                            let s = (i * (round * 2 * t + 1)) % STACKS;
                            let (id, new) = r.intern_stack(&frames(s));
                            out.push((s, id, new));
                        }
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut id_of = std::collections::HashMap::new();
    let mut writers = std::collections::HashMap::<u64, u32>::new();
    for &(s, id, new) in got.iter().flatten() {
        assert_ne!(id, 0, "stack {s} got no id");
        assert_eq!(*id_of.entry(s).or_insert(id), id, "stack {s} got two ids");
        *writers.entry(s).or_default() += u32::from(new);
    }
    let ids: HashSet<u64> = id_of.values().copied().collect();
    assert_eq!(ids.len() as u64, STACKS, "two stacks share an id");
    for s in 0..STACKS {
        assert_eq!(writers.get(&s), Some(&1), "stack {s}: definitions written");
    }
    drop(r);
    let mut reader = TraceReader::open(&path).unwrap();
    for _ in reader.by_ref() {}
    for (&s, &id) in &id_of {
        assert_eq!(
            reader.stack(id),
            Some(&frames(s)[..]),
            "stack {s} (id {id}) as read back"
        );
    }
}
