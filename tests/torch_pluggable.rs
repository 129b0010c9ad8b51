//! `gpushim run --pluggable`: PyTorch's pluggable allocator installed over the shim when the
//! program imports torch, with no change to the program. No PyTorch here: a stand-in `torch`
//! package records what it is asked (the GPU machine runs the real one: README, Benchmarks).
//! Proven: the allocator is installed once, with this shim and its two entry points, only when
//! torch is imported and only under `--pluggable`; a sitecustomize the program's path already
//! had still runs; a refusal by PyTorch leaves the program running with one line said; the
//! folder written for the run is gone after it; `--per-tensor` and `--pluggable` exclude each
//! other.

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

/// A stand-in for torch: `torch.cuda.memory` with the two calls the installer makes, recording
/// them in `torch.calls`; `REFUSE` in the environment makes the swap raise as PyTorch does once
/// its allocator has started.
const FAKE_TORCH: &str = r#"
import os, types
calls = []
class CUDAPluggableAllocator:
    def __init__(self, path, alloc, free):
        self.args = (path, alloc, free)
def change_current_allocator(a):
    if os.environ.get("REFUSE"):
        raise RuntimeError("Can't swap an already initialized allocator")
    calls.append(a.args)
cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator))
"#;

fn with_fake_torch(dir: &Path) -> std::path::PathBuf {
    let pkgs = dir.join("pkgs");
    std::fs::create_dir_all(pkgs.join("torch")).unwrap();
    std::fs::write(pkgs.join("torch/__init__.py"), FAKE_TORCH).unwrap();
    pkgs
}

fn run(
    dir: &Path,
    flags: &[&str],
    pythonpath: &str,
    program: &str,
    env: &[(&str, &str)],
) -> Output {
    let mut c = Command::new(gpushim_bin());
    c.arg("run")
        .arg("--lib")
        .arg(shim())
        .args(flags)
        .args(["--trace", "off", "--", "python3", "-c", program])
        .current_dir(dir)
        .env("PYTHONPATH", pythonpath)
        .env("TMPDIR", dir)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

const SHOW: &str = "import torch; print('calls', torch.calls)";

/// What `program` prints under `gpushim run FLAGS` with the stand-in torch on the path; the
/// run must succeed.
fn printed(dir: &Path, flags: &[&str], program: &str) -> String {
    let pkgs = with_fake_torch(dir);
    let out = run(dir, flags, pkgs.to_str().unwrap(), program, &[]);
    assert_ok(&out);
    let text = stdout(&out).trim().to_string();
    eprintln!("{program}: {text}; stderr: {}", stderr(&out));
    text
}

#[test]
fn the_allocator_is_installed_at_import_torch_with_this_shim_and_its_entry_points() {
    let dir = tempdir("plug-install");
    let want = format!(
        "calls [('{}', 'gpushim_alloc', 'gpushim_free')]",
        shim().display()
    );
    assert_eq!(printed(&dir, &["--pluggable"], SHOW), want);
    // Not without the flag, and not for a program that never imports torch.
    assert_eq!(printed(&dir, &[], SHOW), "calls []");
    let program = "import sys; print('torch' in sys.modules)";
    assert_eq!(printed(&dir, &["--pluggable"], program), "False");
    // Imported twice, installed once.
    let program = "import torch, importlib; import torch as t2; print(len(torch.calls))";
    assert_eq!(printed(&dir, &["--pluggable"], program), "1");
}

#[test]
fn a_sitecustomize_already_on_the_path_still_runs() {
    let dir = tempdir("plug-chain");
    let pkgs = with_fake_torch(&dir);
    let theirs = dir.join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(
        theirs.join("sitecustomize.py"),
        "import builtins\nbuiltins.THEIR_SITE_RAN = True\n",
    )
    .unwrap();
    let path = format!("{}:{}", theirs.display(), pkgs.display());
    let program = "import torch; print(THEIR_SITE_RAN, len(torch.calls))";
    let out = run(&dir, &["--pluggable"], &path, program, &[]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), "True 1", "stderr: {}", stderr(&out));
}

#[test]
fn a_refusal_by_pytorch_is_said_once_and_the_program_runs_on() {
    let dir = tempdir("plug-refused");
    let pkgs = with_fake_torch(&dir);
    let out = run(
        &dir,
        &["--pluggable"],
        pkgs.to_str().unwrap(),
        SHOW,
        &[("REFUSE", "1")],
    );
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), "calls []");
    let err = stderr(&out);
    assert_eq!(
        err.matches("gpushim: --pluggable: PyTorch kept its own allocator")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("already initialized"), "{err}");
}

#[test]
fn the_folder_written_for_the_run_is_removed_after_it() {
    let dir = tempdir("plug-clean");
    let pkgs = with_fake_torch(&dir);
    let program = "import sys; print([p for p in sys.path if 'gpushim-site' in p][0])";
    let out = run(&dir, &["--pluggable"], pkgs.to_str().unwrap(), program, &[]);
    assert_ok(&out);
    let site = stdout(&out).trim().to_string();
    assert!(site.starts_with(dir.to_str().unwrap()), "{site}");
    assert!(!Path::new(&site).exists(), "{site} is still there");
}

#[test]
fn per_tensor_and_pluggable_exclude_each_other() {
    let dir = tempdir("plug-both");
    let out = run(&dir, &["--pluggable", "--per-tensor"], "", SHOW, &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--per-tensor") && err.contains("cannot be used with"),
        "{err}"
    );
}
