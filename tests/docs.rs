//! The documents agree with the code: what the README shows is what the demo prints, the
//! layout maps every folder, every command and script the docs show runs, the configuration
//! page says what `gpushim config` says, and the shim reads its switches from one table.

use crate::common::*;
use std::path::Path;
use std::process::Command;

#[test]
fn the_docs_show_what_a_c_loop_prints_and_the_layout_maps_every_folder() {
    // The leaks example of a program of one's own (docs/internals.md, "Tests"): the C loop's
    // own lines (the time and pid parts aside).
    let v = report_json(&["leaks"], &[&train_loop_trace("readme")]);
    let g = &v["iterations"]["growing"][0];
    let line = format!(
        "grows 1.00 MiB per iteration ({} -> {})",
        gpushim::report::units::human_bytes(g["live_at_first_boundary"].as_u64().unwrap()),
        gpushim::report::units::human_bytes(g["live_at_last_boundary"].as_u64().unwrap())
    );
    let internals = std::fs::read_to_string(repo().join("docs/internals.md")).unwrap();
    assert!(
        internals.contains(&line),
        "docs/internals.md should show `{line}`"
    );
    // The layout names every top-level folder and file the repository holds, and every script.
    let files = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(repo())
        .output()
        .unwrap();
    let map = std::fs::read_to_string(repo().join("docs/layout.md")).unwrap();
    let layout = map.split("## Layout").nth(1).unwrap();
    let top: std::collections::BTreeSet<String> = String::from_utf8_lossy(&files.stdout)
        .lines()
        .filter_map(|l| l.split('/').next().map(str::to_string))
        .collect();
    for name in top {
        if ["Cargo.lock", "README.md", ".gitignore"].contains(&name.as_str()) {
            continue;
        }
        assert!(layout.contains(&name), "the layout leaves out {name}");
    }
    // ... and is the map of both crates: every module folder and every top-level source file.
    for root in ["src", "shim/src"] {
        for entry in std::fs::read_dir(repo().join(root)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let shown = if entry.file_type().unwrap().is_dir() {
                format!("{name}/")
            } else if name == "lib.rs" {
                continue;
            } else {
                name.clone()
            };
            assert!(
                layout.contains(&shown),
                "the layout's map leaves out {root}/{shown}"
            );
        }
    }
    for entry in std::fs::read_dir(repo().join("scripts")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".sh") {
            assert!(
                layout.contains(&name),
                "the layout leaves out scripts/{name}"
            );
        }
    }
}

/// What the README and the docs show can be run: every `gpushim COMMAND` they name exists
/// (its `--help` answers), every command they show with its arguments succeeds, and every
/// script they name is there and parses.
#[test]
fn the_commands_and_scripts_the_docs_show_run() {
    let (commands, shown, scripts) = named_in_docs();
    assert!(
        commands.contains("leaks") && commands.contains("summary"),
        "{commands:?}"
    );
    for c in &commands {
        let out = Command::new(gpushim_bin())
            .args([c, "--help"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`gpushim {c}` named in the docs: {}",
            stderr(&out)
        );
    }
    // Every command shown with its arguments runs as shown, in a folder of its own: a trace
    // it names is the bundled example's trace, the program `run` starts is the bundled
    // training loop on the simulator (the docs' programs need a GPU and PyTorch). Commands with
    // placeholders of their own (COMMAND, ...) stand for others and were checked by --help.
    let trace = train_loop_trace("docs-commands");
    let dir = tempdir("docs-run");
    let mut ran = 0;
    for line in &shown {
        // A pipeline's first command is gpushim's.
        let words: Vec<String> = line
            .split(" | ")
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(|w| w.trim_matches('\'').to_string())
            .collect();
        // What `run` starts is replaced below, placeholders and all.
        let own: Vec<&String> = words.iter().take_while(|w| *w != "--").collect();
        let placeholder = |w: &str| {
            w.len() >= 3 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                || w.ends_with("...")
        };
        if own.is_empty() || own.iter().any(|w| placeholder(w)) {
            continue;
        }
        let is_run = words[0] == "run";
        let mut args = args_as_shown(&words, &dir, &trace);
        let mut c = Command::new(gpushim_bin());
        if is_run {
            args.insert(1, "--lib".into());
            args.insert(2, shim().into_os_string());
            args.extend([
                "--".into(),
                sim().bin("train_loop").into_os_string(),
                "3".into(),
            ]);
            c.env("LD_LIBRARY_PATH", &sim().dir);
        }
        let out = c
            .args(&args)
            .current_dir(&dir)
            .env_remove("GPUSHIM_CONF")
            .env_remove("GPUSHIM_TRACE")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`gpushim {line}` as the docs show it, run as {args:?}: {}",
            stderr(&out)
        );
        ran += 1;
    }
    assert!(ran >= 14, "only {ran} commands run of {shown:?}");
    assert!(!scripts.is_empty());
    // Every file of the repository a script reads by name is there (a renamed test file once
    // broke a GPU check that only the GPU machine runs).
    let named = files_scripts_name();
    assert!(named.len() > 10, "{named:?}");
    for n in &named {
        assert!(
            repo().join(n).is_file(),
            "a script names {n}, which is not there"
        );
    }
    for s in &scripts {
        let path = repo().join(s);
        assert!(path.is_file(), "{s} named in the docs is not there");
        let out = Command::new("bash").arg("-n").arg(&path).output().unwrap();
        assert!(out.status.success(), "{s}: {}", stderr(&out));
    }
}

