//! The reports on a trace made by running a client under the shim on the simulator
//! (`tests/clients/leaky.c`: NVTX "step" iterations, 512 KiB leaked per step from leak(), a
//! 200 MiB spike from spike() in step 6, one allocation on device 1, one failed 64 GiB request).

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

struct Leaky {
    trace: TestFile,
    leak_fn: Func,
    spike_fn: Func,
}

/// A function of the client: its name and where it starts in the executable.
struct Func {
    name: &'static str,
    start: u64,
}

fn leaky() -> Leaky {
    leaky_steps("reports", 12)
}

/// Runs the client under the shim for `steps` iterations and reads what it printed.
fn leaky_steps(dir: &str, steps: u32) -> Leaky {
    let t = tempdir(dir).file("leaky.trace");
    let out = run(
        &sim().bin("leaky"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![
                ("GPUSHIM_CONF", "pool:caching,stacks:on".into()),
                ("GPUSHIM_SIM_DEVICES", "2".into()),
                ("GPUSHIM_SIM_MEMORY", (1u64 << 30).to_string()),
                ("NVTX_INJECTION64_PATH", shim().display().to_string()),
            ],
            args: vec![steps.to_string()],
        },
    );
    assert_ok(&out);
    let s = stdout(&out);
    let get = |k: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{k} missing from {s}"))
    };
    assert!(s.contains("huge 2"), "{s}");
    Leaky {
        trace: t,
        leak_fn: Func {
            name: "leak",
            start: get("leak_fn "),
        },
        spike_fn: Func {
            name: "spike",
            start: get("spike_fn "),
        },
    }
}

/// Runs the command with `args` (text and paths alike).
fn gpushim(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    Command::new(gpushim_bin())
        .args(args.iter().map(|a| a.as_ref()))
        .output()
        .unwrap()
}

fn report(args: &[&str], trace: &Path) -> serde_json::Value {
    report_many(args, &[trace])
}

/// Whether a call site's innermost frame is in `f`: named from the executable's symbol table
/// (`leak (leaky+0x123b) < ...`), or, with `--no-symbols`, `leaky+0x123b` inside the function
/// (the client's functions are a few dozen bytes long).
fn in_function(label: &str, f: &Func) -> bool {
    let first = label.split(" < ").next().unwrap_or("");
    if first.starts_with(&format!("{} (leaky+0x", f.name)) {
        return true;
    }
    let Some(off) = first.strip_prefix("leaky+0x") else {
        return false;
    };
    let off = u64::from_str_radix(off, 16).unwrap_or(0);
    (f.start..f.start + 0x60).contains(&off)
}

