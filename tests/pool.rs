//! The pool in the shim, on the simulator: safe reuse while simulated kernels still use freed
//! memory (contract 3), out-of-memory retry and failure with the runtime's last error, `limit`
//! and `cudaMemGetInfo` virtualization, pointer queries and IPC on pooled blocks (contract 2),
//! pass-through when the pool is off, and the PyTorch pluggable-allocator entry points.

use crate::common::*;
use gpushim::trace::format::RecordKind;
use std::collections::HashMap;

fn values(out: &std::process::Output) -> HashMap<String, i64> {
    stdout(out)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(i64::MIN)))
        .collect()
}

/// `gpushim summary --json` of a trace.
fn summary_json(trace: &std::path::Path) -> serde_json::Value {
    report_json(&["summary"], &[trace])
}

/// Runs the pool client under the shim; `pool:caching` unless `env` sets `GPUSHIM_CONF` (the
/// default configuration passes every call through).
fn pool_run(
    args: &[&str],
    mut env: Vec<(&'static str, String)>,
    trace: Option<&std::path::Path>,
) -> std::process::Output {
    if !env.iter().any(|(k, _)| *k == "GPUSHIM_CONF") {
        env.push(("GPUSHIM_CONF", "pool:caching".into()));
    }
    let out = run(
        &sim().bin("pool"),
        Run {
            preload: true,
            trace,
            env,
            args: args.iter().map(|s| s.to_string()).collect(),
        },
    );
    assert_ok(&out);
    out
}

#[test]
fn freed_memory_is_never_handed_out_while_a_kernel_may_still_use_it() {
    let out = pool_run(&["reuse", "200"], vec![], None);
    let v = values(&out);
    assert_eq!(v["violations"], 0, "{}", stdout(&out));
    // Checkpoints of one event for the whole context.
    let ctx = pool_run(
        &["reuse", "200"],
        vec![("GPUSHIM_CTX_EVENTS", "1".into())],
        None,
    );
    assert_eq!(values(&ctx)["violations"], 0, "{}", stdout(&ctx));
    // Stream-ordered frees are reused at once on their own stream...
    assert!(v["same_stream_reuse"] > 150, "{}", stdout(&out));
    // ...and the host never waited for the GPU while the device had room: the loop never
    // synchronizes and its kernels outlast an iteration, so blocks freed with cudaFree are still
    // fenced when asked for again, and fresh memory serves (fewer device allocations than the
    // 400 of the same run without a pool all the same).
    assert!(v["device_allocs"] < 200, "{}", stdout(&out));
    // Under a limit the pool waits for fences and gives idle memory back instead, and still
    // never hands out a block in use.
    let out = pool_run(
        &["reuse", "200"],
        vec![("GPUSHIM_CONF", "pool:caching,limit:32MiB".into())],
        None,
    );
    let v = values(&out);
    assert_eq!(v["violations"], 0, "{}", stdout(&out));
}

#[test]
fn without_the_shim_the_same_program_allocates_on_the_device_every_time() {
    // The reuse check can fail: without a pool every cudaMalloc goes to the device (and real
    // cudaFree waits for the device, so nothing is in use either).
    let out = run(
        &sim().bin("pool"),
        Run {
            args: vec!["reuse".into(), "50".into()],
            ..Run::default()
        },
    );
    assert_ok(&out);
    let v = values(&out);
    assert_eq!(v["violations"], 0);
    // Two cudaMalloc a round reach cuMemAlloc_v2 (the three stream-ordered ones go to the
    // simulator's own stream-ordered pool).
    assert_eq!(v["device_allocs"], 50 * 2, "{}", stdout(&out));
}

#[test]
fn out_of_memory_releases_the_cache_retries_and_then_fails_like_cuda() {
    let dir = tempdir("pool-oom");
    let t = dir.join("oom.trace");
    let out = pool_run(
        &["oom"],
        vec![("GPUSHIM_SIM_MEMORY", (64u64 << 20).to_string())],
        Some(&t),
    );
    let v = values(&out);
    assert_eq!(v["first"], 0);
    assert_eq!(v["retry"], 0, "the cached 30 MiB went back and 50 MiB fit");
    assert_eq!((v["oom"], v["null"], v["last"], v["then"]), (2, 1, 2, 0));
    assert_eq!((v["driver_oom"], v["zero"]), (2, 1));
    let (records, _) = decode(&t);
    let kinds: Vec<RecordKind> = records.iter().map(|r| r.kind).collect();
    assert!(kinds.contains(&RecordKind::OomRetry), "{kinds:?}");
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == RecordKind::OutOfMemory)
            .count(),
        2
    );
    // The failed calls are recorded with their code.
    let failed = calls(&records).iter().filter(|r| r.status == 2).count();
    assert_eq!(failed, 2);
}