type Names = std::collections::BTreeSet<String>;

/// What the README and the docs name: the `gpushim` commands (their first words), each command
/// shown with its arguments, and the scripts.
fn named_in_docs() -> (Names, Names, Names) {
    let mut texts = vec![std::fs::read_to_string(repo().join("README.md")).unwrap()];
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "md") {
            texts.push(std::fs::read_to_string(path).unwrap());
        }
    }
    let (mut commands, mut shown, mut scripts) = (Names::new(), Names::new(), Names::new());
    // A command is `gpushim WORD` at the start of a code line (after an optional `$ `) or
    // right after a backtick.
    let first_word = |rest: &str| -> Option<String> {
        let w: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase())
            .collect();
        (!w.is_empty()).then_some(w)
    };
    for t in &texts {
        for line in t.lines() {
            let code = line.trim_start().trim_start_matches("$ ");
            if let Some(rest) = code.strip_prefix("gpushim ") {
                commands.extend(first_word(rest));
                shown.insert(rest.split('#').next().unwrap_or("").trim().to_string());
            }
            for (i, _) in line.match_indices("`gpushim ") {
                let rest = &line[i + "`gpushim ".len()..];
                commands.extend(first_word(rest));
                shown.insert(rest.split('`').next().unwrap_or("").trim().to_string());
            }
        }
        for w in t.split(|c: char| c.is_whitespace() || "`|(),;:".contains(c)) {
            if let Some(i) = w.find("scripts/")
                && w.ends_with(".sh")
            {
                scripts.insert(w[i..].to_string());
            }
        }
    }
    (commands, shown, scripts)
}

/// The arguments of a command the docs show (`words`, the command first), as it is run here:
/// a trace it names is the example's (`trace`, or one made for the command in `dir`), a saved
/// analysis the one `analyze` writes of it, the repository's recorded traces as they are.
fn args_as_shown(words: &[String], dir: &Path, trace: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    let is_run = words[0] == "run";
    let mut has_trace = false;
    for w in words {
        if w == "--" && is_run {
            break;
        }
        // A trace named in the text (a file, or a pattern of several) is the example's;
        // a trace `run` is to write is left as it is.
        if w.starts_with("tests/data/") {
            // The repository's own recorded traces (PyTorch runs) are used as they are.
            args.push(repo().join(w).into_os_string());
            has_trace = true;
        } else if w.contains(".analysis") {
            // A saved analysis: the one `analyze` writes here, or one of the trace.
            let saved = dir.join("shown.analysis");
            if words[0] != "analyze" && !saved.exists() {
                let out = Command::new(gpushim_bin())
                    .args(["analyze".as_ref(), trace.as_os_str(), "-o".as_ref()])
                    .arg(&saved)
                    .output()
                    .unwrap();
                assert_ok(&out);
            }
            args.push(saved.into_os_string());
            has_trace = true;
        } else if w.contains(".trace") && !is_run {
            args.push(example_trace(words, dir, trace).into_os_string());
            has_trace = true;
        } else if args.last().is_some_and(|a| a == "--checkpoint") && w != "auto" {
            // The class the docs name is the blocks program's.
            args.push("Block".into());
        } else {
            args.push(w.into());
        }
    }
    let reads_a_trace = !matches!(words[0].as_str(), "run" | "config" | "lib");
    if reads_a_trace && !has_trace {
        args.push(trace.as_os_str().to_owned());
    }
    args
}

/// Every file under `tests/` the scripts read by name.
fn files_scripts_name() -> Names {
    let mut named = Names::new();
    let mut stack = vec![repo().join("scripts")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let text = text.replace("\", \"", "/");
            for (i, _) in text.match_indices("tests/") {
                let rest: String = text[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || "_./".contains(*c))
                    .collect();
                let rest = rest.trim_end_matches('.');
                if [".rs", ".c", ".py", ".cpp", ".h"]
                    .iter()
                    .any(|x| rest.ends_with(x))
                {
                    named.insert(rest.to_string());
                }
            }
        }
    }
    named
}

