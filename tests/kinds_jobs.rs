//! Memory by kind on every rank of a job on the stand-ins: DDP and FSDP1
//! (`tests/clients/kinds/job.py`), one process a rank as torchrun starts them; each rank's
//! kinds to the byte, the ranks side by side, a leak on one rank named. DeepSpeed's ZeRO is in
//! `kinds_zero.rs`.

use crate::common::*;
use crate::kinds::pairs;
use std::path::Path;

/// A two-rank job on the stand-ins, one process a rank as torchrun starts them, in the frames
/// and order of requests of FSDP1 (each rank's shard of the flat parameter, its gradient's
/// shard made by the post-backward hook outside the engine's frames; the flat parameter
/// gathered again before the backward, or kept from the forward) and of DDP (its buckets made
/// at build, made again before the second forward; the gradients views of them, or apart):
/// every rank's parameters, gradients and optimizer state to the byte, none read as input or
/// activations; FSDP's gathered flat parameter a communication buffer at the peak, and DDP's
/// buckets where the gradients stand apart from them; the resharding said from the frames.
#[test]
fn every_rank_of_a_sharded_or_data_parallel_job_has_its_kinds() {
    const MIB: u64 = 1 << 20;
    let dir = tempdir("kinds-job");
    // mode, the framework and resharding `summary` says, parameters, gradients, optimizer
    // state at exit, communication buffers at exit and at the peak.
    for (mode, says, expect, buffers) in [
        (
            "fsdp1",
            "FSDP1 (FullyShardedDataParallel), its parameters gathered again for each backward",
            [4 * MIB, 4 * MIB, 8 * MIB],
            [None, Some(12 * MIB)],
        ),
        (
            "fsdp1-grad-op",
            "FSDP1 (FullyShardedDataParallel), its parameters kept from the forward to the \
             backward (SHARD_GRAD_OP",
            [4 * MIB, 4 * MIB, 8 * MIB],
            [None, Some(12 * MIB)],
        ),
        (
            "ddp",
            "DDP (DistributedDataParallel);",
            [8 * MIB, 8 * MIB, 16 * MIB],
            [None, None],
        ),
        (
            "ddp-apart",
            "DDP (DistributedDataParallel);",
            [8 * MIB, 8 * MIB, 16 * MIB],
            [Some(8 * MIB), Some(8 * MIB)],
        ),
    ] {
        let traces = job_ranks(&dir, &format!("{mode}."), mode, 3, None);
        let refs: Vec<&Path> = traces.iter().map(|t| t.as_path()).collect();
        // The framework and its resharding are named from the frames.
        let text = stdout(&gpushim_text(&["summary", traces[0].to_str().unwrap()]));
        assert!(
            text.contains(&format!("data parallel, from the frames: {says}")),
            "{mode}: {text}"
        );
        let s = report_json(&["summary"], &refs);
        for (rank, t) in s["traces"].as_array().unwrap().iter().enumerate() {
            let f = &t["framework"][0];
            let kinds: std::collections::BTreeMap<String, u64> =
                pairs(&f["kinds_at_exit"]).into_iter().collect();
            let got = [
                kinds.get("parameter").copied().unwrap_or(0),
                kinds.get("gradient").copied().unwrap_or(0),
                kinds.get("optimizer_state").copied().unwrap_or(0),
            ];
            assert_eq!(got, expect, "{mode} rank {rank}: {kinds:?}");
            assert!(
                !kinds.contains_key("input") && !kinds.contains_key("activation"),
                "{mode} rank {rank}: {kinds:?}"
            );
            // FSDP's gathered flat parameter (made by its own code, let go after the forward
            // or the backward) and its reduce-scatter's output in a later step (let go once
            // the gradient's shard is kept) are communication buffers at the peak in the
            // backward (8 and 4 MiB), never activations or temporaries, and gone at exit;
            // DDP's buckets beside the gradients are its buffers, at the peak and at exit.
            let at_peak: std::collections::BTreeMap<String, u64> =
                pairs(&f["kinds_at_peak"]).into_iter().collect();
            let got = [
                kinds.get("communication").copied(),
                at_peak.get("communication").copied(),
            ];
            assert_eq!(got, buffers, "{mode}: {kinds:?} {at_peak:?}");
        }
    }
}

