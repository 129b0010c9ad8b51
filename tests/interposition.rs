//! Contract 1 (coverage), 2 (fidelity) and 4 (never break the host) in pass-through mode, on
//! the simulator: every route reaches the shim, each call is recorded once, results are the
//! real ones, and the shim stays out of the way when it should.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};

fn trace_in(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("run.trace")
}

#[test]
fn every_hooked_function_called_directly_is_recorded_once_in_call_order() {
    let dir = tempdir("coverage");
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("coverage"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert_ok(&out);
    let expected: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert!(
        expected.len() > 40,
        "the client made too few calls: {expected:?}"
    );
    let (records, stats) = decode(&t);
    assert_eq!(api_names(&records), expected);
    assert_eq!((stats.torn, stats.lost, stats.damage), (0, 0, None));
    // Every call succeeded, and every allocating call recorded a pointer and a size.
    for r in calls(&records) {
        assert_eq!(r.status, 0, "{r:?}");
        if matches!(
            r.kind,
            RecordKind::Alloc
                | RecordKind::AllocAsync
                | RecordKind::HostAlloc
                | RecordKind::ManagedAlloc
        ) {
            assert!(r.ptr != 0 && r.size > 0, "{r:?}");
        }
    }
    // Async records carry their stream, announced once.
    let streams: Vec<_> = records
        .iter()
        .filter(|r| r.kind == RecordKind::StreamName)
        .collect();
    assert_eq!(streams.len(), 2, "one runtime and one driver stream");
    assert!(
        calls(&records)
            .iter()
            .filter(|r| r.kind == RecordKind::AllocAsync)
            .all(|r| r.stream != 0)
    );
}

#[test]
fn every_function_listed_in_the_design_is_covered_by_the_coverage_client() {
    // Contract 1's list; the coverage test above proves each one is recorded.
    let listed = [
        "cudaMalloc",
        "cudaFree",
        "cudaMallocAsync",
        "cudaFreeAsync",
        "cudaMallocFromPoolAsync",
        "cudaMallocManaged",
        "cudaMallocHost",
        "cudaHostAlloc",
        "cudaFreeHost",
        "cudaMallocPitch",
        "cudaMalloc3D",
        "cudaMemGetInfo",
        "cudaMallocAsync_ptsz",
        "cudaFreeAsync_ptsz",
        "cudaMallocFromPoolAsync_ptsz",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuMemHostAlloc",
        "cuMemFreeHost",
        "cuMemCreate",
        "cuMemRelease",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemSetAccess",
        "cuMemGetInfo_v2",
        "cuMemAllocAsync_ptsz",
        "cuMemFreeAsync_ptsz",
        "cuMemAllocFromPoolAsync_ptsz",
    ];
    let src = std::fs::read_to_string(repo().join("tests/clients/coverage.c")).unwrap();
    for name in listed {
        assert!(
            src.contains(&format!("CALL(\"{name}\"")),
            "coverage.c does not call {name}"
        );
        assert!(
            Api::ALL.iter().any(|a| a.name() == name),
            "the trace format has no API named {name}"
        );
    }
}

#[test]
fn python_ctypes_lookups_through_dlsym_are_intercepted() {
    let dir = tempdir("ctypes");
    let t = trace_in(&dir);
    let out = run(
        std::path::Path::new("python3"),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec![
                repo()
                    .join("tests/clients/ctypes_client.py")
                    .to_string_lossy()
                    .into_owned(),
                sim()
                    .dir
                    .join("libcudart.so.13")
                    .to_string_lossy()
                    .into_owned(),
            ],
            ..Run::default()
        },
    );
    assert_ok(&out);
    assert_eq!(stdout(&out), "cudaMalloc 0\ncudaFree 0\n");
    let (records, _) = decode(&t);
    assert_eq!(api_names(&records), ["cudaMalloc", "cudaFree"]);
    let c = calls(&records);
    assert_eq!(c[0].size, 1 << 20);
    assert_eq!(
        c[0].ptr, c[1].ptr,
        "the free names the pointer the allocation returned"
    );
}

