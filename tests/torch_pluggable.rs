//! `gpushim run --pluggable`: PyTorch's pluggable allocator installed over the shim when the
//! program imports torch, with no change to the program. No PyTorch here: a stand-in `torch`
//! package records what it is asked (the GPU machine runs the real one: README, Benchmarks).
//! Proven: the allocator is installed once, with this shim and its two entry points, only when
//! torch is imported and only under `--pluggable`; a sitecustomize the program's path already
//! had still runs; a refusal by PyTorch leaves the program running with one line said; the
//! folder written for the run is gone after it; `--per-tensor` and `--pluggable` exclude each
//! other; PyTorch's memory statistics, which its pluggable allocator does not keep, answer from
//! the shim's pool (tensors made through `gpushim_alloc` on the simulator), and under
//! `--per-tensor` too (through `cudaMalloc`), where PyTorch's own would read 0.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A stand-in for torch: `torch.cuda.memory` with the two calls the installer makes, recording
/// them in `torch.calls`; `REFUSE` in the environment makes the swap raise as PyTorch does once
/// its allocator has started. Its memory statistics are built as PyTorch 2.11 builds them, on
/// `torch._C`'s functions looked up at each call, which raise once the pluggable allocator is
/// in (as PyTorch's do: "CUDAPluggableAllocator does not yet support getDeviceStats").
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
def _unsupported(what):
    def f(device):
        raise RuntimeError(f"CUDAPluggableAllocator does not yet support {what}")
    return f
_C = types.SimpleNamespace(
    _cuda_memoryStats=_unsupported("getDeviceStats"),
    _cuda_resetPeakMemoryStats=_unsupported("resetPeakStats"),
    _cuda_resetAccumulatedMemoryStats=_unsupported("resetAccumulatedStats"))
def current_device():
    return 0
class device:
    def __init__(self, d):
        self.index = int(d.split(":")[1]) if ":" in d else None
def memory_stats(device=None):
    out = {}
    def flat(prefix, v):
        if isinstance(v, dict):
            for k, w in v.items():
                flat(prefix + "." + k if prefix else k, w)
        else:
            out[prefix] = v
    flat("", _C._cuda_memoryStats(current_device() if device is None else device))
    return dict(sorted(out.items()))
def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)
def max_memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.peak", 0)
def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)
def reset_peak_memory_stats(device=None):
    _C._cuda_resetPeakMemoryStats(current_device() if device is None else device)
def reset_accumulated_memory_stats(device=None):
    _C._cuda_resetAccumulatedMemoryStats(current_device() if device is None else device)
def memory_summary(device=None, abbreviated=False):
    return memory_stats(device)["allocated_bytes.small_pool.current"]
cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=CUDAPluggableAllocator,
    change_current_allocator=change_current_allocator, memory_summary=memory_summary),
    current_device=current_device, memory_stats=memory_stats, memory_allocated=memory_allocated,
    max_memory_allocated=max_memory_allocated, memory_reserved=memory_reserved,
    reset_peak_memory_stats=reset_peak_memory_stats,
    reset_accumulated_memory_stats=reset_accumulated_memory_stats, memory_summary=memory_summary)
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
fn the_folder_on_pythonpath_is_the_users_alone_and_outlives_the_run() {
    // Whatever the program leaves running keeps the path in its environment: it must stay a
    // folder nobody else can create or write, not a name in /tmp that another user could make
    // again with a sitecustomize.py of theirs.
    use std::os::unix::fs::MetadataExt;
    let dir = tempdir("plug-site");
    let pkgs = with_fake_torch(&dir);
    let program = "import sys; print([p for p in sys.path if 'site-' in p][0])";
    let cache = dir.join("cache");
    let cache_env = [("XDG_CACHE_HOME", cache.to_str().unwrap())];
    let out = run(
        &dir,
        &["--pluggable"],
        pkgs.to_str().unwrap(),
        program,
        &cache_env,
    );
    assert_ok(&out);
    let site = PathBuf::from(stdout(&out).trim());
    assert!(
        site.starts_with(cache.join("gpushim")),
        "{}",
        site.display()
    );
    for d in [&site, &cache.join("gpushim")] {
        let m = std::fs::symlink_metadata(d).unwrap();
        assert!(m.is_dir(), "{}", d.display());
        assert_eq!(m.mode() & 0o077, 0, "{} is open to others", d.display());
    }
    assert!(site.join("sitecustomize.py").is_file());
    // A folder open to others, or one that is a link, is closed or refused before use.
    std::fs::set_permissions(
        cache.join("gpushim"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let out = run(
        &dir,
        &["--pluggable"],
        pkgs.to_str().unwrap(),
        program,
        &cache_env,
    );
    assert_ok(&out);
    let mode = std::fs::metadata(cache.join("gpushim")).unwrap().mode();
    assert_eq!(mode & 0o077, 0, "closed again");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(
        &elsewhere,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let linked = dir.join("linked");
    std::fs::create_dir(&linked).unwrap();
    std::os::unix::fs::symlink(&elsewhere, linked.join("gpushim")).unwrap();
    let out = run(
        &dir,
        &["--pluggable"],
        pkgs.to_str().unwrap(),
        program,
        &[
            ("XDG_CACHE_HOME", linked.to_str().unwrap()),
            ("HOME", "relative"),
            ("XDG_RUNTIME_DIR", ""),
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a private folder"),
        "{}",
        stderr(&out)
    );
    let mode = std::fs::metadata(&elsewhere).unwrap().mode();
    assert_eq!(mode & 0o777, 0o777, "nothing changed through the link");
}

#[test]
fn a_python_that_ignores_pythonpath_or_site_is_refused_with_the_way_out() {
    // -I, -E and -S keep Python from reading PYTHONPATH or importing sitecustomize: the
    // allocator would silently not be installed.
    let dir = tempdir("plug-isolated");
    for (flags, flag) in [("-I", "-I"), ("-E", "-E"), ("-S", "-S"), ("-bIu", "-I")] {
        for route in ["--pluggable", "--per-tensor"] {
            let out = Command::new(gpushim_bin())
                .args(["run", "--lib"])
                .arg(shim())
                .args([
                    route, "--trace", "off", "--", "python3", flags, "-c", "pass",
                ])
                .current_dir(&dir)
                .output()
                .unwrap();
            assert!(!out.status.success(), "{route} {flags}");
            let err = stderr(&out);
            assert!(
                err.contains(&format!("python {flag}")) && err.contains("torch_allocator"),
                "{route} {flags}: {err}"
            );
        }
    }
    // A flag of the program's own, after the script, is the program's business.
    let pkgs = with_fake_torch(&dir);
    let script = dir.join("s.py");
    std::fs::write(&script, "import sys; print(sys.argv[1:])").unwrap();
    let out = Command::new(gpushim_bin())
        .args(["run", "--lib"])
        .arg(shim())
        .args(["--pluggable", "--trace", "off", "--", "python3", "-u"])
        .arg(&script)
        .arg("-I")
        .env("PYTHONPATH", &pkgs)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), "['-I']");
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

/// Two tensors made and one freed, then PyTorch's statistics read: the tensors as PyTorch's
/// pluggable allocator makes them (`gpushim_alloc`/`gpushim_free` of the shim the installer
/// named) or, with `PER_TENSOR` set, as PyTorch with its cache off does (`cudaMalloc` and
/// `cudaFree`, which the shim pools), on the simulator's device 0.
const TENSORS: &str = r#"
import ctypes, os, torch
c = torch.cuda
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaSetDevice(0)
if os.environ.get("PER_TENSOR"):
    rt.cudaMalloc.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t)
    rt.cudaFree.argtypes = (ctypes.c_void_p,)
    def alloc(n):
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), n) == 0
        return p.value
    def free(p, n):
        assert rt.cudaFree(p) == 0
