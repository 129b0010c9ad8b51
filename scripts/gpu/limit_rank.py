"""Fills the process's GPU with 256 MiB tensors until out of memory, under a gpushim `limit`.
Prints 'RESULT {json}': what cudaMemGetInfo showed before, when full and after releasing, and
how much was allocated. Works under torchrun (RANK/LOCAL_RANK) or alone."""
import json
import os
import time

import torch

rank = int(os.environ.get("RANK", 0))
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
free0, total0 = torch.cuda.mem_get_info()
chunks = []
t0 = time.perf_counter()
try:
    while len(chunks) < 4096:
        chunks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        chunks[-1].fill_(1)
except torch.OutOfMemoryError:
    pass
free1, _ = torch.cuda.mem_get_info()
n = len(chunks)
del chunks
torch.cuda.empty_cache()
free2, total2 = torch.cuda.mem_get_info()
mib = lambda b: b >> 20  # noqa: E731
print("RESULT " + json.dumps({
    "rank": rank, "device": torch.cuda.current_device(), "total_shown_mib": mib(total0),
    "free_at_start_mib": mib(free0), "allocated_mib": n * 256, "free_when_full_mib": mib(free1),
    "free_after_release_mib": mib(free2), "total_after_mib": mib(total2),
    "fill_s": round(time.perf_counter() - t0, 2),
}), flush=True)
