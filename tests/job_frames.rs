//! What a job's frames say of it, on rank 0 of two real FSDP2 jobs recorded on two H200s
//! (`tests/data/dist`: `scripts/gpu/dist_kinds.py` under `scripts/gpu.sh dist`, a 6-layer GPT-2,
//! 4 steps, one with `fully_shard`'s defaults, one with `reshard_after_forward=False`): the
//! framework, whether its parameters are resharded after the forward, and the rank and world
//! size the run's environment gave.

use crate::common::*;

#[test]
fn summary_says_the_framework_its_resharding_and_the_world() {
    for (trace, said) in [
        (
            "fsdp2.trace",
            "FSDP2 (fully_shard), its parameters gathered again for each backward (resharded \
             after the forward); rank 0 of 2 (its WORLD_SIZE)",
        ),
        (
            "fsdp2-keep.trace",
            "FSDP2 (fully_shard), its parameters kept from the forward to the backward \
             (reshard_after_forward=False); rank 0 of 2 (its WORLD_SIZE)",
        ),
    ] {
        let t = repo().join("tests/data/dist").join(trace);
        let text = stdout(&gpushim_text(&["summary", t.to_str().unwrap()]));
        assert!(
            text.contains(&format!("data parallel, from the frames: {said}\n")),
            "{trace}: {text}"
        );
        let s = report_json(&["summary"], &[t.as_path()]);
        let sharding = s["sharding"].as_str().unwrap_or("");
        assert!(
            said.contains(sharding) && !sharding.is_empty(),
            "{trace}: {s}"
        );
        assert_eq!(s["world_size"].as_u64(), Some(2), "{trace}");
    }
}
