//! `fit --world-size`: one rank of a data-parallel job at another world size, from a run at
//! one. The stand-in job (`tests/clients/kinds/job.py`) run at two world sizes: the answer at
//! four ranks from the run at two is the run at four's own answer, to the byte, under FSDP1
//! (whose shards are resized) and DDP (which holds the whole model on every rank); a trace that
//! does not say its world size, or a run with no data-parallel framework, is refused with the
//! reason.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Rank 0 of the stand-in job in `mode` at `world` ranks, 4 steps; `keep_world_size` false:
/// run with no WORLD_SIZE in its environment (the stand-in is told the world otherwise).
pub fn rank0(dir: &Path, mode: &str, world: u32, keep_world_size: bool) -> PathBuf {
    rank0_at(dir, mode, world, keep_world_size, 1)
}

/// [`rank0`] at a batch `batch` times the stand-in's.
fn rank0_at(dir: &Path, mode: &str, world: u32, keep_world_size: bool, batch: u32) -> PathBuf {
    rank0_with(dir, mode, (world, keep_world_size, batch), &[])
}

/// [`rank0_at`] with more of the stand-in's settings (`env`).
fn rank0_with(
    dir: &Path,
    mode: &str,
    (world, keep_world_size, batch): (u32, bool, u32),
    more: &[(&'static str, &str)],
) -> PathBuf {
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let named: String = more.iter().map(|(k, v)| format!(".{k}{v}")).collect();
    let t = dir.join(format!(
        "{mode}.w{world}.{keep_world_size}.b{batch}{named}.trace"
    ));
    let mut env = vec![
        ("RANK", "0".to_string()),
        ("KINDS_BATCH", batch.to_string()),
    ];
    env.extend(more.iter().map(|&(k, v)| (k, v.to_string())));
    if keep_world_size {
        env.push(("WORLD_SIZE", world.to_string()));
    } else {
        env.push(("JOB_WORLD", world.to_string()));
    }
    let args = vec![
        lib("libtorch_cpu.so"),
        lib("libc10_cuda.so"),
        "4".into(),
        mode.into(),
    ];
    assert_ok(&python_client(&t, "kinds/job.py", args, env));
    t
}

/// `fit --json` of `trace` (a run at batch 1) with `extra` arguments; the answer.
pub fn fit(trace: &Path, extra: &[&str]) -> Value {
    fit_at(trace, "1", extra)
}

/// [`fit`] of a run at batch `at`.
fn fit_at(trace: &Path, at: &str, extra: &[&str]) -> Value {
    let ask = [
        "--at", at, "--batch", "1,2,4,8", "--limit", "96MiB", "--json",
    ];
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"fit", &trace];
    for a in ask.iter().chain(extra) {
        args.push(a);
    }
    let o = gpushim(&args);
    assert_ok(&o);
    serde_json::from_slice(&o.stdout).expect("fit's JSON")
}

/// A row: batch, peak reserved, peak allocated.
pub type Row = (u64, u64, u64);

/// Each setting's rows and largest batch.
pub fn answers(f: &Value) -> Vec<(Vec<Row>, u64)> {
    f["settings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let rows = s["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["batch"].as_u64().unwrap(),
                        r["peak_reserved_bytes"].as_u64().unwrap(),
                        r["peak_allocated_bytes"].as_u64().unwrap(),
                    )
                })
                .collect();
            (rows, s["largest_batch"].as_u64().unwrap())
        })
        .collect()
}

