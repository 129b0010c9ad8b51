"""Real training workloads whose shapes change every step, timed per step, in one allocator
mode. Prints one 'RESULT {json}' line. Used by scripts/gpu.sh perf, which alternates modes.

usage: workloads.py WORKLOAD MODE [STEPS]
  WORKLOAD  transformer (8 layers, width 1024, sequences 64..319)
            gpt2 (GPT2LMHeadModel from GPT2Config(), bf16 autocast, AdamW, sequences 64..509)
            resnet50 (torchvision, channels-last, bf16, batch 16..44, resolution 160..256)
            Each changes its shape every step, cycling through 6 shapes; the first 6 steps
            (one cycle) are warm-up and not timed.
  MODE      default | expandable | pertensor | pluggable (modes.py), or toggle: one process
            under the shim's pool with PyTorch's cache switched off and on by
            torch.cuda.memory.caching_allocator_enable, a cycle of shapes at a time (off, on,
            on, off, ...), so per-tensor steps and cached steps are timed minutes apart at most
            and a drifting machine moves both alike (scripts/gpu.sh inproc); or swap: the same
            with PyTorch's caching allocator and the pluggable one (GPUSHIM_LIB's) swapped
            instead (modes.swap_allocators). TOGGLE_NULL=1 keeps PyTorch's cache in both
            halves, to show how far from 1.000 the method itself lands
WORKLOAD_SCALE=N (environment) multiplies every batch by N: with N large enough the GPU, not
the host, bounds the step, and what remains of a mode's cost is on the GPU's side. GROW=N
(transformer, gpt2; not with toggle or swap) makes the sequence N tokens longer every step
(GPT-2 stops at 1024), so the peak climbs every step.
Device memory is NVML's (the shim does not intercept it), sampled after every step. host_ms is
the time the host took to enqueue the step (until `loss.item()` waits for the GPU): a step whose
host_ms is close to step_ms is bound by the host, and any host cost of the allocator adds to it."""
import gc
import json
import os
import statistics
import sys
import time

from modes import set_up, swap_allocators

workload, mode = sys.argv[1], sys.argv[2]
# GROW=N: the sequence grows by N tokens every step instead of cycling (transformer, gpt2), so
# the peak climbs every step and the allocator meets sizes it never saw.
GROW = int(os.environ.get("GROW", "0"))
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
if GROW and mode in ("toggle", "swap"):
    sys.exit("workloads.py: GROW compares nothing in toggle or swap (their pairs need shapes that repeat)")
torch = set_up("default" if mode in ("toggle", "swap") else mode)
if mode == "toggle":
    # Per tensor from the start, as `gpushim run --per-tensor` would be: the model's
    # parameters and the optimizer's state are the pool's, as in a per-tensor run.
    use_cache = torch.cuda.memory.caching_allocator_enable
    use_cache(False)
elif mode == "swap":
    # PyTorch's caching allocator and the pluggable one (the shim's) in one process, swapped
    # between cycles (modes.py); the shim's from the start, as in a pluggable run.
    use_cache = swap_allocators(torch)
    use_cache(False)
import pynvml  # noqa: E402

pynvml.nvmlInit()
nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
torch.manual_seed(0)
dev = "cuda"
SCALE = int(os.environ.get("WORKLOAD_SCALE", "1"))

if workload == "transformer":
    import torch.nn as nn
    layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(32000, 1024),
                          nn.TransformerEncoder(layer, 8, enable_nested_tensor=False),
                          nn.Linear(1024, 32000)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        seq = 64 + GROW * i if GROW else 64 + (i * 51) % 257
        x = torch.randint(0, 32000, (8 * SCALE, seq), device=dev)
        return x, x

    def loss_of(x, y):
        out = model(x)
        return torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
elif workload == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        seq = min(64 + GROW * i, 1024) if GROW else 64 + (i * 89) % 449
        x = torch.randint(0, 50257, (8 * SCALE, seq), device=dev)
        return x, x

    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
elif workload == "resnet50":
    import torchvision
    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        b = (16 + (i * 7) % 33) * SCALE
        r = 160 + ((i * 13) % 4) * 32
        x = torch.randn(b, 3, r, r, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device=dev)
        return x, y

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)
else:
    sys.exit(f"unknown workload {workload}")

# Shapes change every step, cycling through SHAPES of them; the first cycle is warm-up, so
# what is timed is steady training, not cuDNN and cuBLAS meeting a shape for the first time
# (which made single runs differ by 20%).
SHAPES = 6


