//! `gpushim fit` on the PyTorch stand-in, against runs whose truth is computed: the kinds
//! program (`tests/clients/kinds/train.py`) at batch 3 predicts the run at 6 and 12, and the
//! run at those batches, recorded, is the truth: its own requests replayed through the same
//! model of PyTorch's allocator (which replays a recorded run to the byte) give the peaks the
//! prediction must equal, and, under a limit, whether a batch fits.

use crate::common::*;
use serde_json::Value;
use std::path::Path;

/// The kinds program at `batch`, 3 steps, under the shim; its trace.
pub(crate) fn at_batch(dir: &Path, batch: u64) -> std::path::PathBuf {
    let t = dir.join(format!("b{batch}.trace"));
    assert_ok(&kinds_program(
        &t,
        3,
        false,
        vec![("KINDS_BATCH", batch.to_string())],
    ));
    t
}

pub(crate) fn json(args: &[&str]) -> Value {
    let out = gpushim_text(args);
    assert_ok(&out);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The replay of a recorded run's own requests under `setting` (and a limit): peak reserved,
/// peak allocated, failures.
pub(crate) fn replayed(trace: &Path, setting: &str, limit: Option<&str>) -> (u64, u64, u64) {
    let t = trace.to_str().unwrap();
    let mut args = vec!["simulate", t, "--torch", setting, "--json"];
    if let Some(l) = limit {
        args.extend(["--limit", l]);
    }
    let v = json(&args);
    let o = v[0]["outcomes"]
        .as_array()
        .and_then(|rows| rows.iter().rev().find(|o| o["setting"] == setting))
        .unwrap_or_else(|| panic!("no {setting:?} in {v}"));
    (
        o["peak_reserved_bytes"].as_u64().unwrap(),
        o["peak_allocated_bytes"].as_u64().unwrap(),
        o["failures"].as_u64().unwrap(),
    )
}

#[test]
fn the_peaks_at_twice_and_four_times_the_batch_are_those_of_the_runs_at_those_batches() {
    let dir = tempdir("fit-peaks");
    let small = at_batch(&dir, 3);
    let fit = json(&[
        "fit",
        small.to_str().unwrap(),
        "--at",
        "3",
        "--batch",
        "6,12",
        "--json",
    ]);
    assert_eq!(fit["unknown_bytes"], 0, "{fit}");
    for batch in [6u64, 12] {
        let real = at_batch(&dir, batch);
        for s in fit["settings"].as_array().unwrap() {
            let setting = s["setting"].as_str().unwrap();
            let row = s["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["batch"] == batch)
                .unwrap();
            let (reserved, allocated, _) = replayed(&real, setting, None);
            assert_eq!(
                (
                    row["peak_reserved_bytes"].as_u64().unwrap(),
                    row["peak_allocated_bytes"].as_u64().unwrap()
                ),
                (reserved, allocated),
                "batch {batch} under {setting:?}"
            );
        }
    }
}

#[test]
fn the_largest_batch_under_a_limit_runs_and_the_next_does_not() {
    let dir = tempdir("fit-largest");
    let small = at_batch(&dir, 3);
    let limit = "160MiB";
    let fit = json(&[
        "fit",
        small.to_str().unwrap(),
        "--at",
        "3",
        "--limit",
        limit,
        "--json",
    ]);
    let s = &fit["settings"][0];
    assert_eq!(s["setting"], "", "the run's own setting first: {fit}");
    let largest = s["largest_batch"].as_u64().unwrap();
    assert!(largest > 3, "{fit}");
    let (_, _, fails) = replayed(&at_batch(&dir, largest), "", Some(limit));
    assert_eq!(fails, 0, "batch {largest} was said to fit");
    let (_, _, fails) = replayed(&at_batch(&dir, largest + 1), "", Some(limit));
    assert!(fails > 0, "batch {} fits too", largest + 1);
    // The text names the largest batch under each setting.
    let out = gpushim_text(&[
        "fit",
        small.to_str().unwrap(),
        "--at",
        "3",
        "--limit",
        limit,
    ]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains(&format!("the largest batch that fits: {largest}")),
        "{}",
        stdout(&out)
    );
}

#[test]
fn batches_are_asked_as_a_list_or_a_range_and_nonsense_is_refused() {
    let dir = tempdir("fit-args");
    let small = at_batch(&dir, 3);
    let t = small.to_str().unwrap();
    let rows = |spec: &str| -> Vec<u64> {
        let v = json(&["fit", t, "--at", "3", "--batch", spec, "--json"]);
        v["settings"][0]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["batch"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(rows("3,5,9"), [3, 5, 9]);
    assert_eq!(rows("3:24"), [3, 6, 12, 24]);
    assert_eq!(rows("4:16:4"), [4, 8, 12, 16]);
    let bad = gpushim_text(&["fit", t, "--at", "3", "--batch", "x:y"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("not a list of batches"),
        "{}",
        stderr(&bad)
    );
    // The two usual mistakes are each said for what they are.
    for (spec, says) in [
        ("128:8", "runs down from 128 to 8"),
        ("0", "a batch is at least 1"),
        ("8,0", "a batch is at least 1"),
    ] {
        let out = gpushim_text(&["fit", t, "--at", "3", "--batch", spec]);
        assert_eq!(out.status.code(), Some(2), "{spec}");
        assert!(stderr(&out).contains(says), "{spec}: {}", stderr(&out));
    }
    let gpu = gpushim_text(&["fit", t, "--at", "3", "--device-memory", "l4", "--json"]);
    assert_ok(&gpu);
    let unknown = gpushim_text(&["fit", t, "--at", "3", "--device-memory", "z9"]);
    assert!(
        stderr(&unknown).contains("nor a GPU known here"),
        "{}",
        stderr(&unknown)
    );
    // A size without a unit (24 meant as GB, read as 24 bytes) is refused with the units; a
    // bare number of a megabyte or more is bytes.
    for flag in ["--device-memory", "--limit"] {
        let bare = gpushim_text(&["fit", t, "--at", "3", flag, "24"]);
        assert_eq!(bare.status.code(), Some(2), "{flag}");
        assert!(
            stderr(&bare).contains("'24' has no unit") && stderr(&bare).contains("24GiB"),
            "{flag}: {}",
            stderr(&bare)
        );
    }
    let bytes = json(&["fit", t, "--at", "3", "--limit", "167772160", "--json"]);
    assert_eq!(bytes["limit_bytes"], 167_772_160, "{bytes}");
}

#[test]
fn the_page_and_oom_say_what_fits_when_given_the_runs_batch() {
    let dir = tempdir("fit-where");
    let small = at_batch(&dir, 3);
    let page = dir.join("p.html");
    let out = gpushim_text(&[
        "report",
        small.to_str().unwrap(),
        "--at",
        "3",
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_ok(&out);
    let text = std::fs::read_to_string(&page).unwrap();
    let from = text.find("application/json\">").unwrap() + "application/json\">".len();
    let to = from + text[from..].find("</script>").unwrap();
    let d: Value = serde_json::from_str(&text[from..to]).unwrap();
    let f = &d["traces"][0]["fit"];
    let alone = json(&["fit", small.to_str().unwrap(), "--at", "3", "--json"]);
    for k in 0..2 {
        assert_eq!(
            f["settings"][k]["largest_batch"], alone["settings"][k]["largest_batch"],
            "{f}"
        );
        assert!(
            f["settings"][k]["rows"].as_array().unwrap().len() >= 10,
            "{f}"
        );
    }
    // Summary's headroom in batches is fit's largest batch.
    let out = gpushim_text(&["summary", small.to_str().unwrap(), "--at", "3"]);
    assert_ok(&out);
    let want = format!(
        "the largest that fits {}",
        gpushim::report::units::human_bytes(alone["limit_bytes"].as_u64().unwrap())
    );
    let line = stdout(&out)
        .lines()
        .find(|l| l.starts_with("headroom in batches: the run used 3"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("{}", stdout(&out)));
    assert!(line.contains(&want), "{line}");
    assert!(
        line.contains(&format!(
            "is {} under the defaults",
            alone["settings"][0]["largest_batch"]
        )),
        "{line}"
    );
    // After an out-of-memory: the largest batch that would have fit.
    let oom = repo().join("tests/data/torch/oom.trace");
    let copy = dir.join("oom.trace");
    std::fs::copy(oom, &copy).unwrap();
    let out = gpushim_text(&["oom", copy.to_str().unwrap(), "--at", "4"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("at batch 4, the largest batch that fits"),
        "{}",
        stdout(&out)
    );
}

/// The run's batch is read from its command line when `--at` is not given: `fit` and `oom`
/// say where they found it, and a run whose command line says none gets the way to give it.
#[test]
fn the_runs_batch_comes_from_its_command_line() {
    let dir = tempdir("fit-cmdline");
    let t = dir.join("flag.trace");
    let out = kinds_program_with(&t, 3, false, &["--batch-size", "3"], vec![]);
    assert_ok(&out);
    let found = gpushim_text(&["fit", t.to_str().unwrap(), "--json"]);
    assert_ok(&found);
    assert!(
        String::from_utf8_lossy(&found.stderr)
            .contains("the run's batch is 3, from its command line (--batch-size 3)"),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    let given = json(&["fit", t.to_str().unwrap(), "--at", "3", "--json"]);
    let found: Value = serde_json::from_slice(&found.stdout).unwrap();
    assert_eq!(found, given);
    // A run at the same batch without the flag: the same prediction only when told.
    let plain = at_batch(&dir, 3);
    let none = gpushim_text(&["fit", plain.to_str().unwrap()]);
    assert!(!none.status.success());
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains("the run's batch is not on its command line"),
        "{err}"
    );
    assert!(err.contains("--at 8"), "{err}");
}

/// A buffer that grows with the batch only in part (1 MiB and 256 KiB a sample, from the
/// program's own line) is scaled wrong from its kind alone; a second run at another batch
/// gives each request the line through its two sizes, and the peaks at 12 are the run's at 12.
#[test]
fn a_second_run_scales_what_the_kinds_cannot() {
    let dir = tempdir("fit-second");
    let affine = |batch: u64| {
        let t = dir.join(format!("a{batch}.trace"));
        let env = vec![
            ("KINDS_BATCH", batch.to_string()),
            ("KINDS_AFFINE", "1".to_string()),
        ];
        assert_ok(&kinds_program(&t, 3, false, env));
        t
    };
    let (small, other, real) = (affine(3), affine(6), affine(12));
    let ask = |more: &[&str]| -> Value {
        let mut args = vec!["fit", small.to_str().unwrap(), "--at", "3", "--batch", "12"];
        args.extend(more);
        args.push("--json");
        json(&args)
    };
    let alone = ask(&[]);
    let both = ask(&["--with", other.to_str().unwrap(), "--with-at", "6"]);
    assert!(both["second"]["requests"].as_u64().unwrap() > 0, "{both}");
    let peak = |fit: &Value, k: usize| {
        let r = &fit["settings"][k]["rows"][0];
        (
            r["peak_reserved_bytes"].as_u64().unwrap(),
            r["peak_allocated_bytes"].as_u64().unwrap(),
        )
    };
    for k in 0..2 {
        let setting = both["settings"][k]["setting"].as_str().unwrap();
        let (reserved, allocated, _) = replayed(&real, setting, None);
        assert_eq!(peak(&both, k), (reserved, allocated), "under {setting:?}");
        assert_ne!(
            peak(&alone, k).1,
            allocated,
            "the kinds alone would have been right: the test proves nothing"
        );
    }
    // The second run's batch must differ from the run's.
    let small = small.to_str().unwrap();
    refused_with_itself(small, &["--with-at", "3"], "another batch");
}

/// `fit TRACE --at 3 --with TRACE MORE` (the run given as its own second run) fails and says
/// `says`.
fn refused_with_itself(trace: &str, more: &[&str], says: &str) {
    let mut args = vec!["fit", trace, "--at", "3", "--with", trace];
    args.extend(more);
    let out = gpushim_text(&args);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(says), "{}", stderr(&out));
}

/// The sequence length as a second axis: runs at lengths 2 and 4 (a factor the program's
/// tensors take, as a model's do) with attention's scores kept in each layer (the square of
/// the length) tell each request how it follows the length; the peaks predicted at length 8
/// are those of the run at 8, to the byte, under both settings, and the largest batch that fits
/// at 8 is the one the run at 8 gives. Without the scores told apart (a line through the run
/// at 2 alone, as if all grew in proportion) the peak would be lower: the test would prove
/// nothing otherwise.
#[test]
fn a_second_run_at_another_sequence_length_predicts_a_third() {
    let dir = tempdir("fit-seq");
    let at_seq = |seq: u64| {
        let t = dir.join(format!("s{seq}.trace"));
        let env = vec![
            ("KINDS_BATCH", "3".to_string()),
            ("KINDS_ATTENTION", "1".into()),
        ];
        let more = ["--seq-len".to_string(), seq.to_string()];
        let more: Vec<&str> = more.iter().map(String::as_str).collect();
        assert_ok(&kinds_program_with(&t, 3, false, &more, env));
        t
    };
    let (two, four, eight) = (at_seq(2), at_seq(4), at_seq(8));
    let limit = "400MiB";
    // The lengths from the runs' command lines (--seq-len).
    let fit = json(&[
        "fit",
        two.to_str().unwrap(),
        "--at",
        "3",
        "--with",
        four.to_str().unwrap(),
        "--seq",
        "8",
        "--limit",
        limit,
        "--json",
    ]);
    let axis = &fit["seq"];
    assert_eq!(
        (axis["at"].as_u64(), axis["other"].as_u64()),
        (Some(2), Some(4)),
        "{fit}"
    );
    // Two layers' scores a step, three steps.
    assert_eq!(axis["square"][0], 6, "{axis}");
    assert!(axis["linear"][0].as_u64().unwrap() > 0, "{axis}");
    let row = &axis["lengths"][0];
    assert_eq!(row["length"], 8);
    let truth = json(&[
        "fit",
        eight.to_str().unwrap(),
        "--at",
        "3",
        "--limit",
        limit,
        "--json",
    ]);
    for (k, s) in row["settings"].as_array().unwrap().iter().enumerate() {
        let setting = s["setting"].as_str().unwrap();
        let (reserved, allocated, _) = replayed(&eight, setting, None);
        assert_eq!(
            (
                s["row"]["peak_reserved_bytes"].as_u64().unwrap(),
                s["row"]["peak_allocated_bytes"].as_u64().unwrap()
            ),
            (reserved, allocated),
            "length 8 under {setting:?}: {fit}"
        );
        assert_eq!(
            s["largest_batch"], truth["settings"][k]["largest_batch"],
            "the largest batch at length 8 under {setting:?}"
        );
        assert!(s["largest_batch"].as_u64().unwrap() > 0, "{fit}");
    }
    // The scores' square matters: at 8, scaling every forward tensor in proportion (the
    // batch's rule, from the run at 2 four times as large) would miss them.
    let as_batch = json(&[
        "fit",
        two.to_str().unwrap(),
        "--at",
        "3",
        "--batch",
        "12",
        "--json",
    ]);
    assert_ne!(
        as_batch["settings"][0]["rows"][0]["peak_allocated_bytes"],
        row["settings"][0]["row"]["peak_allocated_bytes"],
        "{as_batch}"
    );
    // The text says how the requests follow the length.
    let out = gpushim_text(&[
        "fit",
        two.to_str().unwrap(),
        "--at",
        "3",
        "--with",
        four.to_str().unwrap(),
        "--seq-at",
        "2",
        "--with-seq",
        "4",
        "--seq",
        "8",
    ]);
    assert_ok(&out);
    let text = stdout(&out);
    assert!(
        text.contains("with its square (as attention's scores do)"),
        "{text}"
    );
    // A second run at the run's own length is refused.
    refused_with_itself(
        two.to_str().unwrap(),
        &["--with-seq", "2", "--seq-at", "2"],
        "another length",
    );
}

/// A global reduction in the backward (its staging buffer with the rows until the simulated
/// device, 8 multiprocessors, is full: 21 blocks at batch 3, capped at 22 from 6 on) is sized
/// as PyTorch sizes it: the peaks at 6 and 12 are the runs'. The trace keeps what the device is
/// made of; a trace without it (from an older shim) resizes the buffer in proportion, and
/// misses.
#[test]
fn a_reductions_staging_buffer_grows_only_until_the_device_is_full() {
    let dir = tempdir("fit-reduce");
    // The program at `batch`, its pair kept past another request when `kept`.
    let traced = |name: &str, batch: u64, kept: bool| {
        let t = dir.join(format!("{name}.trace"));
        let mut env = vec![
            ("KINDS_BATCH", batch.to_string()),
            ("KINDS_REDUCE", "448".to_string()),
            ("GPUSHIM_SIM_MULTIPROCESSORS", "8".to_string()),
        ];
        if kept {
            env.push(("KINDS_REDUCE_KEPT", "1".to_string()));
        }
        assert_ok(&kinds_program(&t, 3, false, env));
        t
    };
    let run = |batch: u64| traced(&format!("r{batch}"), batch, false);
    let (small, real6, real12) = (run(3), run(6), run(12));
    let make = gpushim::trace::reader::TraceReader::open(&small)
        .unwrap()
        .info()
        .devices[0];
    assert_eq!(
        make.map(|m| (m.multiprocessors, m.threads_per_multiprocessor)),
        Some((8, 2048)),
        "the trace keeps what the device is made of"
    );
    let ask = |trace: &Path| -> Value {
        json(&[
            "fit",
            trace.to_str().unwrap(),
            "--at",
            "3",
            "--batch",
            "6,12",
            "--json",
        ])
    };
    let fit = ask(&small);
    assert_eq!(fit["reductions"], 3, "one a step: {fit}");
    let peaks = |fit: &Value, k: usize, row: usize| {
        let r = &fit["settings"][k]["rows"][row];
        (
            r["peak_reserved_bytes"].as_u64().unwrap(),
            r["peak_allocated_bytes"].as_u64().unwrap(),
        )
    };
    // The same run, its header's word for the device cleared (as an older shim wrote it).
    let older = dir.join("older.trace");
    let mut bytes = std::fs::read(&small).unwrap();
    let at = gpushim::trace::format::header::DEVICES;
    bytes[at..at + 8].fill(0);
    std::fs::write(&older, bytes).unwrap();
    let blind = ask(&older);
    assert_eq!(blind["reductions"], 0, "{blind}");
    // The same pair kept past another request is no reduction's.
    let kept = traced("kept", 3, true);
    assert_eq!(ask(&kept)["reductions"], 0);
    for k in 0..2 {
        let setting = fit["settings"][k]["setting"].as_str().unwrap();
        for (row, real) in [(0, &real6), (1, &real12)] {
            let (reserved, allocated, _) = replayed(real, setting, None);
            assert_eq!(
                peaks(&fit, k, row),
                (reserved, allocated),
                "under {setting:?}"
            );
        }
        assert_ne!(
            peaks(&blind, k, 1).1,
            replayed(&real12, setting, None).1,
            "in proportion would have been right: the test proves nothing"
        );
    }
}

/// A convolution's workspace (asked from the convolution's line and freed before anything
/// else) that a limit leaves no room for is done without, as PyTorch does it (cuDNN's next
/// algorithm, down to those needing none): the batch fits, and the row says how many were done
/// without; the program at that batch under that limit runs to its end. The same request from
/// another line is one the program needs: the batch does not fit.
#[test]
fn a_convolutions_workspace_that_cannot_be_had_is_done_without() {
    let dir = tempdir("fit-workspace");
    let run = |name: &str, batch: u64, more: &[(&'static str, String)]| {
        let t = dir.join(format!("{name}.trace"));
        let mut env = vec![
            ("KINDS_BATCH", batch.to_string()),
            ("KINDS_CONV", (16 << 20).to_string()),
        ];
        env.extend(more.iter().cloned());
        let out = kinds_program(&t, 3, false, env);
        assert_ok(&out);
        (t, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let fit12 = |t: &Path| -> Value {
        let t = t.to_str().unwrap();
        json(&[
            "fit", t, "--at", "3", "--batch", "12", "--limit", "200MiB", "--json",
        ])
    };
    let row = |fit: &Value| fit["settings"][0]["rows"][0].clone();
    let (conv, _) = run("conv", 3, &[]);
    let fit = fit12(&conv);
    assert_eq!(row(&fit)["failures"], 0, "{fit}");
    assert!(
        row(&fit)["workspaces_done_without"].as_u64() > Some(0),
        "{fit}"
    );
    let text = gpushim_text(&[
        "fit",
        conv.to_str().unwrap(),
        "--at",
        "3",
        "--batch",
        "12",
        "--limit",
        "200MiB",
    ]);
    assert_ok(&text);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("workspaces done without"),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
    let (elsewhere, _) = run("elsewhere", 3, &[("KINDS_CONV_ELSEWHERE", "1".into())]);
    let needed = fit12(&elsewhere);
    assert!(row(&needed)["failures"].as_u64() > Some(0), "{needed}");
    assert_eq!(
        row(&needed)["workspaces_done_without"],
        Value::Null,
        "{needed}"
    );
    // The program at 12 under that limit: it runs, doing without.
    let allowed = (200u64 << 20).to_string();
    let (_, said) = run("real", 12, &[("STANDIN_ALLOWED", allowed)]);
    assert!(said.contains("trained 3"), "{said}");
    assert!(!said.contains("workspaces done without 0"), "{said}");
}
