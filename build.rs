//! With the `bundle-shim` feature (the Python wheel's build), builds libgpushim.so in a target
//! folder of its own and leaves it in OUT_DIR for the `gpushim` command to carry, with the
//! fingerprint of the sources it was built from (`gpushim lib --sources` prints it; the package
//! check compares it with the sources). Without it, nothing: the workspace builds the shim as a
//! crate of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the shim compiles: its own crate and the core's, with the workspace's manifest and lock.
const SHIM_SOURCES: [&str; 4] = ["shim", "src/core", "Cargo.toml", "Cargo.lock"];

/// Every file under `p` (or `p` itself), by path relative to `root` with `/` between parts.
fn files(root: &Path, p: &Path, out: &mut Vec<(String, PathBuf)>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).expect("a source folder reads") {
            files(root, &e.expect("a source folder lists").path(), out);
        }
    } else if p.is_file() {
        let rel = p.strip_prefix(root).expect("under the root");
        let parts: Vec<_> = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        out.push((parts.join("/"), p.to_path_buf()));
    }
}

/// FNV-1a (64 bits) over each file, in order of its relative path: the path, a NUL, the
/// contents, a NUL. tests/python/check_package.py computes the same.
fn fingerprint(root: &Path) -> String {
    let mut all = Vec::new();
    for part in SHIM_SOURCES {
        files(root, &root.join(part), &mut all);
    }
    all.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (rel, path) in &all {
        let body = std::fs::read(path).expect("a source file reads");
        for b in rel.bytes().chain([0]).chain(body).chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BUNDLE_SHIM").is_none() {
        return;
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    // What the shim compiles (cargo looks into each folder's files).
    for part in SHIM_SOURCES {
        println!("cargo:rerun-if-changed={}", root.join(part).display());
    }
    std::fs::write(out.join("shim_sources.txt"), fingerprint(&root))
        .expect("write the sources' fingerprint into OUT_DIR");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = out.join("shim-target");
    // A target folder of its own: the outer build holds the workspace's.
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "-p",
            "gpushim-shim",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env_remove("CARGO_FEATURE_BUNDLE_SHIM")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "building libgpushim.so for the bundle failed"
    );
    std::fs::copy(
        target.join("release/libgpushim.so"),
        out.join("libgpushim.so"),
    )
    .expect("copy libgpushim.so into OUT_DIR");
}
