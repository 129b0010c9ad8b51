//! Device memory the pool does not serve (VMM physical allocations: NCCL's buffers) is part of
//! what a process holds: `summary` and `peak` count it as live and as reserved, and agree.

use crate::common::*;
use gpushim::trace::format::{Api, RecordKind};
use std::process::Command;

#[test]
fn vmm_memory_counts_as_live_and_reserved_in_summary_and_peak() {
    let path = tempdir("vmm").file("vmm.trace");
    let mut t = HandTrace::create(&path);
    let mut rec = |kind, api, ptr, size| t.rec(kind, api, ptr, size);
    const MIB: u64 = 1 << 20;
    // The pool takes a 20 MiB segment and serves 16 MiB of it; NCCL creates 8 MiB of VMM
    // memory, then the program frees its block and NCCL releases its memory.
    rec(RecordKind::SegmentReserve, Api::Shim, 0x1000_0000, 20 * MIB);
    rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000_0000, 16 * MIB);
    rec(RecordKind::PhysCreate, Api::CuMemCreate, 0x77, 8 * MIB);
    rec(RecordKind::PhysRelease, Api::CuMemRelease, 0x77, 0);
    rec(RecordKind::Free, Api::CudaFree, 0x1000_0000, 0);
    drop(t);

    let out = Command::new(gpushim_bin())
        .args(["summary", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&out);
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &s["devices"][0];
    assert_eq!(d["peak_live_bytes"], 24 * MIB);
    assert_eq!(d["peak_reserved_bytes"], 28 * MIB);
    let frag = d["fragmentation_at_peak"].as_f64().unwrap();
    assert!((frag - (1.0 - 24.0 / 28.0)).abs() < 1e-9, "{frag}");

    let out = Command::new(gpushim_bin())
        .args(["peak", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_ok(&out);
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p[0]["live_bytes"], 24 * MIB);
    assert_eq!(p[0]["reserved_bytes"], 28 * MIB);
}
