//! Reports a person can trust: the same trace gives the same answer every time,
//! call sites that read alike stay apart, and figures agree between reports.

mod common;
use common::*;
use gpushim::trace::format::{Api, RecordKind};
use std::path::Path;
use std::process::Command;

fn json(args: &[&str], trace: &Path) -> serde_json::Value {
    report_json(args, &[trace])
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
    let v = json(&["leaks"], &irregular_loop());
    let it = &v["iterations"];
    assert!(it.is_object(), "iterations found: {v}");
    assert_eq!(it["count"], 10, "{it}");
    let growing = it["growing"].as_array().unwrap();
    assert_eq!(growing.len(), 1, "{growing:?}");
    assert_eq!(growing[0]["bytes_per_iteration"], 1 << 20);
}

/// The bundled example under the shim with stacks, as the demo runs it.
fn train_loop_trace(name: &str) -> TestFile {
    let t = tempdir(name).file("train.trace");
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "pool:caching,stacks:on".into())],
            args: vec!["20".into()],
        },
    );
    assert_ok(&out);
    t
}

#[test]
fn the_demo_finds_the_same_leak_the_same_way_every_run() {
    let mut answers = Vec::new();
    for i in 0..8 {
        let v = json(&["leaks"], &train_loop_trace(&format!("demo{i}")));
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
    let peak = json(&["peak"], &t);
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
    let summary = json(&["summary"], &t);
    assert_eq!(
        peak[0]["time_ns"], summary["devices"][0]["peak_time_ns"],
        "the peak's moment is the same in both reports"
    );
}

/// `gpushim run` with a command that leaves a marker file when it starts.
fn run_marked(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (std::process::Output, bool) {
    let marker = dir.join("started");
    let _ = std::fs::remove_file(&marker);
    let mut c = Command::new(gpushim_bin());
    c.arg("run")
        .arg("--lib")
        .arg(shim())
        .args(args)
        .arg("--")
        .arg("sh")
        .arg("-c")
        .arg(format!("touch '{}'", marker.display()))
        .current_dir(dir)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (out, marker.exists())
}

#[test]
fn run_refuses_a_trace_it_cannot_write_before_starting_the_program() {
    let dir = tempdir("run-trace");
    let missing = format!("{}/no/such/t.%p.trace", dir.display());
    let existing = dir.join("taken.trace");
    std::fs::write(&existing, b"x").unwrap();
    for (args, why) in [
        (vec!["--trace", missing.as_str()], "does not exist"),
        (
            vec!["--trace", existing.to_str().unwrap()],
            "never overwritten",
        ),
    ] {
        let (out, started) = run_marked(&dir, &args, &[]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(!started, "the program must not start: {args:?}");
        assert!(stderr(&out).contains(why), "{}", stderr(&out));
    }
    let (out, started) = run_marked(&dir, &[], &[("GPUSHIM_TRACE", missing.as_str())]);
    assert!(
        !started && out.status.code() == Some(2),
        "GPUSHIM_TRACE too"
    );
    // Turned off on purpose: it runs, and says so once, not "made no CUDA memory call".
    let (out, started) = run_marked(&dir, &["--trace", "off"], &[]);
    assert!(started && out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recording is off"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("made no CUDA"), "{}", stderr(&out));
}

#[test]
fn run_refuses_a_bad_configuration_from_either_source_before_starting() {
    let dir = tempdir("run-conf");
    for (args, env) in [
        (vec!["--conf", "garbage,limit:1GiB"], vec![]),
        (vec![], vec![("GPUSHIM_CONF", "pool:bogus")]),
        (vec![], vec![("GPUSHIM_CONF", "garbage,limit:1GiB")]),
    ] {
        let (out, started) = run_marked(&dir, &args, &env);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}");
        assert!(!started, "{args:?} {env:?}");
        let err = stderr(&out);
        assert!(err.contains("nothing was started"), "{err}");
        assert!(err.contains("garbage") || err.contains("bogus"), "{err}");
    }
    // `config` names what it was given, not GPUSHIM_CONF.
    let out = Command::new(gpushim_bin())
        .args(["config", "pool:bogus"])
        .env_remove("GPUSHIM_CONF")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!stderr(&out).contains("GPUSHIM_CONF"), "{}", stderr(&out));
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
    let summary = json(&["summary"], &t);
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

fn text(args: &[&str]) -> std::process::Output {
    Command::new(gpushim_bin())
        .args(args)
        .env_remove("GPUSHIM_CONF")
        .output()
        .unwrap()
}

#[test]
fn empty_answers_say_why() {
    let t = train_loop_trace("empty");
    let t = t.to_str().unwrap();
    // A filter that keeps nothing fails and says what the trace holds.
    let out = text(&["peak", "--range", "nosuch", t]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the filters keep no allocation")
            && stderr(&out).contains("NVTX ranges: none"),
        "{}",
        stderr(&out)
    );
    let out = text(&["leaks", "--boundary", "nosuch", t]);
    assert_ok(&out);
    let s = stdout(&out);
    assert!(
        s.contains("--boundary nosuch names no NVTX range or mark"),
        "{s}"
    );
    assert!(!s.contains("no repeating NVTX range"), "{s}");
    // A trace cut inside its records: what is left still answers, and says when it is empty.
    let dir = tempdir("cut");
    let cut = dir.join("cut.trace");
    let bytes = std::fs::read(t).unwrap();
    std::fs::write(&cut, &bytes[..4096 + 32]).unwrap();
    let out = text(&["peak", cut.to_str().unwrap()]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("no allocation in this trace"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn run_names_each_trace_once_and_reports_with_stacks_never_suggest_turning_them_on() {
    let dir = tempdir("once");
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env_remove("GPUSHIM_CONF")
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--conf", "stacks:3", "--trace", "t.trace"])
        .arg(sim().bin("train_loop"))
        .arg("5")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert_eq!(
        err.matches("t.trace").count(),
        2,
        "the trace line and the next step:\n{err}"
    );
    assert!(!err.contains("trace written to"), "{err}");
    // stacks:3 records one call in three: the rest have no stack, and that is no reason to
    // suggest stacks:on.
    let out = text(&["leaks", dir.join("t.trace").to_str().unwrap()]);
    assert_ok(&out);
    assert!(!stdout(&out).contains("stacks:on"), "{}", stdout(&out));
}

#[test]
fn help_lists_report_options_only_for_reports_and_describes_every_argument() {
    for cmd in ["run", "config"] {
        let out = text(&[cmd, "--help"]);
        assert!(
            !stdout(&out).contains("--device"),
            "{cmd}: {}",
            stdout(&out)
        );
    }
    for cmd in [
        "summary", "leaks", "peak", "oom", "events", "diff", "export", "plot",
    ] {
        let help = stdout(&text(&[cmd, "--help"]));
        assert!(help.contains("--device"), "{cmd}");
        for line in help.lines() {
            let l = line.trim_start();
            if l.starts_with("--json") || l.starts_with('<') {
                assert!(l.split_whitespace().count() > 1, "{cmd}: undescribed `{l}`");
            }
        }
    }
    assert!(stdout(&text(&["flamegraph", "--help"])).contains("PNG"));
    // A picture named for another format is refused, not written as SVG.
    let t = train_loop_trace("jpg");
    let jpg = t.with_extension("jpg");
    let out = text(&["plot", "-o", jpg.to_str().unwrap(), t.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!jpg.exists());
    assert!(stderr(&out).contains(".svg or .png"), "{}", stderr(&out));
}

#[test]
fn run_takes_the_command_without_a_double_dash() {
    let dir = tempdir("nodash");
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env_remove("GPUSHIM_CONF")
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--trace", "off", "sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn two_runs_are_named_by_their_files_in_diff_plot_and_summary() {
    let a = train_loop_trace("diff-a");
    let b = train_loop_trace("diff-b");
    let (sa, sb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let out = text(&["diff", sa, sb]);
    assert_ok(&out);
    let d = stdout(&out);
    assert!(
        d.contains(&format!("A = {sa}")) && d.contains(&format!("B = {sb}")),
        "{d}"
    );
    assert!(d.lines().nth(2).unwrap().contains("train.trace"), "{d}");
    // Two traces without ranks: the plot names them by file.
    let svg = a.with_file_name("two.svg");
    let out = text(&["plot", "-o", svg.to_str().unwrap(), sa, sb]);
    assert_ok(&out);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("train.trace device 0 live"), "{svg}");
    assert!(!svg.contains("trace 1 "), "positions are no names");
    // summary --json of two traces: the largest peak is an object with named fields.
    let v = {
        let out = text(&["summary", "--json", sa, sb]);
        assert_ok(&out);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let l = &v["combined"]["largest_peak"];
    assert!(
        l["trace"].is_string() && l["peak_live_bytes"].is_u64(),
        "{l}"
    );
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
    let out = text(&[
        "plot",
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

#[test]
fn the_readme_shows_what_the_demo_prints_and_maps_every_folder() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    // The leaks example: the demo's own lines (the time and pid parts aside).
    let v = json(&["leaks"], &train_loop_trace("readme"));
    let g = &v["iterations"]["growing"][0];
    let line = format!(
        "grows 1.00 MiB per iteration ({} -> {})",
        gpushim::report::summary::human_bytes(g["live_at_first_boundary"].as_u64().unwrap()),
        gpushim::report::summary::human_bytes(g["live_at_last_boundary"].as_u64().unwrap())
    );
    assert!(readme.contains(&line), "the README should show `{line}`");
    // The layout names every top-level folder and file the repository holds, and every script.
    let files = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(repo())
        .output()
        .unwrap();
    let map = std::fs::read_to_string(repo().join("docs/layout.md")).unwrap();
    let layout = map.split("## Layout").nth(1).unwrap();
    let top: std::collections::BTreeSet<String> = String::from_utf8_lossy(&files.stdout)
        .lines()
        .filter_map(|l| l.split('/').next().map(str::to_string))
        .collect();
    for name in top {
        if ["Cargo.lock", "README.md", ".gitignore"].contains(&name.as_str()) {
            continue;
        }
        assert!(layout.contains(&name), "the layout leaves out {name}");
    }
    // ... and is the map of both crates: every module folder and every top-level source file.
    for root in ["src", "shim/src"] {
        for entry in std::fs::read_dir(repo().join(root)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let shown = if entry.file_type().unwrap().is_dir() {
                format!("{name}/")
            } else if name == "lib.rs" {
                continue;
            } else {
                name.clone()
            };
            assert!(
                layout.contains(&shown),
                "the layout's map leaves out {root}/{shown}"
            );
        }
    }
    for entry in std::fs::read_dir(repo().join("scripts")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".sh") {
            assert!(
                layout.contains(&name),
                "the layout leaves out scripts/{name}"
            );
        }
    }
}

#[test]
fn a_folder_given_as_the_trace_takes_the_trace_inside_it() {
    let dir = tempdir("trace-folder");
    let out = Command::new(gpushim_bin())
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env_remove("GPUSHIM_CONF")
        .args(["run", "--lib"])
        .arg(shim())
        .arg("--trace")
        .arg(&dir)
        .arg("--")
        .arg(sim().bin("train_loop"))
        .arg("3")
        .output()
        .unwrap();
    assert_ok(&out);
    let traces: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
    assert!(
        traces[0].starts_with("gpushim-train_loop.") && traces[0].ends_with(".trace"),
        "{traces:?}"
    );
}

#[test]
fn an_unknown_option_of_run_is_refused_with_the_nearest_one() {
    for (given, nearest) in [
        ("--config", "--conf"),
        ("--trace-dir", "--trace"),
        ("--plugable", "--pluggable"),
    ] {
        let out = Command::new(gpushim_bin())
            .args(["run", given, "x", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{given}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("unknown option {given} (did you mean {nearest}?)")),
            "{given}: {err}"
        );
    }
}

/// Every environment switch of the shim is named in its one table (`shim/src/options.rs`):
/// no other file reads a `GPUSHIM_` variable by name.
#[test]
fn the_shims_switches_are_read_from_one_table() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("shim/src"), &mut files);
    let table = repo().join("shim/src/options.rs");
    let mut named = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let reads = text.matches("c\"GPUSHIM_").count();
        if f == table {
            named = reads;
        } else {
            assert_eq!(reads, 0, "{} reads a GPUSHIM_ variable itself", f.display());
        }
    }
    assert!(named >= 7, "the table names {named}");
}

/// What the README and the docs show can be run: every `gpushim COMMAND` they name exists
/// (its `--help` answers), every command they show with its arguments succeeds, and every
/// script they name is there and parses.
#[test]
fn the_commands_and_scripts_the_docs_show_run() {
    let mut texts = vec![std::fs::read_to_string(repo().join("README.md")).unwrap()];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        texts.push(std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    let mut commands = std::collections::BTreeSet::new();
    let mut shown = std::collections::BTreeSet::new();
    let mut scripts = std::collections::BTreeSet::new();
    // A command is `gpushim WORD` at the start of a code line (after an optional `$ `) or
    // right after a backtick.
    let first_word = |rest: &str| -> Option<String> {
        let w: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase())
            .collect();
        (!w.is_empty()).then_some(w)
    };
    for t in &texts {
        for line in t.lines() {
            let code = line.trim_start().trim_start_matches("$ ");
            if let Some(rest) = code.strip_prefix("gpushim ") {
                commands.extend(first_word(rest));
                shown.insert(rest.split('#').next().unwrap_or("").trim().to_string());
            }
            for (i, _) in line.match_indices("`gpushim ") {
                let rest = &line[i + "`gpushim ".len()..];
                commands.extend(first_word(rest));
                shown.insert(rest.split('`').next().unwrap_or("").trim().to_string());
            }
        }
        for w in t.split(|c: char| c.is_whitespace() || "`|(),;:".contains(c)) {
            if let Some(i) = w.find("scripts/")
                && w.ends_with(".sh")
            {
                scripts.insert(w[i..].to_string());
            }
        }
    }
    assert!(
        commands.contains("leaks") && commands.contains("summary"),
        "{commands:?}"
    );
    for c in &commands {
        let out = Command::new(gpushim_bin())
            .args([c, "--help"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`gpushim {c}` named in the docs: {}",
            stderr(&out)
        );
    }
    // Every command shown with its arguments runs as shown, in a folder of its own: a trace
    // it names is the bundled example's trace, the program `run` starts is the bundled
    // training loop on the simulator (the docs' programs need a GPU and PyTorch). Commands with
    // placeholders of their own (COMMAND, ...) stand for others and were checked by --help.
    let trace = train_loop_trace("docs-commands");
    let dir = tempdir("docs-run");
    let mut ran = 0;
    for line in &shown {
        // A pipeline's first command is gpushim's.
        let words: Vec<String> = line
            .split(" | ")
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(|w| w.trim_matches('\'').to_string())
            .collect();
        // What `run` starts is replaced below, placeholders and all.
        let own: Vec<&String> = words.iter().take_while(|w| *w != "--").collect();
        if own.is_empty()
            || own
                .iter()
                .any(|w| *w == "CMD" || *w == "COMMAND" || w.ends_with("..."))
        {
            continue;
        }
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        let is_run = words[0] == "run";
        let mut has_trace = false;
        for w in &words {
            if w == "--" && is_run {
                break;
            }
            // A trace named in the text (a file, or a pattern of several) is the example's;
            // a trace `run` is to write is left as it is.
            if w.contains(".trace") && !is_run {
                args.push(trace.as_os_str().to_owned());
                has_trace = true;
            } else {
                args.push(w.into());
            }
        }
        let reads_a_trace = !matches!(words[0].as_str(), "run" | "config" | "lib");
        if reads_a_trace && !has_trace {
            args.push(trace.as_os_str().to_owned());
        }
        let mut c = Command::new(gpushim_bin());
        if is_run {
            args.insert(1, "--lib".into());
            args.insert(2, shim().into_os_string());
            args.extend([
                "--".into(),
                sim().bin("train_loop").into_os_string(),
                "3".into(),
            ]);
            c.env("LD_LIBRARY_PATH", &sim().dir);
        }
        let out = c
            .args(&args)
            .current_dir(&dir)
            .env_remove("GPUSHIM_CONF")
            .env_remove("GPUSHIM_TRACE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`gpushim {line}` as the docs show it, run as {args:?}: {}",
            stderr(&out)
        );
        ran += 1;
    }
    assert!(ran >= 14, "only {ran} commands run of {shown:?}");
    assert!(!scripts.is_empty());
    // Every file of the repository a script reads by name is there (a renamed test file once
    // broke a GPU check that only the GPU machine runs).
    let mut named = std::collections::BTreeSet::new();
    let mut stack = vec![repo().join("scripts")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let text = text.replace("\", \"", "/");
            for (i, _) in text.match_indices("tests/") {
                let rest: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "_./".contains(*c))
                    .collect();
                let rest = rest.trim_end_matches('.');
                if [".rs", ".c", ".py", ".cpp", ".h"]
                    .iter()
                    .any(|x| rest.ends_with(x))
                {
                    named.insert(rest.to_string());
                }
            }
        }
    }
    assert!(named.len() > 10, "{named:?}");
    for n in &named {
        assert!(
            repo().join(n).is_file(),
            "a script names {n}, which is not there"
        );
    }
    for s in &scripts {
        let path = repo().join(s);
        assert!(path.is_file(), "{s} named in the docs is not there");
        let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(out.status.success(), "{s}: {}", stderr(&out));
    }
}

/// The configuration reference (docs/configuration.md) says of every key what `gpushim config`
/// says, word for word: a key added or reworded in the code must be in the page too.
#[test]
fn the_configuration_page_says_what_gpushim_config_says() {
    let page = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let out = Command::new(gpushim_bin()).arg("config").output().unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    let keys = text
        .split("keys (")
        .nth(1)
        .and_then(|k| k.split("other variables").next())
        .expect("gpushim config lists its keys");
    let mut lines = keys
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty());
    let mut seen = 0;
    while let (Some(key_line), Some(accepts)) = (lines.next(), lines.next()) {
        let (key, meaning) = key_line.split_once(char::is_whitespace).unwrap();
        let accepts = accepts.strip_prefix("accepts: ").unwrap();
        let row = format!("| `{key}` | {} | {accepts} |", meaning.trim());
        assert!(
            page.contains(&row),
            "docs/configuration.md lacks the row:\n{row}"
        );
        seen += 1;
    }
    assert!(seen >= 10, "{text}");
    for var in ["GPUSHIM_TRACE", "GPUSHIM_DISABLE"] {
        assert!(text.contains(var) && page.contains(var), "{var}");
    }
}
