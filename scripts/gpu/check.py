"""The GPU machine's checks for the interposition issue, run by scripts/gpu.sh check. Prints one
table: each check, PASS or FAIL, and the figures behind it."""
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ["GPUSHIM_BIN"]
LIB = os.environ["GPUSHIM_LIB"]
W = os.environ["GPUSHIM_WORK"]
rows = []
notes = []


def row(check, ok, detail):
    rows.append((check, "PASS" if ok else ("FAIL" if ok is False else "info"), detail))


def run(cmd, trace=None, preload=True, env=None, timeout=600):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.pop("GPUSHIM_TRACE", None)
    if preload:
        e["LD_PRELOAD"] = LIB
    if trace:
        if os.path.exists(trace):
            os.remove(trace)
        e["GPUSHIM_TRACE"] = trace
    e.update(env or {})
    t0 = time.time()
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    return p.stdout, p.stderr, p.returncode, time.time() - t0


def summary(trace):
    out = subprocess.run([BIN, "summary", "--json", trace], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def apis(trace):
    out = subprocess.run([BIN, "events", "--json", trace], capture_output=True, text=True)
    names = []
    for line in out.stdout.splitlines():
        r = json.loads(line)
        # The program's calls: not the shim's own records (threads, streams, NVML's figure,
        # the pool's notes) nor the memory figures it showed the caller.
        if r["kind"] not in ("thread_start", "stream_name", "mem_info_shown") and r["api"] != "gpushim":
            names.append(r["api"])
    return names


def live_by_api(trace):
    """Live bytes at the end, by the API that allocated them (frees matched by pointer)."""
    out = subprocess.run([BIN, "events", "--json", trace], capture_output=True, text=True)
    live = {}
    for line in out.stdout.splitlines():
        r = json.loads(line)
        if r["status"] != 0:
            continue
        k, key = r["kind"], None
        if k in ("alloc", "alloc_async", "managed_alloc"):
            live[("d", r["ptr"])] = (r["api"], r["size"])
        elif k == "phys_create":
            live[("p", r["ptr"])] = (r["api"], r["size"])
        elif k in ("free", "free_async"):
            live.pop(("d", r["ptr"]), None)
        elif k == "phys_release":
            live.pop(("p", r["ptr"]), None)
    by = {}
    for api, size in live.values():
        by[api] = by.get(api, 0) + size
    return by


def stats_line(stdout):
    for line in stdout.splitlines():
        if line.startswith("STATS "):
            return json.loads(line[6:])
    return None


def facts():
    src = open(os.path.join(ROOT, "tests", "simulator_fidelity.rs")).read()
    m = re.search(r'pub const CUDA_FACTS: &str = "\\\n(.*?)";', src, re.S)
    return m.group(1)


def t(name):
    return os.path.join(W, name + ".trace")


# 1. Conformance: the same scenarios as the simulator's, on real CUDA, with and without the shim.
alone, err, rc, _ = run([os.path.join(W, "conformance")], preload=False)
shimmed, err2, rc2, _ = run([os.path.join(W, "conformance")], trace=t("conformance"))
row("conformance: identical with and without the shim", alone == shimmed and rc == rc2 == 0,
    f"{len(alone.splitlines())} scenario lines")
expected = facts()
diff = [f"real: {a!r} / table: {b!r}" for a, b in zip(alone.splitlines(), expected.splitlines()) if a != b]
row("conformance: real CUDA matches docs/cuda-facts.md (and the simulator)", not diff, "; ".join(diff) or "all lines equal")

# 2. Every hooked function called directly: one record each, in order.
out, err, rc, _ = run([os.path.join(W, "coverage")], trace=t("coverage"))
exp = out.splitlines()
got = apis(t("coverage"))
row("coverage: every listed function recorded once, in order", rc == 0 and exp == got,
    f"{len(exp)} calls made, {len(got)} recorded" + ("" if rc == 0 else f"; client rc {rc}: {err.strip()[:200]}"))

# 3. Entry points (cudaGetDriverEntryPointByVersion, cuGetProcAddress_v2).
out, err, rc, _ = run([os.path.join(W, "entry_points")], trace=t("entry")) 
exp = [l[5:] for l in out.splitlines() if l.startswith("call ")]
got = apis(t("entry"))
checks = [l for l in out.splitlines() if l.startswith("check ")]
ok = rc == 0 and exp == got and all(l.endswith(" 1") for l in checks)
row("entry points: VMM and cuMemAlloc through both lookups recorded; others untouched", ok,
    f"{len(exp)} calls, {len(got)} records; " + ", ".join(checks))

# 4. What the shim costs per call in pass-through mode (recording on).
b0, _, _, _ = run([os.path.join(W, "bench_calls"), "2000"], preload=False)
b1, _, _, _ = run([os.path.join(W, "bench_calls"), "2000"], trace=t("bench"))
def kv(s):
    return {l.split()[0]: float(l.split()[1]) for l in s.splitlines() if len(l.split()) == 2}
k0, k1 = kv(b0), kv(b1)
for k, label in [("malloc_free_us", "cudaMalloc+cudaFree 1 MiB"), ("malloc_free_async_us", "cudaMallocAsync+cudaFreeAsync 1 MiB")]:
    if k in k0 and k in k1:
        row(f"cost: {label}, median µs", None, f"without {k0[k]:.3f}, with shim {k1[k]:.3f} (+{k1[k]-k0[k]:.3f})")

# 5. PyTorch in its four allocator modes: what the shim saw against PyTorch's own counters.
modes = [
    ("default", {}),
    ("expandable_segments", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    ("backend:cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    ("caching off", {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}),
]
script = os.path.join(ROOT, "scripts", "gpu", "torch_modes.py")
reference = {}
for name, env in modes:
    tr = t("torch-" + name.replace(":", "_").replace(" ", "_"))
    out, err, rc, secs = run([sys.executable, script], trace=tr, env=env)
    st = stats_line(out)
    if rc != 0 or st is None:
        row(f"pytorch {name}", False, f"rc {rc}: {err.strip()[-300:]}")
        continue
    s = summary(tr)
    calls = {a["api"]: a["calls"] for a in s["apis"]}
    live = live_by_api(tr)
    nda, ndf = st["num_device_alloc"], st["num_device_free"]
    mal, fre = calls.get("cudaMalloc", 0), calls.get("cudaFree", 0)
    others = {k: v for k, v in live.items() if k not in ("cudaMalloc", "cuMemCreate", "cudaMallocAsync")}
    detail = (f"shim: cudaMalloc {mal}, cudaFree {fre}, cuMemCreate {calls.get('cuMemCreate', 0)}, "
              f"cuMemMap {calls.get('cuMemMap', 0)}, cudaMallocAsync {calls.get('cudaMallocAsync', 0)}, "
              f"cudaFreeAsync {calls.get('cudaFreeAsync', 0)}; live by API {live}; "
              f"pytorch: num_device_alloc {nda}, num_device_free {ndf}, reserved {st['memory_reserved']}, "
              f"allocated {st['memory_allocated']}, tensor allocations {st['allocation.all.allocated']}, "
              f"frees {st['allocation.all.freed']}; loss {st['loss']:.4f}; {secs:.1f} s")
    if name == "default":
        reference = st
        ok = mal == nda and fre == ndf and live.get("cudaMalloc", 0) == st["memory_reserved"]
    elif name == "expandable_segments":
        ok = calls.get("cuMemMap", 0) > 0 and live.get("cuMemCreate", 0) == st["memory_reserved"]
    elif name == "backend:cudaMallocAsync":
        # PyTorch keeps no call counts in this mode: every tensor is one cudaMallocAsync, so the
        # default run's tensor counts (same deterministic script) are the reference.
        ok = (calls.get("cudaMallocAsync", 0) == reference.get("allocation.all.allocated")
              and calls.get("cudaFreeAsync", 0) == reference.get("allocation.all.freed")
              and live.get("cudaMallocAsync", 0) == st["memory_allocated"])
    else:
        # Caching off: PyTorch's counters stay zero; the reference is again the default run.
        ok = (mal == reference.get("allocation.all.allocated")
              and fre == reference.get("allocation.all.freed"))
    row(f"pytorch {name}", ok, detail)
    if others:
        notes.append(f"pytorch {name}: memory not from PyTorch's allocator, live at exit: {others}")

# 6. JAX (platform allocator) and CuPy: allocations seen; allocations minus frees = live at exit.
fw = os.path.join(ROOT, "scripts", "gpu", "frameworks.py")
for name, env in [("jax", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}),
                  ("cupy", {})]:
    tr = t(name)
    out, err, rc, secs = run([sys.executable, fw, name], trace=tr, env=env)
    st = stats_line(out)
    if rc != 0 or st is None:
        row(f"{name}", False, f"rc {rc}: {err.strip()[-300:]}")
        continue
    s = summary(tr)
    allocs = {a["api"]: a["calls"] for a in s["apis"] if a["bytes"] > 0}
    live = live_by_api(tr)
    # JAX's platform allocator backs arrays with the VMM functions; CuPy's pool with cuMemAlloc.
    main_api = "cuMemCreate" if name == "jax" else "cuMemAlloc_v2"
    ok = sum(allocs.values()) > 0 and live.get(main_api, 0) == st["framework_live_bytes"]
    row(f"{name}: allocations seen, live at exit = framework's figure", ok,
        f"shim calls {allocs}; live by API {live}; {name} says {st['framework_live_bytes']}")

# 7. NVTX through PyTorch, with `gpushim run` (which sets NVTX_INJECTION64_PATH), caching off
# so that each step's tensors are real allocations between the range records.
nvtx_dir = os.path.join(W, "nvtx")
os.makedirs(nvtx_dir, exist_ok=True)
e = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
p = subprocess.run([BIN, "run", "--lib", LIB, "--trace", os.path.join(nvtx_dir, "t.%p.trace"), "--",
                    sys.executable, os.path.join(ROOT, "scripts", "gpu", "torch_nvtx.py")],
                   env=e, capture_output=True, text=True)
traces = [os.path.join(nvtx_dir, f) for f in os.listdir(nvtx_dir)]
pushes, marks, pops = [], 0, 0
for tr in traces:
    ev = subprocess.run([BIN, "events", "--json", tr], capture_output=True, text=True).stdout
    for line in ev.splitlines():
        r = json.loads(line)
        if r["kind"] == "range_push":
            pushes.append(r["text"])
        elif r["kind"] == "mark":
            marks += 1
        elif r["kind"] == "range_pop":
            pops += 1
ok = p.returncode == 0 and pushes == [f"step {i}" for i in range(5)] and marks == 5 and pops == 5
row("nvtx: torch.cuda.nvtx ranges recorded through injection, no code change", ok,
    f"pushes {pushes}, marks {marks}, pops {pops}; rc {p.returncode} {p.stderr.strip()[-200:] if p.returncode else ''}")

width = max(len(r[0]) for r in rows)
lines = [f"{'check'.ljust(width)}  result  detail", "-" * (width + 60)]
for c, res, d in rows:
    lines.append(f"{c.ljust(width)}  {res:<6}  {d}")
lines += [""] + notes
text = "\n".join(lines)
print(text)
out_dir = os.environ.get("OUT")
if out_dir:
    open(os.path.join(out_dir, "gpu-check.txt"), "w").write(text + "\n")
sys.exit(1 if any(r[1] == "FAIL" for r in rows) else 0)
