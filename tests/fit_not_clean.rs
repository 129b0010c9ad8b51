//! `gpushim fit` on a run that was not clean: one that leaks, and a trace cut short. What the
//! answers rest on is said before them, and the clean run says nothing of the kind.

use crate::common::*;
use crate::fit::{at_batch, json};

/// `fit` on the kinds program that keeps each step's last activation (3 MiB a step): it says
/// first that the run leaks, how much per iteration and where, that its answers are of this
/// run's length, and how many iterations until the growth alone fills the room left; the same
/// program without the leak says nothing of the kind.
#[test]
fn fit_on_a_leaking_run_says_so_first() {
    let dir = tempdir("fit-leaking");
    let leaking = dir.join("leak.trace");
    assert_ok(&kinds_program(&leaking, 20, true, vec![]));
    let out = gpushim_text(&["fit", leaking.to_str().unwrap(), "--at", "1"]);
    assert_ok(&out);
    let text = stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("the run leaks: its memory grows 3.00 MiB per iteration"),
        "{text}"
    );
    assert!(first.contains("activations"), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("the growth alone fills the room left")
                && l.contains("more iterations")),
        "{text}"
    );
    let v = json(&["fit", leaking.to_str().unwrap(), "--at", "1", "--json"]);
    assert_eq!(v["leaking"]["bytes_per_iteration"], 3 << 20, "{v}");
    let clean = dir.join("clean.trace");
    assert_ok(&kinds_program(&clean, 20, false, vec![]));
    let out = gpushim_text(&["fit", clean.to_str().unwrap(), "--at", "1"]);
    assert_ok(&out);
    assert!(!stdout(&out).contains("leaks"), "{}", stdout(&out));
}

/// `fit` of a run whose trace was cut short says so before its answers, and how they are
/// bounded, as `summary`, `leaks` and `peak` do; the whole trace says nothing of the kind.
#[test]
fn fit_on_a_cut_trace_says_so_first() {
    let dir = tempdir("fit-cut");
    let whole = at_batch(&dir, 1);
    let bytes = std::fs::read(&whole).unwrap();
    // Two thirds of what was written (the file's zeroed tail left out).
    let written = bytes.iter().rposition(|&b| b != 0).unwrap_or(0);
    let cut = dir.join("cut.trace");
    std::fs::write(&cut, &bytes[..written * 2 / 3]).unwrap();
    let out = gpushim_text(&["fit", cut.to_str().unwrap(), "--at", "1"]);
    let text = stdout(&out);
    let said = text.find("the trace is incomplete: ");
    let answers = text.find("from a run at batch");
    assert!(
        said.is_some_and(|s| answers.is_some_and(|a| s < a))
            && text.contains("the peaks can be off"),
        "{text}{}",
        stderr(&out)
    );
    let out = gpushim_text(&["fit", whole.to_str().unwrap(), "--at", "1"]);
    assert!(!stdout(&out).contains("incomplete"), "{}", stdout(&out));
}
