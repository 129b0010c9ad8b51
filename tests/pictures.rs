//! The pictures and exports: the plot (SVG, PNG) with NVML's line and iterations marked,
//! flame graphs, Perfetto's timeline, PyTorch's memory_viz pickle and page; several traces on
//! one wall clock.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use std::path::Path;
use std::process::Command;

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
fn memory_viz_keeps_the_newest_events_it_is_asked_to_and_says_so() {
    // As PyTorch's `_record_memory_history(max_entries=N)`: each device's newest N events, the
    // segments at the end whole; the events kept are the full history's last N, frames and all.
    let l = leaky();
    let export = |most: &str, name: &str| {
        let out = l.trace.with_extension(name);
        let o = gpushim(&[
            &"export",
            &"--format",
            &"memory-viz",
            &"--max-entries",
            &most,
            &"-o",
            &out,
            &l.trace,
        ]);
        assert_ok(&o);
        (out, stderr(&o))
    };
    let (all, said_all) = export("100000", "all.pickle");
    assert!(!said_all.contains("left out"), "{said_all}");
    let (few, said) = export("5", "few.pickle");
    assert!(said.contains("newest 5 allocation events"), "{said}");
    let check = r#"
import pickle, sys
a = pickle.load(open(sys.argv[1], "rb"))
f = pickle.load(open(sys.argv[2], "rb"))
assert a["segments"] == f["segments"]
left = 0
for full, kept in zip(a["device_traces"], f["device_traces"]):
    assert len(kept) == min(5, len(full)), (len(kept), len(full))
    assert kept == full[len(full) - len(kept):]
    left += len(full) - len(kept)
assert any(t["frames"] for d in a["device_traces"] for t in d)
print(left)
"#;
    let py = Command::new("python3")
        .args(["-c", check])
        .arg(&all)
        .arg(&few)
        .output()
        .unwrap();
    assert_ok(&py);
    let left = stdout(&py).trim().to_string();
    assert!(left.parse::<u64>().unwrap() > 0);
    assert!(said.contains(&format!("; {left} older ones")), "{said}");
}

