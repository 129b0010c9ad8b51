//! `fit --checkpoint`: a run without activation checkpointing answers for the same program with
//! its blocks checkpointed. The program of repeated blocks on the PyTorch stand-in
//! (`tests/clients/kinds/blocks.py`) runs both ways; what `fit` predicts from the plain run at
//! batch 1 is what the checkpointed program did at batches 1, 2 and 4.

use crate::common::*;
use crate::fit::json;
use std::path::{Path, PathBuf};

/// The blocks program at `batch`, checkpointed or not: its trace.
pub(crate) fn blocks(dir: &Path, batch: u64, ckpt: bool) -> PathBuf {
    blocks_in(dir, batch, if ckpt { "ckpt" } else { "" })
}

/// The blocks program at `batch` in `mode` ("", "ckpt", "amp", "amp-grads", "amp-full",
/// "amp-temps", "amp-summed" or "grads"): its trace.
fn blocks_in(dir: &Path, batch: u64, mode: &str) -> PathBuf {
    blocks_with(dir, batch, mode, &[])
}

/// The blocks program at `batch` in `mode`, with `env` set (BLOCKS_REDUCE,
/// BLOCKS_TRANSFORMERS, ...): its trace.
pub(crate) fn blocks_with(
    dir: &Path,
    batch: u64,
    mode: &str,
    env: &[(&'static str, &str)],
) -> PathBuf {
    let t = if mode.is_empty() {
        dir.join(format!("b{batch}.trace"))
    } else {
        dir.join(format!("b{batch}-{mode}.trace"))
    };
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let mut args = vec![lib("libtorch_cpu.so"), lib("libc10_cuda.so"), "2".into()];
    if !mode.is_empty() {
        args.push(mode.into());
    }
    args.extend(["--batch-size".into(), batch.to_string()]);
    assert_ok(&python_client(&t, "kinds/blocks.py", args, env));
    t
}

/// Each setting's rows: (setting, batch, peak reserved, peak allocated).
pub(crate) fn rows(v: &serde_json::Value) -> Vec<(String, u64, u64, u64)> {
    let mut out = Vec::new();
    for s in v["settings"].as_array().unwrap_or_else(|| panic!("{v}")) {
        for r in s["rows"].as_array().unwrap() {
            out.push((
                s["setting"].as_str().unwrap().to_string(),
                r["batch"].as_u64().unwrap(),
                r["peak_reserved_bytes"].as_u64().unwrap(),
                r["peak_allocated_bytes"].as_u64().unwrap(),
            ));
        }
    }
    out
}

/// The row at `batch` under `setting` ("" for the run's).
pub(crate) fn row(
    rows: &[(String, u64, u64, u64)],
    setting: &str,
    batch: u64,
) -> (String, u64, u64, u64) {
    rows.iter()
        .find(|x| x.0 == setting && x.1 == batch)
        .cloned()
        .unwrap_or_else(|| panic!("no row at {batch} under '{setting}': {rows:?}"))
}

/// A run's own rows at its batch: the truth the predictions are held to.
pub(crate) fn own_rows(trace: &Path, batch: u64) -> Vec<(String, u64, u64, u64)> {
    let b = batch.to_string();
    let t = trace.to_str().unwrap();
    rows(&json(&["fit", t, "--at", &b, "--batch", &b, "--json"]))
}

/// `fit --json` of the run at batch 1 at batches 1, 2 and 4, its blocks of `class`
/// checkpointed.
fn checkpointed_at_1_2_4(trace: &str, class: &str) -> serde_json::Value {
    json(&[
        "fit",
        trace,
        "--at",
        "1",
        "--batch",
        "1,2,4",
        "--checkpoint",
        class,
        "--json",
    ])
}

/// What `fit --checkpoint auto` of the run at batch 1 prints, with `more` arguments.
fn checkpoint_text(trace: &str, more: &[&str]) -> String {
    let args = [
        &["fit", trace, "--at", "1", "--checkpoint", "auto"][..],
        more,
    ]
    .concat();
    let o = gpushim_text(&args);
    assert_ok(&o);
    stdout(&o)
}

/// From the plain run at batch 1, with its blocks named or found: the peak reserved and
/// allocated of the checkpointed program at 1, 2 and 4, to the byte under the run's setting
/// (the replay of the setting a run used is that run's own), and its peak allocated under
/// expandable segments; and not what the plain program holds.
#[test]
fn a_plain_run_predicts_the_checkpointed_programs_peaks() {
    let dir = tempdir("fit-ckpt");
    let plain = blocks(&dir, 1, false);
    let p = plain.to_str().unwrap();
    let checkpointed = |class: &str| checkpointed_at_1_2_4(p, class);
    let predicted = checkpointed("Block");
    let ck = &predicted["checkpoint"];
    assert_eq!(ck["class"], "Block", "{ck}");
    assert_eq!(ck["found"], false);
    assert_eq!(ck["per_step"], 4, "four blocks a step: {ck}");
    assert_eq!(ck["blocks"], 8, "two steps: {ck}");
    assert_eq!(ck["checkpointed"], 8, "{ck}");
    // Each block kept its first two ops' outputs (768 + 512 KiB) for the backward.
    assert_eq!(ck["saved_bytes"], 8 * (768 + 512) * 1024, "{ck}");
    let predicted = rows(&predicted);
    for batch in [1u64, 2, 4] {
        let truth = own_rows(&blocks(&dir, batch, true), batch);
        let (p, t) = (row(&predicted, "", batch), row(&truth, "", batch));
        assert_eq!(p, t, "batch {batch}");
        let es = "expandable_segments:True";
        let (p, t) = (row(&predicted, es, batch), row(&truth, es, batch));
        assert_eq!(p.3, t.3, "allocated under expandable segments at {batch}");
    }
    // The what-if changes the answer: the plain program holds more.
    let plain_rows = rows(&json(&[
        "fit", p, "--at", "1", "--batch", "1,2,4", "--json",
    ]));
    for (w, without) in predicted.iter().zip(&plain_rows) {
        assert!(
            w.3 < without.3,
            "checkpointed {w:?} against plain {without:?}"
        );
    }
    // Found from the frames: the same blocks, the same answer.
    let found = checkpointed("auto");
    assert_eq!(
        found["checkpoint"]["class"], "Block",
        "{}",
        found["checkpoint"]
    );
    assert_eq!(found["checkpoint"]["found"], true);
    assert_eq!(rows(&found), predicted);
    // The text says what was checkpointed and from what.
    let text = gpushim_text(&["fit", p, "--at", "1", "--checkpoint", "auto"]);
    assert_ok(&text);
    let said = stdout(&text);
    assert!(
        said.contains(
            "with activation checkpointing of Block (4 blocks a step, found from the frames)"
        ),
        "{said}"
    );
}

/// The same program's checkpointing predicted from its plain run at batch 1, as each way runs
/// it: where each op's backward ends with the engine's reduction of a gradient to its input's
/// shape (a bias's), a non-reentrant checkpoint lets each recomputed copy go as its node
/// returns, before the reduction's staging buffer, where the plain run's saved output lived
/// through it; a block of transformers' own is checkpointed reentrant (its forward made again
/// whole), as transformers does by default; where each op's node saves its input (the op
/// before's output), the block's backward begins at its last op's node, whose number the next
/// block's first request (made before that block's first node) carries too. To the byte at 1,
/// 2 and 4 against the checkpointed program each time, and said.
#[test]
fn a_checkpoint_is_predicted_as_pytorch_or_transformers_runs_it() {
    let ways: [(&[(&'static str, &str)], bool); 4] = [
        (&[("BLOCKS_REDUCE", "1")], false),
        (&[("BLOCKS_INPUTS", "1")], false),
        (&[("BLOCKS_TRANSFORMERS", "1")], true),
        (
            &[("BLOCKS_REDUCE", "1"), ("BLOCKS_TRANSFORMERS", "1")],
            true,
        ),
    ];
    for (env, reentrant) in ways {
        let dir = tempdir("fit-ckpt-ways");
        let plain = blocks_with(&dir, 1, "", env);
        let p = plain.to_str().unwrap();
        let v = checkpointed_at_1_2_4(p, "auto");
        assert_eq!(
            v["checkpoint"]["reentrant"], reentrant,
            "{env:?}: {}",
            v["checkpoint"]
        );
        let predicted = rows(&v);
        for batch in [1u64, 2, 4] {
            let truth = own_rows(&blocks_with(&dir, batch, "ckpt", env), batch);
            let (p, t) = (row(&predicted, "", batch), row(&truth, "", batch));
            assert_eq!(p, t, "{env:?} at batch {batch}");
        }
        let said = checkpoint_text(p, &[]);
        let way = if reentrant {
            "as torch.utils.checkpoint(use_reentrant=True) does"
        } else {
            "as torch.utils.checkpoint(use_reentrant=False) does"
        };
        assert!(said.contains(way), "{env:?}: {said}");
    }
}

/// `--checkpoint-way` overrides the frames: the same plain run (a block class not of
/// transformers', so non-reentrant by default) asked `reentrant` predicts the program
/// checkpointed reentrant to the byte, and `non-reentrant` the one checkpointed so; the two
/// differ where the engine reduces a gradient (BLOCKS_REDUCE), and the text says the way asked.
#[test]
fn the_checkpoint_way_asked_is_the_way_predicted() {
    let dir = tempdir("fit-ckpt-way");
    let env = [("BLOCKS_REDUCE", "1")];
    let plain = blocks_with(&dir, 1, "", &env);
    let p = plain.to_str().unwrap();
    let reentrant_dir = tempdir("fit-ckpt-way-reentrant");
    let ask = |way: &str| {
        json(&[
            "fit",
            p,
            "--at",
            "1",
            "--batch",
            "1,2,4",
            "--checkpoint",
            "auto",
            "--checkpoint-way",
            way,
            "--json",
        ])
    };
    let (re, non) = (ask("reentrant"), ask("non-reentrant"));
    assert_eq!(re["checkpoint"]["reentrant"], true, "{}", re["checkpoint"]);
    assert_eq!(re["checkpoint"]["way_asked"], true);
    assert_eq!(non["checkpoint"]["reentrant"], false);
    let (re, non) = (rows(&re), rows(&non));
    assert_ne!(re, non, "the two ways differ on this program");
    let with_transformers = [("BLOCKS_REDUCE", "1"), ("BLOCKS_TRANSFORMERS", "1")];
    for batch in [1u64, 2, 4] {
        let truth = own_rows(&blocks_with(&dir, batch, "ckpt", &env), batch);
        assert_eq!(
            row(&non, "", batch),
            row(&truth, "", batch),
            "non-reentrant at {batch}"
        );
        let truth = own_rows(
            &blocks_with(&reentrant_dir, batch, "ckpt", &with_transformers),
            batch,
        );
        assert_eq!(
            row(&re, "", batch),
            row(&truth, "", batch),
            "reentrant at {batch}"
        );
    }
    let said = checkpoint_text(p, &["--checkpoint-way", "reentrant"]);
    assert!(
        said.contains("its forward whole, as torch.utils.checkpoint(use_reentrant=True) does\n")
            || said.contains(
                "its forward whole, as torch.utils.checkpoint(use_reentrant=True) does ("
            ),
        "{said}"
    );
    assert!(!said.contains("whose block this is"), "{said}");
    // Without --checkpoint it is refused.
    let o = gpushim_text(&["fit", p, "--at", "1", "--checkpoint-way", "reentrant"]);
    assert!(!o.status.success());
}

/// Blocks whose ops make no temporary: nothing a block makes is freed inside it, so a saved
/// tensor lives to its block's end. Each is freed there once (its backward's free then frees
/// the recomputed copy): the what-if holds less than the plain run at every batch, no less
/// than the checkpointed program did, and the same from a run of two steps as of six. (Its
/// place at the block's end was computed past the end of the block's requests, so the free
/// went before the tensor was made and every saved tensor stayed: ResNet-50's blocks so
/// predicted 10.6 GiB at batch 8 where the plain run peaked at 2.9.)
#[test]
fn blocks_that_free_nothing_inside_free_what_they_saved_at_their_end() {
    let dir = tempdir("fit-ckpt-no-temps");
    let run = |steps: u64, batch: u64, mode: &str| {
        let t = dir.join(format!("s{steps}-b{batch}-{mode}.trace"));
        let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
        let mut args = vec![
            lib("libtorch_cpu.so"),
            lib("libc10_cuda.so"),
            steps.to_string(),
        ];
        if !mode.is_empty() {
            args.push(mode.into());
        }
        args.extend(["--batch-size".into(), batch.to_string()]);
        let env = vec![("BLOCKS_TEMPS", "0".to_string())];
        assert_ok(&python_client(&t, "kinds/blocks.py", args, env));
        t
    };
    let predict = |plain: &Path, what_if: bool| {
        let p = plain.to_str().unwrap();
        let mut args = vec!["fit", p, "--at", "1", "--batch", "1,2,4", "--json"];
        if what_if {
            args.extend(["--checkpoint", "Block"]);
        }
        rows(&json(&args))
    };
    let (two, six) = (run(2, 1, ""), run(6, 1, ""));
    let predicted = predict(&two, true);
    assert_eq!(
        predicted,
        predict(&six, true),
        "the run's length changed it"
    );
    let plain = predict(&two, false);
    for batch in [1u64, 2, 4] {
        let (w, without) = (row(&predicted, "", batch), row(&plain, "", batch));
        assert!(
            w.3 < without.3,
            "checkpointed {w:?} against plain {without:?}"
        );
        let truth = row(&own_rows(&run(2, batch, "ckpt"), batch), "", batch);
        assert!(
            w.3 >= truth.3,
            "predicted {w:?} below the program's {truth:?}"
        );
    }
}

/// A class no request was made under is refused with the reason; a run without repeated
/// blocks says so and how to name one; `--checkpoint` and a second run are not taken together.
#[test]
fn blocks_that_cannot_be_found_are_said_so() {
    let dir = tempdir("fit-ckpt-none");
    let plain = blocks(&dir, 1, false);
    let p = plain.to_str().unwrap();
    let o = gpushim_text(&["fit", p, "--at", "1", "--checkpoint", "GPT2Block"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(
            "--checkpoint: no request of the run's forward was made under GPT2Block.forward"
        ),
        "{err}"
    );
    // One block a step: no module's forward repeats, and the way out is named.
    let single = dir.join("single.trace");
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let args = vec![lib("libtorch_cpu.so"), lib("libc10_cuda.so"), "2".into()];
    let env = vec![("BLOCKS_COUNT", "1".to_string())];
    assert_ok(&python_client(&single, "kinds/blocks.py", args, env));
    let o = gpushim_text(&[
        "fit",
        single.to_str().unwrap(),
        "--at",
        "1",
        "--checkpoint",
        "auto",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("no module's forward runs more than once in a step")
            && err.contains("--checkpoint CLASS"),
        "{err}"
    );
    // The kinds program has one module class whose forward runs twice a step (Linear): found.
    let t = dir.join("kinds.trace");
    assert_ok(&kinds_program(&t, 3, false, Vec::new()));
    let v = json(&[
        "fit",
        t.to_str().unwrap(),
        "--at",
        "1",
        "--checkpoint",
        "auto",
        "--json",
    ]);
    assert_eq!(v["checkpoint"]["class"], "Linear", "{}", v["checkpoint"]);
    let o = gpushim_text(&[
        "fit",
        p,
        "--at",
        "1",
        "--checkpoint",
        "auto",
        "--with",
        p,
        "--with-at",
        "2",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

/// A temporary of the forward can be a parameter's size by chance: the blocks' temporaries are
/// 128 KiB a sample, at batch 8 the size of each block's 1 MiB weight (GPT-2's dropout masks
/// at 8 x 512 tokens are its position table's size). It still grows with the batch: from the
/// plain run at 8, the plain program's peaks at 16 to the byte, and the checkpointed
/// program's peak allocated.
#[test]
fn a_forward_temporary_the_size_of_a_parameter_grows() {
    let dir = tempdir("fit-param-sized");
    let plain = blocks(&dir, 8, false);
    let p = plain.to_str().unwrap();
    for ckpt in [false, true] {
        let mut args = vec!["fit", p, "--at", "8", "--batch", "16", "--json"];
        if ckpt {
            args.extend(["--checkpoint", "Block"]);
        }
        let predicted = rows(&json(&args));
        let truth = own_rows(&blocks(&dir, 16, ckpt), 16);
        let (p, t) = (row(&predicted, "", 16), row(&truth, "", 16));
        if ckpt {
            // The what-if's order of frees is the program's only near enough for the blocks
            // to land as they did where blocks are a few MiB (docs/fit.md): what is held is
            // exact.
            assert_eq!(p.3, t.3, "peak allocated, checkpointed");
        } else {
            assert_eq!(p, t, "plain");
        }
    }
}

/// Under autocast each weight's 16-bit copy is kept for the backward, as activations are, but
/// does not grow with the batch; an op's output that is half a weight's size by chance (the
/// blocks' second op at batch 1) does. The copies are told by their op (a cast: its node is
/// `ToCopyBackward0`): from the run at 1, the runs at 2 and 4 to the byte.
#[test]
fn autocast_weight_copies_keep_their_size() {
    from_one_to_two_and_four("amp");
}

/// Under autocast as PyTorch runs it, each op casts its input too, on the op's line and by the
/// same node as the weight's copy: at batch 1 the input's copy is the weight's copy's size. The
/// weight's copy hands its gradient to the weight (its `.grad` until the optimizer's step), the
/// input's hands it on: by that the input's copies grow and the weights' do not. From the run
/// at 1, the runs at 2 and 4 to the byte.
#[test]
fn an_inputs_cast_the_size_of_a_weights_copy_grows() {
    from_one_to_two_and_four("amp-grads");
}

/// Under autocast as PyTorch runs it, an op's backward makes its input's 16-bit gradient and
/// its weight's, of one size at batch 1 (half a weight: a Llama's at 2 x 512 tokens, its
/// hidden size). The weight's is let go as soon as its cast has made the weight's gradient of
/// it; the input's, once cast back for the op before. By that the input's gradients grow and
/// the weights' do not: from the run at 1, the runs at 2 and 4 to the byte (both were kept at
/// their size before, as a weight's gradient).
#[test]
fn a_16_bit_gradient_the_size_of_a_weights_grows_unless_it_became_the_weights() {
    from_one_to_two_and_four("amp-full");
}

/// A forward temporary of half a weight's size made by an op that is not a cast (a Llama's
/// projection outputs and rotary halves at 2 x 512 tokens) grows: from the run at 1, the runs
/// at 2 and 4 to the byte (it was kept at its size before, as a weight's 16-bit copy).
#[test]
fn a_forward_temporary_the_size_of_a_weights_copy_grows_unless_a_cast_made_it() {
    from_one_to_two_and_four("amp-temps");
}

/// Where a run makes its weights' gradients anew each step, a weight's gradient is its
/// `.grad`, not a temporary: an op's backward temporary of a weight's size at batch 1 (an fp32
/// Llama's input gradients at 2 x 512 tokens) is an activation's gradient handed to the op
/// before, and grows. From the run at 1, the runs at 2 and 4 to the byte (it was kept at its
/// size before, as a weight's gradient being summed).
#[test]
fn a_gradient_the_size_of_a_weight_handed_on_grows() {
    from_one_to_two_and_four("grads");
}

/// A run that sums its gradients into `.grad` kept from step to step makes them at its first
/// step only: its later steps' weight copies, whose casts then make no parameter's gradient,
/// are weights' copies still (not activations' casts). From the run at 1, the runs at 2 and 4
/// to the byte.
#[test]
fn weight_copies_stay_where_gradients_are_summed_into_a_kept_grad() {
    from_one_to_two_and_four("amp-summed");
}

/// The blocks program in `mode`: `fit` from its run at 1 gives its runs at 2 and 4 to the
/// byte, under the run's setting and expandable segments.
fn from_one_to_two_and_four(mode: &str) {
    let dir = tempdir(&format!("fit-{mode}"));
    let one = blocks_in(&dir, 1, mode);
    let predicted = rows(&json(&[
        "fit",
        one.to_str().unwrap(),
        "--at",
        "1",
        "--batch",
        "2,4",
        "--json",
    ]));
    for batch in [2u64, 4] {
        let truth = own_rows(&blocks_in(&dir, batch, mode), batch);
        for setting in ["", "expandable_segments:True"] {
            let (p, t) = (row(&predicted, setting, batch), row(&truth, setting, batch));
            assert_eq!(p, t, "{mode}: batch {batch} under '{setting}'");
        }
    }
}

/// A checkpointing what-if that edits nothing (the kinds program's layers, whose backward the
/// trace does not tie to them) says so plainly, and its rows are the run's own.
#[test]
fn a_checkpoint_what_if_that_changes_nothing_says_so() {
    let dir = tempdir("fit-ckpt-nothing");
    let t = dir.join("kinds.trace");
    assert_ok(&kinds_program(&t, 5, false, vec![]));
    let p = t.to_str().unwrap();
    let ask = ["fit", p, "--at", "1", "--batch", "1,4"];
    let text = stdout(&crate::common::gpushim_text(
        &[&ask[..], &["--checkpoint", "auto"]].concat(),
    ));
    assert!(
        text.contains("--checkpoint changes nothing in this run: no backward of its")
            && text.contains("the baseline"),
        "{text}"
    );
    let with = rows(&json(
        &[&ask[..], &["--checkpoint", "auto", "--json"]].concat(),
    ));
    let without = rows(&json(&[&ask[..], &["--json"]].concat()));
    assert_eq!(with, without);
}

/// A block class defined inside a function (its frames say `build.<locals>.Block.forward`, as
/// a program that builds its model in a function has it) is found by its own name, from the
/// frames and when named: the same answers as the class defined at the top of its module.
/// A stack of blocks (an encoder's, a decoder's: `T5Stack` running six `T5Block`s) is not a
/// block: its forward runs twice a step and holds every block's requests, but each of its
/// calls runs two or more blocks that hold layers of their own. `auto` takes the blocks, as
/// naming their class does.
#[test]
fn a_stack_of_blocks_is_not_taken_for_a_block() {
    let dir = tempdir("fit-ckpt-stacks");
    let stacked = plain_blocks_with(&dir, "stacked", "BLOCKS_STACKS");
    let (got, named) = (
        checkpointed(&stacked, "auto"),
        checkpointed(&stacked, "Block"),
    );
    assert_eq!(got["checkpoint"]["class"], "Block", "{}", got["checkpoint"]);
    assert_eq!(got["checkpoint"]["per_step"], 4, "{}", got["checkpoint"]);
    assert_eq!(got["checkpoint"]["found"], true);
    assert_eq!(
        named["checkpoint"]["checkpointed"], 8,
        "{}",
        named["checkpoint"]
    );
    assert_eq!(rows(&got), rows(&named));
}

/// The plain blocks program (2 steps at batch 1) with `var` set, traced to `NAME.trace` in
/// `dir`.
fn plain_blocks_with(dir: &Path, name: &str, var: &'static str) -> std::path::PathBuf {
    let trace = dir.join(format!("{name}.trace"));
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let args = vec![
        lib("libtorch_cpu.so"),
        lib("libc10_cuda.so"),
        "2".into(),
        "--batch-size".into(),
        "1".into(),
    ];
    let env = vec![(var, "1".to_string())];
    assert_ok(&python_client(&trace, "kinds/blocks.py", args, env));
    trace
}

/// `fit --json` of `trace` at batches 1 and 4 with the blocks of `class` checkpointed.
fn checkpointed(trace: &Path, class: &str) -> serde_json::Value {
    let t = trace.to_str().unwrap();
    json(&[
        "fit",
        t,
        "--at",
        "1",
        "--batch",
        "1,4",
        "--checkpoint",
        class,
        "--json",
    ])
}

#[test]
fn a_block_class_defined_inside_a_function_is_found() {
    let dir = tempdir("fit-ckpt-local");
    let top = blocks(&dir, 1, false);
    let local = plain_blocks_with(&dir, "local", "BLOCKS_LOCAL");
    let ask = checkpointed;
    let want = ask(&top, "auto");
    assert_eq!(
        want["checkpoint"]["class"], "Block",
        "{}",
        want["checkpoint"]
    );
    for class in ["auto", "Block"] {
        let got = ask(&local, class);
        assert_eq!(
            got["checkpoint"]["class"], "Block",
            "{class}: {}",
            got["checkpoint"]
        );
        assert_eq!(rows(&got), rows(&want), "{class}");
    }
}