#[test]
fn the_limit_caps_memory_and_mem_get_info_shows_the_capped_device() {
    let dir = tempdir("pool-limit");
    let t = dir.join("limit.trace");
    let out = pool_run(
        &["limit"],
        vec![("GPUSHIM_CONF", "pool:caching,limit:100MiB".into())],
        Some(&t),
    );
    let v = values(&out);
    assert_eq!((v["start_free_mib"], v["start_total_mib"]), (100, 100));
    assert_eq!(v["live60_free_mib"], 40);
    // Idle cached memory counts as free; the driver's figure agrees with the runtime's.
    assert_eq!(v["freed_free_mib"], 100);
    assert_eq!((v["driver_free_mib"], v["driver_total_mib"]), (100, 100));
    assert_eq!(v["second60"], 0);
    assert_eq!((v["third60"], v["last"], v["null"]), (2, 2, 1));
    let (records, _) = decode(&t);
    assert!(records.iter().any(|r| r.kind == RecordKind::LimitHit));
    // The real figures are recorded beside the ones shown.
    assert!(records.iter().any(|r| r.kind == RecordKind::MemInfo));
    assert!(records.iter().any(|r| r.kind == RecordKind::MemInfoShown));
}

#[test]
fn pointer_queries_answer_for_the_block() {
    let out = pool_run(&["query"], vec![], None);
    let v = values(&out);
    assert_eq!((v["range"], v["base_is_block"], v["size"]), (0, 1, 3000));
    assert_eq!((v["attr"], v["start_is_block"]), (0, 1));
    assert_eq!((v["ipc_sub_block"], v["ipc_segment_start"]), (0, 0));
}

