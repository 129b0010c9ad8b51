//! A trace of any length: the file stays within `trace_max`, the run is never cut off at it,
//! and every report answers for the whole run as it does from a trace that kept everything.
//! The client (`tests/clients/long_run.c`) allocates 48 blocks from one line every step and
//! frees them, keeps 4 KiB a step from another, takes a 512 MiB spike three quarters of the way
//! through, and ends with a failed 1 TiB request.

use crate::common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const STEPS: u32 = 6000;
/// The bounded trace's size: its ring holds about a quarter of the run's records.
const BOUND: &str = "trace_max:32MiB";
const BOUND_BYTES: u64 = 32 << 20;

/// The client's leak, as `leaks --json`'s iterations give it: 4 KiB a step from `leak()`.
fn assert_leak_grows_4_kib(it: &Value) {
    assert_eq!(it["growing"][0]["bytes_per_iteration"], 4096, "{it}");
    assert!(
        it["growing"][0]["call_site"]
            .as_str()
            .unwrap()
            .starts_with("leak "),
        "{it}"
    );
}

fn run_long(trace: &Path, conf: &str, steps: u32) {
    let out = run(
        &sim().bin("long_run"),
        Run {
            preload: true,
            trace: Some(trace),
            env: vec![("GPUSHIM_CONF", conf.into())],
            args: vec![steps.to_string()],
        },
    );
    assert_ok(&out);
    assert!(stdout(&out).contains("huge 2"), "{}", stdout(&out));
}

/// `v` without its times (two runs of one program differ in them, nothing else).
fn timeless(v: Value) -> Value {
    crate::common::json::without_keys(v, &|k| k.ends_with("time_ns"))
}

/// The parts of each report a trace of any length must answer exactly.
fn answers(trace: &Path) -> Vec<(String, Value)> {
    let leaks = report_json(&["leaks"], &[trace]);
    let peak = report_json(&["peak"], &[trace]);
    let oom = report_json(&["oom"], &[trace]);
    let summary = report_json(&["summary"], &[trace]);
    let growing = &leaks["iterations"]["growing"];
    vec![
        ("leaks: live at exit".into(), leaks["live_at_exit"].clone()),
        (
            "leaks: what grows".into(),
            Value::Array(
                growing
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| {
                        serde_json::json!([
                            g["call_site"].clone(),
                            g["bytes_per_iteration"].clone()
                        ])
                    })
                    .collect(),
            ),
        ),
        (
            "peak".into(),
            serde_json::json!([
                peak[0]["device"],
                peak[0]["live_bytes"],
                peak[0]["by_call_site"]
            ]),
        ),
        ("oom".into(), timeless(oom.clone())),
        ("summary: calls per API".into(), summary["apis"].clone()),
        (
            "summary: devices".into(),
            timeless(summary["devices"].clone()),
        ),
    ]
}

