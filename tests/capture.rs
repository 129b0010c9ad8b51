//! Stream capture (contract 7) and memory given back (contract 8), on the simulator.
//!
//! `tests/clients/capture.c` makes one call during a capture in each mode, from the capturing
//! thread and from another one, and prints what the call, `cudaStreamEndCapture` and
//! `cudaGetLastError` returned. The expected lines are the rules measured on the GPU
//! (docs/cuda-facts.md, "During a stream capture"); the simulator must give them, and so must
//! the shim in every pool mode, since a pool that makes its own calls during a capture breaks
//! graphs the program built correctly. `scripts/gpu.sh capture` runs the same client on real
//! CUDA.

use crate::common::*;

const MODES: [&str; 3] = ["global", "thread_local", "relaxed"];

/// What CUDA answers to scenario `name` in capture mode `mode`, from the capturing thread or
/// another: (call, end of capture, last error).
fn expected(name: &str, mode: &str, same_thread: bool) -> (i32, i32, i32) {
    const REFUSED: (i32, i32, i32) = (900, 901, 901);
    const FINE: (i32, i32, i32) = (0, 0, 0);
    match name {
        // Refused in global mode from any thread and in thread-local mode from the capturing
        // thread; allowed in relaxed mode.
        "cudaMalloc"
        | "cudaFree"
        | "cudaFree(NULL)"
        | "cudaMallocHost"
        | "cudaEventRecord(other)+Query"
        | "cudaEventQuery(earlier)"
        | "cudaEventSynchronize(earlier)" => match (mode, same_thread) {
            ("global", _) | ("thread_local", true) => REFUSED,
            _ => FINE,
        },
        "cudaMallocAsync+FreeAsync(capturing)"
        | "cudaEventRecord(legacy)"
        | "cudaMemGetInfo"
        | "cudaStreamCreate+Destroy" => FINE,
        "cudaDeviceSynchronize" => REFUSED,
        "cudaEventRecord(capturing)+Query" => (907, 901, 901),
        "cudaStreamWaitEvent(capturing,earlier)" => (905, 901, 901),
        other => panic!("no rule for scenario {other}"),
    }
}

