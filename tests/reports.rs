//! The reports on a trace made by running a client under the shim on the simulator
//! (`tests/clients/leaky.c`: NVTX "step" iterations, 512 KiB leaked per step from leak(), a
//! 200 MiB spike from spike() in step 6, one allocation on device 1, one failed 64 GiB request).
//! Reports agree with each other and with themselves: the same trace gives the same answer,
//! call sites that read alike stay apart, and what-if replays match the run.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use std::process::Command;

#[test]
fn leaks_names_the_call_site_that_grows_every_iteration_and_by_how_much() {
    let l = leaky();
    let v = report_json(&["leaks"], &[&l.trace]);
    let it = &v["iterations"];
    assert_eq!(it["boundary"], "NVTX 'step'");
    assert_eq!(it["count"], 12);
    let growing = it["growing"].as_array().unwrap();
    assert_eq!(growing.len(), 1, "{growing:?}");
    assert_eq!(growing[0]["bytes_per_iteration"], 512 * 1024);
    let site = growing[0]["call_site"].as_str().unwrap();
    assert!(in_function(site, &l.leak_fn), "{site} is not in leak()");
    // At exit: the 12 leaked blocks and the device-1 allocation.
    assert_eq!(v["live_at_exit_bytes"], 12 * 512 * 1024 + (8 << 20));
}

#[test]
fn peak_attributes_the_peak_to_the_spike_and_its_nvtx_range() {
    let l = leaky();
    let v = report_json(&["peak"], &[&l.trace]);
    let peaks = v.as_array().unwrap();
    assert_eq!(peaks.len(), 2, "one peak per device");
    let d0 = &peaks[0];
    assert_eq!(d0["device"], 0);
    // Step 6: activations of 1+2+3+4 MiB, 7 leaked blocks, and the spike.
    assert_eq!(
        d0["live_bytes"],
        (10u64 << 20) + 7 * 512 * 1024 + (200 << 20)
    );
    let top = &d0["by_call_site"][0];
    assert_eq!(top["bytes"], 200u64 << 20);
    assert!(
        in_function(top["label"].as_str().unwrap(), &l.spike_fn),
        "{top}"
    );
    assert_eq!(d0["by_range"][0]["label"], "step");
    assert_eq!(peaks[1]["live_bytes"], 8u64 << 20);
}

#[test]
fn oom_explains_the_failed_request() {
    let l = leaky();
    let v = report_json(&["oom"], &[&l.trace]);
    let ooms = v.as_array().unwrap();
    assert_eq!(ooms.len(), 1);
    let o = &ooms[0];
    assert_eq!(o["requested_bytes"], 64u64 << 30);
    assert_eq!(o["status"], 2);
    assert_eq!(o["live_bytes"], 12 * 512 * 1024);
    assert!(in_function(
        o["holders"][0]["label"].as_str().unwrap(),
        &l.leak_fn
    ));
}

#[test]
fn reports_refuse_files_that_are_not_traces_and_name_the_problem() {
    let dir = tempdir("reports-bad");
    let bad = dir.join("bad.trace");
    std::fs::write(&bad, vec![7u8; 10_000]).unwrap();
    let short = dir.join("short.trace");
    std::fs::write(&short, b"GPUSHIM").unwrap();
    for cmd in ["leaks", "peak", "oom", "plot", "flamegraph"] {
        for (f, says) in [(&bad, "not a gpushim trace"), (&short, "shorter than")] {
            let o = gpushim(&[&cmd, &f]);
            assert_eq!(o.status.code(), Some(2), "{cmd}");
            assert!(stderr(&o).contains(says), "{cmd}: {}", stderr(&o));
        }
    }
}