/// The job at a glance: the stand-in's DDP job with a leak on rank 1 alone. `summary` and
/// `peak` of both ranks list every rank's figures side by side and name the skew (rank 1
/// peaks above rank 0); `leaks` names the growing line with the one trace it grows in.
#[test]
fn a_jobs_ranks_side_by_side_and_a_leak_on_one_rank_named() {
    let dir = tempdir("kinds-job-glance");
    let traces = job_ranks(&dir, "r.", "ddp", 8, Some(1));
    let (a, b) = (traces[0].to_str().unwrap(), traces[1].to_str().unwrap());
    let out = gpushim_text(&["summary", a, b]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(text.contains("every rank's PyTorch memory"), "{text}");
    let table = text
        .split("every rank's PyTorch memory")
        .nth(1)
        .unwrap_or_default();
    let row = |r: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(r))
            .map(str::to_string)
    };
    for r in ["rank 0 ", "rank 1 "] {
        let line = row(r).unwrap_or_default();
        assert!(
            line.contains("8.00 MiB") && line.contains("16.00 MiB"),
            "{r}: {text}"
        );
    }
    assert!(text.contains("skew: rank 1 peaks"), "{text}");
    // `peak` of the job: the traces side by side first, with their kinds and the skew; rank 1
    // holds 24 MiB of kept activations at its peak (8 steps of 3 MiB), rank 0 none.
    let out = gpushim_text(&["peak", a, b]);
    assert_ok(&out);
    let text = stdout(&out);
    let table: Vec<&str> = text
        .split("the peaks side by side (2 traces):")
        .nth(1)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    let peak_row = |t: &str| {
        table
            .iter()
            .find(|l| l.contains(&format!("/{t} ")))
            .copied()
    };
    let (r0, r1) = (peak_row("r.0.trace"), peak_row("r.1.trace"));
    assert!(
        r0.is_some_and(|l| !l.contains("activations"))
            && r1.is_some_and(|l| l.contains("activations 24.00 MiB")),
        "{text}"
    );
    assert!(
        table
            .iter()
            .any(|l| l.contains("  skew: ") && l.contains("r.1.trace peaks 21.00 MiB above")),
        "{text}"
    );
    assert!(
        text.find("the peaks side by side") < text.find("device 0: peak live"),
        "{text}"
    );
    let out = gpushim_text(&["leaks", a, b]);
    assert_ok(&out);
    let text = stdout(&out);
    let job = text
        .split("all 2 traces together")
        .nth(1)
        .unwrap_or_default();
    let grows = job
        .lines()
        .find(|l| l.contains("grows 3.00 MiB per iteration"));
    assert!(
        grows.is_some_and(|l| l.contains("in 1 of 2 traces (only ") && l.contains("r.1.trace")),
        "{text}"
    );
}

/// The stand-in job (`tests/clients/kinds/job.py`) in `mode`, `steps` steps, as two ranks
/// started as torchrun starts them (`RANK`, `WORLD_SIZE`), `leak_rank` keeping each step's
/// last activation: their traces, `dir/{prefix}{rank}.trace`.
/// FSDP1's pre-backward hook (it gathers a unit's flat parameter again, from a hook with no
/// frame of the engine's) is the backward's: a weight's gradient the engine makes before it and
/// holds until the flat parameter's split joins it (a ResNet's classifier, in the unit whose
/// backward ends at its first convolution) is a temporary of that backward at the peak, not a
/// gradient kept; the gradients at the peak are the flat parameter's shard alone.
#[test]
fn a_weight_gradient_held_across_fsdp1s_pre_backward_hook_is_a_temporary() {
    const MIB: u64 = 1 << 20;
    let dir = tempdir("kinds-held");
    let held = vec![("JOB_HELD_GRAD_MIB", "6".to_string())];
    let traces = ranks(&dir, "held.", "kinds/job.py", 2, 3, "fsdp1", held);
    let refs: Vec<&Path> = traces.iter().map(|t| t.as_path()).collect();
    let s = report_json(&["summary"], &refs);
    let f = &s["traces"][0]["framework"][0];
    let at_peak: std::collections::BTreeMap<String, u64> =
        pairs(&f["kinds_at_peak"]).into_iter().collect();
    assert_eq!(at_peak.get("gradient"), Some(&(4 * MIB)), "{at_peak:?}");
    assert!(
        at_peak.get("temporary").is_some_and(|&t| t >= 6 * MIB),
        "{at_peak:?}"
    );
}

/// A tensor the program let go of whose memory another stream still uses when the program
/// ends (its free asked for, not completed: PyTorch no longer counts it allocated) is in no
/// kind at exit: the rank's gradients at exit are its flat parameter's shard alone, and the
/// memory is said held by tensors let go of, in use on other streams.
#[test]
fn a_tensor_let_go_of_but_in_use_on_another_stream_at_exit_is_in_no_kind() {
    const MIB: u64 = 1 << 20;
    let dir = tempdir("kinds-deferred");
    let env = vec![
        ("JOB_HELD_GRAD_MIB", "6".to_string()),
        ("JOB_HELD_DEFERRED", "1".to_string()),
    ];
    let traces = ranks(&dir, "deferred.", "kinds/job.py", 2, 3, "fsdp1", env);
    let refs: Vec<&Path> = traces.iter().map(|t| t.as_path()).collect();
    let s = report_json(&["summary"], &refs);
    let t = &s["traces"][0];
    let at_exit: std::collections::BTreeMap<String, u64> =
        pairs(&t["framework"][0]["kinds_at_exit"])
            .into_iter()
            .collect();
    assert_eq!(at_exit.get("gradient"), Some(&(4 * MIB)), "{at_exit:?}");
    assert_eq!(at_exit.get("temporary"), None, "{at_exit:?}");
    let held = t["held_at_exit"].as_array().unwrap();
    assert!(
        held.iter().any(
            |h| h["owner"] == "PyTorch tensors let go of, in use on other streams"
                && h["bytes"].as_u64() == Some(6 * MIB)
        ),
        "{held:?}"
    );
}