fn ipc_run(args: &[&str], conf: &str, trace: Option<&std::path::Path>) -> HashMap<String, i64> {
    let out = run(
        &sim().bin("ipc"),
        Run {
            preload: true,
            trace,
            env: vec![("GPUSHIM_CONF", conf.to_string())],
            args: args.iter().map(|s| s.to_string()).collect(),
        },
    );
    assert_ok(&out);
    let v = values(&out);
    assert!(
        v.contains_key("peer_ok"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    v
}

#[test]
fn pooled_blocks_shared_through_ipc_reach_the_peer_as_the_same_memory() {
    let dir = tempdir("ipc");
    let trace = dir.join("ipc-%p.trace");
    let v = ipc_run(&[], "pool:caching", Some(&trace));
    // Three blocks of one segment: the first exports as the segment, the others as tickets.
    assert_eq!(
        (v["ticket0"], v["ticket1"], v["ticket2"]),
        (0, 1, 1),
        "{v:?}"
    );
    // The peer (under the shim) sees each block's own contents, writes into the second, and
    // the exporter sees the write in that block only. The simulator refuses a second open of
    // one allocation in a process, so the three opens shared one mapping.
    assert_eq!((v["open0"], v["open1"], v["open2"]), (0, 0, 0), "{v:?}");
    assert_eq!((v["close0"], v["close1"], v["close2"]), (0, 0, 0), "{v:?}");
    assert_eq!(
        (v["peer_ok"], v["peer_wrote"], v["others_intact"]),
        (1, 1, 1),
        "{v:?}"
    );
    // Both processes traced: the export in one, the opens and closes in the other.
    let mut kinds = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        kinds.extend(decode(&entry.unwrap().path()).0.iter().map(|r| r.kind));
    }
    let count = |k| kinds.iter().filter(|&&x| x == k).count();
    assert_eq!(count(RecordKind::IpcExport), 3);
    assert_eq!(count(RecordKind::IpcOpen), 3);
    assert_eq!(count(RecordKind::IpcClose), 3);
}

#[test]
fn a_peer_without_the_shim_cannot_open_a_ticket_and_never_gets_the_wrong_memory() {
    let v = ipc_run(&["--plain-peer"], "pool:caching", None);
    // The block that starts its segment is a real handle and works; the tickets are refused
    // by CUDA itself.
    assert_eq!(v["open0"], 0, "{v:?}");
    assert_ne!(v["open1"], 0, "{v:?}");
    assert_ne!(v["open2"], 0, "{v:?}");
    assert_eq!((v["peer_ok"], v["peer_wrote"]), (0, 0), "{v:?}");
}

#[test]
fn without_a_pool_ipc_passes_through_unchanged() {
    let v = ipc_run(&[], "pool:off", None);
    assert_eq!(
        (v["ticket0"], v["ticket1"], v["ticket2"]),
        (0, 0, 0),
        "{v:?}"
    );
    assert_eq!(
        (v["peer_ok"], v["peer_wrote"], v["others_intact"]),
        (1, 1, 1),
        "{v:?}"
    );
    let plain = ipc_run(&["--plain-peer"], "pool:off", None);
    assert_eq!((plain["peer_ok"], plain["peer_wrote"]), (1, 1), "{plain:?}");
}

#[test]
fn the_pool_serves_repeated_allocations_and_pool_off_passes_every_call_through() {
    let pooled = values(&pool_run(&["count", "500"], vec![], None));
    assert!(pooled["device_allocs"] <= 2, "{pooled:?}");
    let off = values(&pool_run(
        &["count", "500"],
        vec![("GPUSHIM_CONF", "pool:off".into())],
        None,
    ));
    assert_eq!(off["device_allocs"], 500);
}

#[test]
fn the_pytorch_pluggable_allocator_entry_points_pool_even_with_pool_off() {
    let out = pool_run(
        &["pluggable"],
        vec![("GPUSHIM_CONF", "pool:off".into())],
        None,
    );
    let v = values(&out);
    assert_eq!((v["alloc_ok"], v["reused_on_stream"]), (1, 1));
    assert_eq!(v["device_allocs"], 1);
    // `GPUSHIM_COSTS=1` counts the entry points as the allocation and free hooks: 2 each.
    let out = pool_run(&["pluggable"], vec![("GPUSHIM_COSTS", "1".into())], None);
    let err = stderr(&out);
    for work in ["malloc hook", "free hook"] {
        let line = err.lines().find(|l| l.contains(work));
        let calls = line.and_then(|l| l.split_whitespace().rev().nth(2));
        assert_eq!(calls, Some("2"), "{work}: {err}");
    }
}

#[test]
fn sizes_near_two_to_the_64_are_out_of_memory_and_never_a_cached_block() {
    // Without the shim: the simulator's own answer.
    let plain = run(
        &sim().bin("pool"),
        Run {
            args: vec!["huge".into()],
            ..Run::default()
        },
    );
    assert_eq!(values(&plain)["wrong"], 0, "{}", stdout(&plain));
    for conf in [
        "pool:caching",
        "pool:caching,round:pow2",
        "pool:caching,round:pow2_4",
        "pool:expandable",
        "pool:expandable,round:pow2",
    ] {
        let out = pool_run(&["huge"], vec![("GPUSHIM_CONF", conf.into())], None);
        assert_eq!(values(&out)["wrong"], 0, "{conf}: {}", stdout(&out));
    }
}

#[test]
fn a_legacy_stream_only_process_reuses_freed_blocks_at_once_and_streams_end_that_safely() {
    for conf in ["pool:caching", "pool:expandable"] {
        let out = pool_run(&["legacy"], vec![("GPUSHIM_CONF", conf.into())], None);
        let v = values(&out);
        // The block freed while its 100 ms kernel runs comes back at once, with no wait.
        assert_eq!(v["reused_legacy"], 1, "{conf}: {}", stdout(&out));
        assert!(v["waited_ms"] < 50, "{conf}: {}", stdout(&out));
        // Once another stream exists, nothing still in use reaches it.
        assert_eq!(v["in_use_on_new_stream"], 0, "{conf}: {}", stdout(&out));
    }
}

#[test]
fn the_off_switch_also_turns_the_pluggable_allocator_into_plain_cuda_calls_and_writes_nothing() {
    let dir = tempdir("pluggable-off");
    let t = dir.join("t.trace");
    let out = pool_run(
        &["pluggable"],
        vec![("GPUSHIM_DISABLE", "1".into())],
        Some(&t),
    );
    let v = values(&out);
    assert_eq!(v["alloc_ok"], 1);
    assert_eq!(v["device_allocs"], 2, "no pooling: CUDA served both");
    assert!(!t.exists(), "no trace");
    assert_eq!(stderr(&out), "", "and nothing said");
}

#[test]
fn the_expandable_pool_keeps_the_same_promises_and_grows_one_mapping() {
    let exp = || vec![("GPUSHIM_CONF", "pool:expandable".to_string())];
    let v = values(&pool_run(&["reuse", "200"], exp(), None));
    assert_eq!(v["violations"], 0);
    assert!(v["same_stream_reuse"] > 150);
    // Large blocks come from mapped pages, not cuMemAlloc: only the small segments are left.
    assert!(v["device_allocs"] <= 4, "{v:?}");
    let mut env = exp();
    env.push(("GPUSHIM_SIM_MEMORY", (64u64 << 20).to_string()));
    let v = values(&pool_run(&["oom"], env, None));
    assert_eq!((v["first"], v["retry"]), (0, 0));
    assert_eq!((v["oom"], v["null"], v["last"], v["then"]), (2, 1, 2, 0));
    let dir = tempdir("pool-exp");
    let t = dir.join("exp.trace");
    let v = values(&pool_run(
        &["limit"],
        vec![("GPUSHIM_CONF", "pool:expandable,limit:100MiB".into())],
        Some(&t),
    ));
    assert_eq!(
        (
            v["start_total_mib"],
            v["live60_free_mib"],
            v["freed_free_mib"]
        ),
        (100, 40, 100)
    );
    assert_eq!((v["second60"], v["third60"]), (0, 2));
    // The growth went through the VMM functions, and the trace says how much was mapped.
    let (records, _) = decode(&t);
    let mapped: u64 = records
        .iter()
        .filter(|r| r.kind == RecordKind::SegmentReserve)
        .map(|r| r.size)
        .sum();
    assert_eq!(mapped, 60 << 20);
}

#[test]
fn stream_ordered_calls_on_a_capturing_stream_reach_cuda() {
    let v = values(&pool_run(&["capture"], vec![], None));
    assert_eq!(v["capture_rc"], 0);
    assert_eq!(
        v["reached_cuda_during"], 1,
        "served by CUDA while capturing"
    );
    assert_eq!(
        v["reached_cuda_after"], 0,
        "pooled again after the capture ended"
    );
}

fn ipc_attack(args: &[&str], conf: &str) -> (HashMap<String, i64>, String) {
    let out = run(
        &sim().bin("ipc"),
        Run {
            preload: true,
            env: vec![
                ("GPUSHIM_CONF", conf.to_string()),
                ("GPUSHIM_TRACE", "off".to_string()),
            ],
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Run::default()
        },
    );
    assert_ok(&out);
    (values(&out), stderr(&out))
}

#[test]
fn handles_of_freed_blocks_never_open_the_next_allocation() {
    // The adversary's reproduction: export a segment's first block (a real handle) and a block
    // inside it (a ticket), free both, allocate again (filled with 0x77), open the old handles.
    // (Under pool:expandable such blocks cannot be exported at all: CUDA's own error.)
    for conf in ["pool:caching", "pool:off"] {
        let (v, err) = ipc_attack(&["stale"], conf);
        assert_eq!((v["export_real"], v["export_ticket"]), (0, 0), "{conf}");
        // CUDA answers 800 (not permitted) for a handle of freed memory (seen on the H100).
        assert_eq!(
            (v["stale0"], v["stale1"]),
            (800, 800),
            "{conf}: CUDA's answer\n{err}"
        );
        assert_eq!((v["byte0"], v["byte1"]), (0, 0), "{conf}: nothing read");
    }
}

#[test]
fn altered_tickets_are_refused_and_the_genuine_one_opens() {
    let (v, err) = ipc_attack(&["forge"], "pool:caching");
    for k in [
        "forged_secret",
        "forged_slot",
        "forged_generation",
        "forged_nonce",
    ] {
        assert_eq!(v[k], 1, "{k}: {v:?}\n{err}");
    }
    assert_eq!((v["genuine"], v["genuine_byte"]), (0, 0x42), "{v:?}");
    assert_eq!(
        err.lines().count(),
        1,
        "one line for all refusals, naming why:\n{err}"
    );
    assert!(err.contains("forged"), "{err}");
}

#[test]
fn a_ticket_table_open_to_others_or_hard_linked_is_refused() {
    let (v, err) = ipc_attack(&["perms"], "pool:caching");
    assert_eq!((v["table_found"], v["table_mode"]), (1, 600), "{v:?}");
    assert_eq!(v["world_readable0"], 1, "{v:?}\n{err}");
    assert_eq!(v["hardlinked0"], 1, "{v:?}");
    assert_eq!((v["private0"], v["byte0"]), (0, 0x42), "{v:?}");
}

#[test]
fn more_than_a_thousand_ipc_opens_in_one_process_all_succeed() {
    for conf in ["pool:off", "pool:caching"] {
        let (v, err) = ipc_attack(&["many", "1100"], conf);
        assert_eq!(
            (v["exported"], v["failed_exports"]),
            (1100, 0),
            "{conf}: {err}"
        );
        assert_eq!(
            (v["opened"], v["failed_opens"], v["failed_closes"]),
            (1100, 0, 0),
            "{conf}: {v:?}\n{err}"
        );
    }
}

#[test]
fn the_summary_says_when_and_where_the_process_left_the_legacy_stream() {
    let summary = |args: &[&str]| {
        let dir = tempdir("streams-left");
        let t = dir.join("t.trace");
        pool_run(
            args,
            vec![("GPUSHIM_CONF", "pool:caching,stacks:on".into())],
            Some(&t),
        );
        summary_json(&t)
    };
    // `legacy` creates a non-blocking stream after its first reuse: the note names the call
    // and the client's function that made it.
    let s = summary(&["legacy"]);
    let left = &s["streams_left_legacy"];
    assert_eq!(left["api"], "cuStreamCreate", "{s}");
    assert!(left["stream"].as_u64().unwrap() > 2, "{s}");
    let site = left["site"].as_str().unwrap_or_default();
    assert!(site.contains("main (pool+"), "{site}");
    let pool = &s["pool"][0];
    assert_eq!(pool["segments_reserved"], 1, "{s}");
    assert_eq!(pool["splits"], 1, "{s}");
    assert_eq!(pool["waits"], 0, "{s}");
    // `count` never leaves the legacy stream: no note.
    let s = summary(&["count", "20"]);
    assert!(s["streams_left_legacy"].is_null(), "{s}");
    assert!(
        s["pool"][0]["segments_reserved"].as_u64().unwrap() >= 1,
        "{s}"
    );
}

#[test]
fn checkpoints_record_events_only_on_busy_streams_and_not_one_per_allocation() {
    // 64 idle streams, 100 allocations each finding the previous one's block fenced behind a
    // kernel running on the legacy stream: one checkpoint stays outstanding (a new one could
    // not pass before it), and it needs an event on the legacy stream only, the 64 streams
    // having no work queued (a query each tells). The pool recorded 65 events at every
    // allocation in an early version (6,500 here), 65 in all in a later one (one per stream). With
    // `GPUSHIM_CTX_EVENTS=1` and a driver that has `cuCtxRecordEvent` (12.5 and later), the
    // checkpoint is one event for the whole context and no stream is queried; on an older
    // driver the pool tries it once, then does as by default.
    for conf in ["pool:caching", "pool:expandable"] {
        for (ctx_events, old_driver) in [(false, false), (true, false), (true, true)] {
            let mut env = vec![("GPUSHIM_CONF", conf.into())];
            if ctx_events {
                env.push(("GPUSHIM_CTX_EVENTS", "1".into()));
            }
            if old_driver {
                env.push(("CUDA_SIM_NO_CTX_EVENT", "1".into()));
            }
            let out = pool_run(&["seals", "100"], env, None);
            let v = values(&out);
            let what = format!("{conf}, context events {ctx_events}, old driver {old_driver}");
            if ctx_events && !old_driver {
                assert!(
                    (1..=2).contains(&v["context_events"]),
                    "{what}: {}",
                    stdout(&out)
                );
                assert_eq!(v["event_records"], 0, "{what}: {}", stdout(&out));
                assert_eq!(v["stream_queries"], 0, "{what}: {}", stdout(&out));
            } else {
                assert!(v["event_records"] <= 2, "{what}: {}", stdout(&out));
                assert!(v["event_records"] >= 1, "{what}: {}", stdout(&out));
                // Tried at most once.
                assert!(v["context_events"] <= i64::from(ctx_events), "{what}");
                assert!(v["stream_queries"] >= 64, "{what}: {}", stdout(&out));
            }
        }
    }
}

#[test]
fn under_the_pluggable_allocator_a_framework_library_does_not_make_the_pool_give_back_at_once() {
    // PyTorch's library is loaded, but the pluggable allocator replaced its cache: every tensor
    // comes to the pool, which must cache (trim:auto = 1 s), not hand each emptied segment back
    // at the trimmer's next tick (each `cuMemFree` waits for the whole device).
    let dir = tempdir("plug-c10");
    let lib = framework_library(&dir);
    let preload = format!("{}:{}", shim().display(), lib.display());
    for conf in ["pool:caching", "pool:expandable", "pool:off"] {
        let out = pool_run(
            &["plugidle"],
            vec![
                ("GPUSHIM_CONF", conf.into()),
                ("LD_PRELOAD", preload.clone()),
            ],
            None,
        );
        let v = values(&out);
        assert_eq!(v["alloc_ok"], 1, "{conf}: {}", stdout(&out));
        assert_eq!(v["device_frees"], 0, "{conf}: {}", stdout(&out));
    }
}

#[test]
fn the_summary_says_how_far_behind_the_gpu_ran_when_fenced_blocks_were_wanted() {
    // 64 idle streams end the single-stream rule; the host runs ahead of 8 ms of simulated
    // GPU work per step, and the step's own synchronization lets the GPU catch up.
    let dir = tempdir("checkpoints");
    let t = dir.join("t.trace");
    let out = run(
        &sim().bin("perstep"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "pool:caching,stacks:off".into())],
            args: ["10", "16", "8000", "64"].map(String::from).to_vec(),
        },
    );
    assert_ok(&out);
    let s = summary_json(&t);
    let pool = &s["pool"][0];
    let made = pool["checkpoints"].as_u64().unwrap();
    // At most about one a step: made only when nothing cached fits while freed blocks wait
    // for their fences, never while one is outstanding.
    assert!((1..=30).contains(&made), "{s}");
    let median = pool["checkpoint_pass_median_ns"].as_u64().unwrap();
    // The GPU ran behind by part of a step (8 ms of work), never by nothing.
    assert!(median > 100_000 && median < 50_000_000, "{s}");
    assert!(pool["checkpoint_pass_max_ns"].as_u64().unwrap() >= median);
}

