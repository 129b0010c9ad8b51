"""Cost of recording an allocation's stack: allocates and frees a small block N times from a
Python stack DEPTH frames deep (ctypes, on the simulator) and prints nanoseconds per round.
With THRASH_KB, that much other memory is written before each call (as a real program's own
work evicts the shim from the caches), only the calls are timed, and each level of the stack
is a function of its own (its own code object, as in a real program's stack).
Usage: py_bench.py LIBCUDART N DEPTH [THRASH_KB]"""
import ctypes
import sys
import time

rt = ctypes.CDLL(sys.argv[1])
n, depth = int(sys.argv[2]), int(sys.argv[3])
thrash = int(sys.argv[4]) * 1024 if len(sys.argv) > 4 else 0
junk = ctypes.create_string_buffer(max(thrash, 1))
malloc, free = rt.cudaMalloc, rt.cudaFree
size = ctypes.c_size_t(4096)


def rounds():
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    if thrash:
        clock, memset, spent = time.perf_counter_ns, ctypes.memset, 0
        for i in range(n):
            memset(junk, i & 0xFF, thrash)
            t0 = clock()
            malloc(ref, size)
            t1 = clock()
            memset(junk, ~i & 0xFF, thrash)
            t2 = clock()
            free(p)
            spent += t1 - t0 + clock() - t2
        return spent / n
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


if thrash:
    # level_1 calls rounds(), level_k calls level_(k-1).
    exec(
        "".join(
            f"def level_{k}():\n    return {'rounds' if k == 1 else f'level_{k - 1}'}()\n"
            for k in range(1, depth + 1)
        )
    )
    nest = lambda _: globals()[f"level_{depth}"]()  # noqa: E731

nest(depth)  # warm up: caches filled, stacks interned
print(f"{nest(depth):.0f}")
