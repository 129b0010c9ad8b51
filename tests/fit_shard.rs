//! `fit --shard`: a run that keeps the whole model on each rank answers for the same program
//! with its model sharded as FSDP2 shards it. The program of repeated blocks on the PyTorch
//! stand-in (`tests/clients/kinds/blocks.py`) runs as rank 0 of a job under DDP, and under
//! FSDP2 resharding after the forward or not (its stand-in makes FSDP2's buffers in the order
//! FSDP2's hooks make them, on their own streams); what `fit --shard` predicts from the DDP run
//! at batch 1 is what the FSDP2 program did at batches 1, 2 and 4, at the job's world size and
//! at another.

use crate::common::*;
use crate::fit::json;
use crate::fit_checkpoint::{blocks_with, own_rows, row, rows};

const EXPANDABLE: &str = "expandable_segments:True";

/// From the DDP run at 2 ranks, batch 1: `--shard full` is the FSDP2 program and `--shard
/// grad-op` the one that keeps its gathered weights to the backward, to the byte under both
/// of PyTorch's settings at 1, 2 and 4, at 2 ranks and (`--world-size 4`) at 4; and said.
#[test]
fn a_ddp_run_predicts_its_model_sharded_as_fsdp2_shards_it() {
    let dir = tempdir("fit-shard");
    let ddp = blocks_with(&dir, 1, "ddp", &[("WORLD_SIZE", "2"), ("RANK", "0")]);
    let d = ddp.to_str().unwrap();
    for (way, mode) in [("full", "fsdp2"), ("grad-op", "fsdp2-keep")] {
        for world in ["2", "4"] {
            let v = sharded_at_1_2_4(d, way, world, &[]);
            let s = &v["shard"];
            assert_eq!(s["way"], way, "{s}");
            assert_eq!(s["world"].as_u64(), world.parse().ok(), "{s}");
            assert_eq!(s["class"], "Block", "{s}");
            assert_eq!(s["unit_bytes"].as_u64(), Some(1 << 20), "{s}");
            assert_eq!(s["root_bytes"].as_u64(), Some(0), "{s}");
            assert_eq!(s["per_step"].as_u64(), Some(4), "{s}");
            // Two steps of four blocks of three ops, each op's weight gradient.
            assert_eq!(s["gradients"].as_u64(), Some(24), "{s}");
            assert_eq!(
                s["dropped_bytes"].as_u64(),
                Some(8 << 20),
                "DDP's buckets: {s}"
            );
            let env = [("WORLD_SIZE", world), ("RANK", "0")];
            agrees_with_program(
                &v,
                "fit-shard-real",
                mode,
                &env,
                &format!("{way} at {world}"),
            );
        }
    }
    let said = stdout(&gpushim_text(&["fit", d, "--at", "1", "--shard", "full"]));
    assert!(
        said.contains(
            "one rank with the model sharded over 2 ranks as FSDP2 shards it (--shard full"
        ),
        "{said}"
    );
    // No parameter of the program is used through a broadcast.
    assert!(!said.contains("broadcast's backward"), "{said}");
    assert!(
        said.contains("let go after each forward and gathered again"),
        "{said}"
    );
}

/// A parameter added to the input, broadcast over the batch (`BLOCKS_ROW` under DDP: 3 MiB,
/// an AddBackward0 node whose backward makes its gradient), is kept whole on every rank as
/// FSDP2 keeps one of first dimension 1 (its shard its whole, gathered and reduce-scattered at
/// the world times it), and said: what, its bytes and the node, in `--json` and the text; the
/// program without it says nothing of the kind (`a_ddp_run_predicts_its_model_sharded...`).
/// Fails without `sharding/broadcast.rs`. (The stand-in's FSDP2 program holds its row in a
/// group of its own, gathered in another order than the root's: the figures are checked
/// against real ViTs, `docs/gpu-checks.md`.)
#[test]
fn a_parameter_used_through_a_broadcast_is_kept_whole_as_fsdp2_keeps_a_row() {
    let dir = tempdir("fit-shard-broadcast");
    let row_bytes = (3u64 << 20).to_string();
    let row = ("BLOCKS_ROW", row_bytes.as_str());
    let ddp = blocks_with(&dir, 1, "ddp", &[("WORLD_SIZE", "2"), ("RANK", "0"), row]);
    let d = ddp.to_str().unwrap();
    for world in ["2", "4"] {
        let v = sharded_at_1_2_4(d, "full", world, &[]);
        let b = &v["shard"]["broadcast"];
        assert_eq!(b["parameters"].as_u64(), Some(1), "{b}");
        assert_eq!(b["bytes"].as_u64(), Some(3 << 20), "{b}");
        assert_eq!(b["nodes"], serde_json::json!(["AddBackward0"]), "{b}");
    }
    let said = stdout(&gpushim_text(&["fit", d, "--at", "1", "--shard", "full"]));
    assert!(
        said.contains(
            "1 parameter gets its gradient (3.00 MiB) from a broadcast's backward \
             (AddBackward0): kept whole on every rank"
        ),
        "{said}"
    );
}

