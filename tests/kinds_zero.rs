//! Memory by kind on every rank of a DeepSpeed ZeRO job, on the stand-ins
//! (`tests/clients/kinds/ds_job.py` over `tests/clients/kinds/deepspeed`: DeepSpeed's files,
//! functions and order of requests, tensors from the stand-in allocator). Each rank's
//! parameters, gradients and optimizer state to the byte, as DeepSpeed counts them (the fp32
//! master weights among the optimizer's states), and DeepSpeed's own buffers (its gradient
//! bucket, the parameters ZeRO-3 gathers for a layer) communication buffers.

use crate::common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// The stand-in ZeRO job in `mode`, `steps` steps, as `world` ranks: their traces.
fn zero_job(dir: &Path, mode: &str, world: u32, steps: u32) -> Vec<PathBuf> {
    let prefix = format!("{mode}.{world}.");
    crate::kinds_jobs::ranks(dir, &prefix, "kinds/ds_job.py", world, steps, mode, vec![])
}

/// `[{"kind": k, "bytes": b}]` as a map, the kinds of some bytes.
fn kinds(v: &serde_json::Value) -> BTreeMap<String, u64> {
    crate::kinds::pairs(v)
        .into_iter()
        .filter(|(_, b)| *b > 0)
        .collect()
}

fn expect(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|&(k, b)| (k.to_string(), b)).collect()
}

/// ZeRO-2 and ZeRO-3, and DeepSpeed's 16-bit optimizers without ZeRO (`FP16_UnfusedOptimizer`)
/// and for ZeRO-1 with fp32 accumulation (`BF16_Optimizer`), at two and four ranks: every
/// rank's kinds at exit to the byte (the master weights optimizer state, not parameters as
/// their `__init__` frame says; ZeRO-3's gradient bucket and gradients' buffer, made by one
/// function, told apart by their lines' order, as `BF16_Optimizer`'s master weights and
/// gradients' buffer), the stage or optimizer named from the frames with the rank and world
/// size, and at the peak the bucket and the gathered weight communication buffers, not input or
/// activations; the small parameters ZeRO-3 gathers again after each step communication
/// buffers, not optimizer state as the step's frames say.
#[test]
fn every_rank_of_a_zero_job_has_its_kinds() {
    let dir = tempdir("kinds-zero");
    for world in [2u64, 4] {
        let part = 8 * MIB / world;
        let optimizer = 2 * part + 4 * part;
        for (mode, named, at_exit, bucket_at_peak) in [
            (
                "zero2",
                "DeepSpeed ZeRO-1 or ZeRO-2",
                expect(&[
                    ("parameter", 8 * MIB),
                    ("optimizer_state", optimizer),
                    ("workspace", MIB),
                ]),
                6 * MIB,
            ),
            (
                "zero3",
                "DeepSpeed ZeRO-3",
                expect(&[
                    ("parameter", part),
                    ("gradient", part),
                    ("optimizer_state", optimizer),
                    ("workspace", MIB),
                    ("communication", 6 * MIB + 64 * KIB),
                ]),
                6 * MIB + 4 * MIB + 64 * KIB,
            ),
            (
                "fp16",
                "DeepSpeed without ZeRO in 16 bits (FP16_Optimizer",
                expect(&[
                    ("parameter", 8 * MIB),
                    ("optimizer_state", 16 * MIB + 32 * MIB),
                    ("workspace", MIB),
                ]),
                0,
            ),
            (
                "bf16",
                "DeepSpeed BF16_Optimizer (ZeRO-1 in bf16",
                expect(&[
                    ("parameter", 8 * MIB),
                    ("gradient", 16 * MIB),
                    ("optimizer_state", optimizer),
                    ("workspace", MIB),
                ]),
                0,
            ),
        ] {
            let traces = zero_job(&dir, mode, world as u32, 3);
            let text = stdout(&gpushim_text(&["summary", traces[0].to_str().unwrap()]));
            assert!(
                text.contains(&format!("data parallel, from the frames: {named}")),
                "{mode}: {text}"
            );
            // The world, as the run's environment said it.
            assert!(
                text.contains(&format!("; rank 0 of {world} (its WORLD_SIZE)")),
                "{mode}: {text}"
            );
            let refs: Vec<&Path> = traces.iter().map(|t| t.as_path()).collect();
            let s = report_json(&["summary"], &refs);
            for (rank, t) in s["traces"].as_array().unwrap().iter().enumerate() {
                let f = &t["framework"][0];
                let exit = kinds(&f["kinds_at_exit"]);
                assert_eq!(exit, at_exit, "{mode} at {world}, rank {rank} at exit");
                let peak = kinds(&f["kinds_at_peak"]);
                // The batch alone is input (1 MiB); nothing is unknown.
                assert_eq!(peak.get("input"), Some(&MIB), "{mode} at {world}: {peak:?}");
                assert!(!peak.contains_key("unknown"), "{mode} at {world}: {peak:?}");
                assert_eq!(
                    peak.get("communication").copied().unwrap_or(0),
                    bucket_at_peak,
                    "{mode} at {world}, rank {rank} at the peak: {peak:?}"
                );
            }
        }
    }
}