/// The capture client's run with `args`, under the shim (`preload`) configured `conf`, with
/// `env` besides; it must succeed.
fn capture_run_with(
    args: &[&str],
    preload: bool,
    conf: &str,
    env: Vec<(&'static str, String)>,
) -> std::process::Output {
    let mut all = vec![
        ("GPUSHIM_TRACE", "off".into()),
        ("GPUSHIM_CONF", conf.into()),
    ];
    all.extend(env);
    let out = run(
        &sim().bin("capture"),
        Run {
            preload,
            env: all,
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Run::default()
        },
    );
    assert_ok(&out);
    out
}

fn capture_run(args: &[&str], preload: bool, conf: &str) -> std::process::Output {
    capture_run_with(args, preload, conf, Vec::new())
}

fn capture(args: &[&str], preload: bool, conf: &str) -> String {
    stdout(&capture_run(args, preload, conf))
}

/// As [`capture`], with the simulator's calls taking `latency_us` each.
fn capture_slow(args: &[&str], preload: bool, conf: &str, latency_us: u32) -> String {
    let env = vec![("GPUSHIM_SIM_LATENCY_US", latency_us.to_string())];
    stdout(&capture_run_with(args, preload, conf, env))
}

fn check_table(text: &str, who: &str) {
    let mut seen = 0;
    for line in text.lines() {
        if line.starts_with("after:") {
            assert_eq!(line, "after: malloc=0 free=0 sync=0", "{who}");
            continue;
        }
        let (head, tail) = line
            .split_once(": ")
            .unwrap_or_else(|| panic!("{who}: {line}"));
        let mut words = head.rsplitn(3, ' ');
        let thread = words.next().unwrap();
        let mode = words.next().unwrap();
        let name = words.next().unwrap();
        assert!(MODES.contains(&mode), "{who}: {line}");
        let (rc, end, last) = expected(name, mode, thread == "same");
        assert_eq!(
            tail,
            format!("rc={rc} end={end} last={last}"),
            "{who}: {name} in {mode} capture from the {thread} thread"
        );
        seen += 1;
    }
    assert_eq!(seen, 14 * 3 * 2, "{who}: every scenario ran\n{text}");
}

#[test]
fn the_simulator_follows_the_capture_rules_measured_on_the_gpu() {
    check_table(&capture(&[], false, ""), "simulator");
}

#[test]
fn under_the_shim_every_pool_mode_gives_exactly_the_answers_of_cuda() {
    for conf in ["pool:off", "pool:caching", "pool:expandable"] {
        check_table(&capture(&[], true, conf), conf);
    }
}

/// Runs scenario `name` of the capture client on the simulator alone and under the shim in
/// every pool mode: each must print `want`.
fn same_everywhere(name: &str, want: &str) {
    same_everywhere_with(&[name], want);
}

fn same_everywhere_with(args: &[&str], want: &str) {
    assert_eq!(capture(args, false, ""), want, "simulator");
    for conf in ["pool:off", "pool:caching", "pool:expandable"] {
        assert_eq!(capture(args, true, conf), want, "{conf}");
    }
}

#[test]
fn stream_ordered_memory_captured_on_any_stream_belongs_to_the_graph_never_to_the_pool() {
    // A graph's memory nodes stay the graph's: the next allocation outside the capture gets
    // another address. The pool must pass the captured calls to CUDA on the per-thread default
    // stream too (named as cudaStreamPerThread, or as stream 0 of a _ptsz entry point), and
    // must see a capture begun through the CUDA 10.0 entry point.
    let line = |what: &str| {
        format!("graphmem {what}: begin=0 alloc=0 free=0 end=0 graph=1 next=0 reused=0\n")
    };
    let want = ["created_stream_v1", "per_thread_stream", "ptsz_stream_0"]
        .map(line)
        .concat();
    same_everywhere("graphmem", &want);
}

#[test]
fn a_thread_without_a_context_gets_201_and_leaves_another_threads_capture_alone() {
    same_everywhere("nocontext", "nocontext: alloc=201 end=0 graph=1\n");
}

#[test]
fn after_a_device_reset_the_pool_hands_out_only_memory_the_device_has() {
    // cudaDeviceReset frees every allocation; a block cached before it is not memory any more.
    let want = "reset: malloc=0 free=0 reset=0 malloc_after=0 memset=0 free_after=0\n";
    same_everywhere("reset", want);
}

#[test]
fn more_captures_at_once_than_the_pool_tracks_still_let_it_give_memory_back() {
    // 65 captures: one more than the table of captured streams holds.
    for n in ["64", "65", "80"] {
        let want = format!("overflow: begun={n} ended={n} held_mib=0\n");
        same_everywhere_with(&["overflow", n], &want);
    }
}

#[test]
fn the_pools_own_frees_never_join_or_break_a_capture_begun_meanwhile() {
    // One thread empties the cache (the pool frees its segment) while another begins a global
    // capture; each call takes 200 µs, so the capture often begins while a free is on its way.
    // The pool frees in relaxed mode: no capture is invalidated and no segment is lost.
    let want = "release: rounds=300 invalidated=0 failed_calls=0 held_mib=0\n";
    assert_eq!(capture_slow(&["release", "300"], false, "", 200), want);
    for conf in ["pool:caching", "pool:expandable"] {
        assert_eq!(
            capture_slow(&["release", "300"], true, conf, 200),
            want,
            "{conf}"
        );
    }
}

#[test]
fn an_out_of_memory_inside_a_relaxed_window_leaves_the_capture_intact() {
    // PyTorch's test_graph_capture_oom: CUDA answers 2 and the capture still ends with a graph.
    let want = "oom: malloc=2 last=2 p_null=1 small_malloc=0 small_free=0 end=0 graph=1\n";
    same_everywhere("oom", want);
}

#[test]
fn the_pool_never_breaks_a_graph_with_fenced_blocks_in_its_cache() {
    // Blocks freed just before the capture are fenced; serving the capture's allocations must
    // not record events on the capturing stream, query them or wait for the device.
    let want = "graph: failed_calls=0 end=0 last=0 graph=1 after_sync=0\n";
    same_everywhere("graph", want);
}

fn giveback(conf: &str, preload: bool) -> (u64, u64, u64) {
    giveback_with(conf, preload, vec![])
}

fn giveback_with(conf: &str, preload: bool, env: Vec<(&'static str, String)>) -> (u64, u64, u64) {
    let out = capture_run_with(&["giveback"], preload, conf, env);
    let out = stdout(&out);
    let v: Vec<u64> = out
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').and_then(|(_, v)| v.parse().ok()))
        .collect();
    assert_eq!(v.len(), 3, "{out}");
    (v[0], v[1], v[2])
}

#[test]
fn memory_a_program_frees_goes_back_to_the_device_in_bounded_time_unless_kept() {
    assert_eq!(giveback("", false), (512, 0, 0), "without the shim");
    assert_eq!(giveback("pool:off", true), (512, 0, 0));
    for conf in ["pool:caching", "pool:expandable", "pool:caching,trim:500ms"] {
        let (held, _, later) = giveback(conf, true);
        assert_eq!((held, later), (512, 0), "{conf}: back within 2 s");
    }
    // Asked to keep it: the pool keeps it.
    assert_eq!(giveback("pool:caching,trim:off", true), (512, 512, 512));
}

#[test]
fn with_a_framework_cache_loaded_trim_auto_gives_memory_back_at_the_free_itself() {
    // A library named like PyTorch's CUDA allocator in the process: its cudaFree means "give it
    // back", so the pool does so at once (what PyTorch's test_device_memory_used reads).
    let dir = tempdir("c10");
    let lib = framework_library(&dir);
    let preload = format!("{}:{}", shim().display(), lib.display());
    for conf in ["", "pool:caching", "pool:expandable"] {
        let env = vec![("LD_PRELOAD", preload.clone())];
        assert_eq!(giveback_with(conf, true, env), (512, 0, 0), "'{conf}'");
    }
    // The same library with PyTorch's caching turned off: the pool caches for 1 s.
    let env = vec![
        ("LD_PRELOAD", preload.clone()),
        ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1".to_string()),
    ];
    assert_eq!(giveback_with("pool:caching", true, env), (512, 512, 0));
    // An explicit trim wins over the detection.
    let env = vec![("LD_PRELOAD", preload)];
    assert_eq!(
        giveback_with("pool:caching,trim:off", true, env),
        (512, 512, 512)
    );
}

#[test]
fn a_capture_beginning_while_another_thread_frees_is_never_invalidated_by_the_pool() {
    // PyTorch's test_cuda_graph_error_options in miniature: one thread captures (thread-local
    // mode) while another allocates and frees. The pool's checkpoints record an event on every
    // non-blocking stream; one recorded on the capturing stream in the instant the capture
    // begins would join the graph, and querying it would invalidate the capture (907).
    let want = "race: captures=20000 invalidated=0 allocator_failed=0\n";
    same_everywhere("race", want);
    // At a limit the pool runs out of room during captures at once: it must give its empty
    // segments back (in relaxed capture mode) rather than refuse what CUDA would serve. It
    // refused before, once 32 blocks freed during captures were held fenced.
    for conf in ["pool:caching,limit:64MiB", "pool:expandable,limit:64MiB"] {
        assert_eq!(capture(&["race"], true, conf), want, "{conf}");
    }
}

/// What the shim says on stderr while the capture client runs `args` under `conf`.
fn said(args: &[&str], conf: &str) -> String {
    stderr(&capture_run(args, true, conf))
}

#[test]
fn an_allocation_refused_for_a_capture_is_explained_once() {
    const LINE: &str = "a cudaMalloc during a CUDA graph capture was refused";
    for conf in ["pool:caching", "pool:expandable"] {
        // Every scenario: many refused allocations, one line.
        let err = said(&[], conf);
        assert_eq!(err.matches(LINE).count(), 1, "{conf}: {err}");
        assert!(err.contains("gpushim run --pluggable"), "{err}");
    }
    // An allocation failing inside a relaxed window is not refused for the capture: nothing.
    assert!(!said(&["oom"], "pool:caching").contains(LINE));
    // Without a pool the call is CUDA's own, answered unchanged and unexplained.
    assert!(!said(&[], "pool:off").contains(LINE));
}
