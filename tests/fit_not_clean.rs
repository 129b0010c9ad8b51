//! `gpushim fit` on a run that was not clean: one that leaks, and a trace cut short. What the
//! answers rest on is said before them, and the clean run says nothing of the kind.

use crate::common::*;
use crate::fit::{at_batch, json};

/// `fit` on the kinds program that keeps each step's last activation (3 MiB a step): it says
/// first that the run leaks, how much per iteration and where, that its answers are of this
/// run's length, and how many iterations until the growth alone fills the room left, and
/// answers for the steady step too: without the growth, what the same program without the
/// leak answers; that program says nothing of the kind.
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
    // Beside it, before the answers: the steady step, and the iterations until full.
    let said: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert!(
        said.iter().any(|l| l.starts_with("  without the growth"))
            && said
                .iter()
                .any(|l| l.contains("the growth alone fills the room left")
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
    // The steady step: the leaking run without its growth answers as the clean run does
    // (its largest batch, and its peak at the run's batch), where the run as it was answers
    // for what it had grown to.
    assert!(text.contains("without the growth"), "{text}");
    let c = json(&["fit", clean.to_str().unwrap(), "--at", "1", "--json"]);
    let steady = &v["leaking"]["steady"];
    let clean_run = &c["settings"][0];
    assert_eq!(
        steady["largest_batch"], clean_run["largest_batch"],
        "{steady}"
    );
    assert_eq!(
        steady["rows"][0]["peak_reserved_bytes"], clean_run["rows"][0]["peak_reserved_bytes"],
        "{steady}"
    );
    assert!(
        v["settings"][0]["largest_batch"].as_u64() < clean_run["largest_batch"].as_u64(),
        "{v}"
    );
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

/// `oom` after a run that leaked until the device was full: the growth is said first, with
/// the largest batch a steady step (without the growth) fits in the room PyTorch's allocator
/// had at the failure, beside the run as it was; never a room of 0 B taken from a device less
/// a context larger than it.
#[test]
fn oom_after_a_leaking_run_says_the_growth_and_the_steady_answer() {
    let dir = tempdir("oom-leaking");
    let t = dir.join("leak.trace");
    let env = vec![("GPUSHIM_SIM_MEMORY", (200u64 << 20).to_string())];
    let out = kinds_program(&t, 80, true, env);
    assert!(!out.status.success(), "the run fills its 200 MiB device");
    let out = gpushim_text(&["oom", t.to_str().unwrap(), "--at", "1"]);
    assert_ok(&out);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.starts_with("the run grew 3.00 MiB per iteration"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("the largest batch that fits 200.00 MiB without the growth"),
        "{line}"
    );
    let steady: u64 = line
        .split("under the run's setting: ")
        .nth(1)
        .and_then(|r| r.split([' ', ';']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(steady >= 1, "{line}");
}