#[test]
fn a_library_loaded_rtld_local_is_intercepted_and_forwarded() {
    let dir = tempdir("local");
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("load_local"),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec![sim().dir.join("liblocal.so").to_string_lossy().into_owned()],
            ..Run::default()
        },
    );
    assert_ok(&out);
    assert_eq!(stdout(&out), "local_roundtrip 0\n");
    let (records, _) = decode(&t);
    assert_eq!(api_names(&records), ["cudaMalloc", "cudaFree"]);
    assert!(calls(&records).iter().all(|r| r.status == 0));
}

#[test]
fn driver_functions_from_entry_point_lookups_are_intercepted_and_others_pass_untouched() {
    let dir = tempdir("entry");
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("entry_points"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert_ok(&out);
    let s = stdout(&out);
    let expected: Vec<&str> = s.lines().filter_map(|l| l.strip_prefix("call ")).collect();
    assert!(expected.contains(&"cuMemCreate") && expected.contains(&"cuMemMap"));
    let (records, _) = decode(&t);
    assert_eq!(api_names(&records), expected);
    for check in [
        "unknown_name_untouched",
        "old_abi_untouched",
        "future_version_untouched",
        "current_version_wrapped",
    ] {
        assert!(
            s.contains(&format!("check {check} 1")),
            "{check} failed:\n{s}"
        );
    }
}

#[test]
fn entry_point_lookups_return_the_real_functions_without_the_shim() {
    let out = run(&sim().bin("entry_points"), Run::default());
    assert_ok(&out);
    let s = stdout(&out);
    assert!(s.contains("check current_version_wrapped 0"), "{s}");
    assert!(s.contains("check unknown_name_untouched 1"), "{s}");
}

#[test]
fn the_runtimes_own_driver_calls_go_through_the_shim_but_count_once() {
    let dir = tempdir("route");
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("runtime_route"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert_ok(&out);
    let s = stdout(&out);
    // The runtime got its driver functions through our dlsym and cuGetProcAddress_v2 wrappers...
    assert!(s.contains("runtime_driver_pointer_wrapped 1"), "{s}");
    assert!(s.contains("driver_cuMemAlloc_v2_calls 1"), "{s}");
    // ...and yet the allocation is recorded once, as the runtime call.
    let (records, _) = decode(&t);
    assert_eq!(api_names(&records), ["cudaMalloc", "cudaFree"]);
}

#[test]
fn return_codes_and_last_errors_are_identical_with_and_without_the_shim() {
    let without = run(&sim().bin("conformance"), Run::default());
    let dir = tempdir("conformance");
    let t = trace_in(&dir);
    let with = run(
        &sim().bin("conformance"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert_ok(&without);
    assert_ok(&with);
    assert_eq!(stdout(&with), stdout(&without));
    // Failed calls are recorded with their codes.
    let (records, _) = decode(&t);
    let failed: Vec<(&str, u8)> = calls(&records)
        .iter()
        .filter(|r| r.status != 0)
        .map(|r| (r.api.name(), r.status))
        .collect();
    assert!(failed.contains(&("cudaMalloc", 2)), "{failed:?}");
    assert!(failed.contains(&("cudaFree", 1)), "{failed:?}");
    assert!(failed.contains(&("cuMemAlloc_v2", 1)), "{failed:?}");
}

#[test]
fn the_disable_switch_turns_every_route_off() {
    let dir = tempdir("disabled");
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("runtime_route"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_DISABLE", "1".into())],
            ..Run::default()
        },
    );
    assert_ok(&out);
    assert!(stdout(&out).contains("runtime_driver_pointer_wrapped 0"));
    assert!(!t.exists(), "no trace when disabled");
    let out = run(
        &sim().bin("entry_points"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_DISABLE", "1".into())],
            ..Run::default()
        },
    );
    assert_ok(&out);
    assert!(stdout(&out).contains("check current_version_wrapped 0"));
    assert!(!t.exists());
}

#[test]
fn programs_that_use_no_cuda_run_unchanged_and_leave_no_trace() {
    let dir = tempdir("nocuda");
    for cmd in [
        vec!["/bin/true"],
        vec!["python3", "-c", "pass"],
        vec!["sh", "-c", "echo hi"],
    ] {
        let out = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .current_dir(&dir)
            .env("LD_PRELOAD", shim())
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(stderr(&out), "", "{cmd:?} printed on stderr");
        if cmd[0] == "sh" {
            assert_eq!(stdout(&out), "hi\n");
        }
    }
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "no file may appear"
    );
}

/// The runtime-route client under the shim with `GPUSHIM_CONF` set to `conf`, tracing into a
/// folder of its own: what it did, and its trace (the folder kept with it).
fn runtime_route_with_conf(
    name: &str,
    conf: &str,
) -> (std::process::Output, TestDir, std::path::PathBuf) {
    let dir = tempdir(name);
    let t = trace_in(&dir);
    let out = run(
        &sim().bin("runtime_route"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", conf.into())],
            ..Run::default()
        },
    );
    (out, dir, t)
}

#[test]
fn a_bad_configuration_prints_one_line_naming_the_key_and_the_program_goes_on() {
    let (out, _dir, t) = runtime_route_with_conf("badconf", "pool:off,limt:4GiB");
    assert_ok(&out);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("GPUSHIM_CONF")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("'limt'") && lines[0].contains("limit"),
        "{err}"
    );
    let (records, _) = decode(&t);
    assert_eq!(api_names(&records), ["cudaMalloc", "cudaFree"]);
}

/// A key that carries a terminal escape and a bidi override: the shim's one line quotes it
/// escaped, so what anyone set in the environment never drives the user's terminal.
#[test]
fn a_bad_configuration_is_quoted_escaped() {
    let conf = "pool:off,\u{1b}]0;owned\u{7}\u{202e}:1";
    let (out, _dir, _t) = runtime_route_with_conf("badconf-escape", conf);
    assert_ok(&out);
    let err = stderr(&out);
    assert!(err.contains("GPUSHIM_CONF"), "{err}");
    assert!(
        !err.contains('\u{1b}') && !err.contains('\u{7}') && !err.contains('\u{202e}'),
        "{err:?}"
    );
    assert!(err.contains("\\x1b]0;owned\\x07\\u{202e}"), "{err:?}");
}

#[test]
fn a_bad_trace_pattern_says_why_and_falls_back_to_the_default_name() {
    let dir = tempdir("badpattern");
    let out = std::process::Command::new(sim().bin("runtime_route"))
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", &sim().dir)
        .env("LD_PRELOAD", shim())
        .env("GPUSHIM_TRACE", "x.%q.trace")
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(stderr(&out).contains("'%q'"), "{}", stderr(&out));
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with("gpushim-runtime_route.") && files[0].ends_with(".trace"),
        "{files:?}"
    );
}

