//! PyTorch's autograd graph, read by the shim when a backward pass begins
//! (`shim/src/hooks/graph.rs`), on the stand-in for libtorch_cpu.so (`tests/standin`), whose
//! nodes lay out their sequence number and their inputs' edges where PyTorch's do: each node's
//! class and where each input came from, once per backward pass; a node that does not read as
//! PyTorch's ends the walk without harm; a ring keeps a recent walk.

use crate::common::*;
use std::path::Path;
use std::process::Command;

/// A program on the stand-in: loads it from its first argument as `autograd` with every
/// function typed, then `body`.
fn program(name: &str, body: &str) -> (TestDir, std::path::PathBuf) {
    let dir = tempdir(name);
    let script = dir.join("train.py");
    let prelude = "import ctypes, sys, time\n\
         autograd = ctypes.CDLL(sys.argv[1])\n\
         for f in ('standin_forward_mm', 'standin_forward_cast', 'standin_forward_broken'):\n\
         \x20   getattr(autograd, f).restype = ctypes.c_void_p\n\
         \x20   getattr(autograd, f).argtypes = (ctypes.c_size_t,)\n\
         autograd.standin_backward_node.restype = ctypes.c_void_p\n\
         autograd.standin_backward_node.argtypes = (ctypes.c_size_t, ctypes.c_size_t)\n\
         autograd.standin_link.argtypes = (ctypes.c_size_t, ctypes.c_size_t)\n\
         autograd.standin_link_leaf.argtypes = (ctypes.c_size_t,)\n\
         autograd.standin_link_none.argtypes = (ctypes.c_size_t,)\n";
    std::fs::write(&script, format!("{prelude}{body}")).unwrap();
    (dir, script)
}

/// Runs `script` under the shim with the stand-in as its argument (then `more`); the trace.
fn traced(
    dir: &TestDir,
    script: &Path,
    more: &[std::path::PathBuf],
    env: Vec<(&str, String)>,
) -> std::path::PathBuf {
    let t = dir.join("t.trace");
    let autograd = sim().dir.join("torch/lib/libtorch_cpu.so");
    let mut args = vec![script.display().to_string(), autograd.display().to_string()];
    args.extend(more.iter().map(|p| p.display().to_string()));
    let out = run(
        Path::new("python3"),
        Run {
            preload: true,
            trace: Some(&t),
            args,
            env,
        },
    );
    assert_ok(&out);
    t
}

