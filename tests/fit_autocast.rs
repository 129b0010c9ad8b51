//! `fit --autocast`: a run in 32 bits answers for the same program under `torch.autocast` to 16
//! bits. The program of residual layers on the PyTorch stand-in
//! (`tests/clients/kinds/autocast.py`, whose nodes link their inputs as PyTorch's do, so the
//! shim records its autograd graph) runs both ways; what `fit` predicts from the 32-bit run at
//! batch 1 is what the 16-bit program did at batches 1, 2 and 4.

use crate::common::*;
use crate::fit::json;
use crate::fit_checkpoint::{own_rows, rows};
use std::path::{Path, PathBuf};

/// The program at `batch`, under autocast or not: its trace.
pub(crate) fn layers(dir: &Path, batch: u64, amp: bool) -> PathBuf {
    let t = dir.join(format!("b{batch}{}.trace", if amp { "-amp" } else { "" }));
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let mut args = vec![lib("libtorch_cpu.so"), lib("libc10_cuda.so"), "2".into()];
    if amp {
        args.push("amp".into());
    }
    args.extend(["--batch-size".into(), batch.to_string()]);
    assert_ok(&python_client(&t, "kinds/autocast.py", args, Vec::new()));
    t
}

/// From the 32-bit run at batch 1: the peak reserved and allocated of the 16-bit program at 1,
/// 2 and 4 to the byte, under the run's setting and expandable segments (each run's own
/// replay is its truth); and not what the 32-bit program holds.
#[test]
fn a_32_bit_run_predicts_the_autocast_programs_peaks() {
    let dir = tempdir("fit-autocast");
    let plain = layers(&dir, 1, false);
    let p = plain.to_str().unwrap();
    let fit = |more: &[&str]| {
        let mut args = vec!["fit", p, "--at", "1", "--batch", "1,2,4", "--json"];
        args.extend_from_slice(more);
        json(&args)
    };
    let v = fit(&["--autocast", "bf16"]);
    let a = &v["autocast"];
    // Three layers a step: each product's weight and input copied, and the 32-bit input let
    // go once copied.
    assert_eq!(a["parameter_copies"].as_u64(), Some(3), "{a}");
    assert_eq!(a["activation_copies"].as_u64(), Some(3), "{a}");
    let predicted = rows(&v);
    let as_is = rows(&fit(&[]));
    for batch in [1u64, 2, 4] {
        let amp = layers(&dir, batch, true);
        let truth = own_rows(&amp, batch);
        for setting in ["", "expandable_segments:True"] {
            let find = |rs: &[(String, u64, u64, u64)]| {
                rs.iter()
                    .find(|x| x.0 == setting && x.1 == batch)
                    .cloned()
                    .unwrap_or_else(|| panic!("no row at {batch} under '{setting}': {rs:?}"))
            };
            let (p, t) = (find(&predicted), find(&truth));
            assert_eq!(p, t, "batch {batch} under '{setting}'");
            assert_ne!(
                find(&as_is).3,
                t.3,
                "the 32-bit run holds what the 16-bit one does"
            );
        }
    }
}

/// A run already under autocast (its graph casts parameters) is refused, saying why; so is a
/// trace without the graph, saying how to get one.
#[test]
fn what_the_what_if_cannot_start_from_is_said() {
    let dir = tempdir("fit-autocast-refused");
    let amp = layers(&dir, 1, true);
    let out = gpushim(&[&"fit", &amp, &"--at", &"1", &"--autocast", &"bf16"]);
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(said.contains("already casts its parameters"), "{said}");
    let plain = dir.join("plain.trace");
    let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
    let args = vec![lib("libtorch_cpu.so"), lib("libc10_cuda.so"), "2".into()];
    let off = vec![("GPUSHIM_CONF", "graph:off".to_string())];
    assert_ok(&python_client(&plain, "kinds/autocast.py", args, off));
    let out = gpushim(&[&"fit", &plain, &"--at", &"1", &"--autocast", &"bf16"]);
    assert!(!out.status.success());
    let said = stderr(&out);
    assert!(said.contains("holds no autograd graph"), "{said}");
}

/// The 16-bit program from a run at batch 2, where its activations are half a weight's size:
/// the graph names the ops that made them (an add, a product), none a cast, so they follow the
/// batch, and the answer at 8 is the run at 8's own under both settings; `--with` that run
/// agrees with it.
#[test]
fn activations_of_half_a_weights_size_follow_the_batch_when_no_cast_made_them() {
    let dir = tempdir("fit-autocast-b2");
    let at_two = layers(&dir, 2, true);
    let at_eight = layers(&dir, 8, true);
    let truth = own_rows(&at_eight, 8);
    let (two, eight) = (at_two.to_str().unwrap(), at_eight.to_str().unwrap());
    let from_two = rows(&json(&["fit", two, "--at", "2", "--batch", "8", "--json"]));
    assert_eq!(from_two, truth, "from batch 2");
    let with = rows(&json(&[
        "fit",
        two,
        "--at",
        "2",
        "--batch",
        "8",
        "--with",
        eight,
        "--with-at",
        "8",
        "--json",
    ]));
    assert_eq!(with, truth, "--with the run at 8");
    // The weight's copy is still kept at its size (the cast node made it).
    let text = stdout(&crate::common::gpushim_text(&[
        "fit", two, "--at", "2", "--batch", "8",
    ]));
    let kept = text.split("kept at their size").nth(1).unwrap_or_default();
    assert!(kept.contains("autocast.py:91 in Layer.forward"), "{text}");
    assert!(!kept.contains("autocast.py:98 in Layer.forward"), "{text}");
}
