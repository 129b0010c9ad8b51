//! Trace files made by an adversary (contract 9): every report reads them without a panic, a
//! hang or a wrapped figure. A segment that runs past 2^64, byte totals past 2^64, and a
//! property test that mutates a real trace (bit flips, overwritten bytes, truncation) and runs
//! every report over it in-process, where debug builds also catch arithmetic overflow.
//! `GPUSHIM_FUZZ_CASES` sets how many mutated traces the property test reads (CI: the default).

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use proptest::prelude::*;
use std::path::Path;
use std::process::Command;

/// Writes a trace of `records` and returns its path.
fn write_trace(name: &str, records: &[(RecordKind, Api, u64, u64)]) -> TestFile {
    let path = tempdir(name).file(&format!("{name}.trace"));
    let mut t = HandTrace::create(&path);
    for &(kind, api, ptr, size) in records {
        t.rec(kind, api, ptr, size);
    }
    path
}

fn gpushim(args: &[&str], trace: &Path) -> std::process::Output {
    let out = Command::new(gpushim_bin())
        .args(args)
        .arg(trace)
        .arg("--no-symbols")
        .output()
        .unwrap();
    assert_ok(&out);
    out
}

#[test]
fn a_segment_that_runs_past_two_to_the_64_is_read_by_every_report() {
    const MAX48: u64 = (1 << 48) - 1;
    let top = u64::MAX - (1 << 20);
    let t = write_trace(
        "wrap",
        &[
            (RecordKind::SegmentReserve, Api::Shim, top, MAX48),
            (RecordKind::Alloc, Api::CudaMalloc, top + 4096, 1 << 16),
            (RecordKind::OutOfMemory, Api::Shim, 0, 1 << 30),
            (RecordKind::Alloc, Api::CudaMalloc, 0, 1 << 30),
        ],
    );
    for args in [
        vec!["summary"],
        vec!["oom"],
        vec!["peak"],
        vec!["leaks"],
        vec!["export", "--format", "rmm", "-o", "/dev/null"],
        vec!["export", "--format", "memory-viz", "-o", "/dev/null"],
        vec!["export", "--format", "perfetto", "-o", "/dev/null"],
    ] {
        gpushim(&args, &t);
    }
}

#[test]
fn modules_that_are_fifos_or_directories_never_block_a_report_and_are_named_once() {
    let dir = tempdir("fifo");
    let fifo = dir.join("libfifo.so");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let path = dir.join("fifo.trace");
    let mut t = HandTrace::create(&path);
    // Two modules that cannot be read: a FIFO (opening it for reading would wait for a writer
    // forever) and a directory; a stack in each; an allocation under each stack.
    let names = [
        fifo.to_str().unwrap().to_string(),
        dir.to_str().unwrap().to_string(),
    ];
    for (i, name) in names.iter().enumerate() {
        let base = 0x40_0000 * (i as u64 + 1);
        let id = t.recorder.intern_string(name.as_bytes());
        t.rec(RecordKind::Module, Api::Shim, base, id);
        let (stack, _) = t.recorder.intern_stack(&[base + 0x10, base + 0x20]);
        t.rec(RecordKind::StackRef, Api::Shim, stack, 2);
        let ptr = 0x1000 * (i as u64 + 1);
        t.rec(RecordKind::Alloc, Api::CudaMalloc, ptr, 1 << 20);
    }
    drop(t);
    for cmd in ["leaks", "peak", "events"] {
        let mut child = Command::new(gpushim_bin())
            .args([cmd])
            .arg(&path)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{cmd} blocked on a module that is a FIFO");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert_ok(&out);
        let err = stderr(&out);
        if cmd != "events" {
            assert_eq!(
                err.lines().count(),
                1,
                "{cmd}: one line for both modules:\n{err}"
            );
            assert!(err.contains("not a regular file"), "{err}");
        }
    }
}