/// The trace's graph records, as `gpushim events --json` tells them: (kind, status, ptr, size,
/// text).
fn graph_records(trace: &Path) -> Vec<(String, u64, u64, u64, String)> {
    let out = Command::new(gpushim_bin())
        .args(["events", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => {
            u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
        }
        v => v.as_u64().unwrap(),
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["kind"].as_str().is_some_and(|k| k.starts_with("graph")))
        .map(|v| {
            (
                v["kind"].as_str().unwrap().to_string(),
                v["status"].as_u64().unwrap(),
                hex(&v["ptr"]),
                hex(&v["size"]),
                v["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A forward of two ops (a weight's cast, then a matmul of the cast and an input that takes no
/// gradient) and its backward, whose two nodes both allocate: one walk, from the matmul, with
/// both nodes' classes and the three inputs' sources (the cast, nothing, a parameter).
#[test]
fn a_backward_pass_writes_its_graph_once() {
    let (dir, script) = program(
        "graph-once",
        "c = autograd.standin_forward_cast(1 << 20)\n\
         m = autograd.standin_forward_mm(1 << 20)\n\
         autograd.standin_link_leaf(0)\n\
         autograd.standin_link(1, 0)\n\
         autograd.standin_link_none(1)\n\
         autograd.standin_backward_node(1, 1 << 20)\n\
         autograd.standin_backward_node(0, 1 << 20)\n",
    );
    let t = traced(&dir, &script, &[], vec![]);
    let g = graph_records(&t);
    let said = format!("{g:#?}");
    let kinds: Vec<&str> = g.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "graph_node",
            "graph_edge",
            "graph_edge",
            "graph_node",
            "graph_edge",
            "graph"
        ],
        "{said}"
    );
    // The matmul (node 1): its input 0 from the cast (node 0, output 0), its input 1 none.
    assert_eq!((g[0].2, g[0].4.as_str()), (1, "MmBackward0"), "{said}");
    assert_eq!((g[1].1, g[1].2, g[1].3), (0, 1, 0), "{said}");
    assert_eq!((g[2].1, g[2].2), (2, 1 | 1 << 40), "{said}");
    assert!(g[2].4.contains("takes no gradient"), "{said}");
    // The cast (node 0): its input from a parameter, named by its node's address.
    assert_eq!((g[3].2, g[3].4.as_str()), (0, "ToCopyBackward0"), "{said}");
    assert_eq!((g[4].1, g[4].2), (1, 0), "{said}");
    assert!(g[4].3 > 4096 && g[4].4.contains("from a leaf"), "{said}");
    // The walk: whole, two nodes, three edges.
    assert_eq!((g[5].1, g[5].2, g[5].3), (0, 2, 3), "{said}");
    // After the record that found it due (the segment the backward's tensor took) and that
    // record's stack, never between them; the tensor keeps its name.
    let events = gpushim_text(&["events", "--json", t.to_str().unwrap()]);
    let all: Vec<(String, u64)> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            let kind = v["kind"].as_str().unwrap_or("").to_string();
            (kind, v["thread"].as_u64().unwrap_or(u64::MAX))
        })
        .collect();
    let first = all.iter().position(|(k, _)| k == "graph_node").unwrap();
    // Another thread's record (an NVML sample) may come between: the walking thread's own.
    let thread = all[first].1;
    let before = all[..first].iter().rev().find(|(_, t)| *t == thread);
    assert_eq!(before.map(|b| b.0.as_str()), Some("stack_ref"), "{all:?}");
    let leaks = report_json(&["leaks"], &[&t]).to_string();
    assert!(
        leaks.contains("MmBackward0 (autograd's backward)"),
        "{leaks}"
    );
}

/// A node whose edges lead to memory nobody mapped (a PyTorch laid out otherwise) ends the walk
/// with one record saying so, and no walk follows; the program runs on to its end.
#[test]
fn a_graph_that_does_not_read_as_pytorchs_ends_the_walk_and_the_program_runs_on() {
    let (dir, script) = program(
        "graph-broken",
        "autograd.standin_forward_broken(1 << 20)\n\
         autograd.standin_backward_node(0, 1 << 20)\n\
         autograd.standin_forward_mm(1 << 20)\n\
         autograd.standin_backward_node(1, 1 << 20)\n\
         open(sys.argv[0] + '.ran', 'w').write('to its end')\n",
    );
    let t = traced(&dir, &script, &[], vec![]);
    assert!(dir.join("train.py.ran").exists());
    let g = graph_records(&t);
    let walks: Vec<_> = g.iter().filter(|r| r.0 == "graph").collect();
    assert_eq!(walks.len(), 1, "{g:#?}");
    assert_eq!(walks[0].1, 2, "{g:#?}");
    assert!(
        walks[0].4.contains("did not read as PyTorch's Node"),
        "{g:#?}"
    );
}

/// In a ring of 4 MiB (about 130,000 records), 30 steps of a backward pass and 5,000
/// allocations each: the first three walks are long gone at the end, and the ring still holds
/// one, made since.
#[test]
fn a_ring_keeps_a_recent_graph() {
    let (dir, script) = program(
        "graph-ring",
        "lib = ctypes.CDLL(sys.argv[2])\n\
         lib.standin_malloc.restype = ctypes.c_void_p\n\
         lib.standin_malloc.argtypes = (ctypes.c_size_t,)\n\
         lib.standin_free.argtypes = (ctypes.c_void_p,)\n\
         for step in range(30):\n\
         \x20   autograd.standin_forward_mm(1 << 20)\n\
         \x20   if step:\n\
         \x20       autograd.standin_link(step, step - 1)\n\
         \x20   autograd.standin_backward_node(step, 1 << 20)\n\
         \x20   for i in range(5000):\n\
         \x20       lib.standin_free(lib.standin_malloc(4096))\n\
         \x20       if i % 1000 == 999:\n\
         \x20           time.sleep(0.02)\n",
    );
    let c10 = sim().dir.join("torch/lib/libc10_cuda.so");
    let conf = vec![("GPUSHIM_CONF", "trace_max:4MiB".to_string())];
    let t = traced(&dir, &script, &[c10], conf);
    let s = report_json(&["summary"], &[&t]);
    assert!(s["health"]["summarized"].as_u64().unwrap() > 100_000, "{s}");
    let g = graph_records(&t);
    let walks: Vec<_> = g.iter().filter(|r| r.0 == "graph").collect();
    assert!(!walks.is_empty(), "no walk left in the ring: {g:#?}");
    // A recent walk, whole: from the node of a step after the first three, down its chain of
    // inputs to the first step's (its nodes are those written just before it).
    let at = g.iter().rposition(|r| r.0 == "graph").unwrap();
    let (status, nodes) = (g[at].1, g[at].2);
    let start = g[..at]
        .iter()
        .rev()
        .filter(|r| r.0 == "graph_node")
        .nth(nodes as usize - 1);
    assert_eq!(status, 0, "{g:#?}");
    assert!(nodes > 3, "{g:#?}");
    assert_eq!(start.map(|r| r.2), Some(nodes - 1), "{g:#?}");
}

/// Python that installs a seccomp filter (no new privileges first, so no capability is needed)
/// whose action for `process_vm_readv` (310 on x86-64) is `action`, every other call allowed:
/// `SECCOMP_RET_KILL_PROCESS` is what systemd's `SystemCallFilter` does by default.
fn seccomp_filter(action: u32) -> String {
    format!(
        "class F(ctypes.Structure):\n\
         \x20   _fields_ = [('code', ctypes.c_ushort), ('jt', ctypes.c_ubyte), ('jf', ctypes.c_ubyte), ('k', ctypes.c_uint)]\n\
         class P(ctypes.Structure):\n\
         \x20   _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.POINTER(F))]\n\
         code = (F * 4)(F(0x20, 0, 0, 0), F(0x15, 0, 1, 310), F(0x06, 0, 0, {action}), F(0x06, 0, 0, 0x7fff0000))\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         assert libc.prctl(38, 1, 0, 0, 0) == 0, ctypes.get_errno()\n\
         assert libc.prctl(22, 2, ctypes.byref(P(4, code)), 0, 0) == 0, ctypes.get_errno()\n"
    )
}

/// The forward and backward of `a_backward_pass_writes_its_graph_once`, then a file that says
/// the program reached its end.
const TWO_OPS: &str = "c = autograd.standin_forward_cast(1 << 20)\n\
     m = autograd.standin_forward_mm(1 << 20)\n\
     autograd.standin_link_leaf(0)\n\
     autograd.standin_link(1, 0)\n\
     autograd.standin_link_none(1)\n\
     autograd.standin_backward_node(1, 1 << 20)\n\
     autograd.standin_backward_node(0, 1 << 20)\n\
     open(sys.argv[0] + '.ran', 'w').write('to its end')\n";

/// Under a seccomp filter that kills the process on `process_vm_readv` (as systemd's
/// `SystemCallFilter` does), and under one that refuses it with EPERM, the program runs to its
/// end and its graph is still read whole: a process with a filter is read through a pipe, with
/// calls no filter of a Python program forbids.
#[test]
fn a_seccomp_filter_neither_kills_the_program_nor_hides_its_graph() {
    const KILL_PROCESS: u32 = 0x8000_0000;
    const ERRNO_EPERM: u32 = 0x0005_0001;
    for (name, action) in [("kill", KILL_PROCESS), ("eperm", ERRNO_EPERM)] {
        let body = format!("{}{TWO_OPS}", seccomp_filter(action));
        let (dir, script) = program(&format!("graph-seccomp-{name}"), &body);
        let t = traced(&dir, &script, &[], vec![]);
        assert!(dir.join("train.py.ran").exists(), "{name}: did not run on");
        let g = graph_records(&t);
        let walks: Vec<_> = g.iter().filter(|r| r.0 == "graph").collect();
        assert_eq!(walks.len(), 1, "{name}: {g:#?}");
        // Whole, two nodes and three edges, as without the filter.
        assert_eq!(
            (walks[0].1, walks[0].2, walks[0].3),
            (0, 2, 3),
            "{name}: {g:#?}"
        );
        assert_eq!(g[0].4, "MmBackward0", "{name}: {g:#?}");
    }
}
