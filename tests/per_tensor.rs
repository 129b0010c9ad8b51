//! Issue 12 in CI: a program whose framework does no caching (every tensor a cudaMalloc and a
//! cudaFree), all work on the legacy stream, host and simulated GPU time overlapped, one
//! synchronization per step. Under the pool the host never waits for the GPU while the device
//! has room: the wall time stays within 10% of the GPU's time (the landed pool waited for the
//! GPU at every reuse of a block freed mid-step: 1.17x), and device memory within 2x of live.
//! What decides it is counted, not timed: the trace of each run holds no wait of the pool for
//! the GPU. The wall-clock figure is printed only (a loaded machine gave 2.1x).

mod common;
use common::*;

fn perstep(conf: &str) -> (f64, f64, usize) {
    let trace = tempdir("perstep").file("p.trace");
    let out = run(
        &sim().bin("perstep"),
        Run {
            preload: true,
            trace: Some(&trace),
            env: vec![("GPUSHIM_CONF", conf.to_string())],
            args: ["20", "16", "8000"].map(String::from).to_vec(),
        },
    );
    assert_ok(&out);
    let (records, _) = decode(&trace);
    let waits = records
        .iter()
        .filter(|r| r.kind == gpushim::trace::format::RecordKind::PoolSync)
        .count();
    let v: std::collections::HashMap<String, f64> = stdout(&out)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(f64::NAN)))
        .collect();
    (
        v["wall_us"] / v["gpu_us"],
        v["used_peak"] / v["live_peak"],
        waits,
    )
}

#[test]
fn a_per_tensor_loop_runs_at_gpu_speed_with_memory_within_twice_live() {
    for conf in ["pool:caching", "pool:expandable"] {
        let runs: Vec<(f64, f64, usize)> = (0..3).map(|_| perstep(conf)).collect();
        for (_, mem, waits) in &runs {
            assert_eq!(*waits, 0, "{conf}: the pool waited for the GPU: {runs:?}");
            assert!(*mem <= 2.0, "{conf}: device/live {runs:?}");
        }
        // Wall time is printed, not asserted: on a loaded 2-core machine it reached 2.1x with
        // the pool waiting for nothing (counted above), and a timed assertion only flakes.
        let best = runs.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
        eprintln!("{conf}: best wall/GPU {best:.3} {runs:?}");
    }
}
