//! Memory by kind on the PyTorch stand-in, against a program whose truth is known to the byte
//! (`tests/clients/kinds/train.py`: the same file paths and function names as PyTorch's
//! package, tensors from the stand-in allocator, gradients from its autograd engine thread).
//! Parameters 10 MiB (two 4 MiB layers built, a 2 MiB buffer made by moving the model),
//! gradients 8 MiB, optimizer state 16 MiB, a 1 MiB cuBLASLt-sized workspace; at the peak (the
//! loss's gradient, first tensor of the second step's backward) also 6 MiB of activations and
//! the 128 KiB loss computed outside any module, that 256 KiB temporary and the 1 MiB batch;
//! the other temporaries of the forward, the backward and the optimizer are freed within their
//! phase.

use crate::common::*;
use std::path::Path;

const MIB: u64 = 1 << 20;

fn train(tag: &str, steps: u32, leak: bool) -> TestFile {
    let (t, out) = train_with(tag, steps, leak, vec![]);
    assert_ok(&out);
    t
}

/// The program under the shim with `env` set; the trace and what the program did.
fn train_with(
    tag: &str,
    steps: u32,
    leak: bool,
    env: Vec<(&'static str, String)>,
) -> (TestFile, std::process::Output) {
    let t = tempdir(tag).file("kinds.trace");
    let out = kinds_program(&t, steps, leak, env);
    (t, out)
}

/// `file:N`: the line of the stand-in program's file `file` (under tests/clients/kinds) that
/// holds `code`.
fn line_of(file: &str, code: &str) -> String {
    let text = std::fs::read_to_string(repo().join("tests/clients/kinds").join(file)).unwrap();
    let n = text
        .lines()
        .position(|l| l.contains(code))
        .unwrap_or_else(|| panic!("{code} not in {file}"));
    let name = file.rsplit('/').next().unwrap_or(file);
    format!("{name}:{}", n + 1)
}

fn json(args: &[&str], t: &Path) -> serde_json::Value {
    report_json(args, &[t])
}

/// `[{"kind": k, "bytes": b, ...}]` as (kind, bytes) pairs.
pub fn pairs(v: &serde_json::Value) -> Vec<(String, u64)> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|k| {
            (
                k["kind"].as_str().unwrap().to_string(),
                k["bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn expect(list: &[(&str, u64)]) -> Vec<(String, u64)> {
    list.iter().map(|&(k, b)| (k.to_string(), b)).collect()
}

#[test]
fn summary_and_peak_give_each_kind_its_bytes_at_the_peak_and_at_exit() {
    let t = train("kinds", 4, false);
    let s = json(&["summary"], &t);
    let f = &s["framework"][0];
    assert_eq!(f["allocated_peak_bytes"], 42 * MIB + 3 * MIB / 8, "{f}");
    let at_peak = expect(&[
        ("parameter", 10 * MIB),
        ("gradient", 8 * MIB),
        ("optimizer_state", 16 * MIB),
        ("activation", 6 * MIB + MIB / 8),
        ("temporary", MIB / 4),
        ("input", MIB),
        ("workspace", MIB),
    ]);
    assert_eq!(pairs(&f["kinds_at_peak"]), at_peak, "{f}");
    let at_exit = expect(&[
        ("parameter", 10 * MIB),
        ("gradient", 8 * MIB),
        ("optimizer_state", 16 * MIB),
        ("workspace", MIB),
    ]);
    assert_eq!(pairs(&f["kinds_at_exit"]), at_exit, "{f}");
    // What a forward leaves for its backward: two activations and the loss.
    assert_eq!(f["activations_peak_bytes"], 6 * MIB + MIB / 8, "{f}");
    // The NVML-free text says the same, in words.
    let text = stdout(&gpushim_text(&["summary", t.to_str().unwrap()]));
    assert!(
        text.contains(
            "tensors by kind at their peak: parameters 10.00 MiB, gradients 8.00 MiB, optimizer \
             state 16.00 MiB, activations 6.12 MiB, temporaries 256.00 KiB, input 1.00 MiB, cuBLAS \
             workspaces 1.00 MiB"
        ),
        "{text}"
    );

    // peak: the same kinds, each with the lines that made it.
    let p = json(&["peak"], &t);
    let by_kind = &p[0]["by_kind"];
    assert_eq!(pairs(by_kind), at_peak, "{p}");
    let lines = |kind: &str| -> Vec<String> {
        by_kind
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["kind"] == kind)
            .unwrap()["by_call_site"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["label"].as_str().unwrap().to_string())
            .collect()
    };
    let activation = line_of("torch/nn/modules/linear.py", "an activation");
    assert!(
        lines("activation")[0].contains(&format!("{activation} in Linear.forward")),
        "{p}"
    );
    let state = line_of("torch/optim/adam.py", "# optimizer state");
    assert!(lines("optimizer_state")[0].contains(&format!("{state} in Adam.step")));
    assert!(lines("gradient")[0].contains("MmBackward0"), "{p}");
    let batch = line_of(
        "train.py",
        "x = _standin.empty(1 * MiB * _standin.BATCH * _standin.SEQ)",
    );
    assert!(lines("input")[0].contains(&batch), "{p}");
    // diff: the kinds at each trace's peak side by side.
    let leaky = train("kinds-diff", 4, true);
    let d = report_json(&["diff"], &[&t, &leaky]);
    let row = |kind: &str| {
        d["peak_by_kind"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["kind"] == kind)
            .cloned()
            .unwrap_or_else(|| panic!("{d}"))
    };
    assert_eq!(row("parameter")["a"], 10 * MIB, "{d}");
    assert_eq!(row("parameter")["b"], 10 * MIB, "{d}");
    // The leaky run keeps one more 3 MiB activation per step: more at its peak.
    assert!(
        row("activation")["b"].as_u64().unwrap() > row("activation")["a"].as_u64().unwrap(),
        "{d}"
    );
    assert_eq!(
        row("optimizer_state")["a"],
        row("optimizer_state")["b"],
        "{d}"
    );
    let text = stdout(&gpushim_text(&["peak", t.to_str().unwrap()]));
    assert!(
        text.contains("PyTorch's tensors by kind, then call site:")
            && text.contains("activations 6.12 MiB (3 tensors)"),
        "{text}"
    );
}

#[test]
fn a_growing_line_says_its_kind() {
    let t = train("kinds-leak", 12, true);
    let l = json(&["leaks"], &t);
    let growing = l["iterations"]["growing"].as_array().unwrap();
    let g = growing
        .iter()
        .find(|g| {
            g["call_site"]
                .as_str()
                .unwrap()
                .contains(&line_of("torch/nn/modules/linear.py", "an activation"))
        })
        .unwrap_or_else(|| panic!("{l}"));
    assert_eq!(g["kind"], "activation", "{g}");
    assert_eq!(g["bytes_per_iteration"], 3 * MIB, "{g}");
    let text = stdout(&gpushim_text(&["leaks", t.to_str().unwrap()]));
    assert!(text.contains(", activations  "), "{text}");
}

/// The seeds' metric leak written on the program's own line: a tensor computed from the
/// forward's output (`h = gelu(lin(x))`), kept with its graph, with more of the forward after it
/// before the backward. Its line grows 2 MiB a step and is an activation, never input (input is
/// what the program makes before a step's forward: the batch stays input).
#[test]
fn a_program_line_computed_from_the_forwards_output_is_an_activation() {
    let (t, out) = train_with("kinds-own", 8, false, vec![("KINDS_OWN", "1".into())]);
    assert_ok(&out);
    let l = json(&["leaks"], &t);
    let growing = l["iterations"]["growing"].as_array().unwrap();
    let own = line_of("train.py", "computed from the forward's output");
    let g = growing
        .iter()
        .find(|g| g["call_site"].as_str().unwrap().contains(&own))
        .unwrap_or_else(|| panic!("{own} grows: {l}"));
    assert_eq!(g["kind"], "activation", "{g}");
    assert_eq!(g["bytes_per_iteration"], 2 * MIB, "{g}");
    // The batch, made before the forward, is still input.
    let s = json(&["summary"], &t);
    let input = s["framework"][0]["kinds_at_peak"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == "input")
        .unwrap_or_else(|| panic!("{s}"))
        .clone();
    assert_eq!(input["bytes"], MIB, "{s}");
}

/// An out-of-memory says what the tensors were when it came: the parameters built before the
/// first step, whatever else the step had made.
#[test]
fn an_out_of_memory_gives_the_kinds_at_the_failure() {
    let (t, out) = train_with(
        "kinds-oom",
        4,
        false,
        vec![("GPUSHIM_SIM_MEMORY", (30u64 << 20).to_string())],
    );
    assert!(!out.status.success(), "the program must run out of memory");
    let ooms = json(&["oom"], &t);
    let first = &ooms
        .as_array()
        .and_then(|a| a.first())
        .unwrap_or_else(|| panic!("{ooms}"));
    let kinds = pairs(&first["by_kind"]);
    assert_eq!(kinds[0], ("parameter".to_string(), 10 * MIB), "{first}");
    let text = stdout(&gpushim_text(&["oom", t.to_str().unwrap()]));
    assert!(
        text.contains("PyTorch's tensors by kind: parameters 10.00 MiB"),
        "{text}"
    );
}

/// A run longer than its ring: the tensors the checkpoint restores keep their kinds (by their
/// lines), and a peak the checkpoint kept gives its kinds from the lines alone, saying so.
#[test]
fn a_run_longer_than_its_ring_keeps_its_kinds() {
    let (t, out) = train_with(
        "kinds-ring",
        5000,
        false,
        vec![
            ("GPUSHIM_CONF", "trace_max:4MiB".into()),
            ("KINDS_PACE", "1".into()),
        ],
    );
    assert_ok(&out);
    let s = json(&["summary"], &t);
    assert!(
        s["health"]["summarized"].as_u64().unwrap_or(0) > 0,
        "the ring must have wrapped: {}",
        s["health"]
    );
    let f = &s["framework"][0];
    assert_eq!(
        pairs(&f["kinds_at_exit"]),
        expect(&[
            ("parameter", 10 * MIB),
            ("gradient", 8 * MIB),
            ("optimizer_state", 16 * MIB),
            ("workspace", MIB),
        ]),
        "{f}"
    );
    let p = json(&["peak"], &t);
    let kinds = pairs(&p[0]["by_kind"]);
    assert_eq!(kinds[0], ("parameter".to_string(), 10 * MIB), "{p}");
}

/// A ring's checkpoint taken inside an optimizer step (its temporaries part made, as PyTorch's
/// foreach step makes them all before freeing any): the temporaries made before the
/// checkpoint, which restores them, are temporaries as the whole trace says, not optimizer
/// state. The stand-in's last step pauses after its first temporary; the exit's checkpoint
/// applies every record more than 2 ms older than the last (that temporary among them) and
/// keeps the rest as they came (the second temporary, the frees). The program's last
/// allocation with Python frames is the second temporary, with the first still live. Read
/// from either checkpoint (the reports' newest; the older, as `fit` reads a ring).
#[test]
fn a_checkpoint_inside_an_optimizer_step_leaves_its_temporaries_temporaries() {
    let (t, out) = train_with(
        "kinds-ring-step",
        5000,
        false,
        vec![
            ("GPUSHIM_CONF", "trace_max:4MiB".into()),
            ("KINDS_PACE", "1".into()),
            ("KINDS_OPT_PAUSE", "1.5".into()),
        ],
    );
    assert_ok(&out);
    let health = &json(&["summary"], &t)["health"];
    assert!(
        health["summarized"].as_u64().unwrap_or(0) > 0,
        "the ring must have wrapped: {health}"
    );
    let read = |longest_ring: bool| {
        let opts = gpushim::trace::reader::ReadOptions {
            longest_ring,
            ..Default::default()
        };
        let wants = gpushim::report::analysis::Wants::summary();
        let a = gpushim::report::analysis::analyze(&t, &opts, &wants).unwrap();
        a.summary.unwrap().framework.remove(0)
    };
    for longest_ring in [false, true] {
        let f = read(longest_ring);
        let state = f
            .kinds_at_exit
            .bytes(gpushim::report::kinds::Kind::OptimizerState);
        assert_eq!(state, 16 * MIB);
        // As the program's code ended (the second temporary made), the kinds that last are
        // exit's: the first temporary is no optimizer state.
        assert!(
            f.kinds_before_shutdown.is_none(),
            "read from the {} checkpoint: {:?}",
            if longest_ring { "older" } else { "newest" },
            f.kinds_before_shutdown
        );
    }
}

/// Where the kinds come from is said in docs/kinds.md, and every kind a report can print is
/// explained there.
#[test]
fn every_kind_is_explained_in_the_docs() {
    let doc = std::fs::read_to_string(repo().join("docs/kinds.md")).unwrap();
    for k in gpushim::report::kinds::Kind::ALL {
        assert!(doc.contains(&format!("**{}**", k.name())), "{}", k.name());
    }
}

#[test]
fn the_kinds_as_the_programs_code_ended_are_said_beside_what_pythons_shutdown_left() {
    // The program's last lines hold the parameters, their gradients and the optimizer state;
    // the interpreter's shutdown frees them with no line of the program's. Summary's kinds at
    // exit are what the shutdown left; before it, as the code ended, they are all there.
    let dir = tempdir("kinds-shutdown");
    let t = dir.join("k.trace");
    assert_ok(&kinds_program(
        &t,
        3,
        false,
        vec![("KINDS_SHUTDOWN", "1".into())],
    ));
    let s = report_json(&["summary"], &[&t]);
    let f = &s["framework"][0];
    let bytes = |v: &serde_json::Value, kind: &str| -> u64 {
        v.as_array()
            .unwrap()
            .iter()
            .find(|k| k["kind"] == kind)
            .map_or(0, |k| k["bytes"].as_u64().unwrap())
    };
    let before = &f["kinds_before_shutdown"]["kinds"];
    assert!(before.is_array(), "no kinds before the shutdown: {f}");
    // Two layers' 4 MiB parameters and the 2 MiB buffer the model's move made.
    assert_eq!(bytes(before, "parameter"), 10 << 20, "{before}");
    assert_eq!(bytes(before, "gradient"), 8 << 20, "{before}");
    assert_eq!(bytes(before, "optimizer_state"), 16 << 20, "{before}");
    let exit = &f["kinds_at_exit"];
    assert_eq!(bytes(exit, "optimizer_state"), 0, "{exit}");
    assert_eq!(bytes(exit, "parameter"), 2 << 20, "the buffer only: {exit}");
    assert_eq!(bytes(exit, "gradient"), 0, "{exit}");
    let text = stdout(&gpushim(&[&"summary", &t]));
    assert!(
        text.contains("tensors by kind as the program's code ended")
            && text.contains("at exit, after Python's shutdown freed what the program still held"),
        "{text}"
    );
    // Without a shutdown that frees anything, one line, as before.
    let plain = dir.join("plain.trace");
    assert_ok(&kinds_program(&plain, 3, false, vec![]));
    let s = report_json(&["summary"], &[&plain]);
    assert!(
        s["framework"][0].get("kinds_before_shutdown").is_none(),
        "{s}"
    );
}

/// Three steps of the kinds program: without its leak, the optimizer state, gradients and
/// workspace made in the first step are no growth, and `leaks` says three boundaries are few;
/// with it, the kept activation grows 3 MiB a step all the same.
#[test]
fn memory_made_once_in_a_short_run_is_not_growth() {
    let dir = tempdir("kinds-short");
    for (leak, name) in [(false, "clean.trace"), (true, "leak.trace")] {
        let t = dir.join(name);
        assert_ok(&kinds_program(&t, 3, leak, vec![]));
        let out = gpushim_text(&["leaks", t.to_str().unwrap()]);
        assert_ok(&out);
        let text = stdout(&out);
        assert!(text.contains("  only 3 boundaries: "), "{text}");
        let grows: Vec<&str> = text.lines().filter(|l| l.starts_with("  grows ")).collect();
        if leak {
            assert_eq!(grows.len(), 1, "{text}");
            assert!(grows[0].contains("grows 3.00 MiB per iteration"), "{text}");
            assert!(grows[0].contains("activations"), "{text}");
        } else {
            assert!(grows.is_empty(), "{text}");
            assert!(text.contains("no call site grows"), "{text}");
        }
    }
}
