//! The simulator itself returns what real CUDA returns (docs/cuda-facts.md), without the
//! shim. The same scenarios run on the GPU machine (scripts/gpu.sh check).

use crate::common::*;

/// What real CUDA printed for `tests/clients/conformance.c`, per docs/cuda-facts.md.
pub const CUDA_FACTS: &str = "\
cudaMalloc(&p, 0): 0 null=1
cudaMalloc(NULL, 16): 1 last=1
cudaMalloc(&p, 1 PiB): 2 null=1 last=2 then=0
cudaFree(NULL): 0
cudaFree(interior): 1 last=1
cudaFree twice: 0 1
cudaFree(garbage), cudaFree(host): 1 1
cudaMalloc alignment: 1 1
cuMemAlloc(&d, 0): 1 zero=1
cuMemFree(0): 0
cuMemFree(garbage): 1
cudaMallocAsync(&p, 0, s): 0 null=1
cudaFreeAsync(NULL, s): 0
cudaFree(async pointer): 0
cudaFreeAsync(cudaMalloc pointer): 0
cudaGetLastError at end: 0
";

#[test]
fn simulator_returns_the_codes_real_cuda_returns() {
    let out = run(&sim().bin("conformance"), Run::default());
    assert_ok(&out);
    assert_eq!(stdout(&out), CUDA_FACTS);
}

#[test]
fn simulator_runs_out_of_memory_past_its_limit() {
    let out = run(
        &sim().bin("runtime_route"),
        Run {
            env: vec![("GPUSHIM_SIM_MEMORY", "1000".into())],
            ..Run::default()
        },
    );
    assert_ok(&out);
    // cudaMalloc of 1 MiB fails with cudaErrorMemoryAllocation; cudaFree(NULL) then succeeds.
    assert!(stdout(&out).contains("rc 2 0"), "{}", stdout(&out));
}

#[test]
fn simulated_runtime_reaches_the_driver_through_cu_get_proc_address() {
    let out = run(&sim().bin("runtime_route"), Run::default());
    assert_ok(&out);
    let s = stdout(&out);
    assert!(s.contains("rc 0 0"), "{s}");
    // Without the shim, the runtime holds the driver's own function.
    assert!(s.contains("runtime_driver_pointer_wrapped 0"), "{s}");
    assert!(s.contains("driver_cuMemAlloc_v2_calls 1"), "{s}");
}

#[test]
fn simulated_vmm_maps_alias_physical_memory_and_every_call_succeeds() {
    let out = run(&sim().bin("coverage"), Run::default());
    assert_ok(&out);
}