#[test]
fn leaks_names_the_call_site_that_grows_every_iteration_and_by_how_much() {
    let l = leaky();
    let v = report(&["leaks"], &l.trace);
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
    let v = report(&["peak"], &l.trace);
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
    let v = report(&["oom"], &l.trace);
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
fn perfetto_export_parses_with_one_counter_track_per_device_and_the_nvtx_slices() {
    let l = leaky();
    let out = l.trace.with_extension("json");
    let o = gpushim(&[&"export", &"--format", &"perfetto", &"-o", &out, &l.trace]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let mut tracks: Vec<&str> = ev
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    tracks.sort();
    tracks.dedup();
    assert_eq!(tracks, ["device 0 memory", "device 1 memory"]);
    let begins = ev
        .iter()
        .filter(|e| e["ph"] == "B" && e["name"] == "step")
        .count();
    let ends = ev.iter().filter(|e| e["ph"] == "E").count();
    assert_eq!((begins, ends), (12, 12));
}

#[test]
fn memory_viz_pickle_loads_in_python_with_consistent_segments() {
    let l = leaky();
    for protocol in ["2", "3", "4"] {
        let out = l.trace.with_extension(format!("p{protocol}.pickle"));
        let o = gpushim(&[
            &"export",
            &"--format",
            &"memory-viz",
            &"--protocol",
            &protocol,
            &"-o",
            &out,
            &l.trace,
        ]);
        assert_ok(&o);
        let check = r#"
import pickle, sys
raw = open(sys.argv[1], "rb").read()
assert raw[:2] == bytes([0x80, int(sys.argv[2])]), raw[:2]
s = pickle.loads(raw)
assert set(s) >= {"segments", "device_traces"}, s.keys()
names = {f["name"] for seg in s["segments"] for b in seg["blocks"] for f in b["frames"]}
assert "leak" in names, names
live = 0
for seg in s["segments"]:
    for k in ("device", "address", "total_size", "allocated_size", "stream", "segment_type", "blocks"):
        assert k in seg, k
    at = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == at, (seg["address"], b)
        assert b["state"] in ("active_allocated", "inactive")
        at += b["size"]
        live += b["size"] if b["state"] == "active_allocated" else 0
    assert at == seg["address"] + seg["total_size"]
    assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
assert len(s["device_traces"]) == 2
actions = {t["action"] for t in s["device_traces"][0]}
assert {"alloc", "free_completed", "segment_alloc", "oom"} <= actions, actions
print(live)
"#;
        let py = Command::new("python3")
            .args(["-c", check])
            .arg(&out)
            .arg(protocol)
            .output()
            .unwrap();
        assert_ok(&py);
        assert_eq!(
            stdout(&py).trim(),
            (12 * 512 * 1024 + (8u64 << 20)).to_string()
        );
    }
}

#[test]
fn the_memory_viz_page_carries_the_snapshot_for_pytorchs_viewer() {
    let l = leaky();
    let out = l.trace.with_extension("html");
    let o = gpushim(&[
        &"export",
        &"--format",
        &"memory-viz-html",
        &"--view",
        &"Allocator State History",
        &"-o",
        &out,
        &l.trace,
    ]);
    assert_ok(&o);
    let check = r#"
import base64, json, pickle, re, sys
page = open(sys.argv[1]).read()
assert 'import {add_local_files} from "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"' in page
files = json.loads(re.search(r"const local_files = (.*)$", page, re.M).group(1))
assert re.search(r'add_local_files\(local_files, "Allocator State History"\)', page)
s = pickle.loads(base64.b64decode(files[0]["base64"]))
print(len(s["segments"]), len(s["device_traces"]))
"#;
    let py = Command::new("python3")
        .args(["-c", check])
        .arg(&out)
        .output()
        .unwrap();
    assert_ok(&py);
    let counts: Vec<u64> = stdout(&py)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(counts[0] > 0 && counts[1] == 2, "{counts:?}");
}

#[test]
fn plot_and_flamegraph_write_svg_with_labelled_axes() {
    let l = leaky();
    for (cmd, must) in [
        (
            "plot",
            vec![
                "memory (MiB)",
                "time since the first allocation",
                "device 0 live",
                "device 1 reserved",
                "NVTX range 'step'",
            ],
        ),
        ("flamegraph", vec!["live at the peak", "spike (leaky+0x"]),
    ] {
        let out = l.trace.with_extension(format!("{cmd}.svg"));
        let o = gpushim(&[&cmd, &l.trace, &"-o", &out]);
        assert_ok(&o);
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for m in must {
            assert!(svg.contains(m), "{cmd}: no '{m}'");
        }
    }
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
    let v = report(&["leaks"], &cut);
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
    let v = report(&["summary"], &a.trace);
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

fn report_many(args: &[&str], traces: &[&Path]) -> serde_json::Value {
    report_json(args, traces)
}

#[test]
fn peak_and_leaks_over_several_ranks_answer_per_rank_and_for_the_job() {
    // Two "ranks" of the same program, one running longer.
    let a = leaky_steps("rank0", 12);
    let b = leaky_steps("rank1", 8);
    let v = report_many(&["peak"], &[&a.trace, &b.trace]);
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

    let v = report_many(&["leaks"], &[&a.trace, &b.trace]);
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
    let named = report(&["peak"], &l.trace);
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
    let json = |args: &[&str]| -> serde_json::Value { report(args, &l.trace) };
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

#[test]
fn plot_and_flamegraph_write_png_when_asked() {
    let l = leaky();
    for cmd in ["plot", "flamegraph"] {
        let svg = l.trace.with_extension(format!("{cmd}.svg"));
        let png = l.trace.with_extension(format!("{cmd}.png"));
        for out in [&svg, &png] {
            let o = gpushim(&[&cmd, &l.trace, &"-o", &out]);
            assert_ok(&o);
        }
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{cmd}: not a PNG");
        // IHDR: the width is twice the SVG's.
        let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
        let text = std::fs::read_to_string(&svg).unwrap();
        let svg_width: u32 = text
            .split("width=\"")
            .nth(1)
            .and_then(|w| w.split('"').next())
            .and_then(|w| w.parse().ok())
            .unwrap();
        assert_eq!(width, 2 * svg_width, "{cmd}");
    }
}

#[test]
fn several_traces_make_one_timeline_aligned_by_wall_clock() {
    // Run one after the other: on a shared clock, all of the second comes after the first.
    let a = leaky_steps("wall-a", 4);
    let b = leaky_steps("wall-b", 4);
    let out = a.trace.with_extension("both.json");
    let o = gpushim(&[
        &"export",
        &"--format",
        &"perfetto",
        &"-o",
        &out,
        &a.trace,
        &b.trace,
    ]);
    assert_ok(&o);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    // Named by their files (which differ), not by their position in the list.
    let file = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        names[0].starts_with(&format!("{} leaky", file(&a.trace)))
            && names[1].starts_with(&format!("{} leaky", file(&b.trace))),
        "{names:?}"
    );
    let times = |pid: u64| -> Vec<f64> {
        events
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == pid)
            .map(|e| e["ts"].as_f64().unwrap())
            .collect()
    };
    let (first, second) = (times(1), times(2));
    assert!(!first.is_empty() && !second.is_empty());
    let end_first = first.iter().cloned().fold(f64::MIN, f64::max);
    let start_second = second.iter().cloned().fold(f64::MAX, f64::min);
    assert!(start_second > end_first, "{start_second} <= {end_first}");

    let svg = a.trace.with_extension("both.svg");
    let o = gpushim(&[&"plot", &a.trace, &b.trace, &"-o", &svg]);
    assert_ok(&o);
    let text = std::fs::read_to_string(&svg).unwrap();
    for m in [
        format!("{} device 0 live", file(&a.trace)),
        format!("{} device 0 live", file(&b.trace)),
        "after the first trace started".to_string(),
    ] {
        assert!(text.contains(&m), "no '{m}'");
    }
    // Formats that hold one process refuse several, saying what to do.
    let o = gpushim(&[
        &"export",
        &"--format",
        &"rmm",
        &"-o",
        &a.trace.with_extension("x.csv"),
        &a.trace,
        &b.trace,
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("takes one trace"), "{}", stderr(&o));
}

#[test]
fn top_watches_a_running_process_until_it_exits() {
    let dir = tempdir("top");
    let t = dir.join("slow.trace");
    // Every allocation and free takes 15 ms on the simulator: the run lasts about a second.
    let mut child = command(
        &sim().bin("leaky"),
        Run {
            preload: true,
            trace: Some(&t),
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
        .arg("plot")
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
    let v = report(&["summary"], &l.trace);
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

/// The plot's time axis starts at the first allocation, not at the trace's start (a Python
/// program's imports can take most of a run), and says how far in that was.
#[test]
fn the_plot_starts_where_the_programs_memory_does() {
    use gpushim::trace::format::{Api, RecordKind};
    let dir = tempdir("plot-start");
    let path = dir.join("late.trace");
    let mut t = HandTrace::create(&path);
    t.wait(5_000_000_000);
    for i in 0..10u64 {
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x100_0000 * (i + 1),
            1 << 20,
        );
        t.wait(1_000_000);
    }
    drop(t);
    let svg = dir.join("late.svg");
    let out = Command::new(gpushim_bin())
        .args(["plot", "-o"])
        .arg(&svg)
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("time since the first allocation, 5.00 s after"),
        "{text}"
    );
    // The first point of the live line lies at the left edge of the chart (x = 80).
    let d = text.split("<path d=\"M").nth(1).unwrap();
    let x0: f64 = d.split(',').next().unwrap().parse().unwrap();
    assert!(x0 < 81.0, "first point at x={x0}");
}

/// Every device allocation knows its owner, the library whose code asked CUDA for it, also
/// with stacks off: a library named like NCCL's keeps 12 MiB (runtime and driver calls), the
/// program 2 MiB, in every pool mode.
#[test]
fn memory_held_at_exit_is_named_by_the_library_that_asked_for_it() {
    for conf in ["", "pool:caching", "stacks:off"] {
        let t = tempdir("owners").file("o.trace");
        let out = run(
            &sim().dir.join("owners/owners"),
            Run {
                preload: true,
                trace: Some(&t),
                env: vec![("GPUSHIM_CONF", conf.to_string())],
                ..Run::default()
            },
        );
        assert_ok(&out);
        let v = report_json(&["summary"], &[&t]);
        let held: Vec<(String, u64, u64)> = v["held_at_exit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["owner"].as_str().unwrap().to_string(),
                    h["bytes"].as_u64().unwrap(),
                    h["allocations"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            held,
            vec![
                ("NCCL".to_string(), 12 << 20, 2),
                ("the program".to_string(), 2 << 20, 1)
            ],
            "'{conf}'"
        );
        let text = stdout(&gpushim(&[&"summary", &t]));
        assert!(
            text.contains("held at exit on device 0: NCCL 12.00 MiB, the program 2.00 MiB"),
            "{text}"
        );
    }
}

/// The device's own figure (NVML's, the simulator's here: the process's allocations plus its
/// 512 MiB context) kept in the trace and split by owner at its peak (64 MiB more of the
/// program's, held for a while) and at exit, the rest named as made by no allocating call; the
/// parts add up to NVML's figure.
#[test]
fn nvmls_figure_is_split_by_owner_at_its_peak_and_at_exit() {
    let t = tempdir("nvml").file("n.trace");
    let out = run(
        &sim().dir.join("owners/owners"),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec!["450".into()],
            ..Run::default()
        },
    );
    assert_ok(&out);
    let v = report_json(&["summary"], &[&t]);
    let m = &v["device_memory"][0];
    assert_eq!(m["device"], 0, "{v}");
    assert_eq!(m["device_wide"], false);
    let parts = |r: &serde_json::Value| -> Vec<(String, u64)> {
        r["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["owner"].as_str().unwrap().to_string(),
                    p["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (peak, exit) = (&m["at_peak"], &m["at_exit"]);
    assert_eq!(peak["nvml_bytes"], (512u64 + 14 + 64) << 20, "{m}");
    assert_eq!(
        parts(peak),
        vec![
            ("the program".to_string(), 66 << 20),
            ("NCCL".to_string(), 12 << 20)
        ],
        "{m}"
    );
    assert_eq!(peak["not_allocated_bytes"], 512u64 << 20, "{m}");
    assert_eq!(exit["nvml_bytes"], (512u64 + 14) << 20, "{m}");
    assert_eq!(
        parts(exit),
        vec![
            ("NCCL".to_string(), 12 << 20),
            ("the program".to_string(), 2 << 20)
        ],
        "{m}"
    );
    assert_eq!(exit["held_bytes"], 14u64 << 20, "{m}");
    assert_eq!(exit["not_allocated_bytes"], 512u64 << 20, "{m}");
    for r in [peak, exit] {
        let sum: u64 =
            parts(r).iter().map(|p| p.1).sum::<u64>() + r["not_allocated_bytes"].as_u64().unwrap();
        assert_eq!(r["nvml_bytes"].as_u64().unwrap(), sum, "{r}");
    }
    assert!(
        peak["time_ns"].as_u64().unwrap() < exit["time_ns"].as_u64().unwrap(),
        "{m}"
    );
    let text = stdout(&gpushim(&[&"summary", &t]));
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .map(|l| {
                l.split_whitespace()
                    .rev()
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    assert_eq!(row("the program"), "MiB 2.00 MiB 66.00", "{text}");
    assert_eq!(row("NCCL"), "MiB 12.00 MiB 12.00", "{text}");
    assert_eq!(row("no allocating call"), "MiB 512.00 MiB 512.00", "{text}");
    assert_eq!(row("= NVML"), "MiB 526.00 MiB 590.00", "{text}");
}

/// Across the ranks of a job, the one that came closest to its device's limit is named with
/// its headroom: rank 1's CUDA context is 1 GiB larger here, so its NVML peak is the higher.
#[test]
fn the_rank_closest_to_its_devices_limit_is_named_with_its_headroom() {
    let dir = tempdir("headroom");
    let traces: Vec<_> = [("0", "536870912"), ("1", "1610612736")]
        .iter()
        .map(|(rank, context)| {
            let t = dir.join(format!("r{rank}.trace"));
            let out = run(
                &sim().dir.join("owners/owners"),
                Run {
                    preload: true,
                    trace: Some(&t),
                    args: vec!["300".into()],
                    env: vec![
                        ("RANK", rank.to_string()),
                        ("GPUSHIM_SIM_CONTEXT_BYTES", context.to_string()),
                    ],
                },
            );
            assert_ok(&out);
            t
        })
        .collect();
    let v = report_json(&["summary"], &[&traces[0], &traces[1]]);
    let ranks = v["combined"]["ranks_by_headroom"].as_array().unwrap();
    let got: Vec<(i64, u64, u64)> = ranks
        .iter()
        .map(|r| {
            (
                r["rank"].as_i64().unwrap(),
                r["nvml_peak_bytes"].as_u64().unwrap() >> 20,
                r["headroom_bytes"].as_u64().unwrap() >> 20,
            )
        })
        .collect();
    let total = ranks[0]["device_total_bytes"].as_u64().unwrap() >> 20;
    assert_eq!(
        got,
        vec![
            (1, 1536 + 78, total - 1536 - 78),
            (0, 512 + 78, total - 512 - 78)
        ],
        "{v}"
    );
    let text = stdout(&gpushim(&[&"summary", &traces[0], &traces[1]]));
    assert!(
        text.contains("closest to its device's limit: rank 1 on device 0, NVML peak 1.58 GiB"),
        "{text}"
    );
}

/// The plot draws NVML's figure beside live and reserved memory, and, in a trace without NVTX
/// ranges, marks each iteration of the detected period on the time axis.
#[test]
fn the_plot_draws_nvmls_line_and_marks_detected_iterations() {
    use gpushim::trace::format::{Api, RecordKind};
    let dir = tempdir("plot-nvml");
    let path = dir.join("loop.trace");
    let mut t = HandTrace::create(&path);
    t.rec(RecordKind::DeviceMemory, Api::Shim, 512 << 20, 80 << 30);
    for i in 0..6u64 {
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000_0000, 4 << 20);
        t.rec(
            RecordKind::Alloc,
            Api::CudaMalloc,
            0x2000_0000 + (i << 20),
            1 << 20,
        );
        t.wait(1_000_000);
        t.rec(RecordKind::Free, Api::CudaFree, 0x1000_0000, 0);
        t.rec(
            RecordKind::DeviceMemory,
            Api::Shim,
            (512 + 2 * (i + 1)) << 20,
            80 << 30,
        );
        t.wait(1_000_000);
    }
    drop(t);
    let svg = dir.join("loop.svg");
    let out = gpushim(&[&"plot", &"-o", &svg, &path]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("device 0 as NVML saw the process"), "{text}");
    // NVML's line is the dotted path, a step for each of its 7 samples.
    let nvml = text
        .lines()
        .find(|l| l.starts_with("<path") && l.contains("stroke-dasharray=\"1 3\""))
        .expect("a dotted path");
    let points = nvml.matches('L').count();
    assert!(points >= 7, "{nvml}");
    assert!(
        text.contains("ticks on the time axis: 6 iterations (detected period"),
        "{text}"
    );
    let ticks = text
        .lines()
        .filter(|l| l.contains("stroke=\"#6a7fa0\" stroke-width=\"1\""))
        .count();
    assert_eq!(ticks, 6, "{text}");
}
