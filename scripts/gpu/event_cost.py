"""The host cost of one tensor event (an allocation or a free through PyTorch's caching
allocator, no kernel), in whatever the process runs under: a loop of `torch.empty` and `del`
run DEPTH Python frames deep, timed in blocks. Every block reuses a cached block, so PyTorch's
allocator never calls CUDA: what is timed is PyTorch's own bookkeeping and whatever watches it.

Identical processes on the GPU machine run up to twice as fast as one another, which hides a
cost of 100 ns. So each block of tensors is paired with a block of empty tensors
(`torch.empty(0)`: the same Python and the same tensor made and dropped, but no allocation, so
no allocator event), the two interleaved: the difference is what the two allocator events cost
in this process, and the empty block says how fast this process runs.

Prints one 'RESULT {json}' line: ns per event (half of an allocation and its free), the median
over the blocks of (tensor block - empty block) / 2, and the empty block's ns per tensor.

usage: event_cost.py [DEPTH] [PAIRS_PER_BLOCK] [BLOCKS]
HISTORY=1 (environment) turns PyTorch's own memory history on first
(`torch.cuda.memory._record_memory_history(stacks="python")`), for comparison."""
import json
import os
import statistics
import sys
import time

import torch

depth = int(sys.argv[1]) if len(sys.argv) > 1 else 20
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 9
if os.environ.get("HISTORY") == "1":
    torch.cuda.memory._record_memory_history(stacks="python")
empty = torch.empty
torch.cuda.init()
x = empty(4096, dtype=torch.uint8, device="cuda")
del x
torch.cuda.synchronize()


def loop(n, size):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = empty(size, dtype=torch.uint8, device="cuda")
        del x
    return time.perf_counter_ns() - t0


def at_depth(d, f, *args):
    """Runs f d Python frames below this one."""
    if d <= 0:
        return f(*args)
    return at_depth(d - 1, f, *args)


at_depth(depth, loop, pairs // 5, 4096)
at_depth(depth, loop, pairs // 5, 0)
events, base = [], []
for i in range(blocks):
    # Alternated in order too (AB BA AB ...), so that neither always runs first.
    first, second = (4096, 0) if i % 2 == 0 else (0, 4096)
    t = {first: at_depth(depth, loop, pairs, first), second: at_depth(depth, loop, pairs, second)}
    events.append((t[4096] - t[0]) / (2 * pairs))
    base.append(t[0] / pairs)
print("RESULT " + json.dumps({
    "depth": depth,
    "ns_per_event": statistics.median(events),
    "empty_ns": statistics.median(base),
    "blocks": [round(e, 1) for e in events],
}), flush=True)