fn job_ranks(
    dir: &Path,
    prefix: &str,
    mode: &str,
    steps: u32,
    leak_rank: Option<u32>,
) -> Vec<std::path::PathBuf> {
    let leak = leak_rank.map(|r| ("JOB_LEAK_RANK", r.to_string()));
    ranks(
        dir,
        prefix,
        "kinds/job.py",
        2,
        steps,
        mode,
        leak.into_iter().collect(),
    )
}

/// A stand-in job's `script` in `mode`, `steps` steps, as `world` ranks started as torchrun
/// starts them (`RANK`, `WORLD_SIZE`), `env` set too: their traces, `dir/{prefix}{rank}.trace`.
pub fn ranks(
    dir: &Path,
    prefix: &str,
    script: &str,
    world: u32,
    steps: u32,
    mode: &str,
    env: Vec<(&'static str, String)>,
) -> Vec<std::path::PathBuf> {
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    (0..world)
        .map(|rank| {
            let t = dir.join(format!("{prefix}{rank}.trace"));
            let mut env = env.clone();
            env.push(("RANK", rank.to_string()));
            env.push(("WORLD_SIZE", world.to_string()));
            let args = vec![
                lib("libtorch_cpu.so"),
                lib("libc10_cuda.so"),
                steps.to_string(),
                mode.to_string(),
            ];
            assert_ok(&python_client(&t, script, args, env));
            t
        })
        .collect()
}

/// A rank of FSDP2 (`fully_shard` per block, the stand-in of its parameter group in
/// `tests/clients/kinds/blocks.py`): four blocks of a 1 MiB weight, each cut to its shard, Adam's
/// state 2 MiB a block over the world, each block's gradients reduce-scattered to its shard and
/// let go at the optimizer's step. At each world size the rank's parameters, gradients (before
/// the last step lets them go) and optimizer state to the byte, nothing left as input,
/// activations or gradients at exit; at the peak the gathered weights are the framework's own
/// buffers, never activations, and the parameters still the shards.
#[test]
fn an_fsdp2_rank_has_its_kinds_at_every_world_size() {
    const MIB: u64 = 1 << 20;
    for world in [2u64, 4] {
        let w = world.to_string();
        let dir = tempdir(&format!("kinds-fsdp2-w{world}"));
        let t = crate::fit_checkpoint::blocks_with(
            &dir,
            1,
            "fsdp2",
            &[("WORLD_SIZE", w.as_str()), ("RANK", "0")],
        );
        let s = report_json(&["summary"], &[t.as_path()]);
        let f = &s["framework"][0];
        let at_exit: std::collections::BTreeMap<String, u64> =
            pairs(&f["kinds_at_exit"]).into_iter().collect();
        let shards = 4 * MIB / world;
        assert_eq!(
            at_exit.get("parameter"),
            Some(&shards),
            "{world}: {at_exit:?}"
        );
        assert_eq!(
            at_exit.get("optimizer_state"),
            Some(&(4 * 2 * MIB / world)),
            "{world}: {at_exit:?}"
        );
        for gone in ["gradient", "input", "activation"] {
            assert!(!at_exit.contains_key(gone), "{world}: {at_exit:?}");
        }
        // Before the last step's optimizer lets them go: each block's gradients (three ops'
        // weights' of 1 MiB) reduce-scattered to the rank's shard, kept as its gradient.
        let at_step_end: std::collections::BTreeMap<String, u64> =
            pairs(&f["kinds_before_shutdown"]["kinds"])
                .into_iter()
                .collect();
        assert_eq!(
            at_step_end.get("gradient"),
            Some(&(4 * 3 * MIB / world)),
            "{world}: {at_step_end:?}"
        );
        assert_eq!(at_step_end.get("parameter"), Some(&shards));
        let at_peak: std::collections::BTreeMap<String, u64> =
            pairs(&f["kinds_at_peak"]).into_iter().collect();
        assert_eq!(
            at_peak.get("parameter"),
            Some(&shards),
            "{world}: {at_peak:?}"
        );
        assert!(
            at_peak.get("communication").is_some_and(|&b| b >= MIB),
            "{world}: the gathered weight a buffer of FSDP's at the peak: {at_peak:?}"
        );
    }
}
