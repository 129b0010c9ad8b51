//! Where the device memory went: each allocation's owner (the library that asked CUDA), NVML's
//! figure split by owner at its peak and at exit, and across ranks the one closest to its
//! device's limit. On the simulator, whose NVML counts the process's allocations and a 512 MiB
//! context (tests/sim/nvml_sim.c).

use crate::common::*;

/// Every device allocation knows its owner, the library whose code asked CUDA for it, also
/// with stacks off: a library named like NCCL's keeps 12 MiB (runtime and driver calls), the
/// program 2 MiB, in every pool mode.
#[test]
fn memory_held_at_exit_is_named_by_the_library_that_asked_for_it() {
    for conf in ["", "pool:caching", "stacks:off"] {
        let t = tempdir("owners").file("o.trace");
        let out = run(
            &sim().dir.join("owners/owners"),
            Run {
                preload: true,
                trace: Some(&t),
                env: vec![("GPUSHIM_CONF", conf.to_string())],
                ..Run::default()
            },
        );
        assert_ok(&out);
        let v = report_json(&["summary"], &[&t]);
        let held: Vec<(String, u64, u64)> = v["held_at_exit"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["owner"].as_str().unwrap().to_string(),
                    h["bytes"].as_u64().unwrap(),
                    h["allocations"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            held,
            vec![
                ("NCCL".to_string(), 12 << 20, 2),
                ("the program".to_string(), 2 << 20, 1)
            ],
            "'{conf}'"
        );
        let text = stdout(&gpushim(&[&"summary", &t]));
        assert!(
            text.contains("held at exit on device 0: NCCL 12.00 MiB, the program 2.00 MiB"),
            "{text}"
        );
    }
}

/// A library's stream-ordered memory (`cudaMallocAsync`) is named by the library too.
#[test]
fn stream_ordered_memory_is_named_by_the_library_that_asked_for_it() {
    for conf in ["", "pool:caching"] {
        let t = tempdir("owners-async").file("o.trace");
        let out = run(
            &sim().dir.join("owners/owners"),
            Run {
                preload: true,
                trace: Some(&t),
                env: vec![
                    ("GPUSHIM_CONF", conf.to_string()),
                    ("OWNER_ASYNC", "1".to_string()),
                ],
                ..Run::default()
            },
        );
        assert_ok(&out);
        let v = report_json(&["summary"], &[&t]);
        let nccl = v["held_at_exit"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["owner"] == "NCCL")
            .cloned()
            .unwrap_or_default();
        assert_eq!(nccl["bytes"], 14u64 << 20, "'{conf}': {v}");
        assert_eq!(nccl["allocations"], 3, "'{conf}': {v}");
    }
}

/// The device's own figure (NVML's, the simulator's here: the process's allocations plus its
/// 512 MiB context) kept in the trace and split by owner at its peak (64 MiB more of the
/// program's, held for a while) and at exit, the rest named as made by no allocating call; the
/// parts add up to NVML's figure. The 64 MiB allocation returns 300 ms after the simulator
/// counted it (`GPUSHIM_SIM_RETURN_MS`), so the sampler runs while NVML already has it and
/// its record is not yet written: the sample must wait for the record, whatever the load. And
/// with 32 MiB taken (also late) and freed just before (`OWNER_FIRST`): a sample that began to
/// wait during that call sees calls end, then the 64 MiB one under way at look after look, and
/// must wait for it still, not take the calls for a stream that never pauses.
#[test]
fn nvmls_figure_is_split_by_owner_at_its_peak_and_at_exit() {
    split_by_owner(&[]);
    split_by_owner(&[("OWNER_FIRST", "1")]);
}

fn split_by_owner(more: &[(&'static str, &str)]) {
    let t = tempdir("nvml").file("n.trace");
    let mut env = vec![("GPUSHIM_SIM_RETURN_MS", "300".to_string())];
    env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    let out = run(
        &sim().dir.join("owners/owners"),
        Run {
            preload: true,
            trace: Some(&t),
            args: vec!["450".into()],
            env,
        },
    );
    assert_ok(&out);
    let v = report_json(&["summary"], &[&t]);
    let m = &v["device_memory"][0];
    assert_eq!(m["device"], 0, "{v}");
    assert_eq!(m["device_wide"], false);
    let parts = |r: &serde_json::Value| -> Vec<(String, u64)> {
        r["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["owner"].as_str().unwrap().to_string(),
                    p["bytes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let (peak, exit) = (&m["at_peak"], &m["at_exit"]);
    assert_eq!(peak["nvml_bytes"], (512u64 + 14 + 64) << 20, "{m}");
    assert_eq!(
        parts(peak),
        vec![
            ("the program".to_string(), 66 << 20),
            ("NCCL".to_string(), 12 << 20)
        ],
        "{m}"
    );
    assert_eq!(peak["not_allocated_bytes"], 512u64 << 20, "{m}");
    assert_eq!(exit["nvml_bytes"], (512u64 + 14) << 20, "{m}");
    assert_eq!(
        parts(exit),
        vec![
            ("NCCL".to_string(), 12 << 20),
            ("the program".to_string(), 2 << 20)
        ],
        "{m}"
    );
    assert_eq!(exit["held_bytes"], 14u64 << 20, "{m}");
    assert_eq!(exit["not_allocated_bytes"], 512u64 << 20, "{m}");
    for r in [peak, exit] {
        let sum: u64 =
            parts(r).iter().map(|p| p.1).sum::<u64>() + r["not_allocated_bytes"].as_u64().unwrap();
        assert_eq!(r["nvml_bytes"].as_u64().unwrap(), sum, "{r}");
    }
    assert!(
        peak["time_ns"].as_u64().unwrap() < exit["time_ns"].as_u64().unwrap(),
        "{m}"
    );
    let text = stdout(&gpushim(&[&"summary", &t]));
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .map(|l| {
                l.split_whitespace()
                    .rev()
                    .take(4)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    assert_eq!(row("the program"), "MiB 2.00 MiB 66.00", "{text}");
    assert_eq!(row("NCCL"), "MiB 12.00 MiB 12.00", "{text}");
    assert_eq!(row("no allocating call"), "MiB 512.00 MiB 512.00", "{text}");
    assert_eq!(row("= NVML"), "MiB 526.00 MiB 590.00", "{text}");
}

/// CUDA's default pool, its graph memory and the pools a program creates reserve in chunks
/// (the simulator's are 32 MiB, as on the GPU): the part their allocations leave unused is
/// named, so what no allocating call made is the CUDA context alone, whether the program
/// allocates stream-ordered or not.
#[test]
fn memory_cudas_own_pool_reserves_is_named_and_the_rest_stays_the_context() {
    let rest = |async_too: bool| -> (serde_json::Value, u64) {
        let t = tempdir(if async_too { "pool-async" } else { "pool-sync" }).file("p.trace");
        let mut env = vec![];
        if async_too {
            env.push(("OWNER_ASYNC", "1".to_string()));
            env.push(("OWNER_GRAPH", "1".to_string()));
            env.push(("OWNER_POOLS", "1".to_string()));
        }
        let v = owners_summary(&t, env);
        let exit = v["device_memory"][0]["at_exit"].clone();
        let rest = exit["not_allocated_bytes"].as_u64().unwrap();
        (exit, rest)
    };
    let (plain, plain_rest) = rest(false);
    let (pooled, pooled_rest) = rest(true);
    assert_eq!(plain_rest, 512 << 20, "{plain}");
    assert_eq!(pooled_rest, 512 << 20, "{pooled}");
    let part = |r: &serde_json::Value, name: &str| {
        r["parts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["owner"] == name)
            .and_then(|p| p["bytes"].as_u64())
    };
    // 2 MiB taken stream-ordered, 2 MiB by a graph's memory node and 2 MiB from a pool the
    // program created (two more created, one destroyed, hold nothing): each chunk holds 30 MiB
    // more.
    assert_eq!(
        part(&pooled, "the program's CUDA pools, unused"),
        Some(30 << 20),
        "{pooled}"
    );
    assert_eq!(
        part(&pooled, "CUDA's stream-ordered pool, unused"),
        Some(30 << 20),
        "{pooled}"
    );
    assert_eq!(
        part(&pooled, "CUDA's graph memory, unused"),
        Some(30 << 20),
        "{pooled}"
    );
    assert_eq!(part(&plain, "CUDA's stream-ordered pool, unused"), None);
}

/// `summary --json` of the owners program (holding 64 MiB more for 450 ms) run under the shim
/// with `env`, traced to `trace`.
fn owners_summary(trace: &std::path::Path, env: Vec<(&str, String)>) -> serde_json::Value {
    let out = run(
        &sim().dir.join("owners/owners"),
        Run {
            preload: true,
            trace: Some(trace),
            args: vec!["450".into()],
            env,
        },
    );
    assert_ok(&out);
    report_json(&["summary"], &[trace])
}

/// A graph built node by node (`cudaGraphAddMemAllocNode`, not a capture) takes its memory as
/// the graph's: the allocation is the program's, named by who asked, and the graph memory's
/// chunk beyond it is named; a memory node freed by a free node of its graph is not live.
#[test]
fn a_graphs_memory_node_added_directly_is_the_programs_and_the_rest_stays_the_context() {
    let t = tempdir("graph-node").file("n.trace");
    let v = owners_summary(&t, vec![("OWNER_NODE", "1".to_string())]);
    let exit = &v["device_memory"][0]["at_exit"];
    assert_eq!(
        exit["not_allocated_bytes"].as_u64(),
        Some(512 << 20),
        "{exit}"
    );
    let part = |name: &str| {
        exit["parts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["owner"] == name)
            .and_then(|p| p["bytes"].as_u64())
    };
    // 2 MiB the program's own plus 2 MiB of the node still live; both nodes share one 32 MiB
    // chunk of graph memory, and the one its graph frees is the graph's to use again: unused.
    assert_eq!(part("the program"), Some(4 << 20), "{exit}");
    assert_eq!(
        part("CUDA's graph memory, unused"),
        Some(30 << 20),
        "{exit}"
    );
}

/// Across the ranks of a job, the one that came closest to its device's limit is named with
/// its headroom: rank 1's CUDA context is 1 GiB larger here, so its NVML peak is the higher.
#[test]
fn the_rank_closest_to_its_devices_limit_is_named_with_its_headroom() {
    let dir = tempdir("headroom");
    let traces: Vec<_> = [("0", "536870912"), ("1", "1610612736")]
        .iter()
        .map(|(rank, context)| {
            let t = dir.join(format!("r{rank}.trace"));
            let out = run(
                &sim().dir.join("owners/owners"),
                Run {
                    preload: true,
                    trace: Some(&t),
                    args: vec!["300".into()],
                    env: vec![
                        ("RANK", rank.to_string()),
                        ("GPUSHIM_SIM_CONTEXT_BYTES", context.to_string()),
                    ],
                },
            );
            assert_ok(&out);
            t
        })
        .collect();
    let v = report_json(&["summary"], &[&traces[0], &traces[1]]);
    let ranks = v["combined"]["ranks_by_headroom"].as_array().unwrap();
    let got: Vec<(i64, u64, u64)> = ranks
        .iter()
        .map(|r| {
            (
                r["rank"].as_i64().unwrap(),
                r["nvml_peak_bytes"].as_u64().unwrap() >> 20,
                r["headroom_bytes"].as_u64().unwrap() >> 20,
            )
        })
        .collect();
    let total = ranks[0]["device_total_bytes"].as_u64().unwrap() >> 20;
    assert_eq!(
        got,
        vec![
            (1, 1536 + 78, total - 1536 - 78),
            (0, 512 + 78, total - 512 - 78)
        ],
        "{v}"
    );
    let text = stdout(&gpushim(&[&"summary", &traces[0], &traces[1]]));
    assert!(
        text.contains("closest to its device's limit: rank 1 on device 0, NVML peak 1.58 GiB"),
        "{text}"
    );
}

/// A program of the runtime API alone (the simulator's runtime loads its driver privately, as
/// the real one does) still gets NVML's figure and its split.
#[test]
fn a_runtime_api_program_gets_nvmls_figure_too() {
    let t = tempdir("nvml-runtime").file("rt.trace");
    let out = run(
        &sim().bin("train_loop"),
        Run {
            preload: true,
            trace: Some(&t),
            // Slow enough (1 ms a call, about 0.4 s in all) that NVML's sampler, which looks
            // within 50 ms of an allocation, sees the program even on a loaded machine.
            env: vec![("GPUSHIM_SIM_LATENCY_US", "1000".into())],
            args: vec!["30".into()],
        },
    );
    assert_ok(&out);
    let v = report_json(&["summary"], &[&t]);
    let m = &v["device_memory"][0];
    // NVML is sampled, never at exit: its last figure is the context's 512 MiB and what the
    // program held at that sample, at most its peak, and what CUDA's stream-ordered pool held
    // beyond its allocations then (it reserves whole 32 MiB chunks: a sample while the
    // program's `cudaMallocAsync` blocks were live counts their chunk, past the live bytes).
    let nvml = m["at_exit"]["nvml_bytes"].as_u64().unwrap_or(0);
    let peak = v["devices"][0]["peak_live_bytes"].as_u64().unwrap();
    let pool_chunk = 32u64 << 20;
    assert!(
        nvml > 512 << 20 && nvml <= (512 << 20) + peak + pool_chunk,
        "NVML's figure, for a program of the runtime alone: {v}"
    );
    // At exit the program holds its 30 MiB; CUDA's pool may be seen holding a chunk beyond
    // its allocations or not, as the sampler last looked (a moment the test cannot pick).
    let parts = m["at_exit"]["parts"].as_array().unwrap();
    let program = parts
        .iter()
        .find(|p| p["owner"] == "the program")
        .unwrap_or_else(|| panic!("the program's part: {v}"));
    assert_eq!(program["bytes"], 30 << 20, "{v}");
    let others: u64 = parts
        .iter()
        .filter(|p| p["owner"] != "the program")
        .map(|p| {
            assert!(
                p["owner"].as_str().unwrap_or("").starts_with("CUDA's"),
                "only CUDA's own pools beside the program: {v}"
            );
            p["bytes"].as_u64().unwrap()
        })
        .sum();
    assert_eq!(
        m["at_exit"]["held_bytes"].as_u64(),
        Some((30 << 20) + others),
        "{v}"
    );
}

/// NVML's figure at exit is its last sample: where the allocations moved by a MiB or more
/// after it (a run that ended before the sampler looked again), that sample is of an earlier
/// moment, so no NVML figure is given at exit and no rest is taken from it; where nothing
/// moved after it, the column stands.
#[test]
fn an_nvml_sample_older_than_the_last_allocations_gives_no_figure_at_exit() {
    use gpushim::trace::format::{Api, RecordKind};
    let dir = tempdir("nvml-stale");
    let trace = |name: &str, after: bool| {
        let path = dir.join(name);
        let mut t = HandTrace::create(&path);
        t.rec(RecordKind::DeviceMemory, Api::Shim, 512 << 20, 80 << 30);
        t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x1000_0000, 64 << 20);
        t.rec(RecordKind::DeviceMemory, Api::Shim, 576 << 20, 80 << 30);
        if after {
            // 224 MiB more, and the run ends before NVML is sampled again.
            t.rec(RecordKind::Alloc, Api::CudaMalloc, 0x2000_0000, 224 << 20);
        }
        drop(t);
        path
    };
    let stale = trace("stale.trace", true);
    let text = stdout(&gpushim(&[&"summary", &stale]));
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {text}"))
            .split_whitespace()
            .last()
            .unwrap()
            .to_string()
    };
    assert_eq!(row("= NVML"), "-", "{text}");
    assert_eq!(row("no allocating call"), "-", "{text}");
    assert!(
        text.contains("NVML's last sample, 576.00 MiB at")
            && text.contains("no NVML figure at exit"),
        "{text}"
    );
    let v = report_json(&["summary"], &[&stale]);
    assert_eq!(
        v["device_memory"][0]["at_exit"]["sampled_before"], true,
        "{v}"
    );
    // Sampled after the last allocation: the exit column gives NVML's figure and the rest.
    let fresh = trace("fresh.trace", false);
    let text = stdout(&gpushim(&[&"summary", &fresh]));
    assert!(!text.contains("no NVML figure at exit"), "{text}");
    let exit = text
        .lines()
        .find(|l| l.trim_start().starts_with("= NVML"))
        .unwrap();
    assert!(exit.trim_end().ends_with("576.00 MiB"), "{text}");
}