/// `fit --world-size 4` from rank 0 of the ZeRO job at two ranks is the run at four's own
/// answer, to the byte: what ZeRO shards (ZeRO-3's partitions, the gradients DeepSpeed keeps,
/// the master weights, the optimizer's state and temporaries) resized, what it keeps whole
/// (ZeRO-1 and 2's 16-bit parameters, the bucket, the gathered weights) kept.
#[test]
fn four_ranks_of_a_zero_job_from_a_run_at_two_are_the_run_at_four_to_the_byte() {
    let dir = tempdir("kinds-zero-world");
    // What is resized at two ranks (a partition of 4 MiB, 4 steps): the master weights (8 MiB),
    // Adam's state (16 MiB), its temporaries and the step's gradients' norm (8 and 1 MiB a
    // step); ZeRO-2: the partition's gradients and the fp32 gradient (4 and 8 MiB a step);
    // ZeRO-3: the partitions as cut (2 x 2 MiB), packed (4 MiB), and the gradients' buffer
    // (4 MiB).
    for (mode, named, sharded) in [
        (
            "zero2",
            "DeepSpeed ZeRO-1 or ZeRO-2",
            8 + 16 + 4 * (8 + 1) + 4 * (4 + 8),
        ),
        (
            "zero3",
            "DeepSpeed ZeRO-3",
            8 + 16 + 4 * (8 + 1) + 4 + 4 + 4,
        ),
    ] {
        let at_two = zero_job(&dir, mode, 2, 4).remove(0);
        let at_four = zero_job(&dir, mode, 4, 4).remove(0);
        let predicted = crate::fit_world::fit(&at_two, &["--world-size", "4"]);
        let real = crate::fit_world::fit(&at_four, &[]);
        let at_two_itself = crate::fit_world::fit(&at_two, &[]);
        assert_eq!(
            crate::fit_world::answers(&predicted),
            crate::fit_world::answers(&real),
            "{mode}"
        );
        assert_ne!(
            crate::fit_world::answers(&at_two_itself),
            crate::fit_world::answers(&real),
            "{mode}"
        );
        let w = &predicted["world_size"];
        assert!(w["framework"].as_str().unwrap().starts_with(named), "{w}");
        assert_eq!(
            w["sharded_bytes"].as_u64(),
            Some(sharded * MIB),
            "{mode}: {w}"
        );
    }
}

/// ZeRO at one rank gathers nothing (each partition is a whole parameter): `fit --world-size`
/// of such a run says so and asks for a run at two ranks, rather than answer without the
/// buffers DeepSpeed gathers into at more.
#[test]
fn a_zero_run_at_one_rank_is_not_scaled_and_says_why() {
    let dir = tempdir("kinds-zero-one");
    let at_one = zero_job(&dir, "zero3", 1, 2).remove(0);
    let o = gpushim(&[&"fit", &at_one, &"--at", &"1", &"--world-size", &"2"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("DeepSpeed's ZeRO at a world size of 1 gathers nothing")
            && err.contains("trace the job at 2 ranks or more"),
        "{err}"
    );
}