#[test]
fn a_trace_of_any_length_answers_as_the_whole_trace_does() {
    let dir = tempdir("long_runs");
    let (whole, bounded) = (dir.join("whole.trace"), dir.join("bounded.trace"));
    std::thread::scope(|s| {
        s.spawn(|| run_long(&whole, "stacks:native", STEPS));
        s.spawn(|| run_long(&bounded, &format!("stacks:native,{BOUND}"), STEPS));
    });
    let len = std::fs::metadata(&bounded).unwrap().len();
    assert!(len <= BOUND_BYTES, "the bounded trace is {len} bytes");
    assert!(
        std::fs::metadata(&whole).unwrap().len() > BOUND_BYTES,
        "the run must make more records than the bounded trace holds"
    );
    let health = &report_json(&["summary"], &[&bounded])["health"];
    assert!(
        health["summarized"].as_u64().unwrap() > 100_000,
        "the bounded trace summarizes its oldest records: {health}"
    );
    assert_eq!(health["unsummarized"], 0, "{health}");
    assert_eq!(health["lost"], 0, "{health}");
    let (a, b) = (answers(&whole), answers(&bounded));
    for ((what, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(
            x, y,
            "{what} differs between the whole and the bounded trace"
        );
    }
    // And those answers are the program's: 4 KiB a step from leak(), one step each.
    let leaks = report_json(&["leaks"], &[&bounded]);
    let it = &leaks["iterations"];
    assert!(
        it["boundary"].as_str().unwrap().contains("leak"),
        "the step is marked by the line that runs once a step: {it}"
    );
    assert_leak_grows_4_kib(it);
    for t in [&whole, &bounded] {
        let count = report_json(&["leaks"], &[t])["iterations"]["count"].clone();
        assert_eq!(count, STEPS, "one boundary per step in {}", t.display());
    }
    // The picture spans the whole run: the checkpoint's series before the ring's detail.
    let svg = dir.join("bounded.svg");
    let out = gpushim(&[
        &"plot",
        &"--by",
        &"total",
        &bounded.as_path(),
        &"-o",
        &svg.as_path(),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&svg).unwrap();
    let peak = report_json(&["summary"], &[&whole])["devices"][0]["peak_live_bytes"]
        .as_u64()
        .unwrap();
    let legend = format!("peak live {:.2} MiB", peak as f64 / (1u64 << 20) as f64);
    assert!(
        text.contains(&legend),
        "the picture's peak is the spike's, before the ring ({legend})"
    );
    let first_x = |svg: &str| -> f64 {
        // The live line's path starts at the left of the plot when it covers the whole run.
        let at = svg.find("<path d=\"M").expect("a path");
        svg[at + 10..]
            .split([',', ' '])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let whole_svg = dir.join("whole.svg");
    assert_ok(&gpushim(&[
        &"plot",
        &"--by",
        &"total",
        &whole.as_path(),
        &"-o",
        &whole_svg.as_path(),
    ]));
    let whole_text = std::fs::read_to_string(&whole_svg).unwrap();
    assert!(
        (first_x(&text) - first_x(&whole_text)).abs() < 1.0,
        "both pictures start where the run's memory does"
    );
    let peak = report_json(&["peak"], &[&bounded]);
    assert!(
        peak[0]["by_call_site"][0]["label"]
            .as_str()
            .unwrap()
            .starts_with("spike "),
        "{peak}"
    );
}

/// A process killed by SIGKILL leaves a trace whose reports are complete up to at most a second
/// before the kill.
#[test]
fn a_killed_run_answers_up_to_a_second_before_the_kill() {
    let dir = tempdir("long_runs_kill");
    let trace = dir.join("killed.trace");
    let mut child = command(
        &sim().bin("long_run"),
        Run {
            preload: true,
            trace: Some(&trace),
            env: vec![("GPUSHIM_CONF", format!("stacks:native,{BOUND}"))],
            args: vec!["100000000".into(), "1".into(), "progress".into()],
        },
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if let Some(n) = l.strip_prefix("step ").and_then(|n| n.parse::<u64>().ok()) {
                let _ = tx.send((Instant::now(), n));
            }
        }
    });
    // Run until the ring has wrapped many times, then kill it.
    let mut seen: Vec<(Instant, u64)> = Vec::new();
    let start = Instant::now();
    while seen.last().is_none_or(|&(_, n)| n < 12_000) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "too slow: {seen:?}"
        );
        if let Ok(s) = rx.recv_timeout(Duration::from_secs(1)) {
            seen.push(s);
        }
    }
    // While it runs, the reports speak of now, not of an exit.
    let text = |report: &str| {
        let out = gpushim(&[&report, &trace.as_path()]);
        assert_ok(&out);
        stdout(&out)
    };
    let live = text("leaks");
    assert!(
        live.contains("live now: ") && live.contains("(the process is still running)"),
        "{live}"
    );
    assert!(text("summary").contains("the process is still running"));
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    // SAFETY: kill with a valid pid of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    while let Ok(s) = rx.try_recv() {
        seen.push(s);
    }
    let last = seen.last().unwrap().1;
    // The step the program had printed a second before the kill.
    let a_second_before = seen
        .iter()
        .rev()
        .find(|(t, _)| killed_at.duration_since(*t) >= Duration::from_secs(1))
        .map_or(0, |s| s.1);
    let leaks = report_json(&["leaks"], &[&trace]);
    let kept = leaks["live_at_exit"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["label"].as_str().unwrap().starts_with("leak "))
        .unwrap_or_else(|| panic!("no leak() in {leaks}"))["allocations"]
        .as_u64()
        .unwrap();
    assert!(
        kept > a_second_before && kept <= last + 101,
        "{kept} allocations of leak() live at the kill; the program had made {a_second_before} \
         a second before it and {last} by its last word"
    );
    for report in ["summary", "peak", "oom"] {
        report_json(&[report], &[&trace]);
    }
    let after = text("leaks");
    assert!(
        after.contains("live at exit: ") && after.contains("did not exit cleanly"),
        "{after}"
    );
}