/// The trace a shown command's `*.trace` word stands for: what each command needs to run
/// (`trace`, the bundled example's, where any will do; `dir` keeps the ones made here).
fn example_trace(words: &[String], dir: &Path, trace: &Path) -> std::path::PathBuf {
    if words.iter().any(|w| w == "--checkpoint") {
        // A what-if of checkpointing, blocks in its frames: the blocks program's run.
        let blocks = dir.join("b1.trace");
        if !blocks.exists() {
            crate::fit_checkpoint::blocks(dir, 1, false);
        }
        blocks
    } else if words.iter().any(|w| w == "--autocast") {
        // The what-if of autocast needs the graph: the residual layers' fp32 run.
        let own = dir.join("autocast");
        let layers = own.join("b1.trace");
        if !layers.exists() {
            std::fs::create_dir_all(&own).unwrap();
            crate::fit_autocast::layers(&own, 1, false);
        }
        layers
    } else if words.iter().any(|w| w == "--shard") {
        // A sharding what-if needs a run that keeps the whole model, blocks in its frames: the
        // blocks program's DDP rank.
        let own = dir.join("shard");
        let ddp = own.join("b1-ddp.trace");
        if !ddp.exists() {
            std::fs::create_dir_all(&own).unwrap();
            crate::fit_checkpoint::blocks_with(&own, 1, "ddp", &[("WORLD_SIZE", "2")]);
        }
        ddp
    } else if words.iter().any(|w| w == "--world-size") {
        // Another world size needs a job's rank: the stand-in job's, FSDP1 at 2.
        let own = dir.join("world");
        std::fs::create_dir_all(&own).unwrap();
        crate::fit_world::rank0(&own, "fsdp1", 2, true)
    } else if words[0] == "fit" || words.iter().any(|w| w == "--torch") {
        // What replays PyTorch's allocator needs its tensors: a recorded GPT-2 run.
        repo().join("tests/data/torch/gpt2.trace")
    } else {
        trace.to_path_buf()
    }
}

/// The configuration reference (docs/configuration.md) says of every key what `gpushim config`
/// says, word for word: a key added or reworded in the code must be in the page too.
#[test]
fn the_configuration_page_says_what_gpushim_config_says() {
    let page = std::fs::read_to_string(repo().join("docs/configuration.md")).unwrap();
    let out = Command::new(gpushim_bin()).arg("config").output().unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    let keys = text
        .split("keys (")
        .nth(1)
        .and_then(|k| k.split("other variables").next())
        .expect("gpushim config lists its keys");
    let mut lines = keys
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty());
    let mut seen = 0;
    while let (Some(key_line), Some(accepts)) = (lines.next(), lines.next()) {
        let (key, meaning) = key_line.split_once(char::is_whitespace).unwrap();
        let accepts = accepts.strip_prefix("accepts: ").unwrap();
        let row = format!("| `{key}` | {} | {accepts} |", meaning.trim());
        assert!(
            page.contains(&row),
            "docs/configuration.md lacks the row:\n{row}"
        );
        seen += 1;
    }
    assert!(seen >= 10, "{text}");
    for var in ["GPUSHIM_TRACE", "GPUSHIM_DISABLE"] {
        assert!(text.contains(var) && page.contains(var), "{var}");
    }
}

/// Every environment variable the shim reads is named in its tables (`shim/src/options.rs`):
/// its own switches, and the variables other programs set. No other file names a `GPUSHIM_`
/// variable, or any variable (a name in capitals, written as a C string).
#[test]
fn the_shims_switches_are_read_from_one_table() {
    /// The names in capitals written as C strings in `text`.
    fn variables(text: &str) -> Vec<&str> {
        text.match_indices("c\"")
            .filter_map(|(i, _)| {
                let rest = &text[i + 2..];
                let n = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                (n >= 2 && rest[n..].starts_with('"')).then(|| &rest[..n])
            })
            .collect()
    }
    let files = rust_files(&repo().join("shim/src"));
    let table = repo().join("shim/src/options.rs");
    let (mut own, mut all) = (0, 0);
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let names = variables(&text);
        if f == table {
            own = names.iter().filter(|n| n.starts_with("GPUSHIM_")).count();
            all = names.len();
        } else {
            assert_eq!(
                names,
                Vec::<&str>::new(),
                "{} reads these itself",
                f.display()
            );
        }
    }
    assert!(own >= 7, "the table names {own} of the shim's own");
    assert!(all >= own + 4, "the tables name {all} in all");
    // The shim's own switches are read in one place, into one value (`state::settings`).
    let mut reading: Vec<String> = rust_files(&repo().join("shim/src"))
        .into_iter()
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .any(|l| l.contains("Switch::") && (l.contains(".value()") || l.contains(".on()")))
        })
        .map(|f| f.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    reading.sort();
    assert_eq!(
        reading,
        ["shim/src/state.rs"],
        "the switches are read outside state.rs"
    );
}

