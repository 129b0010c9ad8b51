//! A free PyTorch's allocator completes later than it was asked for (a block another stream
//! still uses, as after `record_stream`: FSDP's gathered parameters, NCCL's buffers), on the
//! stand-in for `libc10_cuda.so` (`tests/standin/c10_cuda.cpp`, `standin_free_deferred`). The
//! request is recorded as the device's next event comes, on whichever thread, or at exit; the
//! completion on its own when it comes.

use crate::common::*;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// A thread frees a tensor whose block a stream still uses and ends; the main thread then makes
/// one of the same size before the free completes: the request is in the trace before that
/// tensor (it was lost with the thread), and a free asked for last and never completed is
/// recorded at exit.
#[test]
fn a_free_completed_later_is_recorded_as_asked_on_any_thread_and_at_exit() {
    let dir = tempdir("deferred-free");
    let script = dir.join("deferred.py");
    std::fs::write(
        &script,
        "import ctypes, sys, threading\n\
         lib = ctypes.CDLL(sys.argv[1])\n\
         lib.standin_malloc.restype = ctypes.c_void_p\n\
         lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
         lib.standin_free.argtypes = (ctypes.c_void_p,)\n\
         lib.standin_free_deferred.argtypes = (ctypes.c_void_p,)\n\
         MiB = 1 << 20\n\
         def worker():\n\
         \x20   x = lib.standin_malloc(8 * MiB)\n\
         \x20   lib.standin_free_deferred(x)\n\
         t = threading.Thread(target=worker)\n\
         t.start()\n\
         t.join()\n\
         y = lib.standin_malloc(8 * MiB)\n\
         lib.standin_process_events()\n\
         lib.standin_free(y)\n\
         z = lib.standin_malloc(4 * MiB)\n\
         lib.standin_free_deferred(z)\n",
    )
    .unwrap();
    let trace = dir.join("t.trace");
    let lib = sim().dir.join("torch/lib/libc10_cuda.so");
    let out = run(
        Path::new("python3"),
        Run {
            preload: true,
            trace: Some(&trace),
            args: vec![script.display().to_string(), lib.display().to_string()],
            env: vec![],
        },
    );
    assert_ok(&out);
    // The trace's tensor records, in order: (kind, address, size).
    let events = stdout(&gpushim_text(&["events", trace.to_str().unwrap()]));
    let tensors: Vec<(String, String, u64)> = events
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() > 7 && f[2].starts_with("tensor_") && f[2] != "tensors").then(|| {
                (
                    f[2].to_string(),
                    f[6].to_string(),
                    f[7].parse().unwrap_or(0),
                )
            })
        })
        .collect();
    let at = |kind: &str, size: u64, nth: usize| {
        tensors
            .iter()
            .enumerate()
            .filter(|(_, (k, _, n))| k == kind && *n == size)
            .nth(nth)
            .map(|(i, _)| i)
    };
    // The thread's request is recorded before the main thread's next tensor, the completion
    // after it, on its own.
    let (requested, made, completed) = (
        at("tensor_free_requested", 8 * MIB, 0),
        at("tensor_alloc", 8 * MIB, 1),
        at("tensor_free", 8 * MIB, 0),
    );
    assert!(
        requested.is_some() && requested < made && made < completed,
        "{tensors:?}"
    );
    // The last request, never completed, is recorded at exit.
    assert!(
        at("tensor_free_requested", 4 * MIB, 0).is_some(),
        "{tensors:?}"
    );
    // The reports count a tensor until its free completes (its block is not free before).
    let s = report_json(&["summary"], &[trace.as_path()]);
    let f = &s["framework"][0];
    assert_eq!(f["allocated_peak_bytes"].as_u64(), Some(16 * MIB), "{f}");
}
