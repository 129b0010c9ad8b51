//! A job across hosts: each host analyses the traces it keeps (`gpushim analyze ... -o`), and
//! the reports join the saved analyses into the job's, with the figures the traces themselves
//! give. Separate folders stand for separate hosts; a saved file from elsewhere is read as
//! anyone's file.

use crate::common::*;
use std::path::{Path, PathBuf};

/// Three ranks' traces, each kept in a folder of its own (its host's disk).
fn ranks() -> (Vec<TestFile>, Vec<PathBuf>) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch");
    let mut kept = Vec::new();
    let mut paths = Vec::new();
    for (i, name) in ["gpt2.trace", "oom.trace", "streams.trace"]
        .iter()
        .enumerate()
    {
        let f = tempdir(&format!("host{i}")).file(name);
        std::fs::copy(data.join(name), &*f).unwrap();
        paths.push(f.to_path_buf());
        kept.push(f);
    }
    (kept, paths)
}

/// Each host's step: its traces analysed and saved beside them.
fn analyse_each(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .map(|p| {
            let saved = p.with_extension("analysis");
            let out = gpushim(&[&"analyze", p, &"-o", &saved]);
            assert_ok(&out);
            saved
        })
        .collect()
}

/// The reports of a job, each trace's report named as the traces or the saved files name it:
/// the names aside, what joined saved analyses say is what the traces say.
fn without_names(mut v: serde_json::Value) -> serde_json::Value {
    if let Some(all) = v["traces"].as_array_mut() {
        for t in all {
            t["trace"] = serde_json::Value::Null;
            if t["report"]["path"].is_string() {
                t["report"]["path"] = serde_json::Value::Null;
            }
        }
    }
    let text = v.to_string();
    // The combined reports name the trace that holds the largest peak, or is nearest its limit.
    let cleaned = text
        .split('"')
        .map(|s| {
            if s.ends_with(".trace") {
                Path::new(s)
                    .file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string()
            } else {
                s.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\"");
    serde_json::from_str(&cleaned).unwrap()
}

#[test]
fn saved_analyses_of_separate_hosts_join_into_the_reports_of_their_traces() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths);
    let traces: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let joined: Vec<&Path> = saved.iter().map(PathBuf::as_path).collect();
    for report in ["summary", "leaks", "peak", "oom"] {
        let direct = without_names(report_json(&[report], &traces));
        let from_saved = without_names(report_json(&[report], &joined));
        assert_eq!(direct, from_saved, "{report}: the joined analyses differ");
    }
    // Each trace is named by its host, then as that host named it.
    let v = report_json(&["leaks"], &joined);
    let names: Vec<&str> = v["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["trace"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3);
    for (n, p) in names.iter().zip(&paths) {
        let (host, name) = n.split_once(':').expect("HOST:TRACE");
        assert!(!host.is_empty());
        assert!(
            name.ends_with(p.file_name().unwrap().to_str().unwrap()),
            "{n}"
        );
    }
    // The job's page from the saved analyses: every trace behind the picker.
    let page = tempdir("job-page").file("job.html");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"report", &"-o", &page];
    for s in &saved {
        args.push(s);
    }
    assert_ok(&gpushim(&args));
    let html = std::fs::read_to_string(&*page).unwrap();
    let data = html
        .split("<script id=\"gpushim-data\" type=\"application/json\">")
        .nth(1)
        .and_then(|s| s.split("</script>").next())
        .unwrap();
    let data: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(data["traces"].as_array().unwrap().len(), 3);
    assert!(
        data["traces"][1]["ooms"]
            .as_array()
            .is_some_and(|o| !o.is_empty()),
        "the failure of the second host's rank is on the page"
    );
}

#[test]
fn what_a_saved_analysis_cannot_answer_is_said() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths[..1]);
    let out = gpushim(&[&"leaks", &saved[0], &"--boundary", &"step"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--boundary needs the traces themselves"),
        "{}",
        stderr(&out)
    );
    let out = gpushim(&[&"peak", &saved[0], &"--device", &"0"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("filter the traces when saving"),
        "{}",
        stderr(&out)
    );
    // Another version, or what is not one at all.
    let dir = tempdir("saved-other");
    let other = dir.file("other.analysis");
    std::fs::write(
        &*other,
        r#"{"format":"gpushim-analysis","version":99,"traces":[]}"#,
    )
    .unwrap();
    let out = gpushim(&[&"summary", &other]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("version 99"), "{}", stderr(&out));
}

#[test]
fn strings_in_a_saved_analysis_reach_the_terminal_escaped() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths[..1]);
    // Someone else's saved file: a program name carrying a terminal escape and a bidi override.
    let text = std::fs::read_to_string(&saved[0]).unwrap();
    let hostile = text.replacen(
        "\"program\":\"",
        "\"program\":\"\\u001b]0;owned\\u0007\\u202e",
        2,
    );
    assert_ne!(hostile, text);
    std::fs::write(&saved[0], hostile).unwrap();
    let out = gpushim(&[&"summary", &saved[0]]);
    assert_ok(&out);
    let shown = stdout(&out);
    assert!(!shown.contains('\u{1b}') && !shown.contains('\u{7}') && !shown.contains('\u{202e}'));
    assert!(shown.contains("\\u{1b}]0;owned"), "{shown}");
}