/// The shim builds every record through the constructors of `trace/event.rs`: no other file
/// writes a `Record` of its own.
#[test]
fn the_shim_builds_records_only_through_its_event_constructors() {
    let mut building: Vec<String> = rust_files(&repo().join("shim/src"))
        .into_iter()
        .filter(|f| !f.ends_with("trace/event.rs"))
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .any(|l| l.contains("Record {"))
        })
        .map(|f| f.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    building.sort();
    assert_eq!(
        building,
        Vec::<String>::new(),
        "records built past trace/event.rs"
    );
}

/// The settings reach the shim's parts as values, each part through one place: the pool (its
/// mode, the engine's policy, the trim), the trace (when it opens) and the PyTorch hook (when it
/// attaches). No other code reads `GPUSHIM_CONF`'s resolved settings.
#[test]
fn the_settings_reach_the_pool_the_trace_and_the_pytorch_hook_each_through_one_place() {
    let files = rust_files(&repo().join("shim/src"));
    let mut readers: Vec<(String, usize)> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let code: usize = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .map(|l| l.matches("state::conf()").count())
                .sum();
            let rel = f.strip_prefix(repo()).unwrap().display().to_string();
            (rel, code)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    readers.sort();
    assert_eq!(
        readers,
        [
            ("shim/src/hooks/torch.rs".to_string(), 1),
            ("shim/src/pool/mod.rs".to_string(), 1),
            ("shim/src/trace/mod.rs".to_string(), 1),
        ]
    );
}

/// The Quick start says what it needs (a GPU and PyTorch) before its first command, and points
/// to the way without them.
#[test]
fn the_quick_start_says_what_it_needs_before_its_commands() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find("## Quick start").expect("a Quick start");
    let section = &readme[start..];
    let first_command = section.find("```").expect("a command block");
    let before = &section[..first_command];
    assert!(
        before.contains("needs an NVIDIA GPU and PyTorch"),
        "{before}"
    );
    assert!(before.contains("(#without-a-gpu)"), "{before}");
    assert!(readme.contains("### Without a GPU"));
}

/// Every block of output the README shows (each under an `<!-- output: COMMAND WHAT -->`
/// comment) is what that command prints now: each line of the block is a line of its output,
/// in order (`...` stands for lines left out), and every block is checked.
#[test]
fn every_output_block_in_the_readme_is_what_the_command_prints() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut rest = readme.as_str();
    while let Some(at) = rest.find("<!-- output: ") {
        let after = &rest[at + "<!-- output: ".len()..];
        let (what, after) = after.split_once(" -->").expect("a closed comment");
        let body = after
            .trim_start()
            .strip_prefix("```\n")
            .unwrap_or_else(|| panic!("a block of output after `{what}`"));
        let (block, after) = body.split_once("```").expect("a closed block");
        blocks.push((what.to_string(), block.to_string()));
        rest = after;
    }
    let shown: Vec<&str> = blocks.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(
        shown,
        ["leaks leaks", "summary kinds", "recommend resnet50"],
        "each block needs a producer here"
    );
    let dir = tempdir("readme-outputs");
    for (what, block) in &blocks {
        let printed = match what.as_str() {
            "leaks leaks" => {
                let t = dir.join("leaks.trace");
                let lib = sim().dir.join("torch/lib");
                let args = ["libtorch_cpu.so", "libc10_cuda.so"]
                    .map(|l| lib.join(l).display().to_string())
                    .to_vec();
                assert_ok(&python_client(&t, "kinds/leaks.py", args, vec![]));
                gpushim_text(&["leaks", t.to_str().unwrap()])
            }
            "summary kinds" => {
                let t = dir.join("kinds.trace");
                assert_ok(&kinds_program(&t, 5, false, vec![]));
                gpushim_text(&["summary", t.to_str().unwrap()])
            }
            "recommend resnet50" => {
                let t = repo().join("tests/data/torch/resnet50.trace");
                gpushim_text(&["simulate", t.to_str().unwrap(), "--recommend"])
            }
            other => panic!("no producer for `{other}`"),
        };
        assert_ok(&printed);
        let out = stdout(&printed);
        let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
        let mut from = 0;
        for want in block.lines().map(str::trim_end) {
            if want == "..." || want.is_empty() {
                continue;
            }
            match lines[from..].iter().position(|l| *l == want) {
                Some(i) => from += i + 1,
                None => panic!(
                    "the README's `{what}` block shows a line the command no longer prints \
                     (or not in this order):\n{want}\n--- it prints:\n{out}"
                ),
            }
        }
    }
}
