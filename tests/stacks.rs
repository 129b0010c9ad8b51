//! Call stacks (GPUSHIM_CONF=stacks:...): each sampled call gets its stack, stacks are written
//! once however often they recur, the shim's own frames are dropped, and the module map lets
//! the command name the frames.

use crate::common::*;
use gpushim::trace::format::RecordKind;
use gpushim::trace::reader::TraceReader;

fn run_loop(conf: &str) -> TestFile {
    let t = tempdir("stacks").file("loop.trace");
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", conf.into())],
            args: vec!["20".into()],
        },
    );
    assert_ok(&out);
    t
}

#[test]
fn every_call_gets_its_stack_and_each_distinct_stack_is_written_once() {
    let t = run_loop("stacks:on");
    let mut reader = TraceReader::open(&t).unwrap();
    let (mut calls, mut refs, mut defs) = (0, 0, 0);
    let mut last_was_call = false;
    let mut frames_of = Vec::new();
    for r in reader.by_ref() {
        match r.kind {
            RecordKind::Alloc
            | RecordKind::Free
            | RecordKind::AllocAsync
            | RecordKind::FreeAsync => {
                calls += 1;
                last_was_call = true;
            }
            RecordKind::StackRef => {
                assert!(last_was_call, "a stack must follow its call");
                last_was_call = false;
                refs += 1;
                frames_of.push(r.ptr);
            }
            RecordKind::Stack => defs += 1,
            _ => {}
        }
    }
    assert_eq!(
        calls,
        1 + 20 * 15 + 1,
        "weights + 15 calls a step + final free"
    );
    assert_eq!(refs, calls);
    // train_loop.c makes its calls from 7 call sites.
    assert!(defs <= 8, "{defs} stack definitions for 7 call sites");
    for id in frames_of {
        let frames = reader.stack(id).expect("every referenced stack is defined");
        let first = reader.describe_address(frames[0]);
        assert!(
            first.starts_with("train_loop+"),
            "innermost frame {first} is not the program's"
        );
        assert!(frames.len() >= 2, "main's caller is missing");
    }
}

#[test]
fn stacks_can_be_sampled_and_a_c_program_gets_its_allocations_stacks_by_default() {
    let t = run_loop("stacks:10");
    let (records, _) = decode(&t);
    let calls = records
        .iter()
        .filter(|r| {
            matches!(
                r.kind,
                RecordKind::Alloc
                    | RecordKind::Free
                    | RecordKind::AllocAsync
                    | RecordKind::FreeAsync
            )
        })
        .count();
    let refs = records
        .iter()
        .filter(|r| r.kind == RecordKind::StackRef)
        .count();
    assert_eq!(refs, calls / 10);
    // By default (`stacks:auto`) a program that runs no CPython gets the native stack of each
    // allocating call, none of its frees.
    let t = run_loop("pool:off");
    let (records, _) = decode(&t);
    let mut allocations = 0;
    let mut with_stack = 0;
    // Per thread: whether its last record was an allocation (NVML's sampler records too).
    let mut last_allocated = std::collections::HashMap::new();
    for r in &records {
        match r.kind {
            RecordKind::Alloc | RecordKind::AllocAsync if r.status == 0 => {
                allocations += 1;
                last_allocated.insert(r.thread, true);
            }
            RecordKind::StackRef => {
                assert_eq!(
                    last_allocated.insert(r.thread, false),
                    Some(true),
                    "a stack after something else: {r:?}"
                );
                with_stack += 1;
            }
            RecordKind::Caller | RecordKind::ThreadStart => {}
            k if !k.is_definition() => {
                last_allocated.insert(r.thread, false);
            }
            _ => {}
        }
    }
    assert!(allocations > 0);
    assert_eq!(with_stack, allocations);
    assert!(
        stdout(&gpushim(&[&"leaks", &t])).contains("(train_loop.c:"),
        "the C program's own line"
    );
    // `stacks:python` records none for it: who called for each allocation only (and the module
    // map that names it).
    let t = run_loop("stacks:python");
    let (records, _) = decode(&t);
    assert!(
        !records
            .iter()
            .any(|r| matches!(r.kind, RecordKind::StackRef | RecordKind::Stack))
    );
    assert!(records.iter().any(|r| r.kind == RecordKind::Caller));
}

/// `events` writes a stack's words once, at its id's first `stack_ref`, and only the id after:
/// the output grows with the distinct stacks, not with every allocation's stack (one long stack
/// named by every allocation of a forged trace made hundreds of times the trace's bytes).
#[test]
fn the_events_command_writes_each_stack_once() {
    let t = run_loop("stacks:on");
    for json in [false, true] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"events", &t];
        if json {
            args.push(&"--json");
        }
        let out = gpushim(&args);
        assert_ok(&out);
        let text = stdout(&out);
        let rows: Vec<&str> = text.lines().filter(|l| l.contains("stack_ref")).collect();
        let with_words: Vec<&str> = rows.iter().copied().filter(|l| l.contains(" < ")).collect();
        let ids: std::collections::BTreeSet<String> = rows
            .iter()
            .map(|l| {
                if json {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["ptr"].to_string()
                } else {
                    l.split(',').nth(6).unwrap().to_string()
                }
            })
            .collect();
        assert!(
            rows.len() > 2 * ids.len(),
            "{json}: {} rows, {} ids",
            rows.len(),
            ids.len()
        );
        assert_eq!(with_words.len(), ids.len(), "{json}: {text}");
    }
}