#[test]
fn a_synchronization_with_nothing_pending_passes_nothing_freed_after_it() {
    // The fence of a later free must not count as passed by an earlier synchronization: the
    // block's kernel (on another stream, 200 ms) still runs when the next request comes.
    // With the context's one event as the checkpoint, and with one event per busy stream (a
    // driver older than 12.5).
    for conf in ["pool:caching", "pool:expandable"] {
        for old_driver in [false, true] {
            let mut env = vec![("GPUSHIM_CONF", conf.into())];
            if old_driver {
                env.push(("CUDA_SIM_NO_CTX_EVENT", "1".into()));
            }
            let out = pool_run(&["syncreuse"], env, None);
            let v = values(&out);
            assert_eq!(
                v["in_use"],
                0,
                "{conf}, old driver {old_driver}: {}",
                stdout(&out)
            );
        }
    }
}

/// Splits are counted in batches (one `Split` record per 64 and the rest at exit), and the
/// summary's count is exact: `count 200` splits its 2 MiB segment at each of its 200 rounds of
/// a 1 MiB allocation and free.
#[test]
fn splits_are_counted_exactly_in_few_records() {
    let dir = tempdir("splits");
    let t = dir.join("t.trace");
    let out = pool_run(&["count", "200"], vec![], Some(&t));
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary_json(&t);
    assert_eq!(s["pool"][0]["splits"], 200, "{s}");
    let events = std::process::Command::new(gpushim_bin())
        .arg("events")
        .arg(&t)
        .output()
        .unwrap();
    let csv = String::from_utf8_lossy(&events.stdout);
    let records = csv.lines().filter(|l| l.contains(",split,")).count();
    assert_eq!(records, 4, "{csv}");
}

