//! The real CUDA 13 runtime from PyPI (`nvidia-cuda-runtime`), loaded with no driver: through
//! the shim it returns exactly what it returns alone, and its versioned symbols bind to the shim.
//! `.ci/run` downloads the wheel and sets GPUSHIM_CUDART_DIR; without it this test says so and
//! passes, unless GPUSHIM_REQUIRE_WHEELS=1 (set in CI) makes the missing wheel a failure.

use crate::common::*;
use std::path::PathBuf;
use std::process::Command;

fn cudart_dir() -> Option<PathBuf> {
    match std::env::var_os("GPUSHIM_CUDART_DIR") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            assert!(
                std::env::var_os("GPUSHIM_REQUIRE_WHEELS").is_none(),
                "GPUSHIM_REQUIRE_WHEELS is set but GPUSHIM_CUDART_DIR is not"
            );
            skipped(
                "real_runtime",
                "set GPUSHIM_CUDART_DIR to the wheel's lib directory (scripts/test.sh does)",
            );
            None
        }
    }
}

#[test]
fn the_real_runtime_without_a_driver_returns_35_through_the_shim_as_alone() {
    let Some(lib) = cudart_dir() else { return };
    assert!(
        lib.join("libcudart.so.13").is_file(),
        "{} has no libcudart.so.13",
        lib.display()
    );
    let dir = tempdir("wheel");
    let exe = dir.join("no_driver");
    let l = lib.to_str().unwrap();
    cc(&[
        "-O1",
        &format!("-I{}", repo().join("tests/sim").display()),
        "-o",
        exe.to_str().unwrap(),
        repo().join("tests/clients/no_driver.c").to_str().unwrap(),
        "-L",
        l,
        "-l:libcudart.so.13",
    ]);
    // The client binds to versioned symbols, as programs built with the CUDA toolkit do.
    let syms = Command::new("objdump")
        .arg("-T")
        .arg(&exe)
        .output()
        .unwrap();
    let syms = String::from_utf8_lossy(&syms.stdout);
    assert!(
        syms.lines()
            .any(|l| l.contains("libcudart.so.13") && l.ends_with(" cudaMalloc")),
        "the client does not reference cudaMalloc@libcudart.so.13:\n{syms}"
    );
    let run_it = |preload: bool, trace: &std::path::Path| {
        let mut c = Command::new(&exe);
        c.env("LD_LIBRARY_PATH", l)
            .env("GPUSHIM_TRACE", trace)
            .env_remove("LD_PRELOAD");
        if preload {
            c.env("LD_PRELOAD", shim());
        }
        c.output().unwrap()
    };
    let t = dir.join("wheel.trace");
    let alone = run_it(false, &t);
    let shimmed = run_it(true, &t);
    assert_ok(&alone);
    assert_ok(&shimmed);
    assert_eq!(
        stdout(&alone),
        "cudaMalloc 35 untouched=1\ncudaMallocHost 35 untouched=1\ncudaMemGetInfo 35 untouched=1\ncudaFree 35\n"
    );
    assert_eq!(stdout(&shimmed), stdout(&alone));
    // The versioned references reached the shim: each call is in the trace, with code 35.
    let (records, _) = decode(&t);
    let seen: Vec<(&str, u8)> = calls(&records)
        .iter()
        .map(|r| (r.api.name(), r.status))
        .collect();
    assert_eq!(
        seen,
        [
            ("cudaMalloc", 35),
            ("cudaMallocHost", 35),
            ("cudaMemGetInfo", 35),
            ("cudaFree", 35)
        ]
    );
    // A missing driver is not out of memory: `oom` names the code and says so, and `run`
    // names it and sends the reader to the summary, not to `oom`.
    let oom = stdout(&gpushim(&[&"oom", &t]));
    assert!(
        oom.contains("cudaErrorInsufficientDriver (35, no CUDA driver")
            && oom.contains("not out of memory")
            && !oom.contains("holding the most"),
        "{oom}"
    );
    let out = Command::new(gpushim_bin())
        .current_dir(&dir)
        .env("LD_LIBRARY_PATH", l)
        .env_remove("GPUSHIM_CONF")
        .env_remove("GPUSHIM_TRACE")
        .args(["run", "--lib"])
        .arg(shim())
        .arg("--")
        .arg(&exe)
        .output()
        .unwrap();
    assert_ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains("failed for another reason than memory")
            && err.contains("cudaErrorInsufficientDriver")
            && err.contains("next: gpushim summary")
            && !err.contains("next: gpushim oom"),
        "{err}"
    );
}