/// The memory_viz page that loaded PyTorch's viewer from a CDN (unpinned: whoever controls
/// that address runs script in the page; offline it never opens) is no longer written: asked
/// for, the command says why and what to use instead, and writes nothing.
#[test]
fn the_page_that_loaded_a_viewer_from_the_network_is_refused_with_what_to_use() {
    let l = leaky();
    let out = l.trace.with_extension("html");
    let o = gpushim(&[
        &"export",
        &"--format",
        &"memory-viz-html",
        &"-o",
        &out,
        &l.trace,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("from the network") && err.contains("gpushim report"),
        "{err}"
    );
    assert!(err.contains("--format memory-viz"), "{err}");
    assert!(!out.exists(), "nothing written");
    // Nor is the format offered in the help any more.
    let help = stdout(&gpushim(&[&"export", &"--help"]));
    assert!(!help.contains("memory-viz-html"), "{help}");
    assert!(help.contains("memory-viz"), "{help}");
}

#[test]
fn plot_and_flamegraph_write_svg_with_labelled_axes() {
    let l = leaky();
    for (cmd, must) in [
        (
            "plot --by total",
            vec![
                "memory (MiB)",
                "time since the first allocation",
                "device 0 live",
                "device 1 reserved",
                "NVTX range 'step'",
            ],
        ),
        ("flamegraph", vec!["live at the peak", "spike (leaky+0x"]),
        (
            "plot",
            vec![
                "device 0: memory by kind",
                "allocations",
                "peak ",
                "iteration (NVTX 'step')",
            ],
        ),
    ] {
        let out = l
            .trace
            .with_extension(format!("{}.svg", cmd.replace(' ', "")));
        let words: Vec<&str> = cmd.split(' ').collect();
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
        for w in &words {
            args.push(w);
        }
        args.extend([&l.trace as &dyn AsRef<std::ffi::OsStr>, &"-o", &out]);
        let o = gpushim(&args);
        assert_ok(&o);
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for m in must {
            assert!(svg.contains(m), "{cmd}: no '{m}'");
        }
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
    let o = gpushim(&[&"plot", &"--by", &"total", &a.trace, &b.trace, &"-o", &svg]);
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
        .args(["plot", "--by", "total", "-o"])
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

#[test]
fn the_plot_runs_to_the_end_of_the_trace_and_its_legend_stays_off_the_lines() {
    // One allocation, then a second of nothing but an NVTX mark: memory is held throughout.
    let path = tempdir("plot-end").file("end.trace");
    let mut t = HandTrace::create(&path);
    t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000_0000, 64 << 20);
    t.wait(1_000_000_000);
    t.rec(RecordKind::Mark, Api::Nvtx, 0, 0);
    drop(t);
    let svg_path = path.with_extension("svg");
    let out = gpushim_text(&[
        "plot",
        "--by",
        "total",
        "-o",
        svg_path.to_str().unwrap(),
        path.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    // The live line runs to the trace's end (1.002 s, x = 831 on an axis that ends at the
    // round 1.2 s), not to the allocation at 1 µs (x = 80).
    let live = svg
        .lines()
        .find(|l| l.starts_with("<path") && !l.contains("dasharray=\"6 4\""))
        .unwrap();
    let xs: Vec<f64> = live
        .split(['M', 'L', ','])
        .filter_map(|w| w.trim().parse::<f64>().ok())
        .collect();
    let max_x = xs.iter().step_by(2).cloned().fold(0.0, f64::max);
    assert!(max_x > 800.0, "the line stops at x={max_x}: {live}");
    // Legend rows sit below the chart's x axis (at y = 360 of the 420-pixel chart).
    for l in svg.lines().filter(|l| l.contains("device 0 live</text>")) {
        let y: f64 = l
            .split("y1=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(y > 420.0, "legend at y={y}: {l}");
    }
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
    let out = gpushim(&[&"plot", &"--by", &"total", &"-o", &svg, &path]);
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
    // NVML's 524 MiB (the context) dwarfs the program's 5 MiB: the scale is the program's, the
    // dotted line runs along the top, and a note says so.
    assert!(
        text.contains("NVML's figure (up to 524.00 MiB) is above this scale"),
        "{text}"
    );
    assert!(text.contains(">5<") || text.contains(">6<"), "{text}");
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

/// With no `--output`, a picture goes beside its trace (never into the working folder).
#[test]
fn pictures_go_beside_their_trace_unless_told_otherwise() {
    let trace = train_loop_trace("pictures-beside");
    let cwd = tempdir("pictures-cwd");
    for (cmd, name) in [
        ("plot", "train.timeline.svg"),
        ("flamegraph", "train.flamegraph.svg"),
    ] {
        let out = Command::new(gpushim_bin())
            .arg(cmd)
            .arg(trace.as_os_str())
            .current_dir(&*cwd)
            .output()
            .unwrap();
        assert_ok(&out);
        let beside = trace.parent().unwrap().join(name);
        assert!(beside.is_file(), "{} wrote no {}", cmd, beside.display());
        assert!(
            stderr(&out).contains(&beside.display().to_string()),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read_dir(&*cwd).unwrap().count(),
        0,
        "nothing lands in the working folder"
    );
}

#[test]
fn a_title_longer_than_the_picture_is_squeezed_in_not_cut() {
    // The flame graph's title names the trace's path: a deep one runs past 1,200 pixels.
    let l = leaky();
    let deep = tempdir(&format!("titles-{}", "deep-folder-name-".repeat(8))).file("t.trace");
    std::fs::copy(&l.trace, &deep).unwrap();
    let out = deep.with_extension("svg");
    assert_ok(&gpushim(&[&"flamegraph", &deep, &"-o", &out]));
    let svg = std::fs::read_to_string(&out).unwrap();
    let title = svg
        .lines()
        .find(|l| l.contains("live at the peak"))
        .unwrap_or_default();
    assert!(
        title.contains(r#"textLength="1180" lengthAdjust="spacingAndGlyphs""#),
        "{title}"
    );
    // A short one is left as it is.
    let out = l.trace.with_extension("titles.svg");
    assert_ok(&gpushim(&[
        &"plot", &"--by", &"total", &l.trace, &"-o", &out,
    ]));
    let svg = std::fs::read_to_string(&out).unwrap();
    let title = svg
        .lines()
        .find(|l| l.contains("device memory over time"))
        .unwrap_or_default();
    assert!(!title.contains("textLength"), "{title}");
}

#[test]
fn the_time_axis_ends_with_the_runs_memory_not_with_the_samples_after_it() {
    // After its last free a program still exits, and the NVML sampler's last figure comes as
    // it does: the axis ended there, squeezing the run into the first part of the picture.
    // It ends with the last change of memory; a figure sampled only then is a dot.
    let trace = train_loop_trace("plot-axis-end");
    let reader = gpushim::trace::reader::TraceReader::open(&*trace).unwrap();
    let records: Vec<_> = reader.collect();
    let last_change = records
        .iter()
        .filter(|r| {
            matches!(
                r.kind,
                gpushim::trace::format::RecordKind::Alloc
                    | gpushim::trace::format::RecordKind::Free
            )
        })
        .map(|r| r.time_ns)
        .max()
        .unwrap();
    let last = records.iter().map(|r| r.time_ns).max().unwrap();
    let svg = tempdir("plot-axis-end").file("total.svg");
    assert_ok(&gpushim(&[&"plot", &"--by", &"total", &trace, &"-o", &svg]));
    let text = std::fs::read_to_string(&*svg).unwrap();
    // The live line: the first solid path; its last point's x against the axis (80 to 980).
    let live = text
        .lines()
        .find(|l| l.starts_with("<path d=\"M") && l.contains("stroke-dasharray=\"\""))
        .expect("the live line");
    let d = live.split('"').nth(1).unwrap();
    let xs: Vec<f64> = d
        .split(['M', 'L', 'H', 'V'])
        .filter_map(|p| p.split(',').next()?.trim().parse().ok())
        .collect();
    let right = xs.iter().copied().fold(0.0, f64::max);
    let first_alloc = records
        .iter()
        .filter(|r| r.kind == gpushim::trace::format::RecordKind::Alloc)
        .map(|r| r.time_ns)
        .min()
        .unwrap();
    let share = (last_change - first_alloc) as f64 / (last - first_alloc) as f64;
    assert!(
        right > 80.0 + 0.6 * 900.0,
        "the run ends at x {right:.0} of 80..980 (its last change is {:.0}% of the way to the trace's last record)",
        100.0 * share
    );
}
