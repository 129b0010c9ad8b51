"""A GPT-like training loop whose sequence length changes every step (what fragments a caching
allocator), timed per step, in one allocator mode. Prints one 'RESULT {json}' line.

Modes (set before torch is imported): default, expandable, async (backend:cudaMallocAsync),
nocache (PYTORCH_NO_CUDA_MEMORY_CACHING=1), pluggable (libgpushim.so's gpushim_alloc/free
through torch.cuda.memory.CUDAPluggableAllocator). Usage: train_bench.py MODE [STEPS]"""
import json
import os
import statistics
import sys
import time

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
if mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
elif mode == "async":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
elif mode == "nocache":
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

if mode == "pluggable":
    lib = os.environ["GPUSHIM_LIB"]
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "gpushim_alloc", "gpushim_free")
    torch.cuda.memory.change_current_allocator(alloc)

torch.manual_seed(0)
width, layers, batch = 1024, 8, 16
model = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(d_model=width, nhead=16, dim_feedforward=4 * width, batch_first=True,
                               norm_first=True),
    num_layers=layers,
).cuda()
head = nn.Linear(width, width).cuda()
opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
gen = torch.Generator(device="cpu").manual_seed(1)

free0, total = torch.cuda.mem_get_info()
used_peak = 0
times, losses = [], []
for step in range(steps):
    seq = 256 + int(torch.randint(0, 7, (1,), generator=gen)) * 128
    x = torch.randn(batch, seq, width, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = head(model(x))
        loss = y.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1e3)
    losses.append(float(loss))
    free, _ = torch.cuda.mem_get_info()
    used_peak = max(used_peak, total - free)

out = {
    "mode": mode,
    "step_ms": statistics.median(times[5:]),
    "loss_first": losses[0],
    "loss_last": losses[-1],
    "mem_get_info_peak_used": used_peak,
    "mem_get_info_total": total,
}
if mode != "pluggable" and mode != "nocache":
    out["torch_peak_reserved"] = torch.cuda.max_memory_reserved()
    out["torch_peak_allocated"] = torch.cuda.max_memory_allocated()
print("RESULT " + json.dumps(out), flush=True)