#[test]
fn the_events_command_prints_the_frames_of_a_stack() {
    let t = run_loop("stacks:on");
    let frames = |extra: &[&str]| {
        let out = std::process::Command::new(gpushim_bin())
            .arg("events")
            .args(extra)
            .arg(&t)
            .output()
            .unwrap();
        assert_ok(&out);
        stdout(&out)
            .lines()
            .find(|l| l.contains(",stack_ref,"))
            .expect("a stack_ref row")
            .to_string()
    };
    // Named from the executable's debug information: `main (train_loop.c:20)`, ...
    let named = frames(&[]);
    assert!(
        named.contains("main (train_loop.c:") && named.contains(" < "),
        "{named}"
    );
    let raw = frames(&["--no-symbols"]);
    assert!(
        raw.contains("train_loop+0x") && raw.contains(" < "),
        "{raw}"
    );
}

#[test]
fn a_stack_recognized_from_before_is_the_same_stack() {
    // Two functions of the same shape, called alternately from the same depth: stacks seen
    // before are recognized without unwinding, and must never be another function's.
    let dir = tempdir("stackcache");
    let t = dir.join("sc.trace");
    let out = run(
        &sim().bin("stackcache"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "stacks:native".into())],
            ..Run::default()
        },
    );
    assert_ok(&out);
    let mut reader = TraceReader::open(&t).unwrap();
    let mut pending: Option<u64> = None;
    let mut checked = 0;
    while let Some(r) = reader.next() {
        match r.kind {
            RecordKind::Alloc => pending = Some(r.size),
            RecordKind::StackRef => {
                if let Some(size) = pending.take() {
                    let names: Vec<String> = reader
                        .stack(r.ptr)
                        .unwrap()
                        .iter()
                        .filter_map(|&ip| gpushim::report::symbolize::frame(&reader, ip).function)
                        .collect();
                    let (want, not) = if size == 4096 {
                        ("from_f", "from_g")
                    } else {
                        ("from_g", "from_f")
                    };
                    assert!(names.iter().any(|n| n == want), "{size} B: {names:?}");
                    assert!(!names.iter().any(|n| n == not), "{size} B: {names:?}");
                    checked += 1;
                }
            }
            RecordKind::Free => pending = None,
            _ => {}
        }
    }
    assert_eq!(checked, 600);
}

/// The build-id of each module is recorded, and a module rebuilt after the run does not name
/// the run's frames: `events` names `local_roundtrip` from the library that ran, keeps
/// `liblocal.so+0x…` and says why once the file on disk has another build-id or none, and
/// names it again once the file that ran is back.
#[test]
fn frames_are_named_only_from_the_build_that_ran() {
    let dir = tempdir("buildid");
    let lib = dir.join("liblocal.so");
    let inc = repo().join("tests/sim");
    let build = |id: &str| {
        let _ = std::fs::remove_file(&lib);
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-I",
            inc.to_str().unwrap(),
            "-o",
            lib.to_str().unwrap(),
            repo().join("tests/clients/local_lib.c").to_str().unwrap(),
            "-L",
            sim().dir.to_str().unwrap(),
            "-lcudart",
            &format!("-Wl,--build-id={id}"),
        ]);
    };
    build("0x0123456789abcdef0123");
    let t = dir.join("local.trace");
    let out = run(
        &sim().bin("load_local"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "stacks:native".into())],
            args: vec![lib.to_string_lossy().into_owned()],
        },
    );
    assert_ok(&out);
    // The trace holds the id the library was linked with, at the library's base.
    let mut reader = TraceReader::open(&t).unwrap();
    let mut base = None;
    while let Some(r) = reader.next() {
        if r.kind == RecordKind::Module
            && reader
                .string(r.size)
                .is_some_and(|p| p.ends_with("/liblocal.so"))
        {
            base = Some(r.ptr);
        }
    }
    let base = base.expect("a module record for liblocal.so");
    assert_eq!(reader.build_id_of(base), Some("0123456789abcdef0123"));
    let events = || {
        let out = std::process::Command::new(gpushim_bin())
            .arg("events")
            .arg(&t)
            .output()
            .unwrap();
        assert_ok(&out);
        let row = stdout(&out)
            .lines()
            .find(|l| l.contains(",stack_ref,") && l.contains("liblocal.so"))
            .expect("a stack_ref row through liblocal.so")
            .to_string();
        (row, stderr(&out))
    };
    let (row, err) = events();
    assert!(row.contains("local_roundtrip (liblocal.so+0x"), "{row}");
    assert!(!err.contains("not the file that ran"), "{err}");
    // Rebuilt with another id: the frame stays an offset, and stderr names the file and both ids.
    build("0xfedcba98765432100123");
    let (row, err) = events();
    assert!(!row.contains("local_roundtrip"), "{row}");
    assert!(row.contains("liblocal.so+0x"), "{row}");
    assert!(
        err.contains("liblocal.so is not the file that ran")
            && err.contains("fedcba98765432100123")
            && err.contains("0123456789abcdef0123"),
        "{err}"
    );
    // Rebuilt with no id at all: nothing proves it is the one that ran.
    build("none");
    let (row, err) = events();
    assert!(!row.contains("local_roundtrip"), "{row}");
    assert!(err.contains("it has no build-id"), "{err}");
    // The build that ran, back in place: named again.
    build("0x0123456789abcdef0123");
    let (row, _) = events();
    assert!(row.contains("local_roundtrip (liblocal.so+0x"), "{row}");
}
