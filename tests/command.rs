//! The command a newcomer meets: `gpushim run` refuses what it cannot do before starting the
//! program, names its traces, takes a folder as the trace; unknown options are refused with the
//! nearest; help is true; empty answers say why.

use crate::common::*;
use std::path::Path;
use std::process::Command;

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
    let (out, started) = run_marked(&dir, &["--trace", missing.as_str()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!started, "the program must not start");
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
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
fn empty_answers_say_why() {
    let t = train_loop_trace("empty");
    let t = t.to_str().unwrap();
    // A filter that keeps nothing fails and says what the trace holds.
    let out = gpushim_text(&["peak", "--range", "nosuch", t]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the filters keep no allocation")
            && stderr(&out).contains("NVTX ranges: none"),
        "{}",
        stderr(&out)
    );
    let out = gpushim_text(&["leaks", "--boundary", "nosuch", t]);
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
    let out = gpushim_text(&["peak", cut.to_str().unwrap()]);
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
    let out = gpushim_text(&["leaks", dir.join("t.trace").to_str().unwrap()]);
    assert_ok(&out);
    assert!(!stdout(&out).contains("stacks:on"), "{}", stdout(&out));
}

#[test]
fn help_lists_report_options_only_for_reports_and_describes_every_argument() {
    for cmd in ["run", "config"] {
        let out = gpushim_text(&[cmd, "--help"]);
        assert!(
            !stdout(&out).contains("--device"),
            "{cmd}: {}",
            stdout(&out)
        );
    }
    for cmd in [
        "summary", "leaks", "peak", "oom", "events", "diff", "export", "plot",
    ] {
        let help = stdout(&gpushim_text(&[cmd, "--help"]));
        assert!(help.contains("--device"), "{cmd}");
        for line in help.lines() {
            let l = line.trim_start();
            if l.starts_with("--json") || l.starts_with('<') {
                assert!(l.split_whitespace().count() > 1, "{cmd}: undescribed `{l}`");
            }
        }
    }
    assert!(stdout(&gpushim_text(&["flamegraph", "--help"])).contains("PNG"));
    // A picture named for another format is refused, not written as SVG.
    let t = train_loop_trace("jpg");
    let jpg = t.with_extension("jpg");
    let out = gpushim_text(&["plot", "-o", jpg.to_str().unwrap(), t.to_str().unwrap()]);
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
    let out = gpushim_text(&["diff", sa, sb]);
    assert_ok(&out);
    let d = stdout(&out);
    assert!(
        d.contains(&format!("A = {sa}")) && d.contains(&format!("B = {sb}")),
        "{d}"
    );
    assert!(d.lines().nth(2).unwrap().contains("train.trace"), "{d}");
    // Two traces without ranks: the plot names them by file.
    let svg = a.with_file_name("two.svg");
    let out = gpushim_text(&["plot", "--by", "total", "-o", svg.to_str().unwrap(), sa, sb]);
    assert_ok(&out);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("train.trace device 0 live"), "{svg}");
    assert!(!svg.contains("trace 1 "), "positions are no names");
    // summary --json of two traces: the largest peak is an object with named fields.
    let v = {
        let out = gpushim_text(&["summary", "--json", sa, sb]);
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

/// `limit` without a pool is said at start, not silently ignored; with a pool it is enforced and
/// nothing is said.
#[test]
fn a_limit_without_a_pool_says_nothing_enforces_it() {
    let dir = tempdir("limit-nopool");
    let run_with = |conf: &str| {
        let t = dir.join(format!("t.{}.trace", conf.len()));
        let out = run(
            &sim().bin("train_loop"),
            Run {
                preload: true,
                trace: Some(&t),
                env: vec![("GPUSHIM_CONF", conf.into())],
                args: vec!["3".into()],
            },
        );
        assert_ok(&out);
        stderr(&out)
    };
    let said = run_with("limit:8MiB");
    assert!(
        said.contains("limit is enforced by the shim's pool, and pool is off: nothing enforces it"),
        "{said}"
    );
    let pooled = run_with("pool:caching,limit:1GiB");
    assert!(!pooled.contains("nothing enforces it"), "{pooled}");
}

/// Under GPUSHIM_DISABLE=1, `gpushim run` says the shim was off, not that the program made no
/// CUDA call.
#[test]
fn run_under_gpushim_disable_says_the_shim_was_off() {
    let dir = tempdir("disabled-run");
    let out = Command::new(gpushim_bin())
        .args(["run", "--trace"])
        .arg(dir.join("t.%p.trace"))
        .arg("--")
        .arg(sim().bin("train_loop"))
        .arg("2")
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("GPUSHIM_DISABLE", "1")
        .output()
        .unwrap();
    assert_ok(&out);
    let said = stderr(&out);
    assert!(
        said.contains("GPUSHIM_DISABLE=1 turned the shim off"),
        "{said}"
    );
    assert!(!said.contains("made no CUDA memory call"), "{said}");
}

/// The README's recipe for a program of one's own, as written: build the simulator, compile a
/// C program with a leak against it, run it under `gpushim run` with nothing set, and `leaks`
/// names the leaking line.
#[test]
fn the_readmes_recipe_for_ones_own_program_names_its_leaking_line() {
    let dir = tempdir("own-program");
    let simdir = dir.join("sim");
    let built = Command::new("bash")
        .arg(repo().join("scripts/build-sim.sh"))
        .arg(&simdir)
        .output()
        .unwrap();
    assert_ok(&built);
    let said = stdout(&built);
    let compile = said
        .lines()
        .find_map(|l| l.strip_prefix("a program of your own: "))
        .unwrap_or_else(|| panic!("build-sim.sh says how to build a program: {said}"));
    std::fs::write(
        dir.join("prog.c"),
        "#include \"cuda_sim.h\"\n\
         static void *kept[16];\n\
         __attribute__((noinline)) void step(int i) {\n\
         \x20   void *scratch = 0;\n\
         \x20   cudaMalloc(&kept[i], 1 << 20);\n\
         \x20   cudaMalloc(&scratch, 1 << 16);\n\
         \x20   cudaFree(scratch);\n\
         }\n\
         int main(void) { for (int i = 0; i < 16; i++) step(i); return 0; }\n",
    )
    .unwrap();
    let cc = Command::new("sh")
        .arg("-c")
        .arg(compile)
        .current_dir(&*dir)
        .output()
        .unwrap();
    assert_ok(&cc);
    let then = said
        .lines()
        .find_map(|l| l.strip_prefix("then: "))
        .and_then(|l| l.split("   ").next())
        .unwrap_or_else(|| panic!("build-sim.sh says how to run it: {said}"));
    let run = Command::new("sh")
        .arg("-c")
        .arg(then.replace("gpushim run", &format!("{} run", gpushim_bin().display())))
        .current_dir(&*dir)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("GPUSHIM_CONF")
        .env("GPUSHIM_LIB", shim())
        .output()
        .unwrap();
    assert_ok(&run);
    let trace = std::fs::read_dir(&*dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".trace"))
        .unwrap_or_else(|| panic!("no trace: {}", stderr(&run)));
    let leaks = report_json(&["leaks"], &[&trace]);
    let top = &leaks["live_at_exit"][0];
    assert_eq!(top["allocations"], 16, "{leaks}");
    assert!(
        top["label"]
            .as_str()
            .unwrap()
            .starts_with("step (prog.c:5)"),
        "{leaks}"
    );
}

/// `events --help` explains every column `events` prints.
#[test]
fn events_help_names_every_column_it_prints() {
    let t = train_loop_trace("events-columns");
    let out = gpushim(&[&"events", &t.as_os_str()]);
    assert_ok(&out);
    let header = stdout(&out).lines().next().unwrap().to_string();
    let help = gpushim(&[&"events", &"--help"]);
    let help = stdout(&help);
    for column in header.split(',') {
        assert!(
            help.contains(&format!("{column} (")) || help.contains(&format!("{column},")),
            "events --help leaves out the column {column}: {help}"
        );
    }
}

/// A trace that is not there gets a way forward: where `run` writes traces, and the nearest
/// trace of that folder.
#[test]
fn a_missing_trace_says_where_traces_are_and_the_nearest() {
    let dir = tempdir("missing-trace");
    std::fs::copy(
        repo().join("tests/data/torch/oom.trace"),
        dir.join("gpushim-python3.4242.trace"),
    )
    .unwrap();
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .args(["leaks", "gpushim-python3.4224.trace"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("no such trace"), "{err}");
    assert!(err.contains("`gpushim run` writes a trace"), "{err}");
    assert!(
        err.contains("did you mean gpushim-python3.4242.trace?"),
        "{err}"
    );
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .args(["summary", "unrelated-name.trace"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("the traces in the working folder: gpushim-python3.4242.trace"),
        "{}",
        stderr(&out)
    );
}

/// A misspelt setting gets the nearest key, before anything starts.
#[test]
fn a_misspelt_setting_gets_the_nearest_key() {
    let dir = tempdir("conf-typo");
    let (out, started) = run_marked(&dir, &["--conf", "pools:caching"], &[]);
    assert!(!started && out.status.code() == Some(2));
    assert!(
        stderr(&out).contains("unknown key 'pools' (did you mean 'pool'?)"),
        "{}",
        stderr(&out)
    );
    let (out, _) = run_marked(&dir, &["--conf", "pool=caching"], &[]);
    assert!(
        stderr(&out).contains("joined by ':', as in 'pool:caching'"),
        "{}",
        stderr(&out)
    );
}

/// A run with failed allocations points to `oom` first.
#[test]
fn a_run_with_failures_points_to_oom() {
    let dir = tempdir("run-oom-next");
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("GPUSHIM_SIM_MEMORY", (1u64 << 30).to_string())
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE")
        .args(["run", "--lib"])
        .arg(shim())
        .arg("--")
        .arg(sim().bin("leaky"))
        .arg("3")
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains(" failed; peak live"), "{err}");
    assert!(err.contains("next: gpushim oom "), "{err}");
}

/// A `trace_max` below what a trace's file takes (it grows in 4 MiB pieces) is refused, saying
/// the smallest it takes, rather than taken and then exceeded.
#[test]
fn a_trace_max_below_the_files_smallest_size_is_refused_with_the_smallest() {
    let out = gpushim_text(&["config", "trace_max:1MiB"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("4MiB at least"), "{}", stderr(&out));
    let ok = gpushim_text(&["config", "trace_max:4MiB"]);
    assert_ok(&ok);
}

#[test]
fn events_that_cannot_be_written_fail_and_say_so() {
    // A full disk (here /dev/full) is not a closed pipe: the command says what failed and
    // exits non-zero, where it ended with success and a cut file.
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    for json in [false, true] {
        let mut c = Command::new(gpushim_bin());
        c.arg("events").arg(&trace);
        if json {
            c.arg("--json");
        }
        let full = std::fs::File::options()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = c.stdout(full).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("writing the records failed"), "{err}");
    }
}
