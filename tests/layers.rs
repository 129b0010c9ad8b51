//! The code's layers hold: each module uses only the layers below it as docs/design.md draws
//! them, and inside the report wing one direction: the analysis on top (it alone opens and
//! rereads a trace), the reports below it with no circle between them, and their text a layer
//! of its own that no report uses.

use crate::common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers docs/design.md draws are the code's: a module uses only modules of its own layer
/// or below (references in comments aside), and the page names the layers in this order.
#[test]
fn each_module_uses_only_the_layers_below_it_as_the_design_draws_them() {
    let design = std::fs::read_to_string(repo().join("docs/design.md")).unwrap();
    let crates: [(&str, &str, &[&[&str]]); 3] = [
        (
            "src/core",
            "- core (",
            &[
                &["fasthash", "fixedfmt"],
                &["trace"],
                &["config"],
                &["engine"],
            ],
        ),
        (
            "src",
            "- command (",
            &[
                &["files", "memory"],
                &["report"],
                &["export"],
                &["run"],
                &["cli"],
            ],
        ),
        (
            "shim/src",
            "- shim:",
            &[
                &["cuda"],
                &["os", "options"],
                &["state", "guard"],
                &["lifecycle"],
                &["costs"],
                &["trace"],
                &["pool"],
                &["hooks"],
                &["route"],
            ],
        ),
    ];
    for (root, heading, layers) in crates {
        let level = |m: &str| layers.iter().position(|l| l.contains(&m));
        // The page draws them in this order.
        let drawing = design.split(heading).nth(1).unwrap_or("");
        let drawing = drawing.split("\n- ").next().unwrap_or("");
        let mut last = 0;
        for l in layers.iter() {
            let at = drawing
                .find(&format!("`{}", l[0]))
                .unwrap_or_else(|| panic!("docs/design.md's {heading} line lacks `{}`", l[0]));
            assert!(at >= last, "docs/design.md draws `{}` out of order", l[0]);
            last = at;
        }
        for layer in layers.iter() {
            for m in layer.iter() {
                let dir = repo().join(root).join(m);
                let files: Vec<std::path::PathBuf> = if dir.is_dir() {
                    let mut v = Vec::new();
                    let mut stack = vec![dir];
                    while let Some(d) = stack.pop() {
                        for e in std::fs::read_dir(d).unwrap() {
                            let p = e.unwrap().path();
                            if p.is_dir() {
                                stack.push(p);
                            } else if p.extension().is_some_and(|x| x == "rs") {
                                v.push(p);
                            }
                        }
                    }
                    v
                } else {
                    vec![repo().join(root).join(format!("{m}.rs"))]
                };
                for f in files {
                    // The table of CUDA functions names each hook body as tokens that only the
                    // route layer, above, expands into code.
                    if f.ends_with("cuda/functions.rs") {
                        continue;
                    }
                    let text = std::fs::read_to_string(&f).unwrap();
                    for line in text.lines() {
                        let code = line.split("//").next().unwrap_or("");
                        for (i, _) in code.match_indices("crate::") {
                            let used: String = code[i + 7..]
                                .chars()
                                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                                .collect();
                            if let (Some(u), Some(own)) = (level(&used), level(m)) {
                                assert!(
                                    u <= own,
                                    "{} ({m}) uses {used}, a layer above it: {line}",
                                    f.display()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A Rust file's code as the layer tests read it: comments and the unit tests (from the first
/// `#[cfg(test)]` on) left out.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The fields of a struct in `code` that own a trace reader (a pass's record may borrow one).
fn owned_reader_fields(code: &str) -> Vec<String> {
    let mut inside = false;
    let mut found = Vec::new();
    for line in code.lines() {
        let t = line.trim();
        if t.contains("struct ") && t.ends_with('{') {
            inside = true;
        } else if line.starts_with('}') {
            inside = false;
        } else if inside
            && let Some((name, ty)) = t.split_once(':')
            && ty.trim().trim_end_matches(',').ends_with("TraceReader")
            && !ty.contains('&')
        {
            found.push(name.trim_start_matches("pub ").to_string());
        }
    }
    found
}

/// The report wing's room a file of it is in: the first folder or file under `src/report`
/// (`peak` for `peak.rs`, `fit` for `fit/steps.rs`); `None` for `src/report/mod.rs`.
fn room_of(report: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(report).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let room = first.trim_end_matches(".rs").to_string();
    (room != "mod").then_some(room)
}

/// The rooms of the report wing a file's code names: `crate::report::ROOM`, and `super::` paths
/// that climb out of its own room, each `{a, b}` group opened.
fn rooms_used(code: &str, own: &str, depth: usize, rooms: &BTreeSet<String>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut name = |path: &str| {
        // `path` follows `crate::report::` or the `super::`s that reach the wing's root.
        let first: String = path
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if rooms.contains(&first) && first != own {
            used.insert(first);
        }
    };
    let mut groups = |rest: &str| {
        if let Some(inner) = rest.strip_prefix('{') {
            let inner = inner.split('}').next().unwrap_or("");
            for item in inner.split(',') {
                name(item.trim());
            }
        } else {
            name(rest);
        }
    };
    for (i, _) in code.match_indices("crate::report::") {
        groups(&code[i + "crate::report::".len()..]);
    }
    // A file `depth` folders below the wing's root reaches it with `depth` supers (a file's
    // own `super` is its folder's module; a `mod.rs` is its folder).
    let climb = "super::".repeat(depth);
    if depth > 0 {
        let mut at = 0;
        while let Some(i) = code[at..].find(&climb) {
            let start = at + i;
            let before = code[..start].chars().last().unwrap_or(' ');
            let rest = &code[start + climb.len()..];
            at = start + climb.len();
            if before == ':' || rest.starts_with("super::") {
                continue;
            }
            groups(rest);
        }
    }
    used
}

/// The report wing reads one way: the analysis opens, rewinds, forks and reopens traces and
/// runs the reports' trackers, and no report uses it back; the text renderers (`render/`)
/// read the reports and nothing in the wing uses them; the reports use one another without a
/// circle (what one room uses never comes back to it).
#[test]
fn the_report_wing_has_one_direction_and_only_the_analysis_opens_a_trace() {
    let report = repo().join("src/report");
    let files = rust_files(&report);
    let rooms: BTreeSet<String> = files.iter().filter_map(|f| room_of(&report, f)).collect();
    assert!(
        rooms.contains("analysis") && rooms.contains("peak"),
        "{rooms:?}"
    );
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let opening = [
        "TraceReader::open",
        "open_following(",
        "reopen_with(",
        ".rewind()",
        ".fork()",
        ".pairs(",
    ];
    for f in &files {
        let Some(room) = room_of(&report, f) else {
            continue;
        };
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let code = code_of(f);
        let rel = f.strip_prefix(&report).unwrap();
        // Folders between the file's module and the wing's root.
        let depth = rel.components().count() - usize::from(f.ends_with("mod.rs"));
        let used = rooms_used(&code, &room, depth, &rooms);
        if room != "render" {
            assert!(
                !used.contains("render"),
                "{} uses the text renderers, a layer of their own above the reports",
                rel.display()
            );
        }
        if room != "analysis" {
            assert!(
                !used.contains("analysis"),
                "{} uses the analysis, which sits above every report",
                rel.display()
            );
            for call in opening {
                assert!(
                    !code.contains(call),
                    "{} opens or rereads a trace ({call}): only the analysis does",
                    rel.display()
                );
            }
            let owning = owned_reader_fields(&code);
            assert!(
                owning.is_empty(),
                "{}: {owning:?} hold a reader: what the analysis hands on is plain data (a \
                 trace's tables, `TraceTables`), the file read and let go",
                rel.display()
            );
        }
        uses.entry(room).or_default().extend(used);
    }
    // No circle: every room's uses, followed to their end, never come back to it.
    for start in uses.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((room, path)) = stack.pop() {
            for next in uses.get(&room).into_iter().flatten() {
                assert!(
                    next != start,
                    "the report wing's rooms use one another in a circle: {} -> {next}",
                    path.join(" -> ")
                );
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    // The analysis uses the reports (it runs their trackers), and the renderers read them,
    // so the test sees the arrows.
    assert!(uses["analysis"].contains("summary") && uses["peak"].contains("live"));
    assert!(uses["render"].contains("summary") && uses["render"].contains("fit"));
}

/// Nothing below the command reads the environment for how to read: the ways of reading
/// (`GPUSHIM_READ_*`, `GPUSHIM_REPLAY_*`) are read once by the command and passed down with
/// its options.
#[test]
fn how_a_command_reads_is_passed_down_not_read_from_the_process() {
    for dir in ["src/report", "src/core", "src/export"] {
        for f in rust_files(&repo().join(dir)) {
            assert!(
                !code_of(&f).contains("env::var"),
                "{} reads the environment: take how to read from the options (ReadMode)",
                f.display()
            );
        }
    }
    let cli = std::fs::read_to_string(repo().join("src/cli/reading.rs")).unwrap();
    for v in [
        "GPUSHIM_READ_MAP",
        "GPUSHIM_READ_INLINE",
        "GPUSHIM_READ_EARLY",
        "GPUSHIM_READ_SPLIT",
        "GPUSHIM_READ_SHORT",
        "GPUSHIM_REPLAY_EVERY",
        "GPUSHIM_REPLAY_MEMORY",
    ] {
        assert!(
            cli.contains(&format!("\"{v}\"")),
            "{v} is read by the command"
        );
    }
}

/// Nothing the command reads with is process-wide: what a command's reading cost is a value
/// (`ReadCounts`) it passes down with how it reads, and no counter or switch of the reader,
/// the analysis or the reports is a `static`. The statics left are the process's own, each
/// named here with why.
#[test]
fn what_a_command_reads_with_is_a_value_not_a_static() {
    let allowed = [
        // The traces the command pinned: its files, as its descriptors are.
        ("src/core/trace/reader/opening.rs", "PINNED"),
        // A mapped window's SIGBUS guards, and the handler chained before: a signal's
        // disposition is the process's.
        ("src/core/trace/reader/mapped.rs", "GUARDS_TABLE"),
        ("src/core/trace/reader/mapped.rs", "PREVIOUS"),
        ("src/core/trace/reader/mapped.rs", "INSTALL"),
        // The page size, read once.
        ("src/core/trace/reader/mapped.rs", "PAGE"),
        // The recorder (in the shim's process): its thread's block, its files' serial.
        ("src/core/trace/recorder/mod.rs", "BLOCK"),
        ("src/core/trace/recorder/mod.rs", "OPEN_SERIAL"),
        // The hash seed, chosen once.
        ("src/core/fasthash.rs", "SEED"),
        // What a module file says, memoised per thread (the same for every reader), and the
        // one line said of unreadable modules.
        ("src/report/symbolize.rs", "CACHE"),
        ("src/report/symbolize.rs", "UNREADABLE_SAID"),
        // The terminal's progress bars: one terminal.
        ("src/cli/progress.rs", "PROGRESS_BAR"),
        ("src/cli/progress.rs", "WORKING"),
    ];
    for dir in ["src/report", "src/core", "src/export", "src/cli"] {
        for f in rust_files(&repo().join(dir)) {
            let code = code_of(&f);
            let shown = f.strip_prefix(repo()).unwrap().display().to_string();
            for line in code.lines() {
                let t = line.trim_start();
                let Some(rest) = t
                    .strip_prefix("static ")
                    .or_else(|| t.strip_prefix("pub static "))
                    .or_else(|| t.strip_prefix("pub(super) static "))
                    .or_else(|| t.strip_prefix("pub(crate) static "))
                else {
                    continue;
                };
                let name = rest.split(':').next().unwrap_or("").trim();
                // A test's own statics (numbering its files) are not the command's.
                if name == "N" || shown.ends_with("tests.rs") {
                    continue;
                }
                assert!(
                    allowed.contains(&(shown.as_str(), name)),
                    "{shown}: `static {name}` is process-wide: count in the command's \
                     ReadCounts (ReadMode::counts) or pass it down"
                );
            }
        }
    }
}