/// A saved analysis whose library owner is named in 65,536 characters: `summary` pads its
/// columns to at most `COLUMN_MAX` (a padding over 65,535 aborts Rust's formatting), alone
/// and joined with another analysis, and the name is still shown whole.
#[test]
fn a_name_longer_than_any_column_is_shown_not_padded_to() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths[..2]);
    let text = std::fs::read_to_string(&saved[0]).unwrap();
    let long = "x".repeat(65_536);
    let forged = text.replace("\"owner\":\"cuBLAS\"", &format!("\"owner\":\"{long}\""));
    assert_ne!(forged, text, "the saved analysis names no cuBLAS owner");
    std::fs::write(&saved[0], forged).unwrap();
    for joined in [&saved[..1], &saved[..2]] {
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"summary"];
        args.extend(joined.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
        let out = gpushim(&args);
        assert_ok(&out);
        let shown = stdout(&out);
        // The table's row: the name, then its figures after the two spaces that end a column.
        let row = shown.lines().find(|l| l.trim_start().starts_with(&long));
        let figures = row.map(|l| l.trim_start()[long.len()..].trim_start());
        assert!(
            figures.is_some_and(|f| f.contains("KiB") || f.contains("MiB") || f.contains(" B")),
            "{}",
            &shown[..shown.len().min(4000)]
        );
    }
}

/// Two saved analyses each claiming 2^64 - 1 events: the job's count saturates at the most
/// there can be, never wraps to a small number (or aborts).
#[test]
fn counts_joined_from_saved_analyses_saturate() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths[..2]);
    for s in &saved {
        let text = std::fs::read_to_string(s).unwrap();
        let events = text.split("\"events\":").nth(1).unwrap();
        let n: String = events.chars().take_while(char::is_ascii_digit).collect();
        let forged = text.replacen(
            &format!("\"events\":{n}"),
            &format!("\"events\":{}", u64::MAX),
            1,
        );
        std::fs::write(s, forged).unwrap();
    }
    let out = gpushim(&[&"summary", &saved[0], &saved[1]]);
    assert_ok(&out);
    let shown = stdout(&out);
    assert!(
        shown.contains(&format!("combined, 2 traces: {} events", u64::MAX)),
        "{shown}"
    );
}

/// A saved analysis padded with millions of zeros in `boundary_times_ns` (10 MB): refused by
/// the count of its values before it is parsed into a tree of hundreds of MB, naming the
/// bound.
#[test]
fn a_saved_analysis_of_millions_of_values_is_refused_before_it_is_parsed() {
    let (_kept, paths) = ranks();
    let saved = analyse_each(&paths[..1]);
    let text = std::fs::read_to_string(&saved[0]).unwrap();
    let zeros = "0,".repeat(5 << 20);
    let forged = text.replacen(
        "\"boundary_times_ns\":[",
        &format!("\"boundary_times_ns\":[{zeros}"),
        1,
    );
    assert_ne!(forged, text, "no boundary_times_ns to pad");
    std::fs::write(&saved[0], forged).unwrap();
    let out = gpushim(&[&"summary", &saved[0]]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("more than the 4194304 one can hold"),
        "{}",
        stderr(&out)
    );
}

/// Every value of a saved analysis, by its JSON pointer.
fn pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let key = k.replace('~', "~0").replace('/', "~1");
                pointers(x, format!("{at}/{key}"), out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// What a forged value becomes: the extremes a number can claim, a string no column holds, an
/// array of a million copies of its first value, a value of another type.
fn forged_value(old: &serde_json::Value, how: u8) -> serde_json::Value {
    use serde_json::json;
    match how % 8 {
        0 => json!(u64::MAX),
        1 => json!(0),
        2 => json!(1e300),
        3 => json!(-1),
        4 => json!("x".repeat(70_000)),
        5 => match old {
            serde_json::Value::Array(a) if !a.is_empty() => {
                serde_json::Value::Array(vec![a[0].clone(); 100_000])
            }
            _ => json!([]),
        },
        6 => json!(null),
        _ => json!({"format": "gpushim-analysis"}),
    }
}

fn saved_cases() -> u32 {
    std::env::var("GPUSHIM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map_or(24, |n| (n / 8).max(1))
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: saved_cases(),
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Saved analyses mutated by their structure (a value set to an extreme, a string past any
    /// column, an array made a hundred thousand long, a value of another type), read by every
    /// report that joins them: each answers or refuses (status 0 to 2), never a
    /// panic, an abort or a signal, within its time.
    #[test]
    fn mutated_saved_analyses_never_crash_a_report(
        edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 1..6),
    ) {
        static BASE: std::sync::OnceLock<(Vec<TestFile>, String)> = std::sync::OnceLock::new();
        let (_, text) = BASE.get_or_init(|| {
            let (kept, paths) = ranks();
            let saved = analyse_each(&paths[..1]);
            let text = std::fs::read_to_string(&saved[0]).unwrap();
            (kept, text)
        });
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut all = Vec::new();
        pointers(&v, String::new(), &mut all);
        for (at, how) in edits {
            let p = &all[at.index(all.len())];
            if let Some(slot) = v.pointer_mut(p) {
                *slot = forged_value(slot, how);
            }
        }
        let dir = tempdir("saved-fuzz");
        let f = dir.join("m.analysis");
        std::fs::write(&f, serde_json::to_vec(&v).unwrap()).unwrap();
        let page = dir.join("m.html");
        for args in [
            vec!["summary"],
            vec!["leaks"],
            vec!["peak"],
            vec!["oom"],
            vec!["report", "-o", page.to_str().unwrap()],
        ] {
            let mut c = std::process::Command::new(gpushim_bin());
            c.args(&args).arg(&*f);
            let out = crate::hostile_folders::finish_within(
                c,
                std::time::Duration::from_secs(60),
                "a report of a mutated saved analysis",
            );
            let code = out.status.code();
            proptest::prop_assert!(
                matches!(code, Some(0..=2)),
                "{args:?}: {:?}\n{}", out.status, stderr(&out)
            );
        }
    }
}