#[test]
fn four_ranks_from_a_run_at_two_are_the_run_at_four_to_the_byte() {
    const MIB: u64 = 1 << 20;
    let dir = tempdir("fit-world");
    for (mode, sharded) in [("fsdp1", true), ("ddp", false)] {
        let at_two = rank0(&dir, mode, 2, true);
        let at_four = rank0(&dir, mode, 4, true);
        let predicted = fit(&at_two, &["--world-size", "4"]);
        let real = fit(&at_four, &[]);
        assert_eq!(answers(&predicted), answers(&real), "{mode}");
        let at_two_itself = fit(&at_two, &[]);
        let w = &predicted["world_size"];
        assert_eq!((w["run"].as_u64(), w["asked"].as_u64()), (Some(2), Some(4)));
        if sharded {
            // At two ranks: the shard (4 MiB), its gradient (4 MiB), Adam's state (8 MiB), the
            // step's temporaries (4 MiB in each of 4 steps) and the reduce-scatter's output of
            // the 3 later steps (4 MiB each, added into the gradient): half of each at four.
            assert_eq!(
                w["sharded_bytes"].as_u64(),
                Some(16 * MIB + 4 * 4 * MIB + 3 * 4 * MIB),
                "{w}"
            );
            assert_ne!(answers(&at_two_itself), answers(&real), "{mode}");
            assert!(w["framework"].as_str().unwrap().starts_with("FSDP1"), "{w}");
        } else {
            // DDP keeps the whole model on every rank: the same answer at any world size.
            assert_eq!(w["sharded_requests"].as_u64(), Some(0), "{w}");
            assert_eq!(answers(&at_two_itself), answers(&real), "{mode}");
        }
        // The text says what was resized, or that nothing is.
        let text = stdout(&gpushim(&[
            &"fit",
            &at_two,
            &"--at",
            &"1",
            &"--limit",
            &"96MiB",
            &"--world-size",
            &"4",
        ]));
        let said = if sharded {
            "one rank of the job at world size 4 from the run's 2 under FSDP1"
        } else {
            "nothing this rank holds is a shard of the model"
        };
        assert!(text.contains(said), "{mode}: {text}");
    }
}

/// Under FSDP1 the whole forward runs inside FSDP's own code: a temporary the model makes there
/// of a shard's size by chance (4 MiB: the flat parameter's 8 MiB over two ranks) is not a shard,
/// nor is the whole flat parameter FSDP makes at wrapping to cut the shard from. Four ranks from
/// two, to the byte, with such a temporary in each forward.
#[test]
fn what_fsdp1_makes_of_a_shards_size_by_chance_is_not_resized() {
    let dir = tempdir("fit-world-chance");
    let temp = [("JOB_FORWARD_TEMP_MIB", "4")];
    let at_two = rank0_with(&dir, "fsdp1", (2, true, 1), &temp);
    let at_four = rank0_with(&dir, "fsdp1", (4, true, 1), &temp);
    let predicted = fit(&at_two, &["--world-size", "4"]);
    assert_eq!(answers(&predicted), answers(&fit(&at_four, &[])));
}