#[test]
fn an_unwritable_trace_path_is_named_on_one_line_with_its_cause() {
    let dir = tempdir("badpath");
    let long = format!("{}/{}.trace", dir.display(), "n".repeat(300));
    let newline = format!("{}/no\nsuch/t.trace", dir.display());
    for (path, cause) in [
        (long.as_str(), "a name in the path is too long"),
        (newline.as_str(), "a directory in the path does not exist"),
    ] {
        let out = std::process::Command::new(sim().bin("runtime_route"))
            .current_dir(&dir)
            .env("LD_LIBRARY_PATH", &sim().dir)
            .env("LD_PRELOAD", shim())
            .env("GPUSHIM_TRACE", path)
            .output()
            .unwrap();
        assert_ok(&out);
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one line:\n{err}");
        assert!(err.contains(cause), "{err}");
        assert!(!err.contains("system error"), "{err}");
    }
}

#[test]
fn trace_off_records_nothing() {
    for off in ["off", "OFF", "Off"] {
        let dir = tempdir("traceoff");
        let out = std::process::Command::new(sim().bin("coverage"))
            .current_dir(&dir)
            .env("LD_LIBRARY_PATH", &sim().dir)
            .env("LD_PRELOAD", shim())
            .env("GPUSHIM_TRACE", off)
            .output()
            .unwrap();
        assert_ok(&out);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{off}");
    }
}