#[test]
fn byte_totals_past_two_to_the_64_saturate_and_never_wrap() {
    const MAX48: u64 = (1 << 48) - 1;
    let records: Vec<_> = (0..70_000u64)
        .map(|i| (RecordKind::Alloc, Api::CudaMalloc, (i + 1) << 12, MAX48))
        .collect();
    let t = write_trace("totals", &records);
    let out = gpushim(&["summary", "--json"], &t);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &s["devices"][0];
    let peak = d["peak_live_bytes"].as_u64().unwrap();
    let end = d["live_bytes_at_end"].as_u64().unwrap();
    assert_eq!(peak, u64::MAX, "saturated");
    assert_eq!(end, peak, "everything is still live: never below the peak");
}

/// A real trace: pool segments, blocks split from them, frees, stream-ordered calls, VMM, OOM,
/// NVTX strings.
fn base_trace() -> Vec<u8> {
    let mut recs = Vec::new();
    for i in 0..64u64 {
        let seg = 0x7f00_0000_0000 + i * (64 << 20);
        recs.push((RecordKind::SegmentReserve, Api::Shim, seg, 32 << 20));
        recs.push((RecordKind::Alloc, Api::CudaMalloc, seg, 1 << 20));
        recs.push((RecordKind::Split, Api::Shim, seg + (1 << 20), 31 << 20));
        recs.push((
            RecordKind::AllocAsync,
            Api::CudaMallocAsync,
            seg + (1 << 20),
            4096,
        ));
        recs.push((
            RecordKind::FreeAsync,
            Api::CudaFreeAsync,
            seg + (1 << 20),
            0,
        ));
        if i % 3 == 0 {
            recs.push((RecordKind::Free, Api::CudaFree, seg, 0));
            recs.push((RecordKind::SegmentRelease, Api::Shim, seg, 32 << 20));
        }
        if i % 7 == 0 {
            recs.push((RecordKind::PhysCreate, Api::CuMemCreate, 0x100 + i, 2 << 20));
            recs.push((RecordKind::OutOfMemory, Api::Shim, 0, 1 << 40));
        }
    }
    std::fs::read(write_trace("base", &recs)).unwrap()
}

/// A trace of PyTorch's caching allocator: per segment four tensors made and three freed (the
/// first kept); every fifth segment, a failed `cudaMalloc`, a failed tensor and the segment
/// given back. What the replays of PyTorch's allocator and the kinds read.
fn torch_trace() -> Vec<u8> {
    let mut recs = Vec::new();
    for i in 0..48u64 {
        let seg = 0x7e00_0000_0000 + i * (32 << 20);
        recs.push((RecordKind::SegmentReserve, Api::Torch, seg, 20 << 20));
        for (kind, first) in [(RecordKind::TensorAlloc, 0), (RecordKind::TensorFree, 1)] {
            for j in first..4u64 {
                recs.push((kind, Api::Torch, seg + j * (4 << 20), 3 << 20));
            }
        }
        if i % 5 == 4 {
            recs.push((RecordKind::Alloc, Api::CudaMalloc, 0, 1 << 40));
            recs.push((RecordKind::TensorOom, Api::Torch, 1 << 30, 1 << 40));
            recs.push((RecordKind::SegmentRelease, Api::Torch, seg, 20 << 20));
        }
    }
    std::fs::read(write_trace("torch", &recs)).unwrap()
}

