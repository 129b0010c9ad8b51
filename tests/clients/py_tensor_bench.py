"""The host cost of one tensor event on the stand-in for PyTorch's allocator (no GPU): a loop
of `standin_malloc` + `standin_free` run DEPTH Python frames deep, timed in blocks interleaved
with blocks of two calls that allocate nothing (`standin_free(None)`), so the difference is what
the two allocator events cost in this process whatever its speed.

Prints one line: ns per event (half of an allocation and its free), the median over the blocks.

usage: py_tensor_bench.py STANDIN_LIB [DEPTH] [PAIRS_PER_BLOCK] [BLOCKS]"""
import ctypes
import statistics
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
lib.standin_malloc.restype = ctypes.c_void_p
lib.standin_malloc.argtypes = (ctypes.c_size_t,)
lib.standin_free.argtypes = (ctypes.c_void_p,)
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 20
pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
blocks = int(sys.argv[4]) if len(sys.argv) > 4 else 9
malloc, free = lib.standin_malloc, lib.standin_free


def loop(n, size):
    t0 = time.perf_counter_ns()
    if size:
        for _ in range(n):
            free(malloc(size))
    else:
        for _ in range(n):
            free(None)
            free(None)
    return time.perf_counter_ns() - t0


def at_depth(d, f, *args):
    """Runs f d Python frames below this one."""
    if d <= 0:
        return f(*args)
    return at_depth(d - 1, f, *args)


free(malloc(4096))
at_depth(depth, loop, pairs // 5, 4096)
at_depth(depth, loop, pairs // 5, 0)
events = []
for i in range(blocks):
    first, second = (4096, 0) if i % 2 == 0 else (0, 4096)
    t = {first: at_depth(depth, loop, pairs, first), second: at_depth(depth, loop, pairs, second)}
    events.append((t[4096] - t[0]) / (2 * pairs))
print(round(statistics.median(events), 1))
