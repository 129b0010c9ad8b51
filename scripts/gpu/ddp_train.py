"""DistributedDataParallel training under torchrun, NCCL backend, one process per GPU.

A small transformer with a sequence length that changes every step; each step is an NVTX range
"step" (so `gpushim leaks` finds the iterations). Rank 0 prints 'LOSS step value' (the loss
averaged over ranks) and every rank prints 'RESULT {json}' (median step time).

Usage: torchrun --nproc_per_node=N ddp_train.py MODE [STEPS] [LEAK_MIB]
MODE: default (PyTorch's caching allocator) or nocache (PYTORCH_NO_CUDA_MEMORY_CACHING=1, so
every tensor is a cudaMalloc the shim pools). LEAK_MIB > 0 keeps that many MiB per step alive
(a deliberate leak for the reports)."""
import json
import os
import statistics
import sys
import time

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
leak_mib = int(sys.argv[3]) if len(sys.argv) > 3 else 0
if mode == "nocache":
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

rank, local, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))

torch.manual_seed(0)
width = 768
model = nn.TransformerEncoder(
    nn.TransformerEncoderLayer(d_model=width, nhead=12, dim_feedforward=4 * width,
                               batch_first=True, norm_first=True, dropout=0.0),
    num_layers=6,
).cuda()
ddp = DDP(model, device_ids=[local])
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
gen = torch.Generator(device="cpu").manual_seed(100 + rank)
kept = []
times = []
for step in range(steps):
    torch.cuda.nvtx.range_push("step")
    t0 = time.perf_counter()
    seq = (128, 320, 192, 256, 96)[step % 5]
    x = torch.randn(16, seq, width, generator=gen).cuda()
    y = torch.randn(16, seq, width, generator=gen).cuda()
    loss = ((ddp(x) - y) ** 2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    avg = loss.detach().clone()
    dist.all_reduce(avg)
    avg /= world
    if leak_mib:
        kept.append(torch.empty(leak_mib << 20, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    torch.cuda.nvtx.range_pop()
    if rank == 0:
        print(f"LOSS {step} {avg.item():.9e}", flush=True)

dist.barrier()
print("RESULT " + json.dumps({
    "rank": rank,
    "step_ms": round(statistics.median(times[5:]) * 1e3, 2),
    "max_reserved_mib": torch.cuda.max_memory_reserved() >> 20,
}), flush=True)
dist.destroy_process_group()
