//! The recorder's file, claims and interning, shown on temporary files.

use super::*;

/// A recorder opened on `path` for a test, as the shim opens one.
fn opened(path: &[u8], trace_max: u64, ring: bool) -> Box<Recorder> {
    let r = Box::new(Recorder::new());
    assert!(r.begin_open());
    r.open(&OpenOptions {
        path,
        pid: 1,
        rank: 0,
        host: b"h",
        program: b"p",
        cmdline: b"p\0",
        env: b"",
        trace_max,
        ring,
    })
    .unwrap();
    r
}

/// A `cudaMalloc`-family record of `kind` on device 0, stamped now by `r`'s clock.
fn call(r: &Recorder, kind: crate::trace::format::RecordKind, ptr: u64, size: u64) -> Record {
    Record {
        kind,
        api: crate::trace::format::Api::CudaMalloc,
        device: 0,
        status: 0,
        thread: 0,
        time_ns: r.now_ns(),
        ptr,
        size,
        stream: 0,
    }
}

#[test]
fn patterns_expand_pid_host_rank_and_percent() {
    let mut out = [0u8; 128];
    let n = expand_pattern(b"/tmp/t.%h.%r.%p.%%", 4242, b"node7", 3, &mut out).unwrap();
    assert_eq!(&out[..n], b"/tmp/t.node7.3.4242.%");
}

#[test]
fn bad_patterns_are_refused_with_a_reason() {
    let mut out = [0u8; 16];
    assert_eq!(
        expand_pattern(b"t.%x", 1, b"h", 0, &mut out),
        Err(PatternError::UnknownEscape(b'x'))
    );
    assert_eq!(
        expand_pattern(b"t.%", 1, b"h", 0, &mut out),
        Err(PatternError::TrailingPercent)
    );
    assert_eq!(
        expand_pattern(b"a-very-long-file-name", 1, b"h", 0, &mut out),
        Err(PatternError::TooLong)
    );
}

#[test]
fn streams_intern_to_stable_distinct_indices() {
    let r = Recorder::new();
    assert_eq!(r.intern_stream(0), (0, false));
    let (a, new_a) = r.intern_stream(0xdead_0000);
    let (b, new_b) = r.intern_stream(0xbeef_0000);
    assert!(new_a && new_b);
    assert_ne!(a, b);
    assert_eq!(r.intern_stream(0xdead_0000), (a, false));
}

#[test]
fn ints_format_in_decimal() {
    let mut b = [0u8; 24];
    assert_eq!(format_int(0, &mut b), b"0");
    assert_eq!(format_int(-12, &mut b), b"-12");
    assert_eq!(format_int(i64::MAX, &mut b), b"9223372036854775807");
}

#[test]
fn another_name_goes_before_the_trace_ending() {
    let mut out = [0u8; PATH_CAP];
    let n = another_name(b"/d/gpushim-python.42.trace", 0x00c0_ffee, &mut out).unwrap();
    assert_eq!(&out[..n], b"/d/gpushim-python.42.00c0ffee.trace");
    assert_eq!(out[n], 0);
    let n = another_name(b"/d/run", 0xdead_beef, &mut out).unwrap();
    assert_eq!(&out[..n], b"/d/run.deadbeef");
    // A name that is only the ending keeps it whole.
    let n = another_name(b"/d/.trace", 1, &mut out).unwrap();
    assert_eq!(&out[..n], b"/d/.trace.00000001");
    assert!(another_name(&[b'x'; PATH_CAP - 9], 1, &mut out).is_none());
    assert_ne!(unguessable_word(), unguessable_word());
}

