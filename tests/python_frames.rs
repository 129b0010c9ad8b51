//! Python frames: a Python program's allocations carry the file, line and function of
//! its frames, read without the GIL and never wrong, and `leaks` names the line that keeps the
//! memory. The programs allocate through ctypes, which releases the GIL around the call, as
//! PyTorch's operators do.
//!
//! Every test runs under `python3`; set `GPUSHIM_TEST_PYTHONS` to a space-separated list of
//! interpreters (CPython 3.9 to 3.13) to run them under each.

use crate::common::*;
use gpushim::report::symbolize::{FrameInfo, frame};
use gpushim::trace::format::RecordKind;
use gpushim::trace::reader::TraceReader;
use std::path::Path;
use std::process::Command;

/// The interpreters to test under: CPython 3.9 to 3.13 with a GIL (others get no frames by
/// design; a machine whose `python3` is one of those says so and tests nothing here).
fn pythons() -> Vec<String> {
    let named: Vec<String> = match std::env::var("GPUSHIM_TEST_PYTHONS") {
        Ok(v) if !v.trim().is_empty() => v.split_whitespace().map(str::to_string).collect(),
        _ => vec!["python3".to_string()],
    };
    named
        .into_iter()
        .filter(|py| {
            let probe = "import sys, sysconfig; print(sys.implementation.name, \
                         sys.version_info[0], sys.version_info[1], \
                         sysconfig.get_config_var('Py_GIL_DISABLED') or 0)";
            let out = Command::new(py).args(["-c", probe]).output();
            let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
            let ok = text.as_deref().is_ok_and(|t| {
                let f: Vec<&str> = t.split_whitespace().collect();
                f.len() == 4
                    && f[0] == "cpython"
                    && f[1] == "3"
                    && f[2].parse::<u32>().is_ok_and(|m| (9..=13).contains(&m))
                    && f[3] == "0"
            });
            if !ok {
                skipped(
                    "python_frames",
                    &format!("{py}: not CPython 3.9-3.13 with a GIL ({text:?})"),
                );
            }
            ok
        })
        .collect()
}

