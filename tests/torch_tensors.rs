//! Every tensor of PyTorch's own caching allocator, in the default run (design contract 10), on
//! the stand-in for PyTorch's `libc10_cuda.so` (`tests/standin/c10_cuda.cpp`: the same
//! exported symbol, C++ type, vtable slot and event layout as torch 2.11, its segments from the
//! simulator). The shim attaches to the allocator's trace, checks it against the segments it
//! sees, and records tensors with their Python lines; what does not check out is refused, said
//! once, and the reports speak of segments.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The stand-in library inside the simulator's folder (`torch/lib/libc10_cuda.so`).
fn standin() -> PathBuf {
    sim().dir.join("torch/lib/libc10_cuda.so")
}

/// Runs the two-leak training loop of `tests/clients/torch_leaks.py` on `lib` under the shim
/// with `env`; returns the trace and stderr.
fn leaky_run(tag: &str, lib: &Path, env: Vec<(&'static str, String)>) -> (TestFile, String) {
    client_run(tag, "torch_leaks.py", &[lib.display().to_string()], env)
}

/// Runs `tests/clients/{script}` with `args` under the shim with `env`; returns the trace and
/// stderr.
fn client_run(
    tag: &str,
    script: &str,
    args: &[String],
    env: Vec<(&'static str, String)>,
) -> (TestFile, String) {
    let script = repo().join("tests/clients").join(script);
    run_script(tag, &script, args, env)
}

/// Writes a Python program `name` into a folder of its own (which goes when the returned value
/// is dropped): five lines that load the stand-in named by its first argument as `lib`, its
/// `standin_malloc` and `standin_free` typed, then `body` from line 6 on.
fn standin_script(name: &str, body: &str) -> (TestDir, PathBuf) {
    let dir = tempdir("standin-script");
    let script = dir.join(name);
    let prelude = "import ctypes, sys\n\
                   lib = ctypes.CDLL(sys.argv[1])\n\
                   lib.standin_malloc.restype = ctypes.c_void_p\n\
                   lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
                   lib.standin_free.argtypes = (ctypes.c_void_p,)\n";
    std::fs::write(&script, format!("{prelude}{body}")).unwrap();
    (dir, script)
}

/// Runs the Python program `script` with `args` under the shim, nothing set.
fn client_run_path(script: &Path, args: &[String]) -> (TestFile, String) {
    run_script("script", script, args, vec![])
}

/// Runs the Python program `script` with `args` under the shim with `env`; returns the trace
/// and stderr.
fn run_script(
    tag: &str,
    script: &Path,
    args: &[String],
    env: Vec<(&'static str, String)>,
) -> (TestFile, String) {
    let t = tempdir(tag).file("t.trace");
    let out = run(
        Path::new("python3"),
        Run {
            preload: true,
            trace: Some(&t),
            args: std::iter::once(script.display().to_string())
                .chain(args.iter().cloned())
                .collect(),
            env,
        },
    );
    assert_ok(&out);
    (t, stderr(&out))
}

fn report(cmd: &str, trace: &Path) -> serde_json::Value {
    report_json(&[cmd], &[trace])
}

const LAYER_LINE: &str = "torch_leaks.py:31 in CachingLayer.__call__";
const METRIC_LINE: &str = "torch_leaks.py:41 in train";

/// The call sites `leaks` says grow, with their growth per iteration.
fn growing(trace: &Path) -> Vec<(String, u64)> {
    let v = report("leaks", trace);
    v["iterations"]["growing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["call_site"].as_str().unwrap().to_string(),
                g["bytes_per_iteration"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn the_default_run_names_both_leaking_lines_with_their_growth() {
    for conf in ["", "pool:caching", "pool:expandable"] {
        let (t, err) = leaky_run("tensors", &standin(), vec![("GPUSHIM_CONF", conf.into())]);
        assert!(!err.contains("tensors are not recorded"), "{conf}: {err}");
        let g = growing(&t);
        assert_eq!(g.len(), 2, "{conf}: {g:?}");
        // One boundary a step, at its first allocation: the first step's segment, taken before
        // the stand-in's tensors were known, carries the same stack as its tensor and must not
        // count that line twice (which made it lose to the step's second line).
        let it = &report("leaks", &t)["iterations"];
        assert_eq!(it["count"], 30, "{conf}: {it}");
        let b = it["boundary"].as_str().unwrap();
        assert!(b.contains("torch_leaks.py:39 in train"), "{conf}: {b}");
        for line in [LAYER_LINE, METRIC_LINE] {
            assert!(
                g.iter()
                    .any(|(site, per)| site.contains(line) && *per == 4 << 20),
                "{conf}: {line} at 4 MiB per iteration: {g:?}"
            );
        }
        // The summary reads as PyTorch's counters: 60 tensors of 4 MiB kept; the cache holds
        // the rest of its segments unused.
        let s = report("summary", &t);
        let f = &s["framework"][0];
        assert_eq!(f["allocated_at_end_bytes"], 240u64 << 20, "{conf}: {s}");
        assert_eq!(f["tensors_at_end"], 60, "{conf}");
        let reserved = f["reserved_at_end_bytes"].as_u64().unwrap();
        assert_eq!(
            f["cached_unused_at_end_bytes"].as_u64().unwrap(),
            reserved - (240 << 20),
            "{conf}"
        );
        assert!(s["tensors_off"].is_null(), "{conf}");
        let p = &s["python_frames"];
        assert_eq!(p["allocations_with"], p["allocations"], "{conf}: {p}");
    }
}

/// Where leaked memory is kept, not only made: a metric kept with the three activations its
/// graph saved grows at four lines, and when the metrics are finally released each is freed
/// right before its activations; `leaks` joins the four lines into one chain, each line to its
/// neighbours in the frees and to the rest through them. A copy kept in a list of its own, freed
/// after them, is joined to nothing; and a run that never frees its leaks joins nothing, since
/// nothing in it shows what keeps what.
#[test]
fn a_leak_is_joined_to_the_line_whose_value_keeps_it_when_they_are_freed_together() {
    const ACT: &str = "torch_kept.py:31 in train";
    const COPY: &str = "torch_kept.py:32 in train";
    const METRIC: &str = "torch_kept.py:33 in train";
    const MID: &str = "torch_kept.py:34 in train";
    const LAST: &str = "torch_kept.py:35 in train";
    for (mode, joined) in [("release", true), ("never", false)] {
        let args = [standin().display().to_string(), "30".into(), mode.into()];
        let (t, _) = client_run("kept", "torch_kept.py", &args, vec![]);
        let v = report("leaks", &t);
        let growing = v["iterations"]["growing"].as_array().unwrap();
        assert_eq!(growing.len(), 5, "{mode}: {v}");
        // What each line is kept alive with: (which line, how often freed next to it).
        let kept_with = |line: &str| -> Vec<(&str, u64)> {
            let g = growing
                .iter()
                .find(|g| g["call_site"].as_str().unwrap().contains(line))
                .unwrap_or_else(|| panic!("{mode}: {line} grows: {v}"));
            let lines = [ACT, COPY, METRIC, MID, LAST];
            g["kept_with"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|k| {
                            let site = k["call_site"].as_str().unwrap();
                            let line = lines.into_iter().find(|l| site.contains(l));
                            (line.unwrap_or(site), k["freed_together"].as_u64().unwrap())
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(kept_with(COPY), vec![], "{mode}");
        if joined {
            // 28 of the 30 steps' allocations outlived the iteration before the last, freed
            // metric, act, mid, last, metric, ...: each neighbour pair 28 times, last and the
            // next metric 27; metric and mid are joined only through the others.
            assert_eq!(kept_with(METRIC), vec![(ACT, 28), (LAST, 27), (MID, 0)]);
            assert_eq!(kept_with(ACT), vec![(METRIC, 28), (MID, 28), (LAST, 0)]);
            assert_eq!(kept_with(LAST), vec![(MID, 28), (METRIC, 27), (ACT, 0)]);
            let text = stdout(&gpushim(&[&"leaks", &t]));
            assert!(
                text.contains(&format!(
                    "kept alive with torch_kept.py:22 in empty < {METRIC}"
                )) && text.contains("(freed in the same chains)"),
                "{text}"
            );
        } else {
            for line in [ACT, METRIC, MID, LAST] {
                assert_eq!(kept_with(line), vec![], "{mode}: {line}");
            }
        }
    }
}

/// A leak made five calls deep and reached from two places every step (2 MiB through one
/// function, 2 MiB through another) is two stacks that read the same: their four innermost
/// frames are the same. `leaks` names that line once, growing by the 4 MiB a step it keeps,
/// as the rows of what is live merge them; it printed the line twice, each at 2 MiB a step.
#[test]
fn stacks_that_read_the_same_grow_as_one_line() {
    let (_dir, script) = standin_script(
        "deep.py",
        "kept = []\n\
         def alloc(n): return lib.standin_malloc(n)\n\
         def f3(n): return alloc(n)\n\
         def f2(n): return f3(n)\n\
         def f1(n): return f2(n)\n\
         def from_a(): kept.append(f1(2 << 20))\n\
         def from_b(): kept.append(f1(2 << 20))\n\
         for i in range(30):\n\
         \x20   lib.standin_free(alloc(1 << 20))\n\
         \x20   from_a()\n\
         \x20   from_b()\n",
    );
    let (t, _) = client_run_path(&script, &[standin().display().to_string()]);
    let g = growing(&t);
    let deep: Vec<&(String, u64)> = g
        .iter()
        .filter(|(site, _)| site.starts_with("deep.py:7 in alloc < deep.py:8 in f3"))
        .collect();
    assert_eq!(deep.len(), 1, "{g:?}");
    assert_eq!(deep[0].1, 4 << 20, "{g:?}");
}

/// A step whose one allocation is kept: the line marks the iterations, and when PyTorch takes a
/// new segment for it (the segment's `cudaMalloc` carries the same Python stack as the tensor)
/// that is still one boundary, not two: 30 steps, 30 boundaries (36 were counted: one more for
/// each of the six 20 MiB segments). A tensor made first, as a model's parameters are, lets the
/// trace know PyTorch's tensors are recorded before the loop's first segment (the process's
/// very first segment is taken before that is known, and would count once more).
#[test]
fn a_line_whose_tensor_takes_a_new_segment_marks_one_boundary_per_step() {
    let (_dir, script) = standin_script(
        "steps.py",
        "params = lib.standin_malloc(1 << 20)\n\
         kept = []\n\
         for i in range(30):\n\
         \x20   kept.append(lib.standin_malloc(4 << 20))\n",
    );
    let (t, _) = client_run_path(&script, &[standin().display().to_string()]);
    let v = report("leaks", &t);
    let it = &v["iterations"];
    assert!(
        it["boundary"].as_str().unwrap().contains("steps.py:9"),
        "{it}"
    );
    assert_eq!(it["count"], 30, "{it}");
    let s = report("summary", &t);
    assert!(
        s["framework"][0]["segments_taken"].as_u64().unwrap() > 1,
        "{s}"
    );
}

#[test]
fn a_layout_that_does_not_check_out_is_refused_and_said_once() {
    let cases = [
        ("STANDIN_LAYOUT", "shifted", "did not match the segment"),
        ("STANDIN_BACKEND", "async", "another allocator backend"),
    ];
    for (var, value, why) in cases {
        let (t, err) = leaky_run("refused", &standin(), vec![(var, value.into())]);
        assert_eq!(
            err.matches("tensors are not recorded").count(),
            1,
            "{var}={value}: {err}"
        );
        assert!(err.contains(why), "{var}={value}: {err}");
        let s = report("summary", &t);
        assert!(
            s["tensors_off"].as_str().unwrap().contains(why),
            "{var}={value}: {s}"
        );
        assert_eq!(s["framework"].as_array().unwrap().len(), 0, "{s}");
        // No tensor record got in before the refusal.
        let (records, _) = decode(&t);
        assert!(
            !records
                .iter()
                .any(|r| r.kind == gpushim::trace::format::RecordKind::TensorAlloc),
            "{var}={value}"
        );
    }
}

#[test]
fn a_version_whose_layout_is_not_known_is_refused() {
    let dir = tempdir("oldtorch");
    let lib = dir.join("torch/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::copy(standin(), lib.join("libc10_cuda.so")).unwrap();
    std::fs::write(
        dir.join("torch/version.py"),
        "__version__ = '2.3.1+cu121'\n",
    )
    .unwrap();
    let (t, err) = leaky_run("oldtorch-run", &lib.join("libc10_cuda.so"), vec![]);
    assert!(err.contains("does not offer its allocator trace"), "{err}");
    let s = report("summary", &t);
    assert!(s["tensors_off"].is_string(), "{s}");
}

#[test]
fn tensors_off_in_the_configuration_records_segments_only_and_says_nothing() {
    let (t, err) = leaky_run(
        "tensors-off",
        &standin(),
        vec![("GPUSHIM_CONF", "tensors:off".into())],
    );
    assert!(!err.contains("tensors are not recorded"), "{err}");
    let s = report("summary", &t);
    assert_eq!(s["framework"].as_array().unwrap().len(), 0);
    assert!(s["tensors_off"].as_str().unwrap().contains("tensors:off"));
}

#[test]
fn an_out_of_memory_of_the_framework_names_the_line_that_asked() {
    let dir = tempdir("tensor-oom");
    let script = dir.join("grow.py");
    std::fs::write(
        &script,
        "import ctypes, sys\n\
         lib = ctypes.CDLL(sys.argv[1])\n\
         lib.standin_malloc.restype = ctypes.c_void_p\n\
         lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
         kept = []\n\
         def grow():\n\
         \x20   return lib.standin_malloc(64 << 20)\n\
         while True:\n\
         \x20   p = grow()\n\
         \x20   if not p:\n\
         \x20       break\n\
         \x20   kept.append(p)\n",
    )
    .unwrap();
    let env = vec![("GPUSHIM_SIM_MEMORY", (300u64 << 20).to_string())];
    let (t, _) = run_script(
        "tensor-oom-run",
        &script,
        &[standin().display().to_string()],
        env,
    );
    let v = report("oom", &t);
    let ooms = v.as_array().unwrap();
    assert_eq!(ooms.len(), 1, "one request failed: {v}");
    let o = &ooms[0];
    assert_eq!(o["api"], "torch_allocator", "{o}");
    assert_eq!(o["requested_bytes"], 64u64 << 20);
    assert!(
        o["request_site"]
            .as_str()
            .unwrap()
            .contains("grow.py:7 in grow"),
        "{o}"
    );
    assert!(o["device_free_bytes"].as_u64().is_some(), "{o}");
}

/// Under a memory fraction PyTorch refuses a request without asking CUDA: `oom` knows the
/// limit from that (the most it had reserved before), replays under it so the run's own setting
/// fails where the run failed, and says so; a program that pins every freed segment with a
/// small tensor is served by expandable segments under the same limit.
#[test]
fn an_out_of_memory_under_a_memory_fraction_is_replayed_under_that_fraction() {
    let (_dir, script) = standin_script(
        "pin.py",
        "kept = []\n\
         for i in range(100):\n\
         \x20   big = lib.standin_malloc((41 + 4 * i) << 19)\n\
         \x20   if not big:\n\
         \x20       break\n\
         \x20   kept.append(lib.standin_malloc(5 << 18))\n\
         \x20   lib.standin_free(big)\n",
    );
    let env = vec![("STANDIN_ALLOWED", (300u64 << 20).to_string())];
    let (t, _) = run_script("pin", &script, &[standin().display().to_string()], env);
    let text = {
        let o = gpushim(&[&"oom", &t]);
        assert_ok(&o);
        stdout(&o)
    };
    assert!(text.contains("by its memory fraction"), "{text}");
    assert!(
        text.contains("the run's own setting (the defaults) fails there too"),
        "{text}"
    );
    let serving = text
        .lines()
        .find(|l| l.contains("of them serve it"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(serving.contains("expandable_segments:True"), "{serving}");
}

/// A private pool (as `torch.cuda.use_mem_pool` makes one) keeps its cached segments from the
/// default pools: four 40 MiB tensors made and freed in one leave 160 MiB that a 150 MiB request
/// of the default pool cannot use, and under a fraction that allowed no more, PyTorch refused
/// it. `oom` replays with the private pool's memory held as the run held it, so the run's own
/// setting fails there too; a replay that gave that memory to the default pools would empty the
/// cache and serve it. A failure in the private pool itself is named, and no setting judged on
/// it. The pool's records come only with the private pool's events.
#[test]
fn an_out_of_memory_beside_a_private_pool_counts_what_the_pool_held() {
    let (_dir, script) = standin_script(
        "mempool.py",
        "lib.standin_use_pool.argtypes = (ctypes.c_ulonglong,)\n\
         lib.standin_use_pool(int(sys.argv[2]))\n\
         xs = [lib.standin_malloc(40 << 20) for _ in range(4)]\n\
         for x in xs:\n\
         \x20   lib.standin_free(x)\n\
         lib.standin_use_pool(int(sys.argv[3]))\n\
         assert not lib.standin_malloc(150 << 20)\n",
    );
    let env = || vec![("STANDIN_ALLOWED", (300u64 << 20).to_string())];
    let args = |private: &str, then: &str| {
        vec![
            standin().display().to_string(),
            private.to_string(),
            then.to_string(),
        ]
    };
    let oom_text = |t: &Path| {
        let o = gpushim(&[&"oom", &t]);
        assert_ok(&o);
        stdout(&o)
    };
    let pool_records = |t: &Path| {
        let o = gpushim(&[&"events", &t]);
        assert_ok(&o);
        stdout(&o)
            .lines()
            .filter(|l| l.contains(",tensor_pool,"))
            .count()
    };
    // The default pool's request, beside the pool.
    let (t, _) = run_script("mempool", &script, &args("7", "0"), env());
    let text = oom_text(&t);
    assert!(
        text.contains("private pools (CUDA graphs' pools, torch.cuda.MemPool) held 160.00 MiB"),
        "{text}"
    );
    assert!(
        text.contains("the run's own setting (the defaults) fails there too"),
        "{text}"
    );
    // Four tensors and their four segments: the frees and the default pool's failure have none.
    assert_eq!(pool_records(&t), 8, "{text}");
    // The same program with no private pool: PyTorch would give its cache back and serve the
    // request, and the replay does (the stand-in, simpler, refuses without giving back, so the
    // replay says the run's setting does not fail there).
    let (t, _) = run_script("mempool-none", &script, &args("0", "0"), env());
    let text = oom_text(&t);
    assert!(!text.contains("private pools"), "{text}");
    assert!(text.contains("does not fail there"), "{text}");
    // A replay that serves what the run failed shows no setting as the fix, and never the
    // run's own (the defaults here) as the one to export.
    assert!(
        text.contains("so no setting is shown to avoid it"),
        "{text}"
    );
    assert!(
        !text.contains("export PYTORCH_CUDA_ALLOC_CONF=\"\""),
        "{text}"
    );
    // Exactly why: the replay gave the cache back at the failure, which the stand-in did not.
    assert!(
        text.contains(
            "its segments part from the run's at segment event 5 (the run: nothing; \
             the replay: 40.00 MiB at"
        ),
        "{text}"
    );
    assert_eq!(pool_records(&t), 0);
    // The failure in the private pool itself.
    let (t, _) = run_script("mempool-inside", &script, &args("7", "7"), env());
    let text = oom_text(&t);
    assert!(
        text.contains("the failed request was in one of PyTorch's private pools"),
        "{text}"
    );
    assert!(!text.contains("of them serve it"), "{text}");
}

/// Runs `script` under the shim with the stand-in libtorch_cpu.so's path as its first argument
/// (then `more`), tracing to `trace`, with `env`.
fn run_with_autograd(script: &Path, trace: &Path, more: &[String], env: Vec<(&str, String)>) {
    let autograd = sim().dir.join("torch/lib/libtorch_cpu.so");
    let mut args = vec![script.display().to_string(), autograd.display().to_string()];
    args.extend(more.iter().cloned());
    let out = run(
        Path::new("python3"),
        Run {
            preload: true,
            trace: Some(trace),
            args,
            env,
        },
    );
    assert_ok(&out);
}

/// A tensor the autograd thread allocates for a node is joined to the Python line of the
/// forward op that made the node: the forward's output recorded the sequence number after the
/// node's, the backward the node's own + 1 (the stand-ins for libtorch_cpu.so and c10). Two ops
/// from two lines: each backward tensor names its own line.
#[test]
fn a_backward_tensor_names_the_forward_line_that_made_its_node() {
    let dir = tempdir("tensor-backward-forward");
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        "import ctypes, sys\n\
         autograd = ctypes.CDLL(sys.argv[1])\n\
         autograd.standin_forward_mm.restype = ctypes.c_void_p\n\
         autograd.standin_forward_mm.argtypes = (ctypes.c_size_t,)\n\
         autograd.standin_backward_kept.argtypes = (ctypes.c_size_t,)\n\
         h1 = autograd.standin_forward_mm(1 << 20)\n\
         h2 = autograd.standin_forward_mm(1 << 20)\n\
         autograd.standin_backward_kept(2 << 20)\n",
    )
    .unwrap();
    let t = dir.join("f.trace");
    run_with_autograd(&script, &t, &[], vec![]);
    let v = report("leaks", &t);
    let text = v.to_string();
    let live = v["live_at_exit"]
        .as_array()
        .unwrap_or_else(|| panic!("{text}"));
    for line in [6, 7] {
        let site = format!("MmBackward0 (autograd's backward) < train.py:{line} in <module>");
        let found = live
            .iter()
            .find(|h| h["label"].as_str().is_some_and(|s| s.contains(&site)))
            .unwrap_or_else(|| panic!("no {site} in {text}"));
        assert_eq!(found["bytes"].as_u64(), Some(2 << 20), "{found}");
    }
    // Only the program's own frames shown: the backward function stays, so a gradient is not
    // taken for its forward line's activation.
    let own = report_json(&["leaks", "--program-frames"], &[&t]).to_string();
    for line in [6, 7] {
        let site = format!("MmBackward0 (autograd's backward) < train.py:{line} in <module>");
        assert!(own.contains(&site), "no {site} in {own}");
    }
}

/// The join survives the ring: in a trace of 4 MiB the backward tensors made before 60,000 more
/// allocations are known from the checkpoint alone, and still name their forward lines. The
/// loop pauses 20 ms every 1,000 allocations, so that its summarizer keeps up however loaded the
/// machine (the ring holds about 40,000 of them).
#[test]
fn a_backward_tensors_forward_line_survives_a_checkpoint() {
    let dir = tempdir("tensor-backward-ring");
    let script = dir.join("ring.py");
    std::fs::write(
        &script,
        "import ctypes, sys, time\n\
         autograd = ctypes.CDLL(sys.argv[1])\n\
         lib = ctypes.CDLL(sys.argv[2])\n\
         autograd.standin_forward_mm.argtypes = (ctypes.c_size_t,)\n\
         autograd.standin_backward_kept.argtypes = (ctypes.c_size_t,)\n\
         lib.standin_malloc.restype = ctypes.c_void_p\n\
         lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
         lib.standin_free.argtypes = (ctypes.c_void_p,)\n\
         h1 = autograd.standin_forward_mm(1 << 20)\n\
         h2 = autograd.standin_forward_mm(1 << 20)\n\
         autograd.standin_backward_kept(2 << 20)\n\
         for i in range(60000):\n\
         \x20   lib.standin_free(lib.standin_malloc(4096))\n\
         \x20   if i % 1000 == 999:\n\
         \x20       time.sleep(0.02)\n",
    )
    .unwrap();
    let t = dir.join("r.trace");
    let conf = vec![("GPUSHIM_CONF", "trace_max:4MiB".to_string())];
    run_with_autograd(&script, &t, &[standin().display().to_string()], conf);
    let s = report("summary", &t);
    assert!(s["health"]["summarized"].as_u64().unwrap() > 100_000, "{s}");
    assert_eq!(s["health"]["unsummarized"].as_u64(), Some(0), "{s}");
    let v = report("leaks", &t);
    let text = v.to_string();
    for line in [9, 10] {
        let site = format!("MmBackward0 (autograd's backward) < ring.py:{line} in <module>");
        assert!(text.contains(&site), "no {site} in {text}");
    }
}

/// A tensor PyTorch's autograd thread allocates (no Python runs there) is named by the backward
/// function that asked, read from `get_current_node()` (the stand-in for libtorch_cpu.so); the
/// forward's tensors keep their Python lines.
#[test]
fn a_tensor_made_in_backward_is_named_by_its_backward_function() {
    let dir = tempdir("tensor-backward");
    let script = dir.join("train.py");
    std::fs::write(
        &script,
        "import ctypes, sys\n\
         autograd = ctypes.CDLL(sys.argv[1])\n\
         lib = ctypes.CDLL(sys.argv[2])\n\
         lib.standin_malloc.restype = ctypes.c_void_p\n\
         lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
         autograd.standin_backward.restype = ctypes.c_void_p\n\
         autograd.standin_backward.argtypes = (ctypes.c_size_t,)\n\
         x = lib.standin_malloc(1 << 20)\n\
         g = autograd.standin_backward(3 << 20)\n",
    )
    .unwrap();
    let t = dir.join("b.trace");
    run_with_autograd(&script, &t, &[standin().display().to_string()], vec![]);
    let v = report("leaks", &t);
    let text = v.to_string();
    for (site, bytes) in [
        ("MmBackward0 (autograd's backward)", 3u64 << 20),
        ("AddBackward0 (autograd's backward)", 3u64 << 19),
        ("train.py:8 in <module>", 1u64 << 20),
    ] {
        let found = v["live_at_exit"]
            .as_array()
            .unwrap_or_else(|| panic!("{text}"))
            .iter()
            .find(|h| h["label"].as_str().is_some_and(|s| s.contains(site)))
            .unwrap_or_else(|| panic!("no {site} in {text}"));
        assert_eq!(found["bytes"].as_u64(), Some(bytes), "{found}");
    }
}

#[test]
fn config_shows_every_key_and_a_closed_pipe_ends_it_quietly() {
    let out = Command::new(gpushim_bin())
        .args(["config", "trim:2s,tensors:off"])
        .output()
        .unwrap();
    assert_ok(&out);
    let text = stdout(&out);
    for key in gpushim::config::KEYS {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(key.key)),
            "{} missing from:\n{text}",
            key.key
        );
    }
    assert!(
        text.contains("trim       2.0 s") || text.contains("trim       2"),
        "{text}"
    );
    assert!(text.contains("tensors    off"), "{text}");
    let piped = Command::new("bash")
        .arg("-c")
        .arg(format!("'{}' config | head -1", gpushim_bin().display()))
        .arg("")
        .output()
        .unwrap();
    assert!(piped.status.success());
    let err = stderr(&piped);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn filters_narrow_the_frameworks_tensors_and_refuse_what_keeps_none() {
    let (t, _) = leaky_run("tensor-filters", &standin(), vec![]);
    // Nothing on device 7, no such range: refused with what the trace holds, as for calls.
    for args in [
        vec!["peak", "--device", "7"],
        vec!["leaks", "--range", "no-such-range"],
    ] {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|s| s as _).collect();
        a.push(&t);
        let o = gpushim(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stdout(&o));
        assert!(
            stderr(&o).contains("the filters keep no allocation")
                && stderr(&o).contains("device 0"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    // A window over the second half keeps the leaks made in it only: fewer tensors live.
    let all = report("summary", &t)["framework"][0]["tensors_at_end"]
        .as_u64()
        .unwrap();
    let (records, _) = decode(&t);
    let times: Vec<u64> = records
        .iter()
        .filter(|r| r.kind == gpushim::trace::format::RecordKind::TensorAlloc)
        .map(|r| r.time_ns)
        .collect();
    let from = format!("{}ns", times[times.len() / 2]);
    let live = |v: &serde_json::Value| -> u64 {
        v["live_at_exit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["allocations"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(live(&report("leaks", &t)), all);
    let v = report_json(&["leaks", "--from", &from], &[&t]);
    assert!(live(&v) > 0 && live(&v) < all, "{} of {all}: {v}", live(&v));
}

#[test]
fn what_is_live_never_exceeds_what_is_reserved() {
    // PyTorch's segment is a cudaMalloc before its segment record says so: live for that
    // moment, and reserved as well (as is any call's memory outside a pool).
    let (t, _) = leaky_run("live-under-reserved", &standin(), vec![]);
    let p = report("peak", &t);
    let d = &p[0];
    let (live, reserved) = (
        d["live_bytes"].as_u64().unwrap(),
        d["reserved_bytes"].as_u64().unwrap(),
    );
    assert!(live > 0 && live <= reserved, "{p}");
    let s = report("summary", &t);
    assert_eq!(
        reserved,
        s["framework"][0]["reserved_peak_bytes"].as_u64().unwrap(),
        "{s}"
    );
}

#[test]
fn pytorchs_viewer_gets_its_segments_and_tensors_and_no_block_that_was_a_segment() {
    let (t, _) = leaky_run("viz-segments", &standin(), vec![]);
    let mut pickle = Vec::new();
    gpushim::export::memory_viz(&t, &mut pickle, (4, 100_000), &Default::default()).unwrap();
    let v: serde_pickle::Value =
        serde_pickle::from_slice(&pickle, serde_pickle::DeOptions::new()).unwrap();
    // Count each action of the device's trace.
    let text = format!("{v:?}");
    let count = |action: &str| text.matches(&format!("String(\"{action}\")")).count();
    let (records, _) = decode(&t);
    let of = |k: gpushim::trace::format::RecordKind| records.iter().filter(|r| r.kind == k).count();
    use gpushim::trace::format::RecordKind::*;
    assert_eq!(count("alloc"), of(TensorAlloc), "{text:.2000}");
    assert_eq!(count("free_completed"), of(TensorFree), "{text:.2000}");
    assert_eq!(count("segment_alloc"), of(SegmentReserve), "{text:.2000}");
    assert!(of(SegmentReserve) > 0 && of(TensorFree) > 0);
}
