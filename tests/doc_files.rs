//! The documents name what is there and stay short: every file of the repository a document
//! names exists, and the README is a short guide.

use crate::common::*;

/// Every file of the repository a document names exists: a path from one of its folders
/// (`src/...`, `docs/...`) as written, a Rust file named by its last parts (`analysis/saved.rs`)
/// as the end of one. A path with a placeholder in capitals (`scripts/bench/NAME.sh`) is a
/// pattern, not a file.
#[test]
fn every_file_a_document_names_exists() {
    let root = repo();
    let mut ours: Vec<String> = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() && !matches!(name, "target" | ".git" | "node_modules") {
                stack.push(p);
            } else if p.is_file() {
                ours.push(
                    p.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let folders = [
        "src/", "shim/", "tests/", "scripts/", "docs/", "python/", ".ci/",
    ];
    let mut docs = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let words = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')));
        for word in words {
            let word = word.trim_end_matches(['.', '/']);
            let ours_folder = folders.iter().any(|f| word.starts_with(f));
            let rust = word.ends_with(".rs");
            if !(ours_folder || rust) || word.contains("//") {
                continue;
            }
            let placeholder = word
                .split(['/', '.'])
                .any(|part| part.len() > 1 && part.chars().all(|c| c.is_ascii_uppercase()));
            let found = root.join(word).exists()
                || (rust && ours.iter().any(|f| f.ends_with(&format!("/{word}"))));
            if !found && !placeholder {
                missing.push(format!("{}: {word}", doc.display()));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "documents name files that are not there:\n{}",
        missing.join("\n")
    );
}

/// The README is a short user's guide (what, install, use, limits): under 250 lines, its
/// figures and their history in `docs/`.
#[test]
fn the_readme_is_a_short_guide() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 250,
        "README.md has {lines} lines: move details into docs/"
    );
    for part in ["## Install", "## Quick start", "## Limits"] {
        assert!(readme.contains(part), "the README lacks {part}");
    }
}
