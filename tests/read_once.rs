//! One analysis per command: each report opens its trace once and reads it in at most two
//! passes (the run, then its marks), counted by the reader itself (`GPUSHIM_READS=1`); the
//! moments of many devices cost one pass, not one each.

use crate::common::*;
use gpushim::trace::format::RecordKind;
use std::path::Path;
use std::process::Command;

/// `gpushim ARGS TRACE --no-symbols` with `GPUSHIM_READS=1` and `env`, which must succeed: the
/// rest of the line of its counts that begins `gpushim: WHAT`, and what it printed.
fn said(args: &[&str], trace: &Path, env: &[(&str, &str)], what: &str) -> (String, String) {
    let out = Command::new(gpushim_bin())
        .args(args)
        .arg(trace)
        .arg("--no-symbols")
        .env("GPUSHIM_READS", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let prefix = format!("gpushim: {what}");
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no '{prefix}' in: {err}"))
        .to_string();
    (line, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `gpushim ARGS TRACE`, which must succeed: (opened, passes) as the command counted them, and
/// what it printed.
fn reads(args: &[&str], trace: &Path) -> ((u64, u64), String) {
    let (line, printed) = said(args, trace, &[], "opened ");
    let mut n = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse::<u64>().unwrap());
    ((n.next().unwrap(), n.next().unwrap()), printed)
}

/// The kinds program, 3000 steps (with its leak if `leak`), into a ring of 4 MiB that laps.
fn ring_trace(name: &str, leak: bool) -> TestFile {
    let ring = tempdir(name).file("ring.trace");
    assert_ok(&kinds_program_with(
        &ring,
        3000,
        leak,
        &[],
        vec![("GPUSHIM_CONF", "trace_max:4MiB".into())],
    ));
    ring
}

#[test]
fn every_report_opens_its_trace_once_and_reads_it_at_most_twice() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let page = tempdir("read-once").file("page.html");
    let svg = tempdir("read-once").file("mem.svg");
    let page = page.to_str().unwrap();
    let svg = svg.to_str().unwrap();
    let total = format!("{svg}.total.svg");
    let (json, pickle, csv) = (
        format!("{svg}.json"),
        format!("{svg}.pickle"),
        format!("{svg}.csv"),
    );
    for args in [
        &["summary"][..],
        &["summary", "--json"],
        &["peak"],
        &["leaks"],
        &["oom"],
        &["report", "-o", page],
        &["plot", "--by", "kind", "-o", svg],
        // The totals over time, with the iterations' ticks from the same read.
        &["plot", "--by", "total", "-o", &total],
        &["export", "--format", "perfetto", "-o", &json],
        &["export", "--format", "memory-viz", "-o", &pickle],
        &["export", "--format", "rmm", "-o", &csv],
        // Two traces (the same name twice: one file, opened once), each read once: its
        // peaks and what it held at its end together.
        &["diff", trace.to_str().unwrap()],
        // A refresh of `top`: its summary and who holds what (each next reads on from it).
        &["top", "--count", "1"],
        // The run's own row and each policy's replay, fed the same read.
        &["simulate", "--conf", "pool:caching", "--conf", "pool:off"],
    ] {
        let ((opened, passes), _) = reads(args, &trace);
        assert_eq!(opened, 1, "{args:?} opened the trace {opened} times");
        assert!(passes <= 2, "{args:?} read the trace {passes} times");
        // The summary's and the peak's moments are taken as the first pass finds them.
        if matches!(args[0], "summary" | "peak" | "top" | "simulate") {
            assert_eq!(passes, 1, "{args:?} read the trace {passes} times");
        }
    }
}

#[test]
fn what_fits_is_read_with_the_reports_beside_it() {
    // `fit`, and what fits beside `summary` and the page: PyTorch's requests and the summary
    // (the headroom beside PyTorch's) from the one read the reports make.
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let page = tempdir("read-once-fit").file("page.html");
    let page = page.to_str().unwrap();
    for args in [
        &["fit", "--at", "8"][..],
        &["summary", "--at", "8"],
        &["report", "--at", "8", "-o", page],
    ] {
        let ((opened, passes), _) = reads(args, &data.join("gpt2.trace"));
        assert_eq!(opened, 1, "{args:?} opened the trace {opened} times");
        assert!(passes <= 2, "{args:?} read the trace {passes} times");
    }
    let fitted = std::fs::read_to_string(page).unwrap();
    assert!(fitted.contains("\"largest_batch\""), "no fit on the page");
    // `oom` of PyTorch's failure: its reports, then the replay's requests once, for both the
    // advice and the largest batch that fits, by the same descriptor rewound.
    let ((opened, passes), printed) = reads(&["oom", "--at", "8"], &data.join("oom.trace"));
    assert!(
        printed.contains("export PYTORCH_CUDA_ALLOC_CONF="),
        "{printed}"
    );
    assert!(printed.contains("the largest batch that fits"), "{printed}");
    // (A fourth: the replay's run says whether it leaks, `leaks`'s sampler reading beside it.)
    assert_eq!((opened, passes), (1, 4), "{printed}");
    // A ring: `fit` reads the checkpoint with the most of the ring after it, once (and
    // `leaks`'s sampler beside it, for whether the run grows).
    let ring = ring_trace("read-once-fit-ring", false);
    let ((opened, passes), printed) = reads(&["fit", "--at", "2"], &ring);
    assert_eq!(opened, 1, "{printed}");
    assert!(passes <= 2, "{passes} passes: {printed}");
    assert!(printed.contains("batch"), "{printed}");
}

#[test]
fn the_first_pass_says_where_its_time_went() {
    // `GPUSHIM_READS=1`: the first pass's time, the decoding threads' CPU time and the
    // trackers' threads' (summed, and the busiest). One thread cannot run longer than the pass;
    // with one group of trackers the busiest is all of them.
    let t = tempdir("pass-times").file("long.trace");
    assert_ok(&kinds_program_with(&t, 2000, false, &[], Vec::new()));
    let (line, _) = said(
        &["summary"],
        &t,
        &[("GPUSHIM_READ_SPLIT", "0")],
        "first pass ",
    );
    let n: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    let [wall, _decoding, trackers, busiest] = n[..] else {
        panic!("four figures in: {line}");
    };
    assert!(busiest > 0.0 && busiest <= wall + 0.01, "{line}");
    assert!((trackers - busiest).abs() <= 0.01, "{line}");
}

#[test]
fn the_peaks_of_many_devices_are_taken_in_one_pass() {
    // 255 devices (as many as a trace can name), each with a peak of its own (device d: d+1
    // blocks of 1 MiB, then all freed but one): one pass finds the peaks and takes every
    // device's moment as it goes.
    let path = tempdir("many-devices").file("devices.trace");
    let mut t = HandTrace::create(&path);
    for d in 0..255u8 {
        let base = (u64::from(d) + 1) << 40;
        for i in 0..=u64::from(d) {
            t.call(RecordKind::Alloc, d, 0, base + (i << 20), 1 << 20);
        }
        for i in 1..=u64::from(d) {
            t.call(RecordKind::Free, d, 0, base + (i << 20), 0);
        }
    }
    drop(t);
    let ((opened, passes), _) = reads(&["peak"], &path);
    assert_eq!((opened, passes), (1, 1));
    let v = report_json(&["peak"], &[&path]);
    let peaks = v.as_array().expect("one trace: a list of peaks");
    assert_eq!(peaks.len(), 255);
    for p in peaks {
        let d = p["device"].as_u64().unwrap();
        assert_eq!(
            p["live_bytes"].as_u64().unwrap(),
            (d + 1) << 20,
            "device {d}"
        );
        let held: u64 = p["by_call_site"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(held, (d + 1) << 20, "device {d}: its holders at its peak");
    }
}

#[test]
fn decoding_on_a_thread_of_its_own_or_from_the_file_mapped_reads_what_decoding_in_turn_reads() {
    // Where there is a second core the records are decoded on a thread of their own, a few
    // batches ahead of the reports, and the file is mapped a window at a time rather than read
    // into a buffer; every report must read the same as when they are decoded in turn
    // (GPUSHIM_READ_INLINE=1) and read into a buffer (GPUSHIM_READ_MAP=0), on a real run's
    // trace and on a ring's (whose records wrap around the end of the file).
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let ring = ring_trace("read-inline", false);
    let lapped = gpushim::trace::reader::TraceReader::open(&*ring).unwrap();
    assert!(lapped.info().summarized > 0, "the ring never lapped");
    for trace in [gpt2.as_path(), &*ring] {
        for report in ["summary", "peak", "leaks", "oom"] {
            let run = |env: &[(&str, &str)]| {
                let mut c = Command::new(gpushim_bin());
                c.args([report, "--json", "--no-symbols"]).arg(trace);
                c.envs(env.iter().copied());
                let out = c.output().unwrap();
                assert_ok(&out);
                out.stdout
            };
            let default = run(&[]);
            for other in [
                [("GPUSHIM_READ_INLINE", "1"), ("GPUSHIM_READ_MAP", "1")],
                [("GPUSHIM_READ_INLINE", "0"), ("GPUSHIM_READ_MAP", "0")],
            ] {
                assert_eq!(
                    default,
                    run(&other),
                    "{report} of {} with {other:?}: read otherwise",
                    trace.display()
                );
            }
        }
    }
}

#[test]
fn a_batch_at_a_time_reads_what_a_record_at_a_time_reads() {
    // The reports' loops read a batch at a time (`next_batch`); the records, their joins to the
    // forward and what a filter keeps must be those the iterator returns one by one, also
    // across a ring's checkpoint and with a filter that keeps part of the records.
    let ring = ring_trace("read-batches", false);
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    for trace in [gpt2.as_path(), &*ring] {
        let mut all = 0;
        // The filter's time from the allocations the trace holds (not a checkpoint's restored
        // state, which is no call): just past the earliest of them, so that the filter leaves
        // those out whatever the machine's load made of the records' times (a fixed time, or
        // the middle of every record's time, kept them all on a loaded machine).
        use gpushim::trace::format::{RecordKind as K, restore};
        let mut restoring = false;
        let mut times: Vec<u64> = Vec::new();
        for r in gpushim::trace::reader::TraceReader::open(trace).unwrap() {
            match r.kind {
                K::Restore => restoring = r.status != restore::END,
                K::Alloc | K::AllocAsync | K::TensorAlloc if !restoring && r.status == 0 => {
                    times.push(r.time_ns)
                }
                _ => {}
            }
        }
        times.sort_unstable();
        let earliest = times.first().copied().expect("the trace holds allocations");
        let middle = times
            .iter()
            .copied()
            .find(|&t| t > earliest)
            .expect("allocations at two times or more");
        for from_ns in [None, Some(middle)] {
            let mut opts = gpushim::trace::reader::ReadOptions::default();
            opts.filter.from_ns = from_ns;
            let open = || gpushim::trace::reader::TraceReader::open_with(trace, &opts).unwrap();
            let one_by_one: Vec<_> = open().collect();
            let mut reader = open();
            let (mut batched, mut batch) = (Vec::new(), Vec::new());
            while reader.next_batch(&mut batch) {
                assert!(!batch.is_empty(), "an empty batch before the end");
                batched.extend_from_slice(&batch);
            }
            assert!(!one_by_one.is_empty());
            assert_eq!(
                batched.len(),
                one_by_one.len(),
                "{} from {from_ns:?}",
                trace.display()
            );
            assert!(
                batched == one_by_one,
                "{}: the records differ",
                trace.display()
            );
            if from_ns.is_none() {
                all = batched.len();
            } else {
                assert!(batched.len() < all, "the filter kept every record");
            }
        }
    }
}

/// `gpushim REPORT --json TRACE`, with the moments taken in the first pass or (`early` false,
/// GPUSHIM_READ_EARLY=0) all in a second: what it printed and how many passes it read.
fn report_early(report: &str, trace: &Path, early: bool) -> (Vec<u8>, u64) {
    let (out, passes, _) = report_early_read(&[report, "--json"], trace, early);
    (out, passes)
}

/// That a report said the same from the first pass (`early`) as from a second (`late`).
fn assert_same(early: &[u8], late: &[u8], what: &str) {
    assert!(
        early == late,
        "{what}: the first pass's answer differs from a second pass's:\n{}\n{}",
        String::from_utf8_lossy(early),
        String::from_utf8_lossy(late)
    );
}

/// `gpushim ARGS TRACE --no-symbols` as [`report_early`] runs it: what it printed, the passes
/// it read and how many times a whole pass's records it decoded.
fn report_early_read(args: &[&str], trace: &Path, early: bool) -> (Vec<u8>, u64, f64) {
    let mut c = Command::new(gpushim_bin());
    c.args(args)
        .arg("--no-symbols")
        .arg(trace)
        .env("GPUSHIM_READS", "1");
    if !early {
        c.env("GPUSHIM_READ_EARLY", "0");
    }
    let out = c.output().unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("gpushim: opened 1 trace file(s), read "))
        .unwrap_or_else(|| panic!("no count of reads in: {err}"));
    let passes = line.split(' ').next().and_then(|n| n.parse().ok());
    let times = line
        .split(": ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok());
    let (Some(passes), Some(times)) = (passes, times) else {
        panic!("no count of reads in: {line}");
    };
    (out.stdout, passes, times)
}

#[test]
fn leaks_sampled_from_the_first_pass_are_those_a_second_pass_samples() {
    // `leaks` begins its sampling in the first pass at a sixteenth of the trace, with the
    // boundary the finder would choose there, the records before it read again by a second
    // reader; where the final choice is the same (a steady loop) it needs no second pass.
    // What it says must be what a whole second pass says: a ring of the kinds program with its
    // leak, and the same program's whole trace (no ring).
    let ring = ring_trace("leaks-early", true);
    let long = tempdir("leaks-early-long").file("long.trace");
    assert_ok(&kinds_program_with(&long, 2000, true, &[], Vec::new()));
    for trace in [&*ring, &*long] {
        for report in ["leaks", "oom"] {
            let (early, _, times) = report_early_read(&[report, "--json"], trace, true);
            let (late, _, late_times) = report_early_read(&[report, "--json"], trace, false);
            assert_same(&early, &late, &format!("{report} of {}", trace.display()));
            if report == "leaks" {
                // The sampling begun in the first pass was used (as the command says), and
                // fewer records were decoded than a second pass decodes. Not a fraction of
                // them: the second reader of the first part reads at least 16,384 records and
                // whole batches, and on a loaded machine the writers leave more of the ring's
                // slots unused (a block older than 1 ms is given up), so the ring holds fewer
                // records and that part is a larger share of them (1.85 times in all where
                // 1.1 on an idle machine).
                let (early_used, said) = sampled_as_read(report, trace, true);
                let (late_used, _) = sampled_as_read(report, trace, false);
                assert!(
                    early_used && !late_used && times < late_times,
                    "{}: read {times} times its records (a second pass {late_times}): {said}",
                    trace.display()
                );
            }
        }
    }
}

/// Whether `gpushim REPORT --json TRACE` (`early`: the sampling begun in the first pass
/// allowed) says it used the leaks' sampling begun as the trace was read; what it said.
fn sampled_as_read(report: &str, trace: &Path, early: bool) -> (bool, String) {
    let mut c = Command::new(gpushim_bin());
    c.args([report, "--json", "--no-symbols"]).arg(trace);
    c.env("GPUSHIM_READS", "1");
    if !early {
        c.env("GPUSHIM_READ_EARLY", "0");
    }
    let out = c.output().unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    (
        err.contains("1 time(s) the leaks were sampled as the trace was read"),
        err,
    )
}

#[test]
fn leaks_begun_mid_step_choose_what_the_end_chooses() {
    // A sixteenth into a trace falls inside a step, where the step's later lines have one
    // allocation fewer than its earlier ones: the choice made there must be the one made at
    // the end (the step's first line), or the leaks are sampled again in a second pass. The
    // two-leak loop on the stand-in, 2,000 steps (about 34,000 records).
    let t = tempdir("leaks-mid-step").file("loop.trace");
    let lib = sim().dir.join("torch/lib/libc10_cuda.so");
    let args = vec![lib.display().to_string(), "2000".to_string()];
    assert_ok(&python_client(&t, "torch_leaks.py", args, vec![]));
    let (early, _, times) = report_early_read(&["leaks", "--json"], &t, true);
    let (late, _, late_times) = report_early_read(&["leaks", "--json"], &t, false);
    assert_same(&early, &late, "leaks of the two-leak loop");
    // The sampling begun in the first pass was used, as the command says; not told from the
    // records decoded: at this trace's size the second reader of its first part (16,384
    // records, half of it) decodes whole batches past it, as many as a second pass decodes
    // when the run's times spread its records out (a loaded machine).
    let (early_used, said) = sampled_as_read("leaks", &t, true);
    let (late_used, _) = sampled_as_read("leaks", &t, false);
    assert!(
        early_used && !late_used,
        "the sampling begun in the first pass was not used (read {times} times its records, \
         a second pass {late_times}): {said}"
    );
    let v: serde_json::Value = serde_json::from_slice(&early).unwrap();
    let b = v["iterations"]["boundary"].as_str().unwrap();
    assert!(b.contains("torch_leaks.py:39 in train"), "{b}");
}

#[test]
fn moments_taken_in_the_first_pass_are_those_the_second_takes() {
    // The summary's and the peak's moments (each device's peak, its tensors', NVML's, the last
    // allocation with Python frames) are taken as the first pass finds them, from a replay
    // kept behind it and rolled forward; what the reports say must be what taking them all in
    // a second pass says: on a real run's trace (the framework's segments claiming the raw
    // allocations that set a peak), a ring's, and one whose peak climbs at every allocation.
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let ring = ring_trace("read-early", true);
    let climb = tempdir("read-early-climb").file("climb.trace");
    let mut t = HandTrace::create(&climb);
    for i in 0..50_000u64 {
        t.call(RecordKind::Alloc, 0, 0, (1 << 40) + (i << 12), 4096);
    }
    drop(t);
    for trace in [gpt2.as_path(), &*ring, &*climb] {
        for report in ["summary", "peak"] {
            let (early, passes) = report_early(report, trace, true);
            let (late, late_passes) = report_early(report, trace, false);
            assert_eq!(passes, 1, "{report} of {}", trace.display());
            assert!(late_passes >= passes, "{report} of {}", trace.display());
            assert_same(&early, &late, &format!("{report} of {}", trace.display()));
        }
    }
}

#[test]
fn the_last_allocation_with_python_frames_is_taken_in_the_first_pass_near_the_end_only() {
    // The program's last allocation with Python frames is proposed at every one of them; the
    // first pass takes it only in the trace's last sixteenth (at least 65,536 records), where
    // a clean exit puts it. One earlier (70,000 tensors made at the end, then as many frees)
    // is taken in a second pass. Either way the summary says what taking
    // every moment in a second pass says, the kinds as the program's code ended among it.
    let near = tempdir("read-early-shutdown").file("near.trace");
    let far = tempdir("read-early-shutdown-far").file("far.trace");
    let shutdown = || ("KINDS_SHUTDOWN", "1".to_string());
    assert_ok(&kinds_program(&near, 3000, false, vec![shutdown()]));
    let tail = vec![shutdown(), ("KINDS_TAIL", "70000".to_string())];
    assert_ok(&kinds_program(&far, 20, false, tail));
    for (trace, want) in [(&*near, 1), (&*far, 2)] {
        let (records, _) = decode(trace);
        let (early, passes) = report_early("summary", trace, true);
        let (late, _) = report_early("summary", trace, false);
        let what = format!("summary of {} ({} records)", trace.display(), records.len());
        assert!(records.len() > 100_000, "{what}: too short to have a tail");
        assert_same(&early, &late, &what);
        assert_eq!(passes, want, "{what}");
        let v: serde_json::Value = serde_json::from_slice(&early).unwrap();
        let before = &v["framework"][0]["kinds_before_shutdown"]["kinds"];
        assert!(
            before.is_array(),
            "{what}: no kinds before the shutdown: {v}"
        );
    }
}

/// `gpushim REPORT --json TRACE`'s moments as it counted them: (taken as the trace was read,
/// taken at the first pass's end).
fn moments_taken(report: &str, trace: &Path) -> (u64, u64) {
    let out = Command::new(gpushim_bin())
        .args([report, "--json", "--no-symbols"])
        .arg(trace)
        .env("GPUSHIM_READS", "1")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let Some(line) = err.lines().find(|l| l.contains("moment(s) taken")) else {
        return (0, 0);
    };
    let mut n = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse::<u64>().unwrap());
    (n.next().unwrap(), n.next().unwrap())
}

#[test]
fn a_moment_is_taken_when_its_window_ends_not_at_the_end_of_the_pass() {
    // A moment taken at the end of the pass is still right (from the replay kept behind the
    // pass), but keeping that replay to the end costs its copy and a log of every record since:
    // a peak early in a long trace must be taken as its window ends. Here the peak is at the
    // 1000th of 41,000 records; in a trace that climbs to its last record, the window is cut
    // short and the moment is taken at the end.
    let early = tempdir("read-early-when").file("early.trace");
    let mut t = HandTrace::create(&early);
    for i in 0..1000u64 {
        t.call(RecordKind::Alloc, 0, 0, (1 << 40) + (i << 12), 4096);
    }
    for i in 0..1000u64 {
        t.call(RecordKind::Free, 0, 0, (1 << 40) + (i << 12), 0);
    }
    for _ in 0..19_500u64 {
        t.call(RecordKind::Alloc, 0, 0, 2 << 40, 64);
        t.call(RecordKind::Free, 0, 0, 2 << 40, 0);
    }
    drop(t);
    let climb = tempdir("read-early-when-climb").file("climb.trace");
    let mut t = HandTrace::create(&climb);
    for i in 0..5000u64 {
        t.call(RecordKind::Alloc, 0, 0, (1 << 40) + (i << 12), 4096);
    }
    drop(t);
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    // GPT-2's trace: the summary's moments (its tensors' peak, NVML's, the last allocation with
    // Python frames) and the peaks, all before the end of the run.
    for (report, trace) in [("peak", &*early), ("summary", &gpt2), ("peak", &gpt2)] {
        let (reading, at_end) = moments_taken(report, trace);
        let what = format!("{report} of {}", trace.display());
        assert!(
            reading >= 1,
            "{what}: no moment taken as the trace was read"
        );
        assert_eq!(at_end, 0, "{what}: a moment waited for the end of the pass");
    }
    let (reading, at_end) = moments_taken("peak", &climb);
    assert_eq!(reading, 0, "a peak at the last record taken before the end");
    assert!(at_end >= 1, "a peak at the last record not taken");
}

#[test]
fn a_peak_that_moves_too_often_to_copy_is_taken_in_a_second_pass() {
    // 40,000 allocations live, then a peak that moves every 70 records (a block freed, a
    // larger one made, 68 records of another thread's frees and allocations of nothing new):
    // each move outlasts its stack window, so each would cost a copy of the live set. The
    // first pass stops copying within its budget and the moment is taken in a second pass,
    // right: the first pass stays linear in what the trace holds.
    let path = tempdir("read-early-budget").file("moves.trace");
    let mut t = HandTrace::create(&path);
    let live = 40_000u64;
    for i in 0..live {
        t.call(RecordKind::Alloc, 0, 0, (1 << 40) + (i << 16), 4096);
    }
    let small = |k: u64| (2 << 40) + (k << 16);
    for k in 0..34u64 {
        t.call(RecordKind::Alloc, 0, 1, small(k), 1);
    }
    let moves = 3000u64;
    for m in 0..moves {
        let old = (1 << 40) + (m << 16);
        t.call(RecordKind::Free, 0, 0, old, 0);
        t.call(RecordKind::Alloc, 0, 0, old, 4096 * 2 + m);
        for k in 0..34u64 {
            t.call(RecordKind::Free, 0, 1, small(k), 0);
            t.call(RecordKind::Alloc, 0, 1, small(k), 1);
        }
    }
    drop(t);
    let (early, passes) = report_early("peak", &path, true);
    let (late, _) = report_early("peak", &path, false);
    assert_eq!(passes, 2, "every move was copied");
    assert_same(&early, &late, "peak");
    let v: serde_json::Value = serde_json::from_slice(&early).unwrap();
    let want = live * 4096 + 34 + (0..moves).map(|m| 4096 + m).sum::<u64>();
    assert_eq!(v[0]["live_bytes"].as_u64(), Some(want));
}

#[test]
fn the_pictures_bands_taken_in_the_first_pass_are_those_the_second_takes() {
    // The page's bands (each column's moment split by kind and line) are added in the first
    // pass as each allocation ends, beside the columns being found and merged two by two; the
    // page must be what adding them in a second pass gives, byte for byte: on a real run's
    // trace, a lapped ring of the kinds program with its leak (thousands of changes a lane, so
    // its columns are merged), and a whole trace of it.
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let ring = ring_trace("bands-early", true);
    let long = tempdir("bands-early-long").file("long.trace");
    assert_ok(&kinds_program_with(&long, 2000, true, &[], Vec::new()));
    let pages = tempdir("bands-early-pages").file("page");
    for (i, trace) in [gpt2.as_path(), &*ring, &*long].into_iter().enumerate() {
        let page = |early: bool| {
            let out = format!("{}-{i}-{early}.html", pages.display());
            let (_, _, times) = report_early_read(&["report", "-o", &out], trace, early);
            (std::fs::read(&out).unwrap(), times)
        };
        let ((early, times), (late, late_times)) = (page(true), page(false));
        assert!(
            early == late,
            "{}: the first pass's bands differ from the second's",
            trace.display()
        );
        // The real run's trace is shorter than the sixteenth the leaks read again.
        if i > 0 {
            assert!(
                times < late_times - 0.4,
                "{}: read {times} times a pass (a second pass: {late_times})",
                trace.display()
            );
        }
    }
}

#[test]
fn the_page_read_by_several_threads_is_the_page_read_by_one() {
    // Where there are cores for it, the trackers of a command asking for several reports are
    // groups, each on a thread with a replay and kinds of its own, sharing the same decoded
    // batches (GPUSHIM_READ_SPLIT=N: at most N groups wherever there is a second core; 0: one
    // group): up to one a report, the page's five (the summary, the peaks, the failures, the
    // iterations, the picture), `oom`'s two (its failures, and what grew until them). The
    // page (with what fits too), the saved analysis and `oom` must be the same to the byte,
    // the file decoded no more often, on a real run's trace, a ring's (a checkpoint restored
    // first) and a leaking loop's whole trace, also filtered (each reader filters as the
    // first).
    let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let ring = ring_trace("read-split", true);
    let long = tempdir("read-split").file("long.trace");
    assert_ok(&kinds_program_with(&long, 2000, true, &[], Vec::new()));
    let two_cores = std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    for trace in [gpt2.as_path(), &*ring, &*long] {
        for args in [
            ["report", "-o", "html", "--quiet"],
            // Filtered by time, not by thread: the thread numbered 0 is whichever wrote the
            // first record, at times the shim's own sampler rather than the program's.
            ["report", "-o", "html", "--from=1ms"],
            // What fits, its requests gathered by the first group beside its reports.
            ["report", "-o", "html", "--at=2"],
            ["analyze", "-o", "analysis", "--quiet"],
            ["oom", "--json", "", "--quiet"],
        ] {
            let read = |split: &str| {
                let out_file = long.with_file_name(format!("{split}.{}", args[2]));
                let mut c = Command::new(gpushim_bin());
                c.args([args[0], "--no-symbols", args[3]]).arg(trace);
                if args[1] == "-o" {
                    c.arg("-o").arg(&out_file);
                } else {
                    c.arg(args[1]);
                }
                c.env("GPUSHIM_READS", "1");
                c.env("GPUSHIM_READ_SPLIT", split);
                let out = c.output().unwrap();
                assert_ok(&out);
                let err = String::from_utf8_lossy(&out.stderr).to_string();
                let printed = if args[1] == "-o" {
                    std::fs::read(&out_file).unwrap()
                } else {
                    out.stdout
                };
                (printed, err)
            };
            let (one, said_one) = read("0");
            assert!(!said_one.contains("threads at once"), "{said_one}");
            // The copies are not decoding: the records read as often either way.
            let times = |s: &str| {
                s.lines()
                    .filter(|l| l.starts_with("gpushim: opened "))
                    .find_map(|l| l.split(": ").nth(2)?.split(' ').next()?.parse::<f64>().ok())
            };
            for (split, most) in [("2", 2), ("3", 3), ("5", 5)] {
                let threads = if args[0] == "oom" { most.min(2) } else { most };
                let (several, said) = read(split);
                let what = format!(
                    "{} {} of {} split {split}",
                    args[0],
                    args[3],
                    trace.display()
                );
                assert!(
                    several == one,
                    "{what}: {threads} threads read otherwise than one"
                );
                let paired = said.contains(&format!("read by {threads} threads at once"));
                assert_eq!(paired, two_cores, "{what}: {said}");
                assert_eq!(
                    times(&said),
                    times(&said_one),
                    "{what}: {said} / {said_one}"
                );
            }
        }
    }
}

#[test]
fn the_short_roads_read_what_the_long_roads_read() {
    // The trackers take a short road for the records of nearly every step (a call that
    // succeeded, its caller, its stack); every report must say the same as when every record
    // takes the long road (GPUSHIM_READ_SHORT=0): on real runs' traces, a lapped ring, and a
    // trace written by hand that mixes such records with those the short roads must leave to
    // the long (failed calls, the shim's own, a caller or a stack from a call's API, a null
    // address, an unknown free, a pool's note waiting for its stack, on several threads).
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let ring = ring_trace("read-short", true);
    let mixed = tempdir("read-short").file("mixed.trace");
    write_mixed(&mixed);
    let page = tempdir("read-short").file("page.html");
    let traces = [
        data.join("gpt2.trace"),
        data.join("oom.trace"),
        data.join("streams.trace"),
        ring.to_path_buf(),
        mixed.to_path_buf(),
    ];
    for trace in &traces {
        let run = |args: &[&str], short: bool| {
            let mut c = Command::new(gpushim_bin());
            c.args(args).arg(trace).arg("--no-symbols");
            if !short {
                c.env("GPUSHIM_READ_SHORT", "0");
            }
            let out = c.output().unwrap();
            assert_ok(&out);
            if args[0] == "report" {
                std::fs::read(&page).unwrap()
            } else {
                out.stdout
            }
        };
        let page_args = ["report", "-o", page.to_str().unwrap()];
        for args in [
            &["summary", "--json"][..],
            &["peak", "--json"],
            &["leaks", "--json"],
            &["oom", "--json"],
            &page_args,
        ] {
            let (short, long) = (run(args, true), run(args, false));
            assert!(
                short == long,
                "{args:?} of {}: the short roads read otherwise:\n{}\n{}",
                trace.display(),
                String::from_utf8_lossy(&short),
                String::from_utf8_lossy(&long)
            );
        }
    }
}

/// A trace of 400 steps whose calls that succeeded come among every record the short roads
/// must not take, chosen by a fixed sequence.
fn write_mixed(path: &Path) {
    use gpushim::trace::format::Api;
    let mut t = HandTrace::create(path);
    // A Python line's stack, as PyTorch's tensors have.
    let line = t.recorder.intern_string(b"train.py\0step");
    let (py, _) = t
        .recorder
        .intern_stack(&[gpushim::trace::format::py_frame(line, 7)]);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for step in 0..400u64 {
        let base = 1 << 40;
        for i in 0..6u64 {
            let thread = (i % 3) as u16;
            let ptr = base + (i << 20);
            t.call(RecordKind::Alloc, (i % 2) as u8, thread, ptr, (i + 1) << 20);
            t.rec_on(thread, RecordKind::Caller, Api::Shim, 0x1000 + i, 0x2000);
            t.rec_on(thread, RecordKind::StackRef, Api::Shim, 7 + i % 2, 3);
            let odd = next() % 12;
            match odd {
                0 => t.rec_on(thread, RecordKind::Caller, Api::CudaMalloc, 5, 6),
                1 => t.rec_on(thread, RecordKind::StackRef, Api::CudaMalloc, 9, 1),
                2 => t.rec_on(
                    thread,
                    RecordKind::Alloc,
                    Api::Shim,
                    base + (99 << 20),
                    4096,
                ),
                3 => t.call(RecordKind::Alloc, 0, thread, 0, 4096),
                4 => t.call(RecordKind::Free, 0, thread, 0xdead_0000, 0),
                5 => {
                    t.rec_on(thread, RecordKind::PoolStreams, Api::CudaMallocAsync, 3, 2);
                    t.rec_on(thread, RecordKind::StackRef, Api::Shim, 8, 3);
                }
                6 => t.failed_on(thread, RecordKind::Alloc, Api::CudaMalloc, 2, 1 << 50),
                // PyTorch's tensors: made with a Python line's stack and freed; refused; at a
                // null address; freed unknown; from a pluggable allocator; a Python stack
                // after no allocation.
                7 => {
                    let p = base + (200 << 20) + (i << 12);
                    t.rec_on(thread, RecordKind::TensorAlloc, Api::Torch, p, 512 << i);
                    t.rec_on(thread, RecordKind::StackRef, Api::Shim, py, 1);
                    if step % 3 != 0 {
                        t.rec_on(thread, RecordKind::TensorFree, Api::Torch, p, 0);
                    }
                }
                8 => {
                    t.failed_on(thread, RecordKind::TensorAlloc, Api::Torch, 2, 1 << 40);
                    t.rec_on(thread, RecordKind::StackRef, Api::Shim, py, 1);
                }
                9 => {
                    t.rec_on(thread, RecordKind::TensorAlloc, Api::Torch, 0, 4096);
                    t.rec_on(thread, RecordKind::StackRef, Api::Shim, py, 1);
                }
                10 => {
                    t.rec_on(thread, RecordKind::TensorFree, Api::Torch, 0xbeef_0000, 0);
                    let p = base + (300 << 20) + (i << 12);
                    t.rec_on(thread, RecordKind::TensorAlloc, Api::Pluggable, p, 8192);
                    t.rec_on(thread, RecordKind::StackRef, Api::Shim, py, 1);
                    t.rec_on(thread, RecordKind::TensorFree, Api::Pluggable, p, 0);
                }
                _ => t.rec_on(thread, RecordKind::StackRef, Api::Shim, py, 1),
            }
        }
        if step % 50 == 0 {
            t.call(RecordKind::Alloc, 0, 0, base + ((100 + step) << 20), 4096);
        }
        for i in (0..6u64).rev() {
            t.call(
                RecordKind::Free,
                (i % 2) as u8,
                (i % 3) as u16,
                base + (i << 20),
                0,
            );
        }
    }
}

#[test]
fn the_moments_copy_the_replay_within_their_budget_whatever_the_threads() {
    // The kinds program starts a thread a step, and each of its allocations with Python frames
    // is the summary's candidate for the last one before the shutdown: the replay's tables by
    // thread grow with the run, and a copy of the replay for a moment costs them too. The
    // copies must stay within the moments' budget (4 Mi entries, and 4 a record read) counted
    // with what they cost; made as if only the live set cost, they cost the threads squared
    // (this run: 47 million entries in 9,280 copies, where 131 thousand in 38).
    let path = tempdir("copies").file("threads.trace");
    assert_ok(&kinds_program_with(&path, 6000, false, &[], Vec::new()));
    let (line, out) = said(&["summary"], &path, &[], "the moments copied the replay ");
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [copies, copied] = n[..] else {
        panic!("two figures in: {line}");
    };
    let records: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("trace: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no count of records in: {out}"));
    assert!(copies > 0, "{line}");
    assert!(
        copied <= (1 << 22) + 4 * records,
        "the moments' copies cost {copied} entries for {records} records: {line}"
    );
}