/// The replays of PyTorch's allocator, in-process: `fit` (three rows, the largest batch, both
/// settings) and `simulate --torch` with `--recommend` (`oom`'s advice is `read_everything`'s);
/// what each answered.
fn replay_everything(
    path: &Path,
    o: &gpushim::trace::reader::ReadOptions,
) -> (
    Result<gpushim::report::fit::Fit, gpushim::report::fit::FitError>,
    Result<(), String>,
) {
    let mut ask = gpushim::report::fit::Ask::largest(2, 64);
    ask.batches = vec![1, 4, 16];
    let fit = gpushim::report::analysis::fit(path, &ask, o);
    // The sharding what-if reads the blocks, parameters and backward of whatever it is given.
    use gpushim::report::torch_allocator::ShardWay;
    for way in [
        ShardWay::Fsdp2 { reshard: true },
        ShardWay::Zero {
            stage: 2,
            bucket: 1 << 20,
        },
        ShardWay::Zero {
            stage: 3,
            bucket: 1 << 20,
        },
    ] {
        let sharded = gpushim::report::fit::Ask {
            shard: Some(way),
            world_size: Some(2),
            ..ask.clone()
        };
        let _ = gpushim::report::analysis::fit(path, &sharded, o);
    }
    let expandable = "expandable_segments:True";
    let confs = [gpushim::report::torch_allocator::model::TorchConf::parse(expandable).unwrap()];
    let simulated = gpushim::report::analysis::read_requests(path, o).and_then(|input| {
        gpushim::report::torch_allocator::simulate(
            &input,
            &confs,
            true,
            &Default::default(),
            &|_| {},
        )
    });
    (fit, simulated.map(|_| ()).map_err(|e| e.to_string()))
}

/// Every report, in-process (frames left unnamed: the mutated modules are not real files).
fn read_everything(path: &Path) {
    let o = &gpushim::trace::reader::ReadOptions {
        symbols: false,
        ..Default::default()
    };
    let _ = gpushim::report::summarize(path, o);
    let _ = gpushim::report::leaks(path, None, o);
    let _ = gpushim::report::leaks(path, Some("step"), o);
    if let Ok(peaks) = gpushim::report::peak(path, o) {
        for p in &peaks {
            let _ = gpushim::export::flamegraph_svg(p, "t", true);
        }
    }
    let _ = gpushim::report::oom(path, o);
    let mut sink = Vec::new();
    let _ = gpushim::export::rmm_csv(path, &mut sink, o);
    let _ = gpushim::export::memory_viz(path, &mut sink, (4, 100_000), o);
    let _ = gpushim::export::perfetto(&[path.to_path_buf()], &mut sink, o);
    let _ = gpushim::export::plot_svg(&[path.to_path_buf()], o);
    // What `diff` and `top` read: the peaks and who holds what is live at the end.
    let at_end = gpushim::report::analysis::Wants {
        live_at_end: true,
        ..gpushim::report::analysis::Wants::peak()
    };
    let _ = gpushim::report::analysis::analyze(path, o, &at_end);
    let _ = gpushim::report::analysis::simulate_pool(path, &["pool:caching".to_string()], o);
    let _ = replay_everything(path, o);
}