/// A program that keeps more allocations live than a small ring's checkpoint slot lists (a
/// 4 MiB trace: 16,384 records) still has its whole live set in the checkpoint, the older
/// allocations summed under their line, and its leak named by that line; a figure that
/// records lost to a lap make uncertain says so.
#[test]
fn a_live_set_larger_than_the_checkpoint_is_kept_by_line() {
    let dir = tempdir("long_runs_live");
    let trace = dir.join("small.trace");
    const KEPT: u64 = 20_000;
    run_long(&trace, "stacks:native,trace_max:4MiB", KEPT as u32);
    let summary = report_json(&["summary"], &[&trace]);
    let health = &summary["health"];
    assert_eq!(health["checkpoints_failed"], 0, "{health}");
    assert!(health["summed"].as_u64().unwrap() > 0, "{health}");
    let leaks = report_json(&["leaks"], &[&trace]);
    let live = leaks["live_at_exit_bytes"].as_u64().unwrap();
    let missing = health["unsummarized"].as_u64().unwrap() > 0;
    if missing {
        // A lap (a slow machine) makes the figure uncertain: it says so.
        assert!(leaks["live_figures"].is_string(), "{leaks}");
    } else {
        match leaks["live_figures"].as_str() {
            // No summed allocation was freed later: exact.
            None => assert_eq!(live, KEPT * 4096, "{leaks}"),
            Some(w) => {
                assert!(w.starts_with("at most"), "{w}");
                assert!(live >= KEPT * 4096, "{leaks}");
            }
        }
    }
    let it = &leaks["iterations"];
    assert_leak_grows_4_kib(it);
    let text = gpushim_text(&["leaks", trace.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("live at exit: "), "{text}");
    assert!(
        text.contains("counted by call site, not one by one"),
        "{text}"
    );
    assert!(!text.contains("no stack"), "{text}");
}

/// A program whose threads come and go by the ten thousand, through a small ring (a 4 MiB
/// trace's checkpoint slot holds 16,384 records, and each thread is announced by one): every
/// checkpoint still fits, the oldest threads' announcements left out (no report reads them),
/// so the summary counts every call of the run.
#[test]
fn threads_that_come_and_go_leave_every_checkpoint_fitting() {
    let dir = tempdir("long_runs_threads");
    let trace = dir.join("threads.trace");
    const THREADS: u64 = 20_000;
    let out = run(
        &sim().bin("thread_churn"),
        Run {
            preload: true,
            trace: Some(&trace),
            env: vec![("GPUSHIM_CONF", "trace_max:4MiB".into())],
            args: vec![THREADS.to_string()],
        },
    );
    assert_ok(&out);
    assert!(stdout(&out).contains(&format!("threads {THREADS}")));
    let s = report_json(&["summary"], &[&trace]);
    let health = &s["health"];
    assert_eq!(health["checkpoints_failed"], 0, "{health}");
    assert!(health["summarized"].as_u64().unwrap() > 0, "{health}");
    let malloc = s["apis"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["api"] == "cudaMalloc")
        .map(|a| a["calls"].as_u64().unwrap());
    assert_eq!(malloc, Some(THREADS + THREADS / 1000), "{}", s["apis"]);
}

/// A run that slows down after its ring lapped (its last steps, its evaluation, its exit): the
/// older checkpoint stays where it was while it lies within most of the ring (seven eighths), each new
/// checkpoint taking the newest's place, so a replay from the older (`fit`, a failure read in
/// detail) has every record since. Alternating slots left the older one checkpoint back: a
/// second's records, and none of the training before a quiet last second.
#[test]
fn the_older_checkpoint_stays_far_back_while_the_ring_holds_it() {
    use gpushim::trace::format::{Api, RecordKind};
    use std::sync::atomic::{AtomicBool, Ordering};
    let path = tempdir("long_runs_older").file("ring.trace");
    let r = ring_recorder(&path, 1 << 20);
    let stop = AtomicBool::new(false);
    let newest = || {
        let c = crate::common::rings::checkpoints(&path);
        c[0].seq.max(c[1].seq)
    };
    let capacity =
        crate::common::rings::header_word(&path, gpushim::trace::format::header::CAPACITY);
    const ROUND: u64 = 100;
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        let mark = || {
            r.append(&record_at(
                RecordKind::Mark,
                Api::Nvtx,
                0,
                0,
                r.now_ns(),
                0,
                0,
            ));
        };
        // Fast: until the ring has lapped and a checkpoint came after, paced so that the
        // summarizer keeps up.
        let mut n = 0u64;
        while r.claimed() < capacity || newest() < 2 {
            mark();
            n += 1;
            if n % 2000 == 0 {
                std::thread::sleep(Duration::from_millis(4));
            }
        }
        // Slow: three rounds of a few records, each with a checkpoint of its own.
        for _ in 0..3 {
            let seq = newest();
            for _ in 0..ROUND {
                mark();
            }
            let waited = Instant::now();
            while newest() == seq {
                assert!(waited.elapsed() < Duration::from_secs(10), "no checkpoint");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        stop.store(true, Ordering::Release);
    });
    let mut c = crate::common::rings::checkpoints(&path);
    c.sort_by_key(|d| d.seq);
    let [older, newest] = c;
    assert!(older.seq > 0, "{c:?}");
    assert!(
        newest.covered - older.covered >= 3 * ROUND,
        "the older checkpoint is one round back: {older:?} {newest:?}"
    );
    assert!(
        gpushim::trace::reader::TraceReader::open(&path).is_ok(),
        "the trace reads"
    );
    // `events` and `export` list the records from the older checkpoint on, in detail: every
    // round's marks, where from the newest they had the last round's alone. Every mark written
    // between the checkpoints: a busy machine can leave a block's tail of slots unused there.
    let between = crate::common::rings::written_between(&path, older.covered, newest.covered);
    assert!(
        between >= 3 * ROUND,
        "{between} records between the checkpoints"
    );
    let t = path.to_str().unwrap();
    let listed = stdout(&gpushim_text(&["events", t]));
    let marks = listed.lines().filter(|l| l.contains(",mark,")).count() as u64;
    assert!(
        marks >= between,
        "{marks} marks listed, {between} records written between the checkpoints"
    );
    let out = tempdir("long_runs_older_export").file("ring.json");
    let o = gpushim_text(&[
        "export",
        "--format",
        "perfetto",
        "-o",
        out.to_str().unwrap(),
        t,
    ]);
    assert_ok(&o);
    let instants = std::fs::read_to_string(&out)
        .unwrap()
        .matches("\"ph\":\"i\"")
        .count() as u64;
    assert!(
        instants >= between,
        "{instants} marks exported, {between} records written between the checkpoints"
    );
}