#[test]
fn a_replay_read_apart_from_the_reports_reads_the_file_they_read() {
    // A filter, or a lapped ring read from its newer checkpoint, reads what a replay of
    // PyTorch's allocator cannot take its requests from (it reads every device's tensors, from
    // the older checkpoint): the replay reads the trace again, by the descriptor the reports
    // opened it with, not by its name; and the filter's check (which reads until the first
    // allocation it keeps) reads the file the command opened first too. So `oom`, `summary
    // --at` and `fit` of one device open the trace once (they opened it four, three and three
    // times, each by its name).
    let ring = tempdir("read-once-apart").file("ring.trace");
    // The program runs out of memory, its leak grown past the device.
    let out = kinds_program_with(
        &ring,
        6000,
        true,
        &["--batch-size", "2"],
        vec![("GPUSHIM_CONF", "trace_max:4MiB".into())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("out of memory"), "{err}");
    let ((opened, _), printed) = reads(&["oom", "--device", "0"], &ring);
    assert_eq!(opened, 1, "{printed}");
    assert!(
        printed.contains("PyTorch's allocator replayed up to the failed request"),
        "no replay's advice: {printed}"
    );
    for args in [
        &["summary", "--at", "2", "--device", "0"][..],
        &["fit", "--at", "2", "--device", "0"],
    ] {
        let ((opened, passes), printed) = reads(args, &ring);
        assert_eq!(
            opened, 1,
            "{args:?} opened the trace {opened} times: {printed}"
        );
        // With `fit`'s leak check, `leaks`'s sampler reading beside the first pass.
        assert!(passes <= 4, "{args:?} read the trace {passes} times");
        assert!(printed.contains("batch"), "{args:?}: {printed}");
    }
    // A job's traces, what fits beside each: each trace's requests read after its analysis
    // (one trace's held at a time), by the descriptor its analysis opened.
    let other = ring.with_file_name("other.trace");
    std::fs::copy(&*ring, &other).unwrap();
    let job = ["summary", "--at", "2", other.to_str().unwrap()];
    let ((opened, _), printed) = reads(&job, &ring);
    assert_eq!(opened, 2, "two traces opened {opened} times: {printed}");
    assert_eq!(
        printed.matches("the largest that fits").count(),
        2,
        "{printed}"
    );
}

#[test]
fn a_trace_read_again_is_the_file_first_opened_whatever_its_name_names_since() {
    // Another trace renamed over the first's name while it is read: a read of it again (as a
    // replay reads apart from the reports) reads the file first opened, not the one its name
    // now names.
    use gpushim::trace::reader::{ReadOptions, TraceReader};
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let path = tempdir("read-again").file("run.trace");
    let other = path.with_file_name("other.trace");
    std::fs::copy(data.join("gpt2.trace"), &path).unwrap();
    std::fs::copy(data.join("oom.trace"), &other).unwrap();
    let count = |r: TraceReader| r.count() as u64;
    let first = TraceReader::open(&*path).unwrap();
    let gpt2 = (first.info().claimed, first.info().pid);
    std::fs::rename(&other, &*path).unwrap();
    let renamed = TraceReader::header(&*path).unwrap();
    assert_ne!((renamed.claimed, renamed.pid), gpt2, "two traces alike");
    let again = first.reopen_with(&ReadOptions::default()).unwrap();
    assert_eq!((again.info().claimed, again.info().pid), gpt2);
    let read_again = count(again);
    assert_eq!(
        read_again,
        count(first),
        "read again: not the records first read"
    );
    assert_ne!(read_again, count(TraceReader::open(&*path).unwrap()));
}

#[test]
fn a_trace_read_as_it_is_written_reads_what_a_whole_read_of_it_reads() {
    // `top` reads on from where its last refresh stopped. A program's writers claim blocks of
    // slots and fill them as their records come, and leave a block's rest unused when they go
    // idle (zeros, as a slot not yet written reads): a slot not written at a look is waited
    // for, unless it was claimed a settling time before an earlier look (then it is unused). Once the program has ended, the last look reads to the end. The records, in
    // their order, are those a whole read of the finished trace reads.
    use gpushim::trace::format::Api;
    use gpushim::trace::reader::{Look, ReadOptions, SETTLED_AFTER, TraceReader};
    let dir = tempdir("follow");
    let path = dir.join("live.trace");
    // Written by this process under another host's name: the reader takes it for running.
    let mut t = HandTrace::create(&path);
    let mut follower = TraceReader::open_following(&path, &ReadOptions::default()).unwrap();
    let key = |r: &gpushim::trace::format::Record| (r.kind as u8, r.ptr, r.time_ns, r.thread);
    let mut followed = Vec::new();
    let read_on = |f: &mut TraceReader, into: &mut Vec<_>| {
        assert_eq!(f.look().unwrap(), Look::Read);
        let mut batch = Vec::new();
        while f.next_batch(&mut batch) {
            into.extend(batch.iter().map(key));
        }
    };
    let mut read_while_running = Vec::new();
    for phase in 0..6u64 {
        for i in 0..3000u64 {
            let ptr = 0x1000_0000 * (phase + 1) + 0x1000 * i;
            let thread = (i % 3) as u16;
            t.rec_on(thread, RecordKind::Alloc, Api::CudaMalloc, ptr, 4096);
            if i % 500 == 499 {
                // The threads idle past a block's age: the rest of their blocks stay unused.
                t.wait(5_000_000);
            }
            if i % 2 == 1 {
                t.rec_on(thread, RecordKind::Free, Api::CudaFree, ptr - 0x1000, 0);
            }
            if i == 1700 {
                // A look while the threads' blocks are part written: the rest of each is
                // written after it, into slots claimed before it.
                read_on(&mut follower, &mut followed);
            }
        }
        // Past the reorder window, so that the phase's records can be handed on.
        t.wait(30_000_000);
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x9000_0000 + phase, 64);
        read_on(&mut follower, &mut followed);
        // Looks a settling time apart until the phase's records are handed on: on a loaded
        // machine one look after one settling time may come before the reader has seen the
        // unused slots twice (a fixed number of looks made this test fail under load).
        let before = read_while_running.last().copied().unwrap_or(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            std::thread::sleep(SETTLED_AFTER);
            read_on(&mut follower, &mut followed);
            if followed.len() > before + 4000 || std::time::Instant::now() > deadline {
                break;
            }
        }
        assert!(follower.writing());
        read_while_running.push(followed.len());
    }
    // Each phase's records were read as it ended, not all at the end.
    assert!(
        read_while_running.windows(2).all(|w| w[1] > w[0] + 4000),
        "{read_while_running:?}"
    );
    t.recorder.mark_clean_exit();
    read_on(&mut follower, &mut followed);
    assert!(!follower.writing());
    let whole: Vec<_> = TraceReader::open(&path).unwrap().map(|r| key(&r)).collect();
    assert!(whole.len() > 6 * 4500, "{}", whole.len());
    assert_eq!(followed.len(), whole.len());
    assert_eq!(followed, whole);
    assert!(follower.stats().unused > 0, "no block was left unused");
}