/// DDP broadcasts the model's states as it wraps it, through a buffer of their size made and
/// let go at once (`DDP_SYNC_STATES`: 10 MiB here, a model's states larger than any tensor of
/// its steps); FSDP2 makes no such buffer. From that DDP run, `--shard full` drops it with the
/// buckets (said) and is the FSDP2 program to the byte at 1, 2 and 4 under both settings
/// (fails with the buffer read as parameters and kept: its cached segment at batch 1 under
/// the defaults). Made by a function the frames do not name (`DDP_SYNC_ELSEWHERE`, as a
/// release that renames it would) it reads as parameters, made after the model's and let go
/// before the first forward: not made all the same, though not said among DDP's buffers
/// (fails without `drop_broadcast` on FSDP2's way).
#[test]
fn ddps_broadcast_of_the_models_states_is_not_made_by_fsdp2() {
    for (elsewhere, dropped) in [("", 18u64 << 20), ("1", 8 << 20)] {
        let dir = tempdir("fit-shard-sync");
        let env = [
            ("WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("DDP_SYNC_STATES", "10485760"),
            ("DDP_SYNC_ELSEWHERE", elsewhere),
        ];
        let ddp = blocks_with(&dir, 1, "ddp", &env);
        let d = ddp.to_str().unwrap();
        let v = sharded_at_1_2_4(d, "full", "2", &[]);
        let s = &v["shard"];
        assert_eq!(
            s["dropped_bytes"].as_u64(),
            Some(dropped),
            "DDP's buckets (8 MiB over the run), and its 10 MiB broadcast where named: {s}"
        );
        let what = format!("full at 2 (the broadcast elsewhere: '{elsewhere}')");
        agrees_with_program(&v, "fit-shard-sync-real", "fsdp2", &env, &what);
        let said = stdout(&gpushim_text(&["fit", d, "--at", "1", "--shard", "full"]));
        let named = "DDP's own buffers not made (its buckets, its broadcast of the model's \
                     states: 18.00 MiB";
        assert_eq!(said.contains(named), elsewhere.is_empty(), "{said}");
    }
}

/// Blocks of two makes whose parameters are all of one size (`BLOCKS_STACKS=3`: two blocks of
/// three 1 MiB weights, then two of four, as an encoder's and a decoder's): the sizes' order
/// repeats with a period that is no block's, so each block's parameters are found from its
/// gradients in the first backward. From the DDP run, `--shard full` and `grad-op` are the
/// FSDP2 programs to the byte at 1, 2 and 4 (fails with the period taken for the blocks).
#[test]
fn blocks_of_two_makes_are_sharded_as_fsdp2_shards_them() {
    let env = [("WORLD_SIZE", "2"), ("RANK", "0"), ("BLOCKS_STACKS", "3")];
    two_makes_sharded_as_fsdp2_shards_them("fit-shard-makes", &env, None);
}

/// The same blocks with each weight followed by two buffers that take no gradient (as a batch
/// norm's running statistics are made with its parameters, and FSDP2 leaves them whole): no
/// run of places is a block's gradients, so each block's are found passing over the buffers,
/// which are in no unit. The FSDP2 programs to the byte (refused without the buffers passed
/// over; fails with them sharded as the root's).
#[test]
fn blocks_made_among_buffers_are_sharded_as_fsdp2_shards_them() {
    let env = [
        ("WORLD_SIZE", "2"),
        ("RANK", "0"),
        ("BLOCKS_STACKS", "3"),
        ("BLOCKS_BUFFERS", "1"),
    ];
    // Two buffers an op: 2 x (3 + 4) x 2 of them, a statistic of the op's place times 64 KiB
    // and a count of 512 bytes each.
    let bytes =
        2 * (((64 + 128 + 192) << 10) + 3 * 512) + 2 * (((64 + 128 + 192 + 256) << 10) + 4 * 512);
    two_makes_sharded_as_fsdp2_shards_them("fit-shard-buffers", &env, Some((28, bytes)));
}

/// The blocks program of two makes (`env`), run under DDP, sharded both ways: the class and
/// its blocks said, the larger make's four weights a unit and no root's, the `buffers` left
/// whole said (how many, their bytes), and every row the FSDP2 program's.
fn two_makes_sharded_as_fsdp2_shards_them(
    dir: &str,
    env: &[(&'static str, &str)],
    buffers: Option<(u64, u64)>,
) {
    let d = tempdir(dir);
    let ddp = blocks_with(&d, 1, "ddp", env);
    for (way, mode) in [("full", "fsdp2"), ("grad-op", "fsdp2-keep")] {
        let v = sharded_at_1_2_4(ddp.to_str().unwrap(), way, "2", &[]);
        let s = &v["shard"];
        assert_eq!(s["class"], "Block", "{s}");
        assert_eq!(s["per_step"].as_u64(), Some(4), "{s}");
        // The larger make's weights, and no root.
        assert_eq!(s["unit_bytes"].as_u64(), Some(4 << 20), "{s}");
        assert_eq!(s["root_bytes"].as_u64(), Some(0), "{s}");
        assert_eq!(s["buffers"].as_u64(), buffers.map(|b| b.0), "{s}");
        assert_eq!(s["buffer_bytes"].as_u64(), buffers.map(|b| b.1), "{s}");
        agrees_with_program(&v, &format!("{dir}-real"), mode, env, way);
    }
    let said = stdout(&gpushim_text(&[
        "fit",
        ddp.to_str().unwrap(),
        "--at",
        "1",
        "--shard",
        "full",
    ]));
    let line = buffers.map(|(n, _)| format!("  {n} buffers made among the parameters ("));
    assert_eq!(
        line.as_ref().is_some_and(|l| said.contains(l.as_str())),
        buffers.is_some(),
        "{said}"
    );
    assert!(
        buffers.is_some()
            == said.contains("left whole on every rank, as FSDP2 leaves a module's buffers"),
        "{said}"
    );
}

/// `fit --json` of the run at batch 1 at batches 1, 2 and 4, sharded `way` over `world` ranks,
/// with `more` arguments.
fn sharded_at_1_2_4(trace: &str, way: &str, world: &str, more: &[&str]) -> serde_json::Value {
    let args = [
        &[
            "fit", trace, "--at", "1", "--batch", "1,2,4", "--shard", way,
        ][..],
        &["--world-size", world, "--json"],
        more,
    ]
    .concat();
    json(&args)
}

/// `fit`'s rows in `v` (batches 1, 2 and 4) are, under both settings, what the blocks program
/// in `mode` did at each batch (run in a new folder named after `dir`, with `env`).
fn agrees_with_program(
    v: &serde_json::Value,
    dir: &str,
    mode: &str,
    env: &[(&'static str, &str)],
    what: &str,
) {
    let predicted = rows(v);
    let real_dir = tempdir(dir);
    for batch in [1u64, 2, 4] {
        let truth = own_rows(&blocks_with(&real_dir, batch, mode, env), batch);
        for setting in ["", EXPANDABLE] {
            assert_eq!(
                row(&predicted, setting, batch),
                row(&truth, setting, batch),
                "--shard {what} ranks, batch {batch}, setting '{setting}'"
            );
        }
    }
}

/// Sharding what is sharded already, or over a world the trace does not say, is refused with
/// the way out named.
#[test]
fn a_shard_that_cannot_be_told_is_refused() {
    let dir = tempdir("fit-shard-refused");
    let refused = |trace: &std::path::Path| {
        let o = gpushim_text(&[
            "fit",
            trace.to_str().unwrap(),
            "--at",
            "1",
            "--shard",
            "full",
        ]);
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let fsdp = blocks_with(&dir, 1, "fsdp2", &[("WORLD_SIZE", "2"), ("RANK", "0")]);
    let err = refused(&fsdp);
    assert!(err.contains("--shard: the run is already sharded"), "{err}");
    let alone = blocks_with(&dir, 1, "ddp", &[]);
    let err = refused(&alone);
    assert!(
        err.contains("the trace does not say its world size")
            && err.contains("give the ranks to shard over with --world-size N"),
        "{err}"
    );
    let zero_dir = tempdir("fit-shard-zero");
    let zero = blocks_with(&zero_dir, 1, "ddp", &[("WORLD_SIZE", "0")]);
    let err = refused(&zero);
    assert!(
        err.contains("the run's WORLD_SIZE (\"0\") is not a world size: give the ranks"),
        "{err}"
    );
    // Blocks of one class made differently (an encoder's and a decoder's) whose gradients are
    // not of their parameters' sizes (the stand-in's block has one weight and three ops, each
    // with a gradient of its own): which parameters are a block's cannot be told.
    let two_dir = tempdir("fit-shard-two-stacks");
    let env = [("WORLD_SIZE", "2"), ("BLOCKS_STACKS", "2")];
    let err = refused(&blocks_with(&two_dir, 1, "ddp", &env));
    assert!(
        err.contains(
            "the run's 4 parameters do not make 4 runs of the same sizes, one for each of its \
             blocks of Block, nor are each block's the sizes of its gradients in the first \
             backward"
        ) && err.contains("a block's parameters cannot be told"),
        "{err}"
    );
    // ZeRO-3 past DeepSpeed's live-parameter limit (1e9 elements: four weights of 1.1 GB)
    // gathers each module again in the backward, which is not modelled: said, with the way.
    let big_dir = tempdir("fit-shard-zero3-big");
    let weight = (1_100_000_000u64).to_string();
    let env = [("WORLD_SIZE", "2"), ("BLOCKS_WEIGHT", weight.as_str())];
    let big = blocks_with(&big_dir, 1, "ddp", &env);
    let o = gpushim_text(&[
        "fit",
        big.to_str().unwrap(),
        "--at",
        "1",
        "--shard",
        "zero3",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("ZeRO-3 is modelled for a model of at most 1000000000 elements")
            && err.contains("this one: 1100000000 elements, 4 parameters over 2 steps")
            && err.contains("ask that run with --world-size"),
        "{err}"
    );
}

/// From the DDP run at 2 ranks, batch 1: `--shard zero2` is the program with its weights held
/// as DeepSpeed's ZeRO-2 holds them (its stand-in makes ZeRO-2's requests in the order
/// DeepSpeed's code makes them, as traces on an H200 show: `blocks.py`), to the byte under both
/// of PyTorch's settings at 1, 2 and 4, at 2 ranks and (`--world-size 4`) at 4, with a gradient
/// bucket of 4 MiB that its twelve 1 MiB gradients a step fill three times over; and said.
#[test]
fn a_ddp_run_predicts_its_model_held_as_zero2_holds_it() {
    let dir = tempdir("fit-zero2");
    let ddp = blocks_with(&dir, 1, "ddp", &[("WORLD_SIZE", "2"), ("RANK", "0")]);
    let d = ddp.to_str().unwrap();
    const MIB: u64 = 1 << 20;
    for (world, w) in [("2", 2u64), ("4", 4)] {
        let v = zero_agrees_with_program(d, "zero2", world, w);
        let (s, z) = (&v["shard"], &v["shard"]["zero"]);
        assert_eq!(z["flat_bytes"].as_u64(), Some(4 * MIB), "{z}");
        // Rank 0's partition holds the first 4/W MiB: two whole weights at 2, one at 4.
        assert_eq!(
            z["partition_gradient_bytes"].as_u64(),
            Some(4 * MIB / w),
            "{z}"
        );
        assert_eq!(z["bucket_bytes"].as_u64(), Some(4 * MIB), "{z}");
        // Adam's one line of state.
        assert_eq!(z["states"].as_u64(), Some(1), "{z}");
        assert_eq!(
            s["dropped_bytes"].as_u64(),
            Some(8 * MIB),
            "DDP's buckets: {s}"
        );
    }
    // The partition is the run's rank's: rank 1's trace answers for rank 1.
    let rank1_dir = tempdir("fit-zero2-rank1");
    let r1 = blocks_with(&rank1_dir, 1, "ddp", &[("WORLD_SIZE", "2"), ("RANK", "1")]);
    let v = sharded_at_1_2_4(
        r1.to_str().unwrap(),
        "zero2",
        "4",
        &["--zero-bucket", "1048576"],
    );
    assert_eq!(
        v["shard"]["zero"]["rank"].as_u64(),
        Some(1),
        "{}",
        v["shard"]
    );
    let said = stdout(&gpushim_text(&["fit", d, "--at", "1", "--shard", "zero2"]));
    assert!(
        said.contains("rank 0 of 2 as DeepSpeed's ZeRO-2 holds it (--shard zero2; fp32; reduce_bucket_size 500000000 elements"),
        "{said}"
    );
    assert!(
        said.contains("each of 24 gradients let go into a gradient bucket of 1.86 GiB"),
        "{said}"
    );
}

/// `fit --shard WAY` (`zero2` or `zero3`) of the DDP run `d` over `world` (`w`) ranks with a
/// bucket of 1,048,576 elements is the blocks program under that stand-in at 1, 2 and 4 to the
/// byte; the partition the rank's 4/W MiB; two steps of four blocks of three ops, each op's
/// weight gradient let go into the bucket. What `fit` answered.
fn zero_agrees_with_program(d: &str, way: &str, world: &str, w: u64) -> serde_json::Value {
    let v = sharded_at_1_2_4(d, way, world, &["--zero-bucket", "1048576"]);
    let (s, z) = (&v["shard"], &v["shard"]["zero"]);
    assert_eq!(s["way"], way, "{s}");
    assert_eq!(z["partition_bytes"].as_u64(), Some((4 << 20) / w), "{z}");
    assert_eq!(z["gradients"].as_u64(), Some(24), "{z}");
    let env = [
        ("WORLD_SIZE", world),
        ("RANK", "0"),
        ("ZERO_BUCKET", "4194304"),
    ];
    let what = format!("{way} at {world}");
    agrees_with_program(&v, &format!("fit-{way}-real"), way, &env, &what);
    v
}

/// From the DDP run at 2 ranks, batch 1: `--shard zero3` is the program with its weights held
/// as DeepSpeed's ZeRO-3 holds them (`blocks.py zero3`: the partitions, the bucket kept for the
/// run, every weight gathered on a stream of its own at each forward's start and let go at its
/// gradient's hook, the bucket's post-scaling copy on DeepSpeed's reduce stream), to the byte
/// under both settings at 1, 2 and 4, at 2 ranks and at 4, the 4 MiB bucket overflowing twice
/// a step; and said.
#[test]
fn a_ddp_run_predicts_its_model_held_as_zero3_holds_it() {
    let dir = tempdir("fit-zero3");
    let ddp = blocks_with(&dir, 1, "ddp", &[("WORLD_SIZE", "2"), ("RANK", "0")]);
    let d = ddp.to_str().unwrap();
    for (world, w) in [("2", 2u64), ("4", 4)] {
        let v = zero_agrees_with_program(d, "zero3", world, w);
        assert_eq!(v["shard"]["zero"]["stage"].as_u64(), Some(3), "{v}");
    }
    let said = stdout(&gpushim_text(&["fit", d, "--at", "1", "--shard", "zero3"]));
    assert!(
        said.contains("rank 0 of 2 as DeepSpeed's ZeRO-3 holds it (--shard zero3; fp32"),
        "{said}"
    );
    assert!(
        said.contains("the parameters gathered whole (4.00 MiB) on a stream of their own")
            && said.contains("(24 gradients into a bucket of 1.86 GiB, kept for the run)"),
        "{said}"
    );
}

/// The FSDP2 program at 2 ranks answers for itself at 4 (`--world-size 4`): its shards (the
/// weights fully_shard cut, the gradients' shards, the optimizer's state and temporaries)
/// resized, the gathered weights and FSDP2's buffers kept, to the byte under both settings at
/// the run's batch. (Another batch is not asked: the stand-in's input gradients, 1 MiB a
/// sample, are a whole weight's size or twice it, which `fit` keeps at their size under FSDP,
/// as `docs/fit.md` says of a temporary of a whole parameter's size.)
#[test]
fn an_fsdp2_run_at_two_ranks_answers_at_four() {
    let w = four_from_two("fit-fsdp2", 2, &[]);
    assert_eq!(w["framework"], "FSDP2 (fully_shard)", "{w}");
    // Four weights' shards, eight of the gradients', four of the optimizer's state and eight
    // of its temporaries.
    assert_eq!(w["sharded_requests"].as_u64(), Some(24), "{w}");
}

/// FSDP2 keeps a parameter of first dimension 1 whole on every rank (it pads the dimension to
/// the world): the stand-in's 3 MiB row, in a module of its own, is a 3 MiB shard at any world,
/// gathered to the world times it. From the run at two ranks, four ranks to the byte: the row's
/// shard, its gathered copy and its reduce-scatter's buffers as the run at four makes them,
/// not halved (`src/report/fit/padded.rs`).
#[test]
fn a_row_fsdp2_keeps_on_every_rank_is_not_halved_at_four() {
    let row_bytes = (3u64 << 20).to_string();
    four_from_two("fit-row", 1, &[("BLOCKS_ROW", row_bytes.as_str())]);
}

/// Under FSDP2's mixed precision (`MixedPrecisionPolicy(param_dtype=torch.bfloat16)`) each
/// all-gather's inputs are the unit's shards cast to 16 bits (half a shard's bytes, on the
/// all-gather stream): shards all the same. From the run at two ranks, four to the byte (weights
/// of 8 MiB: casts of 2 MiB, which move the peak reserved where they are not resized).
#[test]
fn fsdp2s_16_bit_casts_of_its_shards_are_resized_with_the_world() {
    let weight = (8u64 << 20).to_string();
    let w = four_from_two(
        "fit-mp-world",
        1,
        &[("BLOCKS_MP", "1"), ("BLOCKS_WEIGHT", weight.as_str())],
    );
    // The plain program's 24 shards and the casts: each step gathers its 4 blocks in the
    // forward and again in the backward, 2 steps.
    assert_eq!(w["sharded_requests"].as_u64(), Some(24 + 2 * 8), "{w}");
}

/// At a world of one, under mixed precision, FSDP2 casts each parameter's shard to 16 bits in
/// `FSDPParam.all_gather_inputs` under `wait_for_unshard`, just before the parameter's whole
/// storage: a request of the unit's gathering that is a shard (halved at two ranks), not a
/// gathered parameter (not in the all-gather output's bytes); and where two ranks make their
/// casts, before the unit's all-gather output on its stream, let go once it is made (one rank
/// keeps its cast while the parameter is made from it). From the run at one rank (weights of 8
/// MiB: casts of 4 MiB), two to the byte under both settings. Fails with the casts read as
/// gathered parameters (outputs of 12 MiB), kept whole, or left where one rank made them (peak
/// allocated 2 MiB high).
#[test]
fn fsdp2s_casts_at_one_rank_are_shards_of_the_gathering_at_two() {
    let weight = (8u64 << 20).to_string();
    let (at_one, at_two) = (tempdir("fit-mp-one-at-1"), tempdir("fit-mp-one-at-2"));
    let at = |dir: &std::path::Path, world| {
        let env = [
            ("BLOCKS_MP", "1"),
            ("BLOCKS_WEIGHT", weight.as_str()),
            ("WORLD_SIZE", world),
            ("RANK", "0"),
        ];
        blocks_with(dir, 1, "fsdp2", &env)
    };
    let from = at(&at_one, "1");
    let args = ["--at", "1", "--batch", "1", "--world-size", "2", "--json"];
    let v = json(&[&["fit", from.to_str().unwrap()][..], &args[..]].concat());
    let w = &v["world_size"];
    // The plain program's 24 shards and 16 casts: two steps gather four blocks before their
    // forward and again before their backward.
    assert_eq!(w["sharded_requests"].as_u64(), Some(24 + 16), "{w}");
    assert_eq!(w["all_gathers_added"].as_u64(), Some(16), "{w}");
    let truth = own_rows(&at(&at_two, "2"), 1);
    for setting in ["", EXPANDABLE] {
        assert_eq!(
            row(&rows(&v), setting, 1),
            row(&truth, setting, 1),
            "setting '{setting}': {w}"
        );
    }
}

/// Under FSDP2's mixed precision a weight's gradient is 16-bit, half the weight: an input's
/// gradient of a whole fp32 weight's size (the stand-in's, 1 MiB a sample) is an activation's,
/// and follows the batch; and the root's cast of its input to 16 bits, made in FSDP2's own
/// code, is a tensor of the batch, not FSDP2's buffer. From the run at batch 1, batch 2 to the
/// byte under both settings (without mixed precision that size is taken for a weight's
/// gradient and kept: [`an_fsdp2_run_at_two_ranks_answers_at_four`]). Fails with either taken
/// back.
#[test]
fn under_mixed_precision_fsdp2s_run_answers_at_twice_its_batch() {
    let dir = tempdir("fit-mp-halved");
    let env = [("BLOCKS_MP", "1"), ("WORLD_SIZE", "2"), ("RANK", "0")];
    let at_one = blocks_with(&dir, 1, "fsdp2", &env);
    let at_two = blocks_with(&dir, 2, "fsdp2", &env);
    let v = json(&[
        "fit",
        at_one.to_str().unwrap(),
        "--at",
        "1",
        "--batch",
        "2",
        "--json",
    ]);
    let truth = own_rows(&at_two, 2);
    for setting in ["", EXPANDABLE] {
        assert_eq!(
            row(&rows(&v), setting, 2),
            row(&truth, setting, 2),
            "setting '{setting}': {v}"
        );
    }
}

/// FSDP2 shards at a world of one too (its all-gather and reduce-scatter copy), so a run on one
/// GPU answers for two: its shards halved, but not what is a shard's size only because the
/// world is one (the all-gather's output and the gathered weights, the reduce-scatter's input:
/// told from the shards by their stream and their code, not their size). To the byte.
#[test]
fn an_fsdp2_run_on_one_gpu_answers_at_two_ranks() {
    let w = worlds_apart("fit-fsdp2-one", 1, &[], ("1", "2"));
    assert_eq!(
        (w["run"].as_u64(), w["asked"].as_u64()),
        (Some(1), Some(2)),
        "{w}"
    );
    assert_eq!(w["sharded_requests"].as_u64(), Some(24), "{w}");
    // Two steps of four blocks, each gathered before its forward and its backward.
    assert_eq!(w["all_gathers_added"].as_u64(), Some(16), "{w}");
}

/// [`worlds_apart`] from 2 ranks to 4.
fn four_from_two(name: &str, batch: u64, more: &[(&'static str, &str)]) -> serde_json::Value {
    worlds_apart(name, batch, more, ("2", "4"))
}

/// The FSDP2 program (`more` of its settings) at batch `batch` as rank 0 of `from` and of `to`
/// ranks: `fit --world-size TO` of the run at `from` is the run at `to`'s own answer to the
/// byte under both settings at that batch. Returns what `fit` said of the world sizes.
fn worlds_apart(
    name: &str,
    batch: u64,
    more: &[(&'static str, &str)],
    (from, to): (&str, &str),
) -> serde_json::Value {
    let b = batch.to_string();
    // Each world's trace in a folder of its own, kept to the end (a folder goes when dropped).
    let (from_dir, to_dir) = (
        tempdir(&format!("{name}-at-{from}")),
        tempdir(&format!("{name}-at-{to}")),
    );
    let at = |world: &str| {
        let dir = if world == from { &from_dir } else { &to_dir };
        let mut env = vec![("WORLD_SIZE", world), ("RANK", "0")];
        env.extend_from_slice(more);
        blocks_with(dir, batch, "fsdp2", &env)
    };
    let v = json(&[
        "fit",
        at(from).to_str().unwrap(),
        "--at",
        &b,
        "--batch",
        &b,
        "--world-size",
        to,
        "--json",
    ]);
    let w = v["world_size"].clone();
    let truth = own_rows(&at(to), batch);
    for setting in ["", EXPANDABLE] {
        assert_eq!(
            row(&rows(&v), setting, batch),
            row(&truth, setting, batch),
            "at {to} ranks from {from}, setting '{setting}': {w}"
        );
    }
    w
}