fn client(name: &str) -> String {
    repo()
        .join("tests/clients")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn cudart() -> String {
    sim()
        .dir
        .join("libcudart.so.13")
        .to_string_lossy()
        .into_owned()
}

/// Runs a Python client under the shim; returns the trace and the exit code.
fn run_py(python: &str, script: &str, conf: Option<&str>, tag: &str) -> (TestFile, i32, String) {
    run_py_env(python, script, conf, tag, Vec::new())
}

/// `run_py` with more environment for the client.
fn run_py_env(
    python: &str,
    script: &str,
    conf: Option<&str>,
    tag: &str,
    mut env: Vec<(&'static str, String)>,
) -> (TestFile, i32, String) {
    let t = tempdir(tag).file("py.trace");
    if let Some(c) = conf {
        env.push(("GPUSHIM_CONF", c.to_string()));
    }
    let out = run(
        Path::new(python),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec![client(script), cudart()],
            env,
        },
    );
    (t, out.status.code().unwrap_or(-1), stderr(&out))
}

/// Each successful allocation: its size and the frames of the stack recorded after it.
fn allocations(path: &Path) -> Vec<(u64, Vec<FrameInfo>)> {
    let mut reader = TraceReader::open(path).unwrap();
    let mut out: Vec<(u64, Vec<FrameInfo>)> = Vec::new();
    let mut pending: std::collections::HashMap<u16, usize> = Default::default();
    while let Some(r) = reader.next() {
        match r.kind {
            RecordKind::Alloc if r.status == 0 => {
                pending.insert(r.thread, out.len());
                out.push((r.size, Vec::new()));
            }
            RecordKind::StackRef => {
                if let Some(i) = pending.remove(&r.thread) {
                    let frames = reader.stack(r.ptr).unwrap_or(&[]).to_vec();
                    out[i].1 = frames.iter().map(|&f| frame(&reader, f)).collect();
                }
            }
            _ => {}
        }
    }
    out
}

fn leaks_json(path: &Path) -> serde_json::Value {
    report_json(&["leaks"], &[path])
}

#[test]
fn leaks_names_the_line_that_keeps_the_memory_and_its_growth() {
    for py in pythons() {
        let (t, code, err) = run_py(&py, "py_leak.py", None, "pyleak");
        assert_eq!(code, 0, "{py}: {err}");
        let allocs = allocations(&t);
        assert_eq!(allocs.len(), 40, "{py}");
        for (size, frames) in &allocs {
            assert!(
                frames.iter().all(|f| f.python),
                "{py}: only Python frames by default"
            );
            let lines: Vec<(String, u32)> = frames
                .iter()
                .map(|f| (f.function.clone().unwrap(), f.line.unwrap()))
                .collect();
            // alloc() at line 11, called from step() at 17 (freed) or 18 (kept), from the
            // module's loop at line 23: innermost first.
            let caller = if *size == 1 << 20 { 17 } else { 18 };
            assert_eq!(
                lines,
                [
                    ("alloc".to_string(), 11),
                    ("step".to_string(), caller),
                    ("<module>".to_string(), 23)
                ],
                "{py}"
            );
            assert!(
                frames[0]
                    .file
                    .as_deref()
                    .unwrap()
                    .ends_with("tests/clients/py_leak.py")
            );
        }
        let l = leaks_json(&t);
        let top = &l["live_at_exit"][0];
        assert_eq!(
            top["label"],
            "py_leak.py:11 in alloc < py_leak.py:18 in step < py_leak.py:23 in <module>",
            "{py}: {l}"
        );
        assert_eq!(top["allocations"], 20);
        let growth = &l["iterations"]["growing"][0];
        assert_eq!(growth["bytes_per_iteration"], 65536, "{py}: {l}");
        assert!(
            growth["call_site"]
                .as_str()
                .unwrap()
                .contains("py_leak.py:18 in step")
        );
        // The summary counts the allocations that have Python frames.
        let out = Command::new(gpushim_bin())
            .args(["summary"])
            .arg(&t)
            .output()
            .unwrap();
        assert!(
            stdout(&out).contains("Python frames: 40 of 40 allocations"),
            "{py}"
        );
    }
}

#[test]
fn each_thread_gets_its_own_frames() {
    for py in pythons() {
        let (t, code, err) = run_py(&py, "py_threads.py", None, "pythreads");
        assert_eq!(code, 0, "{py}: {err}");
        let allocs = allocations(&t);
        assert_eq!(allocs.len(), 900, "{py}");
        for (size, frames) in &allocs {
            let want = match size {
                4096 => "worker_a",
                8192 => "worker_b",
                _ => "main_loop",
            };
            let names: Vec<&str> = frames
                .iter()
                .filter_map(|f| f.function.as_deref())
                .collect();
            assert_eq!(names.first(), Some(&"grab"), "{py}: {names:?}");
            assert_eq!(names.get(1), Some(&want), "{py}: {size} B from {names:?}");
        }
    }
}

#[test]
fn allocations_while_the_interpreter_exits_end_normally() {
    for py in pythons() {
        let (t, code, err) = run_py(&py, "py_exit.py", None, "pyexit");
        assert_eq!(code, 0, "{py}: {err}");
        let allocs = allocations(&t);
        let sizes: Vec<u64> = allocs.iter().map(|a| a.0).collect();
        assert_eq!(sizes, [1024, 2048, 3072], "{py}");
        // Frames, where present, are the right ones.
        assert_eq!(allocs[0].1[0].function.as_deref(), Some("grab"), "{py}");
        for (_, frames) in &allocs[1..] {
            if let Some(f) = frames.first() {
                assert_eq!(f.function.as_deref(), Some("grab"), "{py}");
            }
        }
    }
}

#[test]
fn stacks_off_or_native_record_no_python_frames() {
    for py in pythons() {
        let (t, code, _) = run_py(&py, "py_leak.py", Some("stacks:off"), "pyoff");
        assert_eq!(code, 0);
        let allocs = allocations(&t);
        assert_eq!(allocs.len(), 40);
        assert!(allocs.iter().all(|a| a.1.is_empty()), "{py}: stacks:off");
        let (t, code, _) = run_py(&py, "py_leak.py", Some("stacks:native"), "pynative");
        assert_eq!(code, 0);
        let allocs = allocations(&t);
        assert!(
            allocs
                .iter()
                .all(|a| !a.1.is_empty() && a.1.iter().all(|f| !f.python)),
            "{py}: stacks:native"
        );
        // Both: Python frames first, then native ones, shown on request.
        let (t, _, _) = run_py(&py, "py_leak.py", Some("stacks:on"), "pyboth");
        let allocs = allocations(&t);
        let (_, frames) = &allocs[0];
        let python = frames.iter().take_while(|f| f.python).count();
        assert_eq!(python, 3, "{py}");
        assert!(
            frames.len() > python,
            "{py}: native frames after the Python ones"
        );
        let shown = |extra: &[&str]| {
            let out = Command::new(gpushim_bin())
                .arg("leaks")
                .args(extra)
                .arg(&t)
                .output()
                .unwrap();
            stdout(&out)
        };
        assert!(!shown(&[]).contains("libcudart"), "{py}");
        let with_native = shown(&["--native-frames"]);
        assert!(with_native.contains("py_leak.py:18 in step"), "{py}");
    }
}

#[test]
fn no_python_frames_once_a_sub_interpreter_exists() {
    for py in pythons() {
        let (t, code, err) = run_py(&py, "py_subinterp.py", None, "pysub");
        if code == 3 {
            continue; // no sub-interpreter module in this Python
        }
        assert_eq!(code, 0, "{py}: {err}");
        let allocs = allocations(&t);
        assert_eq!(allocs.len(), 2, "{py}");
        assert!(!allocs[0].1.is_empty(), "{py}: one interpreter: frames");
        assert!(allocs[1].1.is_empty(), "{py}: two interpreters: none");
        assert!(err.contains("sub-interpreters"), "{py}: {err}");
    }
}

/// Runs `py_code_reuse.py` (with `changes` as REUSE_CHANGES) and checks that each round's
/// allocation names the function and line `expect(round)` gives.
fn code_reuse_rounds(py: &str, changes: &str, expect: impl Fn(u64) -> (String, u32)) {
    let env = vec![("REUSE_CHANGES", changes.to_string())];
    let (t, code, err) = run_py_env(py, "py_code_reuse.py", None, "pyreuse", env);
    assert_eq!(code, 0, "{py}: {err}");
    // The premise: CPython gave some round's code object an address used before (else this
    // test proves nothing about reuse).
    let reused: u32 = err.lines().find_map(|l| l.trim().parse().ok()).unwrap_or(0);
    assert!(reused > 0, "{py}: no code object address was reused: {err}");
    let allocs = allocations(&t);
    assert_eq!(allocs.len(), 30, "{py}");
    for (size, frames) in &allocs {
        let round = size / 4096 - 1;
        let (function, line) = expect(round);
        let top = &frames[0];
        assert_eq!(
            (top.function.clone(), top.line),
            (Some(function), Some(line)),
            "{py}: round {round}"
        );
    }
}

#[test]
fn a_code_object_freed_and_replaced_at_its_address_gives_the_new_line() {
    for py in pythons() {
        code_reuse_rounds(&py, "line", |round| {
            ("template".to_string(), round as u32 + 1001)
        });
    }
}

/// The minor version of a CPython 3 interpreter.
fn minor(py: &str) -> u32 {
    let out = Command::new(py)
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_code_object_renamed_at_its_address_with_its_first_line_kept_gives_the_new_name() {
    // Each round's code object differs from the last only in its name: same file, same first
    // line, same line table, same instructions, and (freed each round) often the same
    // address. From 3.12 the per-thread cache knows a code object by `co_version`, which no two
    // share; before 3.12 it knows it by file name and first line, which these share, so those
    // versions are not asked this (README, "Not built yet").
    for py in pythons() {
        if minor(&py) < 12 {
            eprintln!("{py}: before 3.12 there is no co_version; not asked here");
            continue;
        }
        code_reuse_rounds(&py, "name", |round| (format!("gen{round}"), 1001));
    }
}

/// `--program-frames` leaves the frames of installed packages and the standard library out of
/// call sites (here contextlib's, between the program's generator and the line that used it).
#[test]
fn program_frames_leave_the_libraries_frames_out_of_call_sites() {
    let Some(py) = pythons().into_iter().next() else {
        return;
    };
    let (t, code, err) = run_py(&py, "py_library.py", None, "pylibrary");
    assert_eq!(code, 0, "{py}: {err}");
    let label = |args: &[&str]| {
        let mut a = vec!["leaks"];
        a.extend_from_slice(args);
        report_json(&a, &[&t])["live_at_exit"][0]["label"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let all = label(&[]);
    assert!(all.contains("contextlib.py"), "{all}");
    let own = label(&["--program-frames"]);
    assert_eq!(
        own,
        "py_library.py:15 in workspace < py_library.py:20 in step < py_library.py:25 in <module>",
        "{all}"
    );
}
