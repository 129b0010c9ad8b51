//! `gpushim report`: the run in one HTML page. Without a browser: the page's data against a
//! program whose kinds are known to the byte (`tests/clients/kinds/train.py`), its size for a
//! ring of 10^8 events, that it asks for nothing from the network. With one: the page opened
//! from a file in headless Chromium with the network off (`tests/browser/check_page.py`): no
//! console error, the kinds and the growing line drawn, hovering a band names it and its line,
//! the 10^8-event page open in under 2 s, a screenshot kept.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// The kinds program under the shim, `steps` steps, keeping each step's last activation.
fn kinds_trace(tag: &str, steps: u32) -> TestFile {
    let t = tempdir(tag).file("kinds.trace");
    assert_ok(&kinds_program(&t, steps, true, vec![]));
    t
}

/// `gpushim report TRACE -o OUT`, checked to succeed; the page's text.
fn report(traces: &[&Path], out: &Path) -> String {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"report"];
    for t in traces {
        args.push(t);
    }
    args.push(&"-o");
    args.push(&out);
    let o = gpushim(&args);
    assert_ok(&o);
    std::fs::read_to_string(out).unwrap()
}

/// The data the page carries.
fn data(page: &str) -> Value {
    let open = r#"<script id="gpushim-data" type="application/json">"#;
    let from = page.find(open).expect("the data element") + open.len();
    let to = from + page[from..].find("</script>").expect("its end");
    serde_json::from_str(&page[from..to]).expect("the data is JSON")
}

fn kind_index(d: &Value, kind: &str) -> usize {
    d["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .position(|k| k["id"] == kind)
        .unwrap_or_else(|| panic!("no kind {kind}"))
}

#[test]
fn the_page_stacks_each_kind_to_the_byte_and_draws_the_growing_line() {
    let t = kinds_trace("page-kinds", 12);
    let out = t.with_extension("html");
    let page = report(&[&t], &out);
    // Private, and nothing from the network.
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // (The one address is SVG's namespace, a name that is never fetched.)
    let rest = page.replace("'http://www.w3.org/2000/svg'", "");
    for remote in [
        "http://", "https://", "//cdn", "src=", "href=", "url(", "import",
    ] {
        assert!(
            !rest.contains(remote),
            "the page names something to fetch: {remote}"
        );
    }
    let d = data(&page);
    let lane = &d["traces"][0]["lanes"][0];
    let c = &lane["columns"];
    let n = c["live"].as_array().unwrap().len();
    assert!(n > 100, "{n} columns");
    // At the last column the program holds, by construction: parameters 10 MiB, gradients
    // 8 MiB, optimizer state 16 MiB, the cuBLASLt-sized workspace 1 MiB, and 12 kept
    // activations of 3 MiB.
    let at_end = |kind: &str| c["kinds"][kind_index(&d, kind)][n - 1].as_u64().unwrap();
    assert_eq!(at_end("parameter"), 10 * MIB);
    assert_eq!(at_end("gradient"), 8 * MIB);
    assert_eq!(at_end("optimizer_state"), 16 * MIB);
    assert_eq!(at_end("workspace"), MIB);
    assert_eq!(at_end("activation"), 12 * 3 * MIB);
    // Each column's kinds add up to at most what is live then.
    for i in 0..n {
        let sum: u64 = (0..8).map(|k| c["kinds"][k][i].as_u64().unwrap()).sum();
        assert!(sum <= c["live"][i].as_u64().unwrap(), "column {i}");
    }
    // The peak is marked where the most is live, and it is the figure `peak` gives.
    let peak = report_json(&["peak"], &[&t]);
    let mark = &lane["peak"];
    assert_eq!(mark["bytes"], peak[0]["live_bytes"]);
    assert_eq!(
        c["live"][mark["column"].as_u64().unwrap() as usize],
        mark["bytes"]
    );
    // The growing line is a line of its own, an activation, rising step by step; the growing
    // table names it.
    let growing = &d["traces"][0]["growing"][0];
    assert_eq!(growing["kind"], "activation");
    let line = lane["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["label"] == growing["line"])
        .expect("the growing line is drawn");
    assert_eq!(line["kind"], "activation");
    assert_eq!(line["bytes"][n - 1].as_u64().unwrap(), 12 * 3 * MIB);
    assert!(
        line["frames"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f.as_str().unwrap().contains("linear.py")),
        "{line}"
    );
    // Iterations on the axis.
    assert!(
        lane["steps"].as_array().unwrap().len() >= 10,
        "{}",
        lane["steps"]
    );
}

/// A trace of `events` records in a ring of 64 MiB, written by the recorder with its summarizer
/// running: a step allocates and frees 8 blocks from 3 lines and keeps one in 1,000.
fn ring_of(path: &Path, events: u64) {
    use gpushim::trace::format::{Api, RecordKind};
    use std::sync::atomic::{AtomicBool, Ordering};
    let r = ring_recorder(path, 64 << 20);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| r.run_summarizer(&stop));
        let step = r.intern_string(b"step");
        let mut t = 0u64;
        let mut written = 0u64;
        let mut i = 0u64;
        while written < events {
            let mut rec = |kind, api, ptr, size| {
                t += 1_000;
                written += 1;
                r.append(&record_at(kind, api, 0, 0, t, ptr, size));
            };
            rec(RecordKind::RangePush, Api::Nvtx, step, 1);
            for b in 0..8u64 {
                let p = 0x7f00_0000_0000 + b * (1 << 20);
                rec(RecordKind::Alloc, Api::CudaMalloc, p, (b + 1) << 16);
                rec(RecordKind::StackRef, Api::Shim, 1 + b % 3, 0);
            }
            if i % 1000 == 0 {
                rec(
                    RecordKind::Alloc,
                    Api::CudaMalloc,
                    0x1_0000_0000 + i * 512,
                    512,
                );
            }
            for b in 0..8u64 {
                rec(
                    RecordKind::Free,
                    Api::CudaFree,
                    0x7f00_0000_0000 + b * (1 << 20),
                    0,
                );
            }
            rec(RecordKind::RangePop, Api::Nvtx, 0, 1);
            i += 1;
        }
        stop.store(true, Ordering::Release);
    });
}

