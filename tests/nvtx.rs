//! NVTX injection: ranges and marks become records, in order, on the right thread, with their
//! text; several libraries may initialize the injection.

use crate::common::*;
use gpushim::trace::format::RecordKind;
use gpushim::trace::reader::TraceReader;
use std::path::Path;

/// NVTX records as "THREAD KIND TEXT|LEVEL" lines, in trace order.
fn nvtx_lines(trace: &Path) -> Vec<String> {
    // The program's threads numbered in the order they first recorded, the shim's NVML
    // sampler (a thread of its own, recording only NVML's figure) left out.
    let samplers: std::collections::HashSet<u16> = TraceReader::open(trace)
        .unwrap()
        .filter(|r| r.kind == RecordKind::DeviceMemory)
        .map(|r| r.thread)
        .collect();
    let mut order: Vec<u16> = Vec::new();
    let mut reader = TraceReader::open(trace).unwrap();
    let mut lines = Vec::new();
    while let Some(r) = reader.next() {
        if r.kind == RecordKind::ThreadStart && !samplers.contains(&r.thread) {
            order.push(r.thread);
        }
        let level = match r.kind {
            RecordKind::RangePush
            | RecordKind::RangePop
            | RecordKind::RangeStart
            | RecordKind::RangeEnd => r.size,
            RecordKind::Mark => 0,
            _ => continue,
        };
        let text = match r.kind {
            RecordKind::RangePush | RecordKind::Mark | RecordKind::RangeStart => {
                reader.string(r.ptr).unwrap_or("?").to_string()
            }
            _ => String::new(),
        };
        let thread = order
            .iter()
            .position(|&t| t == r.thread)
            .unwrap_or(usize::MAX);
        lines.push(format!("{thread} {} {text}|{level}", r.kind.name()));
    }
    lines
}

#[test]
fn ranges_and_marks_from_two_nvtx_libraries_arrive_in_order_on_their_threads() {
    let dir = tempdir("nvtx");
    let t = dir.join("nvtx.trace");
    let out = run(
        &sim().bin("nvtx_loader"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![(
                "NVTX_INJECTION64_PATH",
                shim().to_string_lossy().into_owned(),
            )],
            ..Run::default()
        },
    );
    assert_ok(&out);
    let expected: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let got = nvtx_lines(&t);
    for thread in ["0 ", "1 "] {
        let e: Vec<&String> = expected.iter().filter(|l| l.starts_with(thread)).collect();
        let g: Vec<&String> = got.iter().filter(|l| l.starts_with(thread)).collect();
        assert_eq!(g, e, "thread {thread}");
    }
    assert_eq!(got.len(), expected.len());
    // The allocation sits inside the "step 0" range, before "forward" was pushed.
    let (records, _) = decode(&t);
    let kinds: Vec<RecordKind> = calls(&records)
        .iter()
        .map(|r| r.kind)
        .filter(|k| *k != RecordKind::String)
        .collect();
    assert_eq!(
        &kinds[..3],
        [
            RecordKind::RangePush,
            RecordKind::Alloc,
            RecordKind::RangePush
        ]
    );
}

#[test]
fn nvtx_injection_refuses_when_the_shim_is_disabled() {
    let dir = tempdir("nvtx-off");
    let t = dir.join("nvtx.trace");
    let out = run(
        &sim().bin("nvtx_loader"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![
                (
                    "NVTX_INJECTION64_PATH",
                    shim().to_string_lossy().into_owned(),
                ),
                ("GPUSHIM_DISABLE", "1".into()),
            ],
            ..Run::default()
        },
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "InitializeInjectionNvtx2 must return 0"
    );
    assert!(!t.exists());
}

#[test]
fn the_real_nvtx_headers_load_the_injection_and_every_kind_is_recorded() {
    let Some(include) = std::env::var_os("GPUSHIM_NVTX_INCLUDE") else {
        assert!(
            std::env::var_os("GPUSHIM_REQUIRE_WHEELS").is_none(),
            "GPUSHIM_REQUIRE_WHEELS is set but GPUSHIM_NVTX_INCLUDE is not"
        );
        skipped(
            "nvtx",
            "set GPUSHIM_NVTX_INCLUDE to the nvidia-nvtx wheel's include directory",
        );
        return;
    };
    let dir = tempdir("nvtx-real");
    let exe = dir.join("nvtx_real");
    cc(&[
        "-O1",
        &format!("-I{}", Path::new(&include).display()),
        "-o",
        exe.to_str().unwrap(),
        repo().join("tests/clients/nvtx_real.c").to_str().unwrap(),
        "-ldl",
    ]);
    let t = dir.join("real.trace");
    // Injection alone, without LD_PRELOAD: NVTX dlopens the shim itself.
    let out = std::process::Command::new(&exe)
        .env("NVTX_INJECTION64_PATH", shim())
        .env("GPUSHIM_TRACE", &t)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert_ok(&out);
    let got = nvtx_lines(&t);
    let range_id = got
        .iter()
        .find(|l| l.contains("range_start"))
        .and_then(|l| l.rsplit('|').next())
        .unwrap()
        .to_string();
    assert_eq!(
        got,
        [
            "0 range_push outer|0".to_string(),
            "0 mark inside|0".into(),
            "0 range_push with attributes|1".into(),
            "0 range_pop |1".into(),
            "0 range_pop |0".into(),
            format!("0 range_start start to end|{range_id}"),
            format!("0 range_end |{range_id}"),
        ]
    );
}