def step(i):
    """One training step on shape i; (step ms, host ms): host ms ends when the step waits."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = batch(i if GROW else i % SHAPES)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    step.value = loss.item()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000, (t1 - t0) * 1000


def cached_now():
    """Whether PyTorch's cache serves tensors now: a fresh tensor counts in its statistics
    only when it does (the uncached path calls cudaMalloc and counts nothing, and tensors of
    the pluggable allocator are not the cache's). The statistics are read from PyTorch's
    allocator (in swap mode the pluggable one, which keeps none, is put aside to read them)."""
    def allocated():
        if mode != "swap":
            return torch.cuda.memory_allocated()
        was = use_cache.current()
        use_cache(True)
        n = torch.cuda.memory_allocated()
        use_cache(was)
        return n
    before = allocated()
    probe = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
    counted = allocated() > before
    del probe
    return counted


peak = 0
if mode in ("toggle", "swap"):
    # Cycles run off, on, on, off, off, on, on, off, ... (the first two are warm-up): each
    # pair of neighbouring cycles (same shapes, seconds apart) gives one ratio, and the order
    # within a pair alternates, so a machine that drifts one way does not favour either.
    cycles = {False: [], True: []}
    host = {False: [], True: []}
    checked = {}
    by_shape = {}
    pairs = max(1, steps // (2 * SHAPES))
    # TOGGLE_NULL=1: the cache stays on in both halves (the "off" cycles too), so the pairs
    # compare like with like: how far from 1.000 the method itself lands.
    null = os.environ.get("TOGGLE_NULL") == "1"
    # Python's cycle collector runs when it likes, inside a step, and a full collection of a
    # process that imported torch (and transformers) is long next to a step. After the warm-up
    # everything alive is frozen (left out of collections), and the collector runs between
    # cycles, outside the timed steps, instead. KEEP_GC=1 leaves it as it is.
    quiet_gc = os.environ.get("KEEP_GC") != "1"
    for c in range(2 * (pairs + 1)):
        if quiet_gc and c >= 2:
            if c == 2:
                gc.collect()
                gc.freeze()
                gc.disable()
            else:
                gc.collect()
        on = c % 4 in (1, 2)
        use_cache(on or null)
        checked.setdefault(on, cached_now())
        times = [step(c * SHAPES + k) for k in range(SHAPES)]
        if c >= 2:
            cycles[on].append(sum(t for t, _ in times))
            host[on].extend(h for _, h in times)
            for k, (t, _) in enumerate(times):
                by_shape.setdefault((on, k), []).append(t)
        peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(nvml).used)
    ratios = [off / on for off, on in zip(cycles[False], cycles[True])]
    # Robust to a step that stalls (a cycle's sum carries it whole): each shape's median step
    # in each mode, summed over the shapes.
    def shape_sum(on):
        return sum(statistics.median(by_shape[(on, k)]) for k in range(SHAPES))
    print("RESULT " + json.dumps({
        "workload": workload + (f"x{SCALE}" if SCALE > 1 else ""), "mode": mode,
        "pairs": len(ratios),
        "off_ms": statistics.median(cycles[False]) / SHAPES,
        "on_ms": statistics.median(cycles[True]) / SHAPES,
        "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ratio_shapes": shape_sum(False) / shape_sum(True),
        "off_host_ms": statistics.median(host[False]), "on_host_ms": statistics.median(host[True]),
        "toggle_ok": checked == ({False: True, True: True} if null else {False: False, True: True}),
        "null": null, "quiet_gc": quiet_gc,
        "nvml_peak": peak, "loss": step.value}), flush=True)
    sys.exit(0)

YARDSTICK = torch.ones(16, device=dev)


def launch_speed():
    """How fast this process's host runs work that no allocator takes part in: µs per in-place
    kernel launch on a small tensor made before (no allocation; the shim has no hook on
    launches). Identical processes on the GPU machine ran their steps 20-40% apart;
    scripts/gpu.sh perf shows the ratios both raw and divided by this."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        YARDSTICK.add_(1.0)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / 2000 * 1e6


times, host, launch_us = [], [], []
for i in range(steps + SHAPES):
    t, h = step(i)
    if i >= SHAPES:
        times.append(t)
        host.append(h)
    if i % SHAPES == SHAPES - 1:
        launch_us.append(launch_speed())
    peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(nvml).used)
print("RESULT " + json.dumps({"workload": workload, "mode": mode,
                              "step_ms": statistics.median(times), "nvml_peak": peak,
                              "host_ms": statistics.median(host),
                              "launch_us": statistics.median(launch_us),
                              "loss": step.value}), flush=True)
