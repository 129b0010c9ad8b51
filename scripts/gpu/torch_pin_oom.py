"""A program that runs out of memory by fragmentation, for scripts/gpu.sh oomfix: each step
takes a large tensor a little larger than the last, then a 1.25 MiB tensor that lands in the
large one's segment (PyTorch's best fit), and frees the large one: every segment stays pinned
by its small tensor, so reserved memory grows by about one segment a step while little is
allocated, until PyTorch's limit.

usage: torch_pin_oom.py fraction|device|mempool|graph [STEPS]
  fraction   torch.cuda.set_per_process_memory_fraction holds PyTorch's allocator to 3 GiB
  device     no fraction: a tensor fills the device but for 3 GiB first
  mempool    as fraction, and a torch.cuda.MemPool first takes 1 GiB of tensors and keeps it
             cached after they are freed (the pool stays alive): memory the default pools
             cannot use
  graph      as fraction, and a CUDA graph captured first keeps 1 GiB in its private pool
  STEPS      stop after that many steps (the truth runs give the traced run's failing step)
Prints 'RESULT {json}': the step that failed (or none), reserved and allocated then."""
import json
import sys

import torch

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
MiB = 1 << 20
GiB = 1 << 30
total = torch.cuda.get_device_properties(0).total_memory
filler = None
keep = []
if mode in ("fraction", "mempool", "graph"):
    torch.cuda.set_per_process_memory_fraction(3 * GiB / total)
    if mode == "mempool":
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            xs = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
        del xs
        keep.append(pool)
    elif mode == "graph":
        x = torch.zeros(1024, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            (x * 2).sum()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = torch.empty(GiB, dtype=torch.uint8, device="cuda").fill_(1)
            z = y[:1024].float().sum() + x.sum()
        del y
        keep += [g, z]
else:
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(free - 3 * GiB, dtype=torch.uint8, device="cuda")
pins = []
failed = None
for i in range(steps):
    try:
        big = torch.empty(int((20.5 + 2 * i) * MiB), dtype=torch.uint8, device="cuda")
        pins.append(torch.empty(int(1.25 * MiB), dtype=torch.uint8, device="cuda"))
        del big
    except torch.OutOfMemoryError:
        failed = i
        break
torch.cuda.synchronize()
print("RESULT " + json.dumps({"mode": mode, "failed_step": failed, "steps": steps,
                              "reserved": torch.cuda.memory_reserved(),
                              "allocated": torch.cuda.memory_allocated()}), flush=True)
