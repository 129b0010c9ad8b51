"""Cost of recording an allocation's stack: allocates and frees a small block N times from a
Python stack DEPTH frames deep (ctypes, on the simulator) and prints nanoseconds per round.
Usage: py_bench.py LIBCUDART N DEPTH"""
import ctypes
import sys
import time

rt = ctypes.CDLL(sys.argv[1])
n, depth = int(sys.argv[2]), int(sys.argv[3])
malloc, free = rt.cudaMalloc, rt.cudaFree
size = ctypes.c_size_t(4096)


def rounds():
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        malloc(ref, size)
        free(p)
    return (time.perf_counter_ns() - t0) / n


def nest(k):
    # Each level is a frame of its own, at a line of its own.
    if k <= 1:
        return rounds()
    return nest(k - 1)


nest(depth)  # warm up: caches filled, stacks interned
print(f"{nest(depth):.0f}")
