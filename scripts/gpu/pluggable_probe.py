"""What a PyTorch program sees of its memory calls, CUDA graphs and torch.compile
(scripts/gpu.sh pluggable runs it alone, with PyTorch's cache off, and under `gpushim run
--pluggable` and `--per-tensor`). Prints one 'PROBE {json}' line: each check's answer, or the
error it raised (type and the first line of its message), so the runs can be set side by side.
PROBE_COMPILE=0 leaves torch.compile out."""
import json
import os
import sys

import torch

MiB = 1 << 20
out = {}


def probe(name, fn):
    try:
        out[name] = fn()
    except Exception as e:  # the answer is the error itself
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        out[name] = f"raises {type(e).__name__}: {first[:90]}"


probe("backend", lambda: torch.cuda.memory.get_allocator_backend())
probe("pluggable installed", lambda: hasattr(torch, "_gpushim_allocator"))
x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
x.fill_(7)
torch.cuda.synchronize()
probe("memory_allocated (64 MiB live)", lambda: torch.cuda.memory_allocated())
probe("memory_reserved", lambda: torch.cuda.memory_reserved())
probe("max_memory_allocated", lambda: torch.cuda.max_memory_allocated())
probe("memory_stats keys", lambda: len(torch.cuda.memory_stats()))
probe("reset_peak_memory_stats", lambda: torch.cuda.reset_peak_memory_stats() or "ok")
probe("memory_summary (first words)", lambda: " ".join(torch.cuda.memory_summary().split()[:3]))
probe("memory_snapshot segments", lambda: len(torch.cuda.memory_snapshot()))
probe("mem_get_info free<=total", lambda: (lambda f, t: f <= t)(*torch.cuda.mem_get_info()))
del x
probe("empty_cache", lambda: torch.cuda.empty_cache() or "ok")
probe("memory_allocated after free", lambda: torch.cuda.memory_allocated())


def graph_replay():
    """A CUDA graph captured and replayed twice: its output must be right each time."""
    lin = torch.nn.Linear(256, 256, device="cuda")
    inp = torch.randn(64, 256, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            lin(inp)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = lin(inp) * 2
    ok = True
    for scale in (1.0, 3.0):
        inp.copy_(torch.randn(64, 256, device="cuda") * scale)
        g.replay()
        torch.cuda.synchronize()
        ok = ok and torch.allclose(y, lin(inp) * 2, atol=1e-4)
    del g, y
    return "replayed right" if ok else "WRONG RESULT"




def train_steps():
    """Three optimizer steps of a small MLP with shapes that change: loss finite."""
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for batch in (32, 96, 17):
        loss = model(torch.randn(batch, 512, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return "finite" if torch.isfinite(loss).item() else "NOT FINITE"


probe("train 3 steps", train_steps)


def compiled(mode):
    """A small MLP's forward compiled by torch.compile (`mode`), run on 3 batch sizes that
    repeat: its outputs must match eager execution."""
    def run():
        torch._dynamo.reset()
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                                    torch.nn.Linear(512, 256)).cuda()
        fn = torch.compile(model, mode=mode)
        ok = True
        with torch.no_grad():
            for batch in (64, 64, 64, 32, 32, 32):
                x = torch.randn(batch, 256, device="cuda")
                ok = ok and torch.allclose(fn(x), model(x), atol=1e-3, rtol=1e-3)
        torch.cuda.synchronize()
        return "matches eager" if ok else "WRONG RESULT"
    return run


# The graph captures last: a failed capture leaves PyTorch's state unfit for what follows.
if os.environ.get("PROBE_COMPILE", "1") == "1":
    probe("torch.compile (default)", compiled("default"))
probe("CUDA graph capture + replay", graph_replay)
if os.environ.get("PROBE_COMPILE", "1") == "1":
    probe("torch.compile reduce-overhead (CUDA graphs)", compiled("reduce-overhead"))
print("PROBE " + json.dumps(out), flush=True)
sys.exit(0)