fn cases() -> u32 {
    std::env::var("GPUSHIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_real_traces_never_panic_any_report(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..48),
        cut in prop::option::of(any::<prop::sample::Index>()),
        torch in any::<bool>(),
    ) {
        static BASE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        static TORCH: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let base = if torch { TORCH.get_or_init(torch_trace) } else { BASE.get_or_init(base_trace) };
        let mut bytes = base.clone();
        // Records live after the 4 KiB header; most edits land there, some in the header.
        for (at, value, flip) in edits {
            let i = at.index(bytes.len());
            if flip { bytes[i] ^= 1 << (value % 8) } else { bytes[i] = value }
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        let dir = tempdir("fuzz-case");
        let path = dir.join("m.trace");
        std::fs::write(&path, &bytes).unwrap();
        read_everything(&path);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_build_id_that_is_not_hex_is_not_one() {
    let dir = tempdir("buildid-hostile");
    let path = dir.join("ids.trace");
    let mut t = HandTrace::create(&path);
    let ids: [&[u8]; 4] = [b"00ff1e", b"../etc/passwd\n", b"", &[b'a'; 200]];
    for (i, text) in ids.iter().enumerate() {
        let base = 0x40_0000 * (i as u64 + 1);
        let name = t.recorder.intern_string(format!("/lib/m{i}.so").as_bytes());
        t.rec(RecordKind::Module, Api::Shim, base, name);
        let id = t.recorder.intern_string(text);
        t.rec(RecordKind::ModuleBuildId, Api::Shim, base, id);
    }
    let name = t.recorder.intern_string(b"/lib/kept.so");
    t.rec(RecordKind::Module, Api::Shim, 0x240_0000, name);
    let id = t.recorder.intern_string(b"00ff1e");
    t.rec(RecordKind::ModuleBuildId, Api::Shim, 0x240_0000, id);
    // A module loaded again at the first base, with no id of its own: the old one is gone.
    let name = t.recorder.intern_string(b"/lib/again.so");
    t.rec(RecordKind::Module, Api::Shim, 0x40_0000, name);
    drop(t);
    let mut reader = gpushim::trace::reader::TraceReader::open(&path).unwrap();
    while reader.next().is_some() {}
    assert_eq!(reader.build_id_of(0x40_0000), None);
    assert_eq!(reader.build_id_of(0x80_0000), None, "not hex");
    assert_eq!(reader.build_id_of(0xc0_0000), None, "empty");
    assert_eq!(reader.build_id_of(0x100_0000), None, "longer than any id");
    assert_eq!(reader.build_id_of(0x200_0000), None, "never recorded");
    assert_eq!(
        reader.build_id_of(0x240_0000),
        Some("00ff1e"),
        "kept by its base"
    );
}

#[test]
fn names_in_a_trace_never_reach_the_terminal_as_control_characters() {
    // A host name and an NVTX range name holding an escape sequence (which would move the
    // terminal of whoever reads the report) are printed escaped.
    let dir = tempdir("escapes");
    let path = dir.join("esc.trace");
    let mut t = HandTrace::create_on(&path, b"evil\x1b[2Jhost");
    let name = t.recorder.intern_string(b"step\x1b]0;owned\x07\xc2\x9b");
    for i in 0..3u64 {
        t.rec(RecordKind::RangePush, Api::Nvtx, name, 0);
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x100_0000 * (i + 1),
            1 << 20,
        );
        t.rec(RecordKind::RangePop, Api::Nvtx, 0, 0);
    }
    drop(t);
    for report in ["summary", "peak", "events", "leaks"] {
        let out = Command::new(gpushim_bin())
            .arg(report)
            .arg(&path)
            .output()
            .unwrap();
        assert_ok(&out);
        let text = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
        assert!(
            !text.iter().any(|&b| b == 0x1b || b == 0x07),
            "{report} printed a control character: {}",
            String::from_utf8_lossy(&text)
        );
        assert!(
            !String::from_utf8_lossy(&text).contains('\u{9b}'),
            "{report}"
        );
    }
    let out = Command::new(gpushim_bin())
        .args(["summary"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("evil\\x1b[2Jhost"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn leaks_on_a_cut_trace_says_what_is_missing() {
    let dir = tempdir("cut-leaks");
    let path = dir.join("cut.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..200u64 {
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x100_0000 * (i + 1),
            1 << 20,
        );
    }
    drop(t);
    let whole = Command::new(gpushim_bin())
        .arg("leaks")
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&whole);
    assert!(!stdout(&whole).contains("incomplete"), "{}", stdout(&whole));
    let header = gpushim::trace::format::HEADER_SIZE as u64;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(header + 32 * 50)
        .unwrap();
    let cut = Command::new(gpushim_bin())
        .arg("leaks")
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&cut);
    let text = stdout(&cut);
    assert!(
        text.contains("the trace is incomplete") && text.contains("missing past the end"),
        "{text}"
    );
}

/// A real trace of any length: written by the recorder with its summarizer running, wrapped
/// many times, with a checkpoint. Returns its bytes and where its checkpoint slots lie.
fn ring_trace() -> (Vec<u8>, usize, usize) {
    use gpushim::trace::format::header;
    use std::sync::atomic::{AtomicBool, Ordering};
    let path = tempdir("ring-base").file("ring.trace");
    let r = ring_recorder(&path, 2 << 20);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        let step = r.intern_string(b"step");
        let mut t = 0u64;
        for i in 0..30_000u64 {
            let mut rec = |kind, api, ptr, size| {
                t += 10_000;
                r.append(&record_at(kind, api, (i % 2) as u8, 0, t, ptr, size));
            };
            let p = 0x7f00_0000_0000 + (i % 64) * 4096;
            rec(RecordKind::RangePush, Api::Nvtx, step, 1);
            rec(RecordKind::Alloc, Api::CudaMalloc, p, 4096);
            rec(RecordKind::StackRef, Api::Shim, 1 + i % 3, 0);
            if i % 100 == 0 {
                rec(
                    RecordKind::Alloc,
                    Api::CudaMalloc,
                    0x1_0000_0000 + i * 512,
                    512,
                );
            }
            rec(RecordKind::Free, Api::CudaFree, p, 0);
            if i % 1000 == 0 {
                rec(RecordKind::Alloc, Api::CudaMalloc, 0, 1 << 40);
            }
            rec(RecordKind::RangePop, Api::Nvtx, 0, 1);
            if i % 500 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        stop.store(true, Ordering::Release);
    });
    let bytes = std::fs::read(&path).unwrap();
    let at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    assert_ne!(at(header::RING), 0);
    let info = gpushim::trace::reader::TraceReader::open(&path).unwrap();
    assert!(
        info.info().summarized > 0,
        "the base trace has a checkpoint ({} did not fit)",
        info.info().checkpoints_failed
    );
    (
        bytes.clone(),
        at(header::CHECKPOINT_AREA),
        at(header::CHECKPOINT_SLOT_BYTES),
    )
}

/// Makes the checksums of the checkpoints match their (changed) records again, so that their
/// records are read as they are.
fn match_checksums(bytes: &mut [u8], area: usize, slot: usize) {
    use gpushim::trace::format::{header, ring};
    for k in 0..2 {
        let d = header::CHECKPOINTS + k * ring::DESCRIPTOR_BYTES;
        let records = u64::from_le_bytes(bytes[d + 8..d + 16].try_into().unwrap()) as usize;
        let from = area + k * slot;
        if let Some(end) = records.checked_mul(32).and_then(|n| n.checked_add(from))
            && end <= bytes.len()
            && records * 32 <= slot
        {
            let sum = ring::checksum(&bytes[from..end]);
            bytes[d + 24..d + 32].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// A ring trace whose header claims 2^59 records and whose checkpoints hold a record of an
/// unknown kind (the case the fuzzer below once found): the reader names the damage at the ring slot
/// it lies in, and no offset arithmetic overflows.
#[test]
fn a_ring_header_claiming_two_to_the_59_records_is_read_as_damage() {
    use gpushim::trace::format::{RECORD_SIZE, header, record};
    let (mut bytes, area, slot) = ring_trace();
    bytes[header::CLAIMED + 7] = 8;
    for k in 0..2 {
        bytes[area + k * slot + RECORD_SIZE + record::KIND] = 250;
    }
    match_checksums(&mut bytes, area, slot);
    let dir = tempdir("ring-claimed");
    let path = dir.join("m.trace");
    std::fs::write(&path, &bytes).unwrap();
    let mut reader = gpushim::trace::reader::TraceReader::open(&path).unwrap();
    reader.by_ref().for_each(drop);
    let damage = reader
        .stats()
        .damage
        .clone()
        .expect("the claimed count is not the ring's");
    assert!(damage.offset < bytes.len() as u64, "{damage:?}");
    read_everything(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// A trace of any length, its header, ring or checkpoint changed (the checkpoint's checksum
    /// made to match again, so its records are read as they are): every report reads it.
    #[test]
    fn mutated_ring_traces_and_checkpoints_never_panic_any_report(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..48),
    ) {
        static BASE: std::sync::OnceLock<(Vec<u8>, usize, usize)> = std::sync::OnceLock::new();
        let (base, area, slot) = BASE.get_or_init(ring_trace);
        let mut bytes = base.clone();
        for (at, value, place) in edits {
            // 0: anywhere; 1: the header; 2: a checkpoint slot.
            let i = match place {
                0 => at.index(bytes.len()),
                1 => at.index(4096),
                _ => (area + at.index(2 * slot)).min(bytes.len() - 1),
            };
            bytes[i] = value;
        }
        match_checksums(&mut bytes, *area, *slot);
        let dir = tempdir("fuzz-ring");
        let path = dir.join("m.trace");
        std::fs::write(&path, &bytes).unwrap();
        read_everything(&path);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The command under an address-space limit of 2 GiB (`prlimit --as`), as a hostile trace's
/// claims of gigabytes would exceed it: what it printed and how it ended.
fn gpushim_within_2gib(args: &[&str], trace: &Path) -> std::process::Output {
    Command::new("prlimit")
        .arg(format!("--as={}", 2u64 << 30))
        .arg("--")
        .arg(gpushim_bin())
        .args(args)
        .arg(trace)
        .output()
        .expect("prlimit (util-linux) runs the command")
}

/// A ring header whose checkpoint slots claim 6 GiB over a sparse file of 16 GiB (4 KiB on
/// disk): the reader once allocated twice the claim before checking it (6.3 GB, 159 s). Now the
/// claim is checked against the layout a writer makes, every report finishes within 2 GiB, and
/// the summary says in one line what the header claims and where.
#[test]
fn a_checkpoint_claiming_gigabytes_never_sizes_what_is_read() {
    use gpushim::trace::format::{header, ring};
    let (base, _, _) = ring_trace();
    let mut h = base[..4096].to_vec();
    for k in 0..2 {
        let d = header::CHECKPOINTS + k * ring::DESCRIPTOR_BYTES;
        h[d + 8..d + 16].copy_from_slice(&((6u64 << 30) / 32).to_le_bytes());
    }
    h[header::CHECKPOINT_SLOT_BYTES..header::CHECKPOINT_SLOT_BYTES + 8]
        .copy_from_slice(&(6u64 << 30).to_le_bytes());
    let dir = tempdir("claims-checkpoint");
    let path = dir.join("sparse.trace");
    std::fs::write(&path, &h).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(16 << 30)
        .unwrap();
    let out = gpushim_within_2gib(&["summary"], &path);
    assert_ok(&out);
    let text = stdout(&out);
    let lies: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("the trace lies"))
        .collect();
    assert_eq!(lies.len(), 1, "{text}");
    assert!(
        lies[0].contains("offset 112") && lies[0].contains("6442450944"),
        "{text}"
    );
    for args in [&["leaks"][..], &["peak"], &["oom"]] {
        assert_ok(&gpushim_within_2gib(args, &path));
    }
}

/// Modules a trace names that would read as gigabytes: `/proc/self/pagemap` (of no length, yet
/// gigabytes to a reader) and a sparse file of 6 GiB. Neither is read whole: the report
/// finishes within 2 GiB and names each once, saying why its frames stay module+offset.
#[test]
fn modules_that_would_read_as_gigabytes_are_never_read_whole() {
    let dir = tempdir("claims-modules");
    let sparse = dir.join("libsparse.so");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(6 << 30)
        .unwrap();
    for module in [Path::new("/proc/self/pagemap"), sparse.as_path()] {
        let path = dir.join("m.trace");
        let _ = std::fs::remove_file(&path);
        let mut t = HandTrace::create(&path);
        let base = 0x40_0000u64;
        let id = t
            .recorder
            .intern_string(module.to_str().unwrap().as_bytes());
        t.rec(RecordKind::Module, Api::Shim, base, id);
        let (stack, _) = t.recorder.intern_stack(&[base + 0x10, base + 0x20]);
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000, 1 << 20);
        t.rec(RecordKind::StackRef, Api::Shim, stack, 2);
        drop(t);
        for cmd in ["leaks", "peak"] {
            let out = gpushim_within_2gib(&[cmd], &path);
            assert_ok(&out);
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{module:?} {cmd}: {err}");
            assert!(err.contains("not a library"), "{module:?} {cmd}: {err}");
        }
    }
}

#[test]
fn a_trace_cut_short_while_it_is_read_stops_where_it_ends_and_says_so() {
    // More records than three mapped windows hold, the cut in the fourth: far past what the
    // decoder reads ahead of the first batch.
    const N: u64 = 600_000;
    let dir = tempdir("cut-while-read");
    let path = dir.join("cut.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..N {
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000 * (i + 1), 4096);
    }
    drop(t);
    // Cut in the middle of a record and of a page: past it, the file's pages are gone.
    let kept = 400_000u64;
    let cut_at = gpushim::trace::format::HEADER_SIZE as u64 + 32 * kept + 16;
    let mut r = gpushim::trace::reader::TraceReader::open(&path).unwrap();
    let mut batch = Vec::new();
    assert!(r.next_batch(&mut batch));
    let mut read = batch.len() as u64;
    assert!(read < kept, "the first batch is small: {read}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut_at)
        .unwrap();
    while r.next_batch(&mut batch) {
        read += batch.len() as u64;
    }
    assert_eq!(read, kept, "every whole record before the cut, none after");
    let damage = r.stats().damage.as_ref().expect("the cut is said");
    assert!(damage.reason.contains("shrank"), "{}", damage.reason);
}

#[test]
fn an_autograd_graph_numbered_across_every_sequence_number_is_refused_not_divided_by() {
    // The 32-bit run of the stand-in's residual layers, whose walks of the autograd graph each
    // get a first node numbered 0 and a last numbered 2^64 - 1: a step's span of sequence
    // numbers would be 2^64, which wrapped to 0 and was divided by (`fit --autocast` killed by
    // the panic).
    use gpushim::trace::format::{HEADER_SIZE, RECORD_SIZE, record};
    let dir = tempdir("hostile-graph-span");
    let trace = crate::fit_autocast::layers(&dir, 1, false);
    let mut bytes = std::fs::read(&trace).unwrap();
    let seq =
        |b: &[u8], o: usize| u64::from_le_bytes(b[o + record::PTR..][..8].try_into().unwrap());
    let (mut walk, mut walks) = (Vec::new(), 0);
    for o in (HEADER_SIZE..bytes.len()).step_by(RECORD_SIZE) {
        match bytes.get(o + record::KIND).copied() {
            Some(k) if k == RecordKind::GraphNode as u8 => walk.push(o),
            Some(k) if k == RecordKind::Graph as u8 && !walk.is_empty() => {
                let lo = *walk.iter().min_by_key(|&&o| seq(&bytes, o)).unwrap();
                let hi = *walk.iter().max_by_key(|&&o| seq(&bytes, o)).unwrap();
                bytes[lo + record::PTR..][..8].copy_from_slice(&0u64.to_le_bytes());
                bytes[hi + record::PTR..][..8].copy_from_slice(&u64::MAX.to_le_bytes());
                (walk, walks) = (Vec::new(), walks + 1);
            }
            _ => {}
        }
    }
    assert!(walks > 0, "the run walked no graph");
    let hostile = dir.join("span.trace");
    std::fs::write(&hostile, &bytes).unwrap();
    let out = Command::new(gpushim_bin())
        .args(["fit", "--at", "1", "--autocast", "bf16"])
        .arg(&hostile)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("numbered from 0 to the largest sequence number") && err.lines().count() == 1,
        "{err}"
    );
}

/// The command's allocator (`gpushim::memory`) asked for more than any machine has: inside
/// `fallible` the failure is handed back; outside it the process ends with status 2 and one
/// line naming the bytes, no backtrace and no abort. Run in a child process (this test again,
/// with GPUSHIM_TEST_ALLOCATOR_CHILD set), which the allocator ends.
#[test]
fn a_request_the_allocator_cannot_serve_ends_the_command_with_one_line() {
    use std::alloc::{GlobalAlloc, Layout};
    let huge = Layout::from_size_align(1 << 62, 8).unwrap();
    if std::env::var_os("GPUSHIM_TEST_ALLOCATOR_CHILD").is_some() {
        // SAFETY: a layout of nonzero size; a pointer returned is never used.
        let back = gpushim::memory::fallible(|| unsafe { gpushim::memory::Alloc.alloc(huge) });
        println!("handed back: {}", back.is_null());
        // SAFETY: as above; the allocator ends the process rather than return.
        let p = unsafe { gpushim::memory::Alloc.alloc(huge) };
        println!("returned: {}", p.is_null());
        return;
    }
    let me = "hostile_traces::a_request_the_allocator_cannot_serve_ends_the_command_with_one_line";
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", me, "--nocapture", "--test-threads=1"])
        .env("GPUSHIM_TEST_ALLOCATOR_CHILD", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stdout.contains("handed back: true"), "{stdout}");
    assert!(!stdout.contains("returned:"), "{stdout}");
    let line = format!(
        "gpushim: out of memory: {} bytes more could not be had",
        1u64 << 62
    );
    assert!(stderr.contains(&line), "{stderr}");
    assert_eq!(stderr.matches("gpushim:").count(), 1, "{stderr}");
    assert!(
        !stderr.contains("backtrace") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// `fit` holds every tensor event of the run it replays: past the memory it may have (here
/// GPUSHIM_REPLAY_MEMORY's, as a limit on the address space would be), it stops gathering and
/// says how many it held, with status 2, not aborted by the allocator.
#[test]
fn fit_past_the_memory_it_may_have_says_so() {
    let dir = tempdir("replay-memory");
    let path = dir.join("tensors.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..3000u64 {
        let p = 0x7f00_0000_0000 + (i % 7) * 0x10_0000;
        t.rec(RecordKind::TensorAlloc, Api::Torch, p, 4096);
        t.rec(RecordKind::TensorFree, Api::Torch, p, 4096);
    }
    drop(t);
    let fit = |memory: Option<&str>| {
        let mut c = Command::new(gpushim_bin());
        c.args(["fit", "--at", "1", "--no-symbols"]).arg(&path);
        if let Some(m) = memory {
            c.env("GPUSHIM_REPLAY_MEMORY", m);
        }
        c.output().unwrap()
    };
    // 1024 events take 48 KiB; the next room, 96 KiB, is past 64 KiB.
    let out = fit(Some("64KiB"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "the run's tensor events do not fit in the memory GPUSHIM_REPLAY_MEMORY allows: \
             1024 of them were held (48.00 KiB)"
        ),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A setting that is not a size is named, not taken as none.
    let out = fit(Some("lots\x1b[2J"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("GPUSHIM_REPLAY_MEMORY=lots\\x1b[2J: not a size"),
        "{stderr}"
    );
    // With room for them all, the same trace is replayed.
    let out = fit(Some("1MiB"));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("do not fit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The PyTorch trace the property test mutates reaches the replays whole (else its mutations
/// would test only the errors before them): `fit` answers with rows under both settings,
/// and `simulate --torch` with `--recommend`.
#[test]
fn the_torch_base_trace_is_replayed_whole() {
    let dir = tempdir("torch-base");
    let path = dir.join("t.trace");
    std::fs::write(&path, torch_trace()).unwrap();
    let o = gpushim::trace::reader::ReadOptions {
        symbols: false,
        ..Default::default()
    };
    let (fit, simulated) = replay_everything(&path, &o);
    let fit = fit.unwrap();
    assert_eq!(fit.settings.len(), 2);
    assert_eq!(fit.settings[0].rows.len(), 3);
    simulated.unwrap();
}
