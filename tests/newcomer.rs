//! What a newcomer meets first: every command's help with an example, a program killed by a
//! signal said as such, a folder given where a trace goes, a trace cut short.

use crate::common::*;
use std::process::Command;

/// Every command's `--help` ends with an example of it, as the README says: the commands are
/// read from the top-level help, so a new one without an example fails here.
#[test]
fn every_commands_help_shows_an_example_of_it() {
    let top = stdout(&gpushim_text(&["--help"]));
    let commands: Vec<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&c| c != "help")
        .collect();
    assert!(commands.len() >= 16, "{top}");
    for cmd in commands {
        let help = stdout(&gpushim_text(&[cmd, "--help"]));
        let example = help
            .lines()
            .skip_while(|l| !l.starts_with("Example"))
            .skip(1)
            .any(|l| l.contains(&format!("gpushim {cmd}")) || l.contains("$(gpushim lib)"));
        assert!(example, "{cmd}: no example in its help:\n{help}");
    }
}

/// A program killed by a signal: `run` returns 128 + the signal, as a shell does, and says which
/// signal and what usually sends it (the OOM killer, for SIGKILL) instead of a bare 137.
#[test]
fn run_says_when_the_program_was_killed() {
    let dir = tempdir("killed");
    let script = format!(
        "'{}' 2 >/dev/null; kill -9 $$",
        sim().bin("train_loop").display()
    );
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE")
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("killed by SIGKILL") && err.contains("out-of-memory killer"),
        "{err}"
    );
    assert!(
        err.contains("Its trace holds every record up to then"),
        "{err}"
    );
    // A program that exits on its own is not said to be killed.
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env_remove("GPUSHIM_CONF")
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--trace", "off", "--", "sh", "-c", "exit 137"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137));
    assert!(!stderr(&out).contains("killed"), "{}", stderr(&out));
}

/// A folder given to a report where a trace goes: the error lists the traces inside it.
#[test]
fn a_folder_given_to_a_report_names_the_traces_in_it() {
    let dir = tempdir("folder-report");
    let t = train_loop_trace("folder-report-trace");
    std::fs::copy(&*t, dir.join("a.trace")).unwrap();
    std::fs::copy(&*t, dir.join("b.trace")).unwrap();
    std::fs::write(dir.join("notes.txt"), b"x").unwrap();
    let out = gpushim_text(&["summary", dir.to_str().unwrap()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let a = dir.join("a.trace");
    let b = dir.join("b.trace");
    assert!(
        err.contains("a folder: name the traces in it (2: ")
            && err.contains(a.to_str().unwrap())
            && err.contains(b.to_str().unwrap())
            && !err.contains("notes.txt"),
        "{err}"
    );
}

/// A trace cut short (a copy interrupted, a disk full): `oom` and `peak` say so where they
/// answer, as `leaks` and `summary` do, instead of a bare "0 failed allocation(s)" where the
/// whole trace has one.
#[test]
fn oom_and_peak_say_when_the_trace_was_cut_short() {
    let whole = repo().join("tests/data/torch/oom.trace");
    let dir = tempdir("cut-oom");
    let cut = dir.join("cut.trace");
    let bytes = std::fs::read(&whole).unwrap();
    std::fs::write(&cut, &bytes[..5000]).unwrap();
    let said = |cmd: &str, t: &std::path::Path| stdout(&gpushim_text(&[cmd, t.to_str().unwrap()]));
    assert!(said("oom", &whole).contains(": 1 failed allocation(s)"));
    assert!(!said("oom", &whole).contains("incomplete"));
    for cmd in ["oom", "peak"] {
        let text = said(cmd, &cut);
        assert!(
            text.contains("the trace is incomplete") && text.contains("cut short"),
            "{cmd}: {text}"
        );
    }
}

/// What a newcomer trips on, each said in one line naming the fix: `fit` and `diff` given a
/// saved analysis say it is one and that they need the trace (not "not a gpushim trace");
/// `--at 0` is refused alike by every command that takes it; `top` on a trace that is not
/// there yet says at once that it waits for it; `fit` names the defaults as the variable unset.
#[test]
fn what_a_newcomer_trips_on_is_said_with_its_fix() {
    let dir = tempdir("newcomer-trips");
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/gpt2.trace");
    let saved = dir.join("g.analysis");
    assert_ok(&gpushim(&[&"analyze", &trace, &"-o", &saved]));
    for args in [
        vec!["fit", saved.to_str().unwrap(), "--at", "2"],
        vec!["diff", saved.to_str().unwrap(), trace.to_str().unwrap()],
    ] {
        let out = gpushim_text(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("is a saved analysis") && err.contains("give the trace"),
            "{args:?}: {err}"
        );
    }
    for cmd in ["fit", "summary", "oom", "report"] {
        let out = gpushim_text(&[cmd, trace.to_str().unwrap(), "--at", "0"]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(
            stderr(&out).contains("0 is not in 1.."),
            "{cmd}: {}",
            stderr(&out)
        );
    }
    let missing = dir.join("not-yet.trace");
    let mut c = Command::new(gpushim_bin());
    c.args(["top", missing.to_str().unwrap()]);
    let out = crate::hostile_folders::finish_within(
        c,
        std::time::Duration::from_secs(30),
        "top on a trace not there",
    );
    assert!(
        stderr(&out).contains("no trace at") && stderr(&out).contains("waiting up to 10 s"),
        "{}",
        stderr(&out)
    );
    let fit = stdout(&gpushim_text(&[
        "fit",
        trace.to_str().unwrap(),
        "--at",
        "8",
    ]));
    assert!(!fit.contains("PYTORCH_CUDA_ALLOC_CONF=)"), "{fit}");
}
