//! `fit`'s answers where it once gave none or a wrong one: a ring trace (a long run), a run
//! whose requests have no kind that follows the batch, a search that ends at its cap.

use crate::common::*;
use crate::fit::{at_batch, json};
use std::path::Path;
use std::process::Command;

/// A run long enough to be a ring (4000 steps through a 4 MiB trace, its oldest records
/// summarized in a checkpoint) is what an OOM after hours of growth leaves: `fit`, `oom` and the
/// page with `--at` answer it, never abort (the requests and their kinds were once read from two
/// different checkpoints of the ring and zipped), and the peak allocated at each batch is the one
/// predicted from a short run of the same program, which the tensors' kinds alone decide.
#[test]
fn a_ring_trace_is_answered_by_fit_oom_and_the_page_from_one_read() {
    let dir = tempdir("fit-ring");
    let ring = dir.join("ring.trace");
    let out = kinds_program_with(
        &ring,
        4000,
        false,
        &["--batch-size", "2"],
        vec![("GPUSHIM_CONF", "trace_max:4MiB".into())],
    );
    assert_ok(&out);
    let short = dir.join("short.trace");
    assert_ok(&kinds_program_with(
        &short,
        20,
        false,
        &["--batch-size", "2"],
        vec![],
    ));
    let r = ring.to_str().unwrap();
    // The sharding what-if needs the order the model's parameters were made in, which a ring
    // that began after the build has not kept: said, not guessed.
    let o = gpushim_text(&[
        "fit",
        r,
        "--at",
        "2",
        "--shard",
        "full",
        "--world-size",
        "2",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the trace is a ring whose records begin after the model was built"),
        "{err}"
    );
    let info = json(&["summary", r, "--json"]);
    assert!(
        info["health"]["summarized"].as_u64().unwrap() > 0,
        "the run is a ring: {info}"
    );
    let allocated = |t: &str| -> Vec<(u64, u64)> {
        let v = json(&["fit", t, "--batch", "4,8", "--json"]);
        v["settings"][0]["rows"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .map(|row| {
                (
                    row["batch"].as_u64().unwrap(),
                    row["peak_allocated_bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let from_ring = allocated(r);
    assert_eq!(from_ring, allocated(short.to_str().unwrap()));
    assert_eq!(from_ring.len(), 2, "{from_ring:?}");
    // How much of the run the ring's records hold is said, with no warning: many steps.
    let held = json(&["fit", r, "--batch", "4", "--json"])["ring"].clone();
    let backwards = held["backwards"].as_u64().unwrap_or(0);
    assert!((3..4000).contains(&backwards), "{held}");
    let forwards = held["forwards"].as_u64().unwrap_or(0);
    assert!(forwards.abs_diff(backwards) <= 1, "{held}");
    let text = stdout(&gpushim_text(&["fit", r, "--batch", "4"]));
    assert!(
        text.contains(&format!("{backwards} backward pass(es)")),
        "{text}"
    );
    assert!(!text.contains("warning:"), "{text}");
    let short_fit = json(&["fit", short.to_str().unwrap(), "--batch", "4", "--json"]);
    assert!(short_fit.get("ring").is_none(), "{short_fit}");
    let oom = gpushim_text(&["oom", r]);
    assert_ok(&oom);
    let page = dir.join("ring.html");
    let o = gpushim_text(&["report", r, "--at", "2", "-o", page.to_str().unwrap()]);
    assert_ok(&o);
    assert!(page.is_file());
}

/// A ring whose records hold a pass or two of the training (here none: the program's last
/// tensors, made and freed after the training, fill the ring) gets `fit`'s answers with a
/// warning that they are of those records alone, where it said nothing.
#[test]
fn fit_from_a_ring_that_holds_few_steps_says_so() {
    let dir = tempdir("fit-ring-tail");
    let ring = dir.join("ring.trace");
    let out = kinds_program_with(
        &ring,
        200,
        false,
        &["--batch-size", "2"],
        vec![
            ("GPUSHIM_CONF", "trace_max:4MiB".into()),
            ("KINDS_TAIL", "40000".into()),
        ],
    );
    assert_ok(&out);
    let r = ring.to_str().unwrap();
    let v = json(&["fit", r, "--batch", "4", "--json"]);
    let backwards = v["ring"]["backwards"].as_u64();
    assert!(backwards.is_some_and(|b| b < 3), "{v}");
    let text = stdout(&gpushim_text(&["fit", r, "--batch", "4"]));
    assert!(
        text.contains(
            "warning: the trace is a ring, and the records its replay starts from hold only"
        ),
        "{text}"
    );
    // `simulate --torch` says the same of its replay.
    let sim = gpushim_text(&["simulate", "--torch", "expandable_segments:True", r]);
    assert_ok(&sim);
    let said = String::from_utf8_lossy(&sim.stderr);
    assert!(
        said.contains("0 backward pass(es)")
            && said.contains("every figure below is of those alone"),
        "{said}"
    );
}

/// Answers that are not answers are not given: a trace whose requests have no kind that follows
/// the batch (no Python frames) says so first and gives no largest batch, where it printed the
/// search's cap, 4096, as one; a largest batch at the cap is said to be at least that.
#[test]
fn no_largest_batch_is_given_when_nothing_scales_or_the_search_ends_at_its_cap() {
    let gpt2 = repo().join("tests/data/torch/gpt2.trace");
    let g = gpt2.to_str().unwrap();
    let text = stdout(&gpushim_text(&["fit", g, "--at", "8"]));
    assert!(
        text.starts_with("nothing of this run's requests follows the batch"),
        "{text}"
    );
    assert!(
        text.contains("the largest batch that fits: not known") && !text.contains(": 4096"),
        "{text}"
    );
    let dir = tempdir("fit-cap");
    let small = at_batch(&dir, 3);
    let s = small.to_str().unwrap();
    let text = stdout(&gpushim_text(&["fit", s, "--at", "3", "--max-batch", "16"]));
    assert!(
        text.contains("every batch up to 16 fits (the search's cap"),
        "{text}"
    );
    let v = json(&["fit", s, "--at", "3", "--max-batch", "16", "--json"]);
    assert_eq!(v["settings"][0]["largest_is_the_cap"], true, "{v}");
    let v = json(&["fit", s, "--at", "3", "--json"]);
    assert_eq!(v["settings"][0]["largest_is_the_cap"], false, "{v}");
}

#[test]
fn the_device_limit_is_cudas_total_not_nvmls() {
    // On a real device NVML's total is larger than CUDA's by what the driver keeps (480 MiB
    // on an H100 80GB), which no process can allocate; the simulator does the same. The shim
    // keeps CUDA's total in the header, and `fit` takes its limit from it.
    let dir = tempdir("fit-cuda-total");
    let t = crate::fit::at_batch(&dir, 3);
    let reader = gpushim::trace::reader::TraceReader::open(&t).unwrap();
    let made = reader.info().devices[0].expect("device 0's make-up in the header");
    assert_eq!(
        made.memory,
        16 << 30,
        "CUDA's total, as cuMemGetInfo says it"
    );
    let s = crate::fit::json(&["summary", t.to_str().unwrap(), "--json"]);
    let nvml_total = s["device_memory"][0]["device_total_bytes"]
        .as_u64()
        .unwrap();
    assert_eq!(nvml_total, (16 << 30) + (480 << 20), "NVML's total");
    let f = crate::fit::json(&["fit", t.to_str().unwrap(), "--at", "3", "--json"]);
    let headroom = f["headroom_bytes"].as_u64().unwrap();
    assert!(headroom > 0, "{f}");
    assert_eq!(
        f["limit_bytes"].as_u64().unwrap(),
        (16 << 30) - headroom,
        "{f}"
    );
}

#[test]
fn a_trace_without_tensors_is_told_so_before_being_asked_for_its_batch() {
    // The reason that decides comes first: with no tensor to replay no batch helps, so `fit`
    // says that, not "give --at" (a C program's trace: no PyTorch, no batch on its line).
    let t = train_loop_trace("fit-no-tensors");
    let out = gpushim_text(&["fit", t.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("holds no tensors"), "{said}");
    assert!(!said.contains("--at"), "asked for the batch first: {said}");
}

/// `fit TRACE ARGS --json` with `env`, as [`replays_counted`] runs it.
fn fit_counted(trace: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, u64, u64) {
    let t = trace.to_str().unwrap();
    replays_counted(&[&["fit", t][..], args, &["--json"]].concat(), env)
}

/// `gpushim ARGS` with `env`, which must succeed: what it printed, and the events its
/// replays applied and passed over as repeats (`GPUSHIM_READS=1`).
fn replays_counted(args: &[&str], env: &[(&str, &str)]) -> (String, u64, u64) {
    let out = Command::new(gpushim_bin())
        .args(args)
        .env_remove("GPUSHIM_CONF")
        .env("GPUSHIM_READS", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    let line = err
        .lines()
        .filter_map(|l| l.strip_prefix("gpushim: "))
        .find(|l| l.contains("replay(s) of PyTorch's allocator"))
        .unwrap_or_else(|| panic!("no count of the replays: {err}"));
    let number_after = |word: &str| -> u64 {
        let rest = &line[line.find(word).unwrap_or_else(|| panic!("{line}")) + word.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap_or_else(|_| panic!("{line}"))
    };
    (
        stdout(&out),
        number_after("applied"),
        number_after("passed over"),
    )
}

/// A training loop asks for the same tensors every step, and once the cache has settled the
/// replay of a step goes as the one before it went: `fit` passes over such repeats (counting
/// what they count) where it replayed every one some twenty times per setting. Its answers are
/// those of replaying every event, to the byte, on a whole run and on a ring, with rows that
/// fail at every step and optional workspaces done without at every step (what a repeat counts
/// is counted again for each repeat passed over), and the repeats passed over are most of what
/// the replays went through.
#[test]
fn fit_passes_over_repeating_steps_and_answers_as_replaying_every_event() {
    let dir = tempdir("fit-repeats");
    let conv = ("KINDS_CONV", (1u64 << 20).to_string());
    let whole = dir.join("whole.trace");
    assert_ok(&kinds_program_with(
        &whole,
        300,
        false,
        &["--batch-size", "2"],
        vec![conv.clone()],
    ));
    let ring = dir.join("ring.trace");
    assert_ok(&kinds_program_with(
        &ring,
        3000,
        false,
        &["--batch-size", "2"],
        vec![conv, ("GPUSHIM_CONF", "trace_max:4MiB".into())],
    ));
    let (mut failed, mut done_without) = (false, false);
    for trace in [&whole, &ring] {
        for args in [
            &["--batch", "4,8"][..],
            &["--batch", "2,64", "--limit", "96MiB"],
            &["--batch", "16", "--device-memory", "200MiB"],
        ] {
            let (fast, applied, passed) = fit_counted(trace, args, &[]);
            let (every, _, none) = fit_counted(trace, args, &[("GPUSHIM_REPLAY_EVERY", "1")]);
            assert_eq!(fast, every, "{} {args:?}", trace.display());
            assert_eq!(none, 0);
            assert!(
                passed > applied,
                "{} {args:?}: applied {applied}, passed over {passed}",
                trace.display()
            );
            let v: serde_json::Value = serde_json::from_str(&fast).unwrap();
            for row in v["settings"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| s["rows"].as_array().unwrap().iter())
            {
                failed |= row["failures"].as_u64().unwrap_or(0) > 100;
                done_without |= row["workspaces_done_without"].as_u64().unwrap_or(0) > 100;
            }
        }
    }
    assert!(
        failed && done_without,
        "rows that fail and do without at every step"
    );
    // `simulate --torch` under settings other than the run's, and `--recommend`, likewise
    // (the run's own setting is replayed event by event, its segments compared with the run's).
    let r = ring.to_str().unwrap();
    for args in [
        &[
            "simulate",
            "--torch",
            "expandable_segments:True",
            "--json",
            r,
        ][..],
        &["simulate", "--recommend", "--json", r],
    ] {
        let (fast, applied, passed) = replays_counted(args, &[]);
        let (every, _, _) = replays_counted(args, &[("GPUSHIM_REPLAY_EVERY", "1")]);
        assert_eq!(fast, every, "{args:?}");
        // The run's own setting's replay applies every event.
        assert!(
            passed > applied / 2,
            "{args:?}: applied {applied}, passed over {passed}"
        );
    }
    // The peaks at another sequence length, from two runs at two lengths, likewise.
    let at_seq = |seq: &str| {
        let t = dir.join(format!("s{seq}.trace"));
        let env = vec![
            ("KINDS_BATCH", "3".to_string()),
            ("KINDS_ATTENTION", "1".into()),
        ];
        assert_ok(&kinds_program_with(
            &t,
            200,
            false,
            &["--seq-len", seq],
            env,
        ));
        t
    };
    let (two, four) = (at_seq("2"), at_seq("4"));
    let args = [
        "--at",
        "3",
        "--with",
        four.to_str().unwrap(),
        "--seq",
        "8,16",
        "--limit",
        "400MiB",
    ];
    let (fast, applied, passed) = fit_counted(&two, &args, &[]);
    let (every, _, _) = fit_counted(&two, &args, &[("GPUSHIM_REPLAY_EVERY", "1")]);
    assert_eq!(fast, every);
    assert!(passed > applied, "applied {applied}, passed over {passed}");
}

/// The what-ifs edit the run's events (a checkpointed block's forward made again, autocast's
/// copies): their edits are made once and held for their replays, which pass over the edited
/// events' repeats as `fit` passes over the run's, answering as replaying every event does, to
/// the byte. Each program of the stand-in (its blocks, its residual layers) runs 30 steps.
#[test]
fn what_ifs_pass_over_repeating_steps_and_answer_as_replaying_every_event() {
    let dir = tempdir("fit-what-if-repeats");
    let run = |script: &str, name: &str| {
        let t = dir.join(name);
        let lib = |n: &str| sim().dir.join("torch/lib").join(n).display().to_string();
        let args = vec![lib("libtorch_cpu.so"), lib("libc10_cuda.so"), "30".into()];
        assert_ok(&python_client(&t, script, args, Vec::new()));
        t
    };
    let blocks = run("kinds/blocks.py", "blocks.trace");
    let layers = run("kinds/autocast.py", "layers.trace");
    for (trace, what_if) in [
        (&blocks, &["--checkpoint", "Block"][..]),
        (&blocks, &["--checkpoint", "auto"]),
        (&layers, &["--autocast", "bf16"]),
    ] {
        let args = [&["--at", "1", "--batch", "1,2,4,64"][..], what_if].concat();
        let (passing, applied, passed) = fit_counted(trace, &args, &[]);
        let (every, all, none) = fit_counted(trace, &args, &[("GPUSHIM_REPLAY_EVERY", "1")]);
        assert_eq!(passing, every, "{what_if:?}");
        assert_eq!(none, 0);
        assert!(
            passed > applied,
            "{what_if:?}: applied {applied}, passed over {passed}"
        );
        assert_eq!(applied + passed, all, "{what_if:?}");
    }
}