/// A name someone made in advance (a file, a link to a file of the reader's) never stops the
/// trace and is never written through: the trace takes another name beside it.
#[test]
fn a_taken_name_gives_the_trace_another_name() {
    let dir = std::env::temp_dir().join(format!("gpushim-taken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    let name = dir.join("t.trace");
    std::os::unix::fs::symlink(&victim, &name).unwrap();
    let path = name.to_str().unwrap().as_bytes();
    let r = opened(path, 1 << 20, false);
    let got = std::str::from_utf8(r.path()).unwrap().to_string();
    assert_ne!(got.as_bytes(), path);
    assert!(got.starts_with(dir.join("t.").to_str().unwrap()) && got.ends_with(".trace"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    let meta = std::fs::symlink_metadata(&got).unwrap();
    assert!(meta.is_file());
    use std::os::unix::fs::MetadataExt;
    assert_eq!(r.file_id(), Some((meta.dev(), meta.ino())));
    assert_eq!(meta.mode() & 0o777, 0o600);
    drop(r);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A ring whose writers lap the summarizer loses the records it never read, but not the
/// definitions among them: a stack interned before the lap and named after it still reads
/// as its frames, from the checkpoint the summarizer wrote out of the definitions' log.
#[test]
fn a_lap_keeps_the_stacks_and_strings_defined_before_it() {
    use crate::trace::format::{Api, DEVICE_UNKNOWN, RecordKind};
    let path = std::env::temp_dir().join(format!("gpushim-lap-{}.trace", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let r = opened(path.to_str().unwrap().as_bytes(), 4 << 20, true);
    // Wrapping on, as a running summarizer turns it on, without one reading yet.
    r.ring_on.store(true, Ordering::Relaxed);
    let frames = [0x1000u64, 0x2000, 0x3000];
    let (stack, written) = r.intern_stack(&frames);
    assert!(written);
    let name = r.intern_string(b"step");
    let rec = |kind, ptr, size| call(&r, kind, ptr, size);
    r.append(&Record {
        api: Api::Shim,
        device: DEVICE_UNKNOWN,
        ..rec(RecordKind::RangePush, name, 0)
    });
    // Two laps of records the summarizer never reads.
    let capacity = r.capacity.load(Ordering::Relaxed);
    for i in 0..capacity {
        r.append(&rec(RecordKind::Alloc, 0x10_0000 + i * 512, 512));
        r.append(&rec(RecordKind::Free, 0x10_0000 + i * 512, 0));
    }
    // The same stack again: interned long ago, so no definition is written now.
    assert_eq!(r.intern_stack(&frames), (stack, false));
    r.append(&rec(RecordKind::Alloc, 0xa000, 4096));
    r.append(&Record {
        api: Api::Shim,
        ..rec(RecordKind::StackRef, stack, frames.len() as u64)
    });
    r.run_summarizer(&AtomicBool::new(true));
    r.mark_clean_exit();
    let opts = crate::trace::reader::ReadOptions::default();
    let (reader, rp) = crate::trace::live::replay_each(&path, &opts, |_, _, _, _| {}).unwrap();
    assert!(reader.stats().unsummarized > 0, "{:?}", reader.stats());
    assert_eq!(reader.info().checkpoints_failed, 0);
    let kept = rp.live.get(&0xa000).map(|l| l.stack);
    assert_eq!(kept, Some(stack));
    assert_eq!(reader.stack(stack), Some(&frames[..]));
    assert_eq!(reader.string(name), Some("step"));
    drop(reader);
    std::fs::remove_file(&path).unwrap();
}

/// A writer held up between claiming its slot and writing it (preempted for longer than the
/// summarizer's looks) writes after the summarizer passed the slot: the summarizer looks again,
/// feeds the record late and counts it, so the checkpoint holds what it did after the ring
/// moved on. Without the second look the allocation it records would be gone from the run.
#[test]
fn a_record_written_after_the_summarizer_passed_its_slot_is_summarized_late() {
    use crate::trace::format::RecordKind;
    let path = std::env::temp_dir().join(format!("gpushim-late-{}.trace", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let r = opened(path.to_str().unwrap().as_bytes(), 1 << 20, true);
    let rec = |kind, ptr, size| call(&r, kind, ptr, size);
    let stop = AtomicBool::new(false);
    let capacity = r.capacity.load(Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let held = r.claim(1).expect("a slot");
        let pairs = |n: u64| {
            for i in 0..n {
                r.append(&rec(RecordKind::Alloc, 0x10_0000 + i * 512, 512));
                r.append(&rec(RecordKind::Free, 0x10_0000 + i * 512, 0));
                if i % 512 == 511 {
                    std::thread::sleep(std::time::Duration::from_millis(4));
                }
            }
        };
        pairs(64);
        // The summarizer passes the held slot (its looks come every 2 to 10 ms).
        std::thread::sleep(std::time::Duration::from_millis(40));
        let mut body = [0u8; RECORD_SIZE];
        rec(RecordKind::Alloc, 0xa000, 4096).encode_body(&mut body);
        assert!(r.write_slot(held, &body));
        // Then the ring laps it: only the checkpoint can say the allocation is live.
        pairs(capacity);
        std::thread::sleep(std::time::Duration::from_millis(40));
        stop.store(true, Ordering::Release);
    });
    r.mark_clean_exit();
    let opts = crate::trace::reader::ReadOptions::default();
    let (reader, rp) = crate::trace::live::replay_each(&path, &opts, |_, _, _, _| {}).unwrap();
    assert_eq!(reader.stats().unsummarized, 0, "{:?}", reader.stats());
    assert!(
        reader.info().claimed > capacity,
        "the ring must have lapped"
    );
    assert_eq!(reader.stats().summarized_late, 1, "{:?}", reader.stats());
    assert_eq!(rp.live.get(&0xa000).map(|l| l.size), Some(4096));
    drop(reader);
    std::fs::remove_file(&path).unwrap();
}