/// Splits counted after the shim's exit flush (an exit handler of the program's that runs
/// after the shim's, or another thread still allocating) are written at once rather than
/// lost: 10 pairs before exit and 3 in a late exit handler give 13.
#[test]
fn splits_after_the_exit_flush_are_still_counted() {
    let dir = tempdir("late-splits");
    let t = dir.join("t.trace");
    let out = pool_run(&["latesplits", "10", "3"], vec![], Some(&t));
    assert!(out.status.success(), "{}", stderr(&out));
    let s = summary_json(&t);
    assert_eq!(s["pool"][0]["splits"], 13, "{s}");
}

#[test]
fn a_free_after_cuda_shut_down_at_exit_is_no_false_alarm() {
    // On the simulator as on the GPU: a free made after CUDA's own exit handler meets a driver
    // that is shutting down (CUDA_ERROR_DEINITIALIZED, 4).
    let plain = run(&sim().bin("exit_free"), Run::default());
    assert!(
        stdout(&plain).contains("free at exit answered 4"),
        "{}",
        stdout(&plain)
    );
    // Under the pool the program's free is the pool's (it succeeds); giving the segment back
    // meets the same shutdown, which is the end of the process, not a context reset.
    let t = tempdir("exit-free").file("t.trace");
    let out = run(
        &sim().bin("exit_free"),
        Run {
            preload: true,
            trace: Some(&t),
            env: vec![("GPUSHIM_CONF", "pool:caching,trim:0".into())],
            args: vec![],
        },
    );
    assert_ok(&out);
    assert!(
        stdout(&out).contains("free at exit answered 0"),
        "{}",
        stdout(&out)
    );
    assert!(
        !stderr(&out).contains("no longer holds it"),
        "{}",
        stderr(&out)
    );
}