#[test]
fn a_trace_cut_short_still_reports_what_it_holds() {
    let l = leaky();
    let bytes = std::fs::read(&l.trace).unwrap();
    let cut = l.trace.with_extension("cut.trace");
    // The header and the first 2,000 records.
    std::fs::write(&cut, &bytes[..4096 + 2000 * 32]).unwrap();
    let v = report_json(&["leaks"], &[&cut]);
    assert!(v["live_at_exit_bytes"].as_u64().is_some());
    assert_eq!(v["clean_exit"], true, "the header says the process exited");
}

#[test]
fn diff_shows_the_growth_between_two_runs() {
    let a = leaky();
    let short = leaky_steps("reports-diff", 4);
    let o = gpushim(&[&"diff", &"--json", &short.trace, &a.trace]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sites = v["call_sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1, "only the leak differs: {sites:?}");
    assert_eq!(sites[0]["a"], 4 * 512 * 1024);
    assert_eq!(sites[0]["b"], 12 * 512 * 1024);
}

#[test]
fn summary_reports_each_trace_and_the_set_combined() {
    let a = leaky();
    let b = leaky();
    let v = report_json(&["summary"], &[&a.trace]);
    let d0 = &v["devices"][0];
    assert_eq!(
        d0["peak_live_bytes"],
        (10u64 << 20) + 7 * 512 * 1024 + (200 << 20)
    );
    assert_eq!(d0["ooms"], 1);
    assert!(d0["peak_reserved_bytes"].as_u64().unwrap() >= d0["peak_live_bytes"].as_u64().unwrap());
    // The pool's own records are not counted as calls of the program.
    assert!(
        v["apis"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["api"] != "gpushim")
    );
    let o = gpushim(&[&"summary", &a.trace, &b.trace, &"--json"]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["traces"].as_array().unwrap().len(), 2);
    let c = &v["combined"];
    assert_eq!(c["traces"], 2);
    assert_eq!(
        c["sum_of_peaks_bytes"],
        2 * ((10u64 << 20) + 7 * 512 * 1024 + (200 << 20))
    );
    assert_eq!(c["failed_for_memory"], 2);
}

#[test]
fn peak_and_leaks_over_several_ranks_answer_per_rank_and_for_the_job() {
    // Two "ranks" of the same program, one running longer.
    let a = leaky_steps("rank0", 12);
    let b = leaky_steps("rank1", 8);
    let v = report_json(&["peak"], &[&a.trace, &b.trace]);
    let ranks = v["traces"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    // Each rank has a peak per device (the client touches devices 0 and 1).
    let peaks = |r: &serde_json::Value| -> Vec<u64> {
        let devices = r["report"].as_array().unwrap();
        devices
            .iter()
            .map(|d| d["live_bytes"].as_u64().unwrap())
            .collect()
    };
    let all: Vec<u64> = ranks.iter().flat_map(peaks).collect();
    assert_eq!(all.len(), 4);
    let c = &v["combined"];
    assert_eq!(c["sum_of_peaks"], all.iter().sum::<u64>());
    assert_eq!(c["largest_bytes"], *all.iter().max().unwrap());
    // The 200 MiB spike is live at both peaks: 400 MiB from that one call site in the job.
    let top = &c["by_call_site"][0];
    assert!(
        in_function(top["label"].as_str().unwrap(), &a.spike_fn),
        "{top}"
    );
    assert_eq!(
        (top["bytes"].as_u64(), top["allocations"].as_u64()),
        (Some(400 << 20), Some(2))
    );

    let v = report_json(&["leaks"], &[&a.trace, &b.trace]);
    assert_eq!(v["traces"].as_array().unwrap().len(), 2);
    let growing = v["combined"]["growing"].as_array().unwrap();
    let leak = growing
        .iter()
        .find(|g| in_function(g["call_site"].as_str().unwrap(), &a.leak_fn))
        .unwrap_or_else(|| panic!("the leak is not named: {growing:?}"));
    // It grows in both ranks, 512 KiB per iteration each.
    assert_eq!(leak["traces"], 2);
    assert_eq!(leak["bytes_per_iteration"], 2 * 512 * 1024);
}

#[test]
fn call_sites_are_named_by_function_and_without_symbols_by_module_offset() {
    let l = leaky();
    let named = report_json(&["peak"], &[&l.trace]);
    let label = named[0]["by_call_site"][0]["label"].as_str().unwrap();
    // The innermost frames: spike() called from main(), named from the symbol table.
    assert!(
        label.starts_with("spike (leaky+0x") && label.contains(" < main (leaky+0x"),
        "{label}"
    );
    let out = gpushim(&[&"peak", &"--no-symbols", &"--json", &l.trace]);
    assert_ok(&out);
    let raw: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let label = raw[0]["by_call_site"][0]["label"].as_str().unwrap();
    assert!(label.starts_with("leaky+0x"), "{label}");
    assert!(in_function(label, &l.spike_fn), "{label}");
}

#[test]
fn every_report_takes_the_filters_and_bad_ones_are_named() {
    let l = leaky();
    let json = |args: &[&str]| -> serde_json::Value { report_json(args, &[&l.trace]) };
    // Device 1 holds one 8 MiB allocation.
    let s = json(&["summary", "--device", "1"]);
    let devices = s["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["device"], 1);
    assert_eq!(devices[0]["peak_live_bytes"], 8 << 20);
    // Inside the "step" range only: nothing outside it is live at the peak.
    let p = json(&["peak", "--range", "step"]);
    let ranges = p[0]["by_range"].as_array().unwrap();
    assert!(ranges.iter().all(|h| h["label"] == "step"), "{ranges:?}");
    assert!(!ranges.is_empty());
    // Nothing was allocated in the first nanosecond: the window keeps nothing, which is an
    // error that names what the trace holds, not a report of no leak.
    let empty = gpushim(&[&"leaks", &"--to", &"1ns", &"--json", &l.trace]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(
        stderr(&empty).contains("keep no allocation"),
        "{}",
        stderr(&empty)
    );
    // The leak goes on to the end: a window from the middle of the run keeps some of its
    // blocks, not all.
    let all = json(&["leaks"])["live_at_exit_bytes"].as_u64().unwrap();
    let events = gpushim(&[&"events", &"--json", &l.trace]);
    assert_ok(&events);
    // The time of the seventh of the twelve leaked blocks.
    let middle = stdout(&events)
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|e| e["kind"] == "alloc" && e["size"] == 512 * 1024)
        .nth(6)
        .map(|e| e["time_ns"].as_u64().unwrap())
        .unwrap();
    let late = json(&["leaks", "--from", &format!("{middle}ns")])["live_at_exit_bytes"]
        .as_u64()
        .unwrap();
    // From it on: six leaked blocks, and the 8 MiB on device 1 made after the loop.
    assert_eq!(late, 6 * 512 * 1024 + (8 << 20), "{late} of {all}");
    for (args, says) in [
        (vec!["summary", "--from", "12"], "no unit"),
        (
            vec!["summary", "--from", "2ms", "--to", "1ms"],
            "window is empty",
        ),
    ] {
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
        all.extend(args.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>));
        all.push(&l.trace);
        let out = gpushim(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
    }
}

/// The leaky client on the simulator, slowed so that `top` sees it run (every allocation and
/// free takes 15 ms: about a second), tracing to `t`; once its trace is there.
fn slow_leaky(t: &std::path::Path) -> std::process::Child {
    let child = command(
        &sim().bin("leaky"),
        Run {
            preload: true,
            trace: Some(t),
            env: vec![
                ("GPUSHIM_SIM_LATENCY_US", "15000".into()),
                ("NVTX_INJECTION64_PATH", shim().display().to_string()),
            ],
            args: vec!["12".into()],
        },
    )
    .stdout(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let start = std::time::Instant::now();
    while !t.exists() && start.elapsed().as_secs() < 20 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(t.exists(), "the client wrote no trace");
    child
}

#[test]
fn top_watches_a_running_process_until_it_exits() {
    let dir = tempdir("top");
    let t = dir.join("slow.trace");
    let mut child = slow_leaky(&t);
    let out = gpushim(&[&"top", &"--interval", &"100ms", &t]);
    assert_ok(&out);
    assert!(child.wait().unwrap().success());
    let s = stdout(&out);
    let headers: Vec<&str> = s.lines().filter(|l| l.starts_with("leaky (pid")).collect();
    // Several refreshes while it ran, and a last one once it had exited.
    assert!(headers.len() >= 3, "{s}");
    assert!(headers[0].contains("running"), "{s}");
    assert!(headers.last().unwrap().contains("exited"), "{s}");
    assert!(s.contains("live now, by call site:"));
}

/// `top` with a filter that keeps nothing (yet: its program may allocate later) shows nothing
/// live, reading on or reading the whole trace (`GPUSHIM_TOP_WHOLE=1`), where the other
/// reports refuse such a filter.
#[test]
fn top_with_a_filter_that_keeps_nothing_shows_nothing_live_either_way() {
    // Not refused (the program may yet allocate on that device), but said.
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let top = |whole: bool, device: &str| {
        let mut c = Command::new(gpushim_bin());
        c.args(["top", "--count", "1", "--device", device])
            .arg(&trace);
        if whole {
            c.env("GPUSHIM_TOP_WHOLE", "1");
        }
        c.output().unwrap()
    };
    let said = "the filters (--device, --thread, --stream, --from, --to, --range) keep no \
                allocation of the run";
    for device in ["7", "0"] {
        let (on, whole) = (top(false, device), top(true, device));
        assert_ok(&on);
        assert_ok(&whole);
        assert_eq!(stdout(&on), stdout(&whole));
        let out = stdout(&on);
        assert!(out.contains("live now, by call site:"), "{out}");
        assert_eq!(
            out.contains(said),
            device == "7",
            "--device {device}: {out}"
        );
    }
    let summary = Command::new(gpushim_bin())
        .args(["summary", "--device", "7"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(summary.status.code(), Some(2));
}

#[test]
fn top_reads_a_running_trace_once_and_ends_where_a_whole_read_ends() {
    // Each refresh reads only what was written since the last, with a filter too: one pass in
    // all, however many refreshes; the last refresh, once the
    // program has exited, shows what a whole read of the finished trace shows. Read again
    // whole at each refresh (GPUSHIM_TOP_WHOLE=1, as before), one pass a refresh.
    for (whole, filter) in [(false, None), (true, None), (false, Some("--device=0"))] {
        let dir = tempdir(match (whole, filter) {
            (true, _) => "top-whole",
            (false, None) => "top-on",
            (false, Some(_)) => "top-on-filtered",
        });
        let t = dir.join("slow.trace");
        let mut child = slow_leaky(&t);
        let mut top = Command::new(gpushim_bin());
        top.args(["top", "--interval", "100ms"]).arg(&t);
        top.args(filter);
        top.env("GPUSHIM_READS", "1");
        if whole {
            top.env("GPUSHIM_TOP_WHOLE", "1");
        }
        let out = top.output().unwrap();
        assert_ok(&out);
        assert!(child.wait().unwrap().success());
        let s = stdout(&out);
        let refreshes: Vec<&str> = s.split("\n\n").collect();
        assert!(refreshes.len() >= 3, "{s}");
        assert!(refreshes[0].contains("running"), "{s}");
        let last = refreshes.last().unwrap();
        assert!(last.contains("exited"), "{s}");
        let passes = if whole { refreshes.len() } else { 1 };
        let said = format!("read {passes} pass(es)");
        assert!(stderr(&out).contains(&said), "{said}: {}", stderr(&out));
        // The finished trace read whole.
        let after = Command::new(gpushim_bin())
            .args(["top", "--count", "1"])
            .arg(&t)
            .args(filter)
            .env("GPUSHIM_TOP_WHOLE", "1")
            .output()
            .unwrap();
        assert_ok(&after);
        assert_eq!(last.trim_end(), stdout(&after).trim_end());
    }
}

/// NVTX start/end ranges (`nvtxRangeStartA`/`nvtxRangeEnd`, which belong to no thread) mark
/// iterations for `leaks` and narrow reports with `--range`, as push/pop ranges do: five
/// "step" ranges, each leaking 1 MiB made on another thread than the one that started it, and
/// one allocation outside any range.
#[test]
fn start_end_ranges_mark_iterations_and_narrow_reports() {
    use gpushim::trace::format::{Api, RecordKind};
    let dir = tempdir("startend");
    let path = dir.join("se.trace");
    let mut t = HandTrace::create(&path);
    let step = t.recorder.intern_string(b"step");
    for i in 0..5u64 {
        t.rec_on(0, RecordKind::RangeStart, Api::Nvtx, step, 100 + i);
        t.rec_on(
            1,
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x100_0000 * (i + 1),
            1 << 20,
        );
        t.rec_on(1, RecordKind::Alloc, Api::CudaMalloc, 0x9000_0000, 4096);
        t.rec_on(1, RecordKind::Free, Api::CudaFree, 0x9000_0000, 0);
        t.rec_on(2, RecordKind::RangeEnd, Api::Nvtx, 0, 100 + i);
    }
    t.rec_on(1, RecordKind::Alloc, Api::CudaMalloc, 0xa000_0000, 8192);
    drop(t);
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(gpushim_bin())
            .args(args)
            .arg("--json")
            .arg(&path)
            .output()
            .unwrap();
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let leaks = |extra: &[&str]| json(&[&["leaks"], extra].concat());
    let all = leaks(&[]);
    let it = &all["iterations"];
    assert_eq!(it["boundary"], "NVTX 'step'", "{all}");
    assert_eq!(it["count"], 5, "{all}");
    assert_eq!(it["growing"][0]["bytes_per_iteration"], 1 << 20, "{all}");
    assert_eq!(all["live_at_exit_bytes"], 5 * (1 << 20) + 8192, "{all}");
    let inside = leaks(&["--range", "step"]);
    assert_eq!(inside["live_at_exit_bytes"], 5 * (1 << 20), "{inside}");
    // The peak's holders by range: the allocations made while "step" was open, on any thread.
    let peak = json(&["peak"]);
    let by_range = &peak[0]["by_range"];
    assert_eq!(by_range[0]["label"], "step", "{peak}");
    assert_eq!(by_range[0]["bytes"], 5 * (1 << 20), "{peak}");
    assert_eq!(by_range[1]["bytes"], 8192, "{peak}");
    // The plot shades every other "step".
    let svg = dir.join("se.svg");
    let out = Command::new(gpushim_bin())
        .args(["plot", "--by", "total"])
        .arg(&path)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert_ok(&out);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("NVTX range 'step'"), "{svg}");
    assert_eq!(svg.matches(r##"fill="#eef3fb""##).count(), 3, "{svg}");
    // Perfetto: each range an async slice, begun and ended under its range id and name.
    let json = dir.join("se.json");
    let out = Command::new(gpushim_bin())
        .args(["export", "--format", "perfetto", "-o"])
        .arg(&json)
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let phase =
        |ph: &str| -> Vec<&serde_json::Value> { events.iter().filter(|e| e["ph"] == ph).collect() };
    let (begins, ends) = (phase("b"), phase("e"));
    assert_eq!(begins.len(), 5);
    assert_eq!(ends.len(), 5);
    for (i, (b, e)) in begins.iter().zip(&ends).enumerate() {
        assert_eq!(b["name"], "step");
        assert_eq!(e["name"], "step");
        assert_eq!(b["id2"]["local"], 100 + i as u64);
        assert_eq!(e["id2"]["local"], b["id2"]["local"]);
        assert!(e["ts"].as_f64() > b["ts"].as_f64());
    }
}

/// A filter that keeps no allocation is an error naming what the trace holds, for every report
/// (it would otherwise read like "no leak"); one that keeps some runs as before.
#[test]
fn a_filter_that_keeps_nothing_says_what_the_trace_holds_and_fails() {
    use gpushim::trace::format::{Api, RecordKind};
    let dir = tempdir("empty-filter");
    let path = dir.join("f.trace");
    let mut t = HandTrace::create(&path);
    let step = t.recorder.intern_string(b"step");
    for i in 0..3u64 {
        t.rec(RecordKind::RangePush, Api::Nvtx, step, 1);
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x100_0000 * (i + 1),
            1 << 20,
        );
        t.rec(RecordKind::RangePop, Api::Nvtx, 0, 1);
    }
    drop(t);
    let run = |args: &[&str]| {
        Command::new(gpushim_bin())
            .args(args)
            .arg(&path)
            .output()
            .unwrap()
    };
    for args in [
        &["leaks", "--range", "nope"][..],
        &["summary", "--device", "3"],
        &["peak", "--from", "5s"],
        &["oom", "--range", "nope"],
        &["events", "--device", "3"],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("keep no allocation") && err.contains("device 0") && err.contains("step"),
            "{args:?}: {err}"
        );
    }
    assert_ok(&run(&["leaks", "--range", "step"]));
    assert_ok(&run(&["summary", "--device", "0"]));
}

/// Fragmentation is defined (docs/internals.md) and computed as defined: the share of reserved
/// memory that held nothing at the moment reserved peaked, with both figures shown beside it.
#[test]
fn fragmentation_is_what_reserved_held_unused_at_its_peak() {
    let l = leaky();
    let v = report_json(&["summary"], &[&l.trace]);
    for d in v["devices"].as_array().unwrap() {
        let reserved = d["peak_reserved_bytes"].as_u64().unwrap() as f64;
        let live = d["live_at_reserved_peak_bytes"].as_u64().unwrap() as f64;
        let frag = d["fragmentation_at_peak"].as_f64().unwrap();
        assert!(live <= reserved, "{d}");
        assert!((frag - (1.0 - live / reserved)).abs() < 1e-9, "{d}");
    }
    let text = stdout(&gpushim(&[&"summary", &l.trace]));
    assert!(
        text.contains("was live:") && text.contains("held nothing (fragmentation)"),
        "{text}"
    );
}

/// A loop of 10 iterations without NVTX: per iteration three 4 KiB scratch allocations freed
/// again, one 1 MiB allocation kept (the leak), with iterations that take 35 µs or 155 µs.
fn irregular_loop() -> TestFile {
    let path = tempdir("irregular").file("loop.trace");
    let mut t = HandTrace::create(&path);
    let mut next = 0x1000_0000u64;
    for i in 0..10 {
        t.wait(if i % 3 == 1 { 155_000 } else { 35_000 });
        let mut scratch = Vec::new();
        for _ in 0..3 {
            t.rec(RecordKind::Alloc, Api::CudaMalloc, next, 4096);
            scratch.push(next);
            next += 1 << 16;
        }
        t.rec(RecordKind::Alloc, Api::CudaMalloc, next, 1 << 20);
        next += 1 << 21;
        for p in scratch {
            t.rec(RecordKind::Free, Api::CudaFree, p, 0);
        }
    }
    path
}

#[test]
fn a_loop_whose_iterations_vary_in_time_is_still_found_by_its_order() {
    let v = report_json(&["leaks"], &[&irregular_loop()]);
    let it = &v["iterations"];
    assert!(it.is_object(), "iterations found: {v}");
    assert_eq!(it["count"], 10, "{it}");
    let growing = it["growing"].as_array().unwrap();
    assert_eq!(growing.len(), 1, "{growing:?}");
    assert_eq!(growing[0]["bytes_per_iteration"], 1 << 20);
}

#[test]
fn the_demo_finds_the_same_leak_the_same_way_every_run() {
    let mut answers = Vec::new();
    for i in 0..8 {
        let v = report_json(&["leaks"], &[&train_loop_trace(&format!("demo{i}"))]);
        let it = &v["iterations"];
        assert!(it.is_object(), "run {i}: no iterations found: {v}");
        let growing = it["growing"].as_array().unwrap();
        assert_eq!(growing.len(), 1, "run {i}: {growing:?}");
        assert_eq!(growing[0]["bytes_per_iteration"], 1 << 20, "run {i}");
        answers.push((
            it["boundary"].as_str().unwrap().to_string(),
            growing[0]["live_at_first_boundary"].clone(),
            growing[0]["live_at_last_boundary"].clone(),
        ));
    }
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "the same answer every run: {answers:?}"
    );
}

#[test]
fn distinct_call_sites_get_distinct_names_and_peak_time_agrees_with_summary() {
    let t = train_loop_trace("sites");
    let peak = report_json(&["peak"], &[&t]);
    let labels: Vec<&str> = peak[0]["by_call_site"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["label"].as_str().unwrap())
        .collect();
    let mut unique = labels.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        labels.len(),
        "no two rows read alike: {labels:?}"
    );
    assert!(labels.len() >= 3, "{labels:?}");
    let summary = report_json(&["summary"], &[&t]);
    assert_eq!(
        peak[0]["time_ns"], summary["devices"][0]["peak_time_ns"],
        "the peak's moment is the same in both reports"
    );
}

#[test]
fn simulate_agrees_with_the_run_and_with_summary_and_pool_off_passes_through() {
    let t = train_loop_trace("simulate");
    let out = Command::new(gpushim_bin())
        .args([
            "simulate",
            "--json",
            "--conf",
            "pool:caching",
            "--conf",
            "pool:off",
        ])
        .arg(&t)
        .output()
        .unwrap();
    assert_ok(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v.as_array().unwrap();
    let (recorded, caching, off) = (&rows[0], &rows[1], &rows[2]);
    let summary = report_json(&["summary"], &[&t]);
    let d = &summary["devices"][0];
    // The run was made under pool:caching: the replay under it is the run, figure for figure.
    for k in [
        "peak_reserved_bytes",
        "peak_live_bytes",
        "device_allocations",
    ] {
        assert_eq!(caching[k], recorded[k], "{k}");
    }
    assert_eq!(recorded["peak_live_bytes"], d["peak_live_bytes"]);
    assert_eq!(recorded["peak_reserved_bytes"], d["peak_reserved_bytes"]);
    let frag = |x: &serde_json::Value| x.as_f64().unwrap();
    assert!(
        (frag(&recorded["fragmentation_at_peak"]) - frag(&d["fragmentation_at_peak"])).abs() < 1e-9
    );
    assert!(
        (frag(&caching["fragmentation_at_peak"]) - frag(&d["fragmentation_at_peak"])).abs() < 1e-9
    );
    // pool:off: one device allocation per call, nothing reserved beyond what is live.
    let calls: u64 = summary["apis"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["bytes"].as_u64().unwrap_or(0) > 0)
        .map(|a| a["calls"].as_u64().unwrap() - a["failed"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(off["device_allocations"], calls);
    assert_eq!(off["peak_reserved_bytes"], off["peak_live_bytes"]);
    assert_eq!(off["peak_live_bytes"], d["peak_live_bytes"]);
}

/// `leaks` shows 10 call sites of what is live at exit and says how many more there are and
/// what they hold; `--top N` shows them.
#[test]
fn leaks_says_how_many_call_sites_it_left_out_and_top_shows_them() {
    let path = tempdir("leaks-top").file("many.trace");
    let mut t = HandTrace::create(&path);
    for i in 0..13u64 {
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x7f00_0000_0000 + (i << 24),
            (i + 1) << 20,
        );
    }
    drop(t);
    let text = |args: &[&str]| {
        let mut a: Vec<&str> = vec!["leaks"];
        a.extend_from_slice(args);
        let out = Command::new(gpushim_bin())
            .args(&a)
            .arg(path.as_os_str())
            .output()
            .unwrap();
        assert_ok(&out);
        stdout(&out)
    };
    let shown = text(&[]);
    let rows = shown.lines().filter(|l| l.contains(" in      1  ")).count();
    assert_eq!(rows, 10, "{shown}");
    assert!(
        shown.contains("... and 3 more holding 6.00 MiB (--top 13 shows every row)"),
        "{shown}"
    );
    let all = text(&["--top", "13"]);
    assert_eq!(
        all.lines().filter(|l| l.contains(" in      1  ")).count(),
        13,
        "{all}"
    );
    assert!(!all.contains("more holding"), "{all}");
}

/// PyTorch's two `cudaMalloc` attempts (before and after it gives back its cache) and the tensor
/// it could not make are one out-of-memory, its steps listed under it, its error named, and
/// the free memory said only as CUDA reported it at the failure.
#[test]
fn one_out_of_memory_is_one_entry_with_its_steps() {
    let dir = tempdir("oom-steps");
    let t = dir.join("oom.trace");
    std::fs::copy(repo().join("tests/data/torch/oom.trace"), &t).unwrap();
    let v = report_json(&["oom"], &[&t]);
    let ooms = v.as_array().unwrap();
    assert_eq!(ooms.len(), 1, "{v}");
    let steps: Vec<&str> = ooms[0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["api"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        ["cudaMalloc", "cudaMalloc", "torch_allocator"],
        "{v}"
    );
    let out = gpushim(&[&"oom", &t]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("cudaErrorMemoryAllocation (2, out of memory)"),
        "{text}"
    );
    assert!(text.contains("one failure, in 3 steps"), "{text}");
    assert!(!text.contains("failed with 2 "), "{text}");
    assert!(
        text.contains("CUDA said 525.12 MiB free at the failure"),
        "{text}"
    );
}

/// An out-of-memory after a leak names the leak: what the lines growing every iteration held
/// of what was live at the failure.
#[test]
fn oom_says_what_the_growing_lines_held_at_the_failure() {
    let l = leaky();
    let out = gpushim(&[&"oom", &l.trace]);
    assert_ok(&out);
    let text = stdout(&out);
    let leaks = report_json(&["leaks"], &[&l.trace]);
    let growing = leaks["iterations"]["growing"][0]["call_site"]
        .as_str()
        .unwrap();
    let line = text
        .lines()
        .find(|x| x.contains("the lines growing every iteration held"))
        .unwrap_or_else(|| panic!("{text}"));
    // 12 steps of 512 KiB had leaked when the 64 GiB request failed.
    assert!(line.contains("held 6.00 MiB of the"), "{line}");
    assert!(
        text.contains(&format!("(grows 512.00 KiB per iteration)  {growing}")),
        "{text}"
    );
}

/// An allocation whose stack was recorded but whose definition the trace lost is said to be
/// so, not met with advice to turn stacks on (they were on).
#[test]
fn a_stack_whose_definition_was_lost_is_not_blamed_on_the_settings() {
    let path = tempdir("lost-stack").file("lost.trace");
    let mut t = HandTrace::create(&path);
    t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000_0000, 1 << 20);
    t.rec(RecordKind::StackRef, Api::Shim, 4242, 0);
    drop(t);
    let out = gpushim(&[&"leaks", &path]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains("its definition was lost"), "{text}");
    assert!(!text.contains("stacks:on"), "{text}");
}