#[test]
fn a_ring_that_laps_past_what_a_follower_has_not_read_is_said_to_have() {
    // Between two refreshes of `top` a small ring can be written over more than once: the
    // records not yet read are gone, and the look says so (`top` then reads the ring anew),
    // rather than reading the slots' newer records as the older ones.
    use gpushim::trace::reader::{Look, ReadOptions, TraceReader};
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempdir("follow-ring");
    let path = dir.join("ring.trace");
    let r = ring_recorder(&path, 2 << 20);
    let stop = AtomicBool::new(false);
    let at = std::sync::atomic::AtomicU64::new(0);
    // Records until the ring has claimed `n` slots in all (the summarizer keeps up with it).
    let write_to = |n: u64| {
        while TraceReader::header(&path).unwrap().claimed < n {
            for _ in 0..1000 {
                let t = at.fetch_add(1000, Ordering::Relaxed) + 1000;
                let rec = record_at(
                    RecordKind::Alloc,
                    gpushim::trace::format::Api::CudaMalloc,
                    0,
                    0,
                    t,
                    0x1000 + t,
                    64,
                );
                r.append(&rec);
            }
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        write_to(1000);
        let mut follower = TraceReader::open_following(&path, &ReadOptions::default()).unwrap();
        assert_eq!(follower.look().unwrap(), Look::Read);
        let capacity = follower.info().capacity;
        assert!(capacity > 1000);
        write_to(2 * capacity + 5000);
        assert_eq!(follower.look().unwrap(), Look::Lapped);
        stop.store(true, Ordering::Relaxed);
    });
}