#[test]
fn an_existing_trace_file_is_never_overwritten() {
    let dir = tempdir("exists");
    let t = trace_in(&dir);
    std::fs::write(&t, b"precious").unwrap();
    let out = run(
        &sim().bin("runtime_route"),
        Run {
            preload: true,
            trace: Some(&t),
            ..Run::default()
        },
    );
    assert_ok(&out);
    assert_eq!(std::fs::read(&t).unwrap(), b"precious");
    // Recording goes on under another name beside it, which the shim names.
    let err = stderr(&out);
    assert!(err.contains("is taken"), "{err}");
    let other: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p != &*t)
        .collect();
    assert_eq!(other.len(), 1, "{other:?}");
    assert!(err.contains(&other[0].display().to_string()), "{err}");
    assert!(!decode(&other[0]).0.is_empty());
}

#[test]
fn a_runtime_closed_and_loaded_again_elsewhere_is_called_where_it_now_is() {
    // The adversary's row 6: dlclose of libcudart, its old range made inaccessible, dlopen at
    // another address, calls through the hooks. Before, the hook jumped to the old address.
    for conf in ["pool:off", "pool:caching"] {
        let out = run(
            &sim().bin("reload"),
            Run {
                preload: true,
                env: vec![
                    ("GPUSHIM_CONF", conf.into()),
                    ("GPUSHIM_TRACE", "off".into()),
                ],
                ..Run::default()
            },
        );
        assert_ok(&out);
        assert_eq!(
            stdout(&out).trim(),
            "first=0 closed=0 unloaded=1 blocked=1 moved=1 again=0 freed=0 meminfo=0",
            "{conf}"
        );
    }
}

/// The one table of CUDA functions (shim/src/cuda/functions.rs) and the trace's API numbers
/// agree: every API of a CUDA function is the API of a hooked row of that name, and the built
/// shim exports every hooked row (and nothing else of CUDA's).
#[test]
fn the_table_of_cuda_functions_matches_the_trace_apis_and_the_exports() {
    let table = std::fs::read_to_string(repo().join("shim/src/cuda/functions.rs")).unwrap();
    // (C name, API variant) of every hooked row.
    let mut hooked: Vec<(String, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in table.lines().map(str::trim) {
        if let Some((_, rest)) = line.split_once(" = ")
            && let Some((name, _)) = rest.split_once(" in ")
            && !line.starts_with("//")
        {
            pending = Some(name.to_string());
        }
        if let Some(rest) = line.strip_prefix("=> ")
            && let Some((_, api)) = rest.split_once(" as ")
        {
            let api = api.trim_end_matches(';').to_string();
            hooked.push((pending.take().expect("a row before its hook"), api));
        }
    }
    assert!(hooked.len() > 60, "{hooked:?}");
    for api in Api::ALL.iter().filter(|a| (**a as u8) < 100) {
        assert!(
            hooked
                .iter()
                .any(|(name, variant)| name == api.name() && format!("{api:?}") == *variant),
            "the trace API {api:?} ({}) is no hooked row's",
            api.name()
        );
    }
    let nm = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(shim())
        .output()
        .expect("nm runs");
    let exported: std::collections::BTreeSet<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .filter(|s| s.starts_with("cu"))
        .collect();
    let rows: std::collections::BTreeSet<String> =
        hooked.iter().map(|(name, _)| name.clone()).collect();
    assert_eq!(exported, rows);
}
