"""Host cost of one PyTorch tensor's allocation and free, in the allocator mode this process
runs in (MODE: see modes.py): torch.empty of sizes drawn from a training-like mix (many
small, some of 1-64 MiB), 32 live at a time, no kernels. Prints one 'RESULT {json}' line.

usage: alloc_cost.py MODE [ROUNDS]"""
import json
import random
import sys
import time

from modes import set_up

mode = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
torch = set_up(mode)

rng = random.Random(0)
sizes = [rng.choice([768, 3072, 4096, 65536, 262144, 786432]) if rng.random() < 0.8
         else rng.randrange(1 << 20, 64 << 20) for _ in range(4096)]
live = [None] * 32
torch.cuda.synchronize()


def loop(count):
    t0 = time.perf_counter_ns()
    for i in range(count):
        live[i % 32] = torch.empty(sizes[i % 4096], dtype=torch.uint8, device="cuda")
    return (time.perf_counter_ns() - t0) / count


loop(20_000)
ns = loop(n)
print("RESULT " + json.dumps({"mode": mode, "ns_per_tensor": ns}), flush=True)