else:
    shim = ctypes.CDLL(torch.calls[0][0])
    shim.gpushim_alloc.restype = ctypes.c_void_p
    shim.gpushim_alloc.argtypes = (ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    shim.gpushim_free.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    alloc = lambda n: shim.gpushim_alloc(n, 0, None)
    free = lambda p, n: shim.gpushim_free(p, n, 0, None)
a = alloc(3 << 20)
b = alloc(1000)
s = c.memory_stats()
print("live", s["requested_bytes.all.current"], s["allocation.all.current"],
      c.memory_allocated() >= s["requested_bytes.all.current"],
      c.memory_reserved() >= c.memory_allocated() > 0)
free(a, 3 << 20)
s = c.memory_stats()
print("freed", s["requested_bytes.all.current"], s["requested_bytes.all.freed"],
      c.max_memory_allocated() > c.memory_allocated())
c.reset_peak_memory_stats()
c.reset_accumulated_memory_stats()
s = c.memory_stats()
print("reset", c.max_memory_allocated() == c.memory_allocated(), s["requested_bytes.all.freed"])
print("summary", c.memory_summary().split()[0], c.memory.memory_summary(0).count("allocations"))
print("device 1", c.memory_stats(1)["allocation.all.current"])
"#;

#[test]
fn pytorch_memory_statistics_answer_from_the_shims_pool() {
    let dir = tempdir("plug-stats");
    let pkgs = with_fake_torch(&dir);
    let sim_dir = sim().dir.to_str().unwrap().to_string();
    let want = [
        format!("live {} 2 True True", (3 << 20) + 1000),
        format!("freed 1000 {} True", 3 << 20),
        "reset True 0".to_string(),
        "summary gpushim: 1".to_string(),
        "device 1 0".to_string(),
    ];
    for (flag, env) in [
        ("--pluggable", vec![("LD_LIBRARY_PATH", sim_dir.as_str())]),
        (
            "--per-tensor",
            vec![("LD_LIBRARY_PATH", sim_dir.as_str()), ("PER_TENSOR", "1")],
        ),
    ] {
        let out = run(&dir, &[flag], pkgs.to_str().unwrap(), TENSORS, &env);
        assert_ok(&out);
        assert_eq!(
            stdout(&out).lines().collect::<Vec<_>>(),
            want,
            "{flag}; stderr: {}",
            stderr(&out)
        );
    }
    // Without either flag PyTorch's own statistics stay (the stand-in's, which raise).
    let program = "import torch; torch.cuda.memory_allocated()";
    let out = run(&dir, &[], pkgs.to_str().unwrap(), program, &[]);
    assert!(
        stderr(&out).contains("does not yet support getDeviceStats"),
        "{}",
        stderr(&out)
    );
    // Nor with --per-tensor and no pool: PyTorch's own counters are all there is.
    let out = run(
        &dir,
        &["--per-tensor", "--conf", "pool:off"],
        pkgs.to_str().unwrap(),
        program,
        &[],
    );
    assert!(
        stderr(&out).contains("does not yet support getDeviceStats"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn pluggable_refuses_a_configuration_without_a_pool() {
    let dir = tempdir("plug-nopool");
    let out = run(&dir, &["--pluggable", "--conf", "pool:off"], "", SHOW, &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--pluggable needs the shim's pool") && err.contains("nothing was started"),
        "{err}"
    );
    assert!(stdout(&out).is_empty());
}