#[test]
fn a_job_of_more_traces_than_sixty_four_opens_each_once() {
    // A command keeps the descriptor each trace name first opened, so that its later reads of
    // the name (here `export`'s check of its filter, then its export) read that file: up to
    // a quarter of
    // the descriptors the process may have open (64 names before, whatever the limit), so a
    // job of 80 ranks' traces opens 80 files, not 128.
    use gpushim::trace::format::Api;
    let dir = tempdir("job-of-80");
    let paths: Vec<_> = (0..80u64)
        .map(|rank| {
            let p = dir.join(format!("rank{rank}.trace"));
            let mut t = HandTrace::create(&p);
            t.rec(
                RecordKind::Alloc,
                Api::CudaMalloc,
                0x1000 * (rank + 1),
                4096,
            );
            p
        })
        .collect();
    // Under the usual limit of 1,024 descriptors, whatever this machine's.
    let out = Command::new("prlimit")
        .arg("--nofile=1024")
        .arg(gpushim_bin())
        .args(["export", "--format", "perfetto", "--device", "0", "-o"])
        .arg(dir.join("job.json"))
        .args(&paths)
        .env("GPUSHIM_READS", "1")
        .output()
        .unwrap();
    assert_ok(&out);
    let said = stderr(&out);
    assert!(said.contains("opened 80 trace file(s)"), "{said}");
}