/// What cannot be answered is refused with its reason: a trace without WORLD_SIZE (unless the
/// run's is given), and a run of no data-parallel framework.
#[test]
fn a_world_size_the_run_does_not_say_is_asked_for_not_guessed() {
    let dir = tempdir("fit-world-unsaid");
    let unsaid = rank0(&dir, "fsdp1", 2, false);
    let o = gpushim(&[&"fit", &unsaid, &"--at", &"1", &"--world-size", &"4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("does not say its world size")
            && stderr(&o).contains("--run-world-size"),
        "{}",
        stderr(&o)
    );
    // `summary` names the framework and says the world is not said.
    let text = stdout(&gpushim(&[&"summary", &unsaid]));
    assert!(
        text.contains(
            "FSDP1 (FullyShardedDataParallel), its parameters gathered again for each backward \
             (FULL_SHARD or HYBRID_SHARD); the world size not said"
        ),
        "{text}"
    );
    let given = fit(&unsaid, &["--world-size", "4", "--run-world-size", "2"]);
    assert_eq!(given["world_size"]["run"].as_u64(), Some(2));
    // A training loop of one process with no framework of a job.
    let single = dir.join("train.trace");
    assert_ok(&kinds_program(
        &single,
        3,
        false,
        vec![("WORLD_SIZE", "1".into())],
    ));
    let o = gpushim(&[&"fit", &single, &"--at", &"1", &"--world-size", &"4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the frames show no framework"),
        "{}",
        stderr(&o)
    );
}

/// FSDP's gathered parameters (the whole flat parameter, made by FSDP's own code around each
/// forward) and the engine's whole gradient of it (the split's backward joining its views'
/// gradients, `SplitWithSizesBackward0`, before the hook reduce-scatters it) do not
/// follow the batch, where the forward's tensors made inside the wrapper do: the answer at
/// batch 2 from the run at 1 is the run at 2's own, at every batch asked.
#[test]
fn a_frameworks_gathered_parameters_do_not_follow_the_batch() {
    let dir = tempdir("fit-world-batch");
    let at_one = rank0_at(&dir, "fsdp1", 2, true, 1);
    let at_two = rank0_at(&dir, "fsdp1", 2, true, 2);
    let rows = |f: &Value| -> Vec<Row> {
        answers(f)
            .into_iter()
            .flat_map(|(rows, _)| rows)
            .filter(|r| r.0 == 2 || r.0 == 4 || r.0 == 8)
            .collect()
    };
    let from_one = fit_at(&at_one, "1", &["--world-size", "4"]);
    let from_two = fit_at(&at_two, "2", &["--world-size", "4"]);
    assert_eq!(rows(&from_one), rows(&from_two));
}

/// The traces of a job's ranks: each rank's answer, and the rank that fails first named. The
/// stand-in's DDP job whose rank 1 alone keeps an activation a step: rank 1 fits the smaller
/// batch, and the job fails with it.
#[test]
fn the_rank_that_fails_first_is_named() {
    let dir = tempdir("fit-ranks");
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let traces: Vec<PathBuf> = (0..2)
        .map(|rank| {
            let t = dir.join(format!("r.{rank}.trace"));
            let env = vec![
                ("RANK", rank.to_string()),
                ("WORLD_SIZE", "2".to_string()),
                ("JOB_LEAK_RANK", "1".to_string()),
            ];
            let args = vec![
                lib("libtorch_cpu.so"),
                lib("libc10_cuda.so"),
                "6".into(),
                "ddp".into(),
            ];
            assert_ok(&python_client(&t, "kinds/job.py", args, env));
            t
        })
        .collect();
    let ask = ["--at", "1", "--batch", "1,2", "--limit", "96MiB"];
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"fit", &traces[0], &traces[1]];
    for a in &ask {
        args.push(a);
    }
    let out = gpushim(&args);
    assert_ok(&out);
    let text = stdout(&out);
    let first = text
        .lines()
        .find(|l| l.starts_with("the rank that fails first: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(first.contains("r.1.trace"), "{text}");
    args.push(&"--json");
    let out = gpushim(&args);
    assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let largest = |i: usize| v["ranks"][i]["fit"]["settings"][0]["largest_batch"].as_u64();
    assert!(largest(1) < largest(0), "{v}");
    assert_eq!(
        v["fails_first"]["largest_batch"].as_u64(),
        largest(1),
        "{v}"
    );
    // A what-if takes one trace.
    let out = gpushim(&[
        &"fit",
        &traces[0],
        &traces[1],
        &"--at",
        &"1",
        &"--checkpoint",
        &"auto",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// Each row of `high`'s run's setting peaks above `low`'s in allocated bytes, by at most
/// `bytes`.
fn apart_by_at_most(high: &Value, low: &Value, bytes: u64) {
    let peaks = |f: &Value| -> Vec<u64> {
        f["settings"][0]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["peak_allocated_bytes"].as_u64().unwrap())
            .collect()
    };
    let (h, l) = (peaks(high), peaks(low));
    assert!(
        h.iter().zip(&l).all(|(h, l)| h > l && h - l <= bytes),
        "{h:?} {l:?}"
    );
}

/// A rank of a DDP job at two ranks answers at four as its rank held DDP's first buckets, and
/// says which: one that held them to the rebuild (`DDP_BUCKETS_LATE`), one that let them go
/// first, each that another rank may peak up to their bytes lower or higher; and the two runs'
/// peaks are that far apart at most (fails with the buckets read only from a run at one rank).
#[test]
fn a_ddp_rank_says_how_far_another_may_be_from_its_first_buckets() {
    let dir = tempdir("fit-world-buckets");
    let late = fit(
        &rank0_with(&dir, "ddp", (2, true, 1), &[("DDP_BUCKETS_LATE", "1")]),
        &["--world-size", "4"],
    );
    let first = fit(&rank0(&dir, "ddp", 2, true), &["--world-size", "4"]);
    let (w_late, w_first) = (&late["world_size"], &first["world_size"]);
    assert_eq!(
        w_late["first_buckets_bytes"].as_u64(),
        Some(8 << 20),
        "{w_late}"
    );
    assert_eq!(w_late.get("first_buckets_let_go_bytes"), None, "{w_late}");
    assert_eq!(w_first.get("first_buckets_bytes"), None, "{w_first}");
    assert_eq!(
        w_first["first_buckets_let_go_bytes"].as_u64(),
        Some(8 << 20),
        "{w_first}"
    );
    apart_by_at_most(&late, &first, 8 << 20);
    let first_trace = rank0(&dir, "ddp", 2, true);
    let text = stdout(&gpushim(&[
        &"fit",
        &first_trace,
        &"--at",
        &"1",
        &"--world-size",
        &"4",
    ]));
    assert!(
        text.contains(
            "DDP's first buckets (8.00 MiB): the run's rank let them go before the rebuilt \
             ones were made"
        ) && text.contains("another rank's peak can be up to 8.00 MiB lower or higher"),
        "{text}"
    );
}

/// A free that waits on another stream's work (asked for, completed later: as FSDP1 lets its
/// gathered flat parameters go) makes a job's ranks peak apart with the GPU's timing: `fit
/// --world-size` counts such frees and says so, and says nothing of the kind of a run without
/// them (fails without the count).
#[test]
fn frees_that_wait_on_other_streams_are_said_to_move_a_ranks_peak() {
    let dir = tempdir("fit-world-deferred");
    let more = [("JOB_HELD_GRAD_MIB", "6"), ("JOB_HELD_DEFERRED", "1")];
    let deferred = rank0_with(&dir, "fsdp1", (2, true, 1), &more);
    let w = &fit(&deferred, &["--world-size", "4"])["world_size"];
    assert_eq!(w["deferred_frees"].as_u64(), Some(1), "{w}");
    let text = |t: &Path| {
        stdout(&gpushim(&[
            &"fit",
            &t,
            &"--at",
            &"1",
            &"--world-size",
            &"4",
        ]))
    };
    let said = text(&deferred);
    assert!(
        said.contains("1 of the run's frees waited on work of other streams"),
        "{said}"
    );
    let plain = rank0(&dir, "fsdp1", 2, true);
    let w = &fit(&plain, &["--world-size", "4"])["world_size"];
    assert_eq!(w.get("deferred_frees"), None, "{w}");
    assert!(!text(&plain).contains("waited on work"));
}

/// A job at one rank: DDP's answer at two is the run at two's to the byte for a rank that
/// holds the buckets DDP made as it wrapped the model until the rebuilt ones are made, as the
/// run at one does (it keeps the whole model at any world); a rank that lets them go first
/// peaks lower by at most their bytes, which fit says; FSDP1 is refused with the reason, as PyTorch runs it as NO_SHARD at a world of one (nothing
/// in the run is a shard to scale).
#[test]
fn a_run_at_one_rank_answers_for_ddp_and_says_why_not_for_fsdp1() {
    let dir = tempdir("fit-world-one");
    let at_one = rank0(&dir, "ddp", 1, true);
    let predicted = fit(&at_one, &["--world-size", "2"]);
    // A rank whose collectives complete late holds DDP's first buckets to the rebuild, as the
    // run at one rank does: the most a rank reaches, to the byte.
    let late = rank0_with(&dir, "ddp", (2, true, 1), &[("DDP_BUCKETS_LATE", "1")]);
    assert_eq!(answers(&predicted), answers(&fit(&late, &[])));
    // One that lets them go first peaks lower, by at most their bytes, which fit says.
    let first = fit(&rank0(&dir, "ddp", 2, true), &[]);
    let held = predicted["world_size"]["first_buckets_bytes"].as_u64();
    assert_eq!(held, Some(8 << 20), "{}", predicted["world_size"]);
    apart_by_at_most(&predicted, &first, 8 << 20);
    let text = stdout(&gpushim(&[
        &"fit",
        &at_one,
        &"--at",
        &"1",
        &"--world-size",
        &"2",
    ]));
    assert!(
        text.contains("DDP's first buckets (8.00 MiB) held until the rebuilt ones are made"),
        "{text}"
    );
    let fsdp1 = rank0(&dir, "fsdp1", 1, true);
    let o = gpushim(&[&"fit", &fsdp1, &"--at", &"1", &"--world-size", &"2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("FSDP1 at a world size of 1 runs as NO_SHARD")
            && stderr(&o).contains("trace the job at 2 ranks or more"),
        "{}",
        stderr(&o)
    );
}