/// The browser check, when Chromium and Playwright are here (CI installs them and sets
/// `GPUSHIM_REQUIRE_BROWSER`): its output, or `None` where there is no browser to run.
fn in_browser(args: &[&Path]) -> Option<String> {
    let have = std::process::Command::new("python3")
        .args(["-c", "import playwright.sync_api"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        && chromium().is_some();
    if !have {
        assert!(
            std::env::var_os("GPUSHIM_REQUIRE_BROWSER").is_none(),
            "GPUSHIM_REQUIRE_BROWSER is set but Chromium or Playwright is missing \
             (scripts/test.sh installs Debian's chromium and Playwright from PyPI)"
        );
        skipped(
            "page",
            "no Chromium or no Playwright for Python here: the page was not opened in a browser \
             (CI installs both and requires them)",
        );
        return None;
    }
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(repo().join("tests/browser/check_page.py"));
    cmd.args(args);
    cmd.env("GPUSHIM_CHROMIUM", chromium().unwrap());
    let o = cmd.output().unwrap();
    assert_ok(&o);
    Some(stdout(&o))
}

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GPUSHIM_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    [
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

#[test]
fn the_page_of_a_ring_of_10_8_events_is_small_and_opens_in_a_browser_offline() {
    let events: u64 = std::env::var("GPUSHIM_PAGE_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000);
    let dir = tempdir("page-ring");
    let ring = dir.join("ring.trace");
    let started = std::time::Instant::now();
    ring_of(&ring, events);
    eprintln!("{events} records written in {:?}", started.elapsed());
    let ring_page = dir.join("ring.html");
    let page = report(&[&ring], &ring_page);
    assert!(
        page.len() < 2 << 20,
        "the page of a {events}-record ring is {} bytes",
        page.len()
    );
    let d = data(&page);
    let lane = &d["traces"][0]["lanes"][0];
    let n = lane["columns"]["live"].as_array().unwrap().len();
    assert!((600..=1200).contains(&n), "{n} columns");
    let summary = report_json(&["summary"], &[&ring]);
    assert!(
        summary["health"]["summarized"].as_u64().unwrap() > 0,
        "the ring wrapped"
    );
    assert!(
        lane["before_ring"].as_u64().unwrap() > 0,
        "the checkpoint's series is shown"
    );

    let kinds = kinds_trace("page-browser", 20);
    let kinds_page = dir.join("kinds.html");
    report(&[&kinds], &kinds_page);
    // Two traces (the ranks of a job): one page, a lane each behind the picker.
    let other = kinds_trace("page-rank", 6);
    let ranks_page = dir.join("ranks.html");
    let d = data(&report(&[&kinds, &other], &ranks_page));
    let traces = d["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 2);
    assert!(
        traces
            .iter()
            .all(|t| !t["lanes"].as_array().unwrap().is_empty())
    );
    // A run whose allocation failed: its mark, legend entry and table of failures.
    let oom_page = dir.join("oom.html");
    let d = data(&report(
        &[&repo().join("tests/data/torch/oom.trace")],
        &oom_page,
    ));
    assert!(d["traces"][0]["oom_count"].as_u64().unwrap() > 0, "{d}");
    let shot = repo().join("target/test-artifacts/page.png");
    std::fs::create_dir_all(shot.parent().unwrap()).unwrap();
    let Some(out) = in_browser(&[&kinds_page, &ring_page, &shot, &ranks_page, &oom_page]) else {
        return;
    };
    eprintln!("{out}");
    assert!(out.contains("browser check passed"), "{out}");
    assert!(shot.is_file(), "no screenshot at {}", shot.display());
}

#[test]
fn plot_and_flamegraph_draw_the_kinds_the_peak_the_iterations_and_the_failures() {
    let t = kinds_trace("page-plot", 8);
    let svg_of = |args: &[&str], input: &Path, name: &str| {
        let out = input.with_file_name(name);
        let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
        for a in args {
            all.push(a);
        }
        all.extend([&input as &dyn AsRef<std::ffi::OsStr>, &"-o", &out]);
        assert_ok(&gpushim(&all));
        std::fs::read_to_string(&out).unwrap()
    };
    let by_kind = svg_of(&["plot"], &t, "k.svg");
    let activations = gpushim::export::kind_color(gpushim::report::kinds::Kind::Activation);
    let parameters = gpushim::export::kind_color(gpushim::report::kinds::Kind::Parameter);
    for m in [
        "memory by kind".to_string(),
        ">activations<".to_string(),
        ">parameters<".to_string(),
        format!("fill=\"{activations}\""),
        format!("fill=\"{parameters}\""),
        "peak ".to_string(),
        "iteration (".to_string(),
    ] {
        assert!(by_kind.contains(&m), "plot: no {m}");
    }
    // By line: the growing line is a band of its own, named with its kind.
    let leaks = report_json(&["leaks"], &[&t]);
    let growing = leaks["iterations"]["growing"][0]["call_site"]
        .as_str()
        .unwrap();
    let by_line = svg_of(&["plot", "--by", "line"], &t, "l.svg");
    assert!(
        by_line.contains(&format!("{growing} (activations)").replace('<', "&lt;")),
        "plot --by line: no band for {growing}"
    );
    // The flame graph in the kinds' colours.
    let flame = svg_of(&["flamegraph"], &t, "f.svg");
    assert!(
        flame.contains(&format!("fill=\"{activations}\"")),
        "flamegraph"
    );
    // A failed allocation is one red mark, PyTorch's two attempts and the tensor together.
    let oom = repo().join("tests/data/torch/oom.trace");
    let dir = tempdir("page-oom");
    let copy = dir.join("oom.trace");
    std::fs::copy(&oom, &copy).unwrap();
    let picture = svg_of(&["plot"], &copy, "o.svg");
    assert_eq!(picture.matches("<title>failed: ").count(), 1, "{picture}");
    let d = data(&report(&[&copy], &dir.join("o.html")));
    let failures = &d["traces"][0]["lanes"][0]["failures"];
    assert_eq!(failures.as_array().unwrap().len(), 1, "{failures}");
    assert_eq!(failures[0]["requested_bytes"], 600 * MIB);
}

/// `before_ring` set to 10^12 in `text` (a saved analysis or a page's data), in every lane.
fn claim_before_ring(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\"before_ring\":") {
        let (head, tail) = rest.split_at(at + "\"before_ring\":".len());
        out.push_str(head);
        out.push_str("1000000000000");
        rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// A page whose data claims 10^12 columns before the ring's detail (and a reserved figure past
/// any number): from a saved analysis claiming it, the lanes are made whole when read (the page
/// carries only its columns), and a page forged to claim it draws every band, by kind and by
/// line, with no error and no wait, in a real browser.
#[test]
fn a_page_claiming_columns_it_does_not_have_still_draws() {
    let kinds = kinds_trace("page-forged", 6);
    let dir = tempdir("page-forged-out");
    let saved = dir.join("kinds.analysis");
    assert_ok(&gpushim(&[&"analyze", &kinds.to_path_buf(), &"-o", &saved]));
    let text = std::fs::read_to_string(&saved).unwrap();
    let forged = claim_before_ring(&text);
    assert_ne!(forged, text);
    std::fs::write(&saved, forged).unwrap();
    let from_saved = dir.join("saved.html");
    let d = data(&report(&[&saved], &from_saved));
    let lane = &d["traces"][0]["lanes"][0];
    let n = lane["columns"]["live"].as_array().unwrap().len() as u64;
    assert!(
        n > 0 && lane["before_ring"].as_u64().unwrap() <= n,
        "{lane}"
    );

    // The page itself forged: its data edited where the script reads it.
    let page = std::fs::read_to_string(&from_saved).unwrap();
    let forged_page =
        claim_before_ring(&page).replacen("\"reserved\":[", "\"reserved\":[1e309,", 1);
    assert!(forged_page.contains("1000000000000") && forged_page.contains("1e309"));
    let by_hand = dir.join("forged.html");
    std::fs::write(&by_hand, forged_page).unwrap();
    let Some(out) = in_browser(&[Path::new("--forged"), &from_saved, &by_hand]) else {
        return;
    };
    assert!(out.contains("browser check passed"), "{out}");
}

/// A job on two hosts, each host's two ranks saved in one analysis: the page of the two saved
/// files is titled by what it holds, the job's four ranks, not by the two files given.
#[test]
fn a_jobs_page_from_saved_analyses_is_titled_by_its_ranks() {
    let dir = tempdir("page-job-title");
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let trace = |rank: u32| {
        let t = dir.join(format!("r{rank}.trace"));
        let env = vec![("RANK", rank.to_string()), ("WORLD_SIZE", "4".into())];
        let args = vec![
            lib("libtorch_cpu.so"),
            lib("libc10_cuda.so"),
            "3".into(),
            "ddp".into(),
        ];
        assert_ok(&python_client(&t, "kinds/job.py", args, env));
        t
    };
    let traces: Vec<PathBuf> = (0..4).map(trace).collect();
    let saved: Vec<PathBuf> = (0..2)
        .map(|host| {
            let out = dir.join(format!("host{host}.analysis"));
            let pair = &traces[2 * host..2 * host + 2];
            assert_ok(&gpushim(&[&"analyze", &"-o", &out, &pair[0], &pair[1]]));
            out
        })
        .collect();
    let page = report(&[&saved[0], &saved[1]], &dir.join("job.html"));
    let d = data(&page);
    let labels: Vec<&str> = d["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["rank 0", "rank 1", "rank 2", "rank 3"]);
    assert_eq!(d["title"], "gpushim: a job of 4 ranks");
    assert!(page.contains("<title>gpushim: a job of 4 ranks</title>"));
}