#[test]
fn a_look_in_the_middle_of_a_followed_read_loses_no_record() {
    // The first read of a followed trace decodes on a thread of its own, batches ahead of the
    // reader: a look before those are read goes on with them, not without.
    use gpushim::trace::format::Api;
    use gpushim::trace::reader::{Look, ReadOptions, TraceReader};
    let dir = tempdir("follow-mid");
    let path = dir.join("live.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..200_000u64 {
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000 * (i + 1), 4096);
    }
    t.wait(50_000_000);
    t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x9000_0000, 64);
    let mut f = TraceReader::open_following(&path, &ReadOptions::default()).unwrap();
    let mut batch = Vec::new();
    assert!(f.next_batch(&mut batch));
    let mut read = batch.len();
    assert!(read < 200_000, "the first batch is small: {read}");
    assert_eq!(f.look().unwrap(), Look::Read);
    while f.next_batch(&mut batch) {
        read += batch.len();
    }
    // All but the last record, which the reorder window keeps while the program writes.
    assert_eq!(read, 200_000);
}

#[test]
fn a_filtered_report_reads_its_trace_once_and_refuses_a_filter_that_keeps_nothing() {
    // 50,000 allocations and their frees on device 0, then one allocation on device 1 at the end:
    // a filter for device 1 keeps its first allocation only at the trace's end, so checking
    // the filter by a read of its own before the analysis read the trace twice.
    let dir = tempdir("filtered-once");
    let path = dir.join("late.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..50_000u64 {
        t.call(RecordKind::Alloc, 0, 0, 0x1000 * (i + 1), 4096);
        t.call(RecordKind::Free, 0, 0, 0x1000 * (i + 1), 0);
    }
    t.call(RecordKind::Alloc, 1, 0, 0x9000_0000, 8 << 20);
    drop(t);
    let page = tempdir("filtered-once-page").file("page.html");
    let svg = tempdir("filtered-once-svg").file("mem.svg");
    let (page, svg) = (page.to_str().unwrap(), svg.to_str().unwrap());
    let other = path.to_str().unwrap();
    // Each command without the filter, then with it: the filter adds no read.
    for args in [
        &["summary"][..],
        &["peak"],
        &["leaks"],
        &["oom"],
        &["report", "-o", page],
        &["plot", "-o", svg],
        &["diff", other],
    ] {
        let ((opened, whole), _) = reads(args, &path);
        let filtered = [&args[..1], &["--device", "1"], &args[1..]].concat();
        let ((opened_filtered, passes), printed) = reads(&filtered, &path);
        assert_eq!((opened, opened_filtered), (1, 1), "{args:?}");
        assert!(
            passes <= whole,
            "{args:?}: {passes} passes with the filter, {whole} without"
        );
        if matches!(args[0], "summary" | "peak") {
            assert_eq!(passes, 1, "{args:?}");
        }
        if args[0] == "summary" {
            assert!(printed.contains("8.00 MiB"), "{printed}");
        }
    }
    // Device 7 has nothing: each command refuses with what the trace holds, as the check
    // before did.
    for args in [
        &["summary", "--device", "7"][..],
        &["peak", "--device", "7"],
        &["leaks", "--device", "7"],
        &["oom", "--device", "7"],
        &["report", "--device", "7", "-o", page],
        &["plot", "--device", "7", "-o", svg],
        &["diff", "--device", "7", other],
        &["events", "--device", "7"],
    ] {
        let o = Command::new(gpushim_bin())
            .args(args)
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains("the filters keep no allocation")
                && err.contains("device 0, 1")
                && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_moment_settling_its_kinds_looks_only_at_the_records_that_can_settle_them() {
    // The kinds program keeps a cuBLAS workspace from its first step to its end: a workspace is
    // known only by never being freed, so every moment holding it settles its kinds at the end
    // of the trace. Until then its kinds move only as a run of the forward, the backward or
    // the optimizer begins, or as a tensor it waits on is freed: it looked at every tensor
    // freed, some two fifths of the records, where it now looks at about one in ten.
    let trace = tempdir("read-moment-awaits").file("kinds.trace");
    assert_ok(&kinds_program(&trace, 3000, false, vec![]));
    let (records, _) = decode(&trace);
    for report in ["summary", "peak"] {
        let (line, _) = said(&[report], &trace, &[], "the moments being taken looked at ");
        let looked: u64 = line
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count in: {line}"));
        let what = format!("{report}: {looked} of {} records looked at", records.len());
        assert!(
            looked > 0,
            "{what}: no moment settled as the trace was read"
        );
        assert!(looked * 5 < records.len() as u64, "{what}");
        // Still the answer a second pass gives.
        let (early, _) = report_early(report, &trace, true);
        let (late, _) = report_early(report, &trace, false);
        assert_same(&early, &late, &what);
        let v: serde_json::Value = serde_json::from_slice(&early).unwrap();
        assert!(
            v.to_string().contains("workspace"),
            "{what}: no workspace held, so nothing waits to the end: {v}"
        );
    }
}
