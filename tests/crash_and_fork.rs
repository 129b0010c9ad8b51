//! Contract 4 and 5 with the shim in a real process: a trace survives SIGKILL mid-storm, and a
//! process that forks while recording neither hangs nor lets its children into its trace.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use gpushim::trace::reader::TraceReader;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts the allocation storm under the shim, recording into `trace`, once every thread runs.
fn storm(trace: &std::path::Path, threads: usize) -> std::process::Child {
    let mut child = Command::new(sim().bin("storm"))
        .arg(threads.to_string())
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("LD_PRELOAD", shim())
        .env("GPUSHIM_TRACE", trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "storming\n");
    child
}

#[test]
fn a_process_killed_mid_storm_leaves_a_trace_that_decodes_to_its_last_committed_record() {
    let dir = tempdir("storm");
    let t = dir.join("storm.trace");
    let threads = 4;
    let mut child = storm(&t, threads);
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let mut reader = TraceReader::open(&t).unwrap();
    assert!(!reader.info().clean_exit);
    let mut calls = 0u64;
    let mut threads_seen = 0;
    let mut notes = 0u64;
    // The shim's NVML sampler announces its thread too: counted apart.
    let mut samplers = std::collections::HashSet::new();
    for r in reader.by_ref() {
        match r.kind {
            RecordKind::ThreadStart => threads_seen += 1,
            // Who called for each allocation, and the module map that names it.
            RecordKind::Caller | RecordKind::Module | RecordKind::ModuleBuildId => notes += 1,
            // A string's text follows it in records of 16 bytes each.
            RecordKind::String => notes += 1 + r.size.div_ceil(16),
            // A C program's allocations carry their native stacks (`stacks:auto`): each a
            // reference, each distinct stack defined once, its frames 8 bytes each.
            RecordKind::StackRef => notes += 1,
            RecordKind::Stack => notes += 1 + (r.size * 8).div_ceil(16),
            RecordKind::Alloc => {
                assert_eq!((r.api, r.status), (Api::CudaMalloc, 0), "{r:?}");
                assert!(
                    [256, 512, 768, 1024].contains(&r.size),
                    "garbage size: {r:?}"
                );
                assert!(r.ptr != 0 && r.ptr % 256 == 0, "garbage pointer: {r:?}");
                calls += 1;
            }
            RecordKind::Free => {
                assert_eq!((r.api, r.status), (Api::CudaFree, 0), "{r:?}");
                calls += 1;
            }
            // The pool's own decisions (pool:caching is the default).
            RecordKind::SegmentReserve
            | RecordKind::SegmentRelease
            | RecordKind::Split
            | RecordKind::PoolSync => {
                assert_eq!(r.api, Api::Shim, "{r:?}");
                calls += 1;
            }
            // NVML's figure for the process, sampled by its helper thread.
            RecordKind::DeviceMemory => {
                assert_eq!(r.api, Api::Shim, "{r:?}");
                assert!(r.size > 0 && r.ptr <= r.size, "garbage NVML figure: {r:?}");
                samplers.insert(r.thread);
                notes += 1;
            }
            other => panic!("unexpected record kind {other:?}: {r:?}"),
        }
    }
    let s = reader.stats();
    assert_eq!(s.damage, None);
    assert!(calls > 1000, "only {calls} calls recorded in 300 ms");
    assert_eq!(threads_seen - samplers.len(), threads);
    // Each thread can have at most one record claimed and not yet committed when it dies.
    assert!(
        s.torn <= threads as u64,
        "{} torn records from {threads} threads",
        s.torn
    );
    assert_eq!(s.committed, calls + threads_seen as u64 + notes);
}

#[test]
fn two_hundred_forks_while_recording_never_hang_and_never_touch_the_parents_trace() {
    let dir = tempdir("forks");
    let pattern = dir.join("t.%p.trace");
    let mut child = Command::new(sim().bin("forker"))
        .arg("200")
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("LD_PRELOAD", shim())
        .env("GPUSHIM_TRACE", &pattern)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let parent_pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the forking process hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "forked 200\n");

    let mut children = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let (records, stats) = decode(&path);
        assert_eq!(
            (stats.damage.clone(), stats.torn),
            (None, 0),
            "{}",
            path.display()
        );
        let info = TraceReader::open(&path).unwrap().info().clone();
        let c = calls(&records);
        if info.pid == parent_pid {
            // The parent's loop thread ran throughout; no child's failed call is in here.
            assert!(c.len() > 2);
            assert!(
                c.iter().all(|r| r.status == 0),
                "a child's record leaked into the parent's trace"
            );
            assert!(info.clean_exit);
        } else {
            children += 1;
            assert_eq!(c.len(), 1, "{}", path.display());
            assert_eq!((c[0].api, c[0].status), (Api::CudaMalloc, 3));
        }
    }
    // Only the 100 children that made a CUDA call have a trace.
    assert_eq!(children, 100);
}

#[test]
fn a_trace_file_cut_short_by_another_process_never_kills_the_program() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempdir("truncate");
    let t = dir.join("storm.trace");
    let mut child = storm(&t, 4);
    std::thread::sleep(Duration::from_millis(200));
    // Another process of the same user cuts the file to nothing while four threads write it.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&t)
        .unwrap()
        .set_len(0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the program died: {:?}",
        child.try_wait()
    );
    // SAFETY: a plain kill of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "not SIGBUS");
    assert!(
        stderr(&out).contains("cut short"),
        "said once: {}",
        stderr(&out)
    );
}

/// A short run's trace takes on disk what it holds plus a bounded margin, not the chunks mapped
/// ahead of the writers (20 MiB).
#[test]
fn a_short_runs_trace_is_small_on_disk() {
    use std::os::unix::fs::MetadataExt;
    let t = tempdir("small-trace").file("small.trace");
    let out = run(
        &sim().bin("conformance"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert!(out.status.code().is_some());
    let meta = std::fs::metadata(&t).unwrap();
    let on_disk = meta.blocks() * 512;
    let (records, stats) = decode(&t);
    let held = gpushim::trace::format::HEADER_SIZE as u64 + stats.committed * 32;
    assert!(!records.is_empty());
    assert!(
        on_disk <= held + (1 << 20),
        "{on_disk} bytes on disk for {held} bytes of trace"
    );
    // And `ls` says so: the file is cut to what it holds, not left at the chunks mapped ahead.
    assert!(
        meta.len() <= held + (256 << 10),
        "{} bytes long for {held} bytes of trace",
        meta.len()
    );
}
