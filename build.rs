//! With the `bundle-shim` feature (the Python wheel's build), builds libgpushim.so in a target
//! folder of its own and leaves it in OUT_DIR for the `gpushim` command to carry. Without it,
//! nothing: the workspace builds the shim as a crate of its own.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_BUNDLE_SHIM").is_none() {
        return;
    }
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    // What the shim compiles: its own crate and the core library's sources (the trace, the
    // configuration, the engine, the small utilities), with both manifests.
    for part in ["shim", "src", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(part).display());
    }
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
