"""A helper allocates for two call sites: one block is freed, one is kept (a leak)."""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1])
kept = []


def alloc(n):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    assert rc == 0, rc
    return p


def step(i):
    scratch = alloc(1 << 20)  # freed below
    kept.append(alloc(1 << 16))  # kept: grows every iteration
    rt.cudaFree(scratch)


for i in range(20):
    step(i)
    rt.cudaDeviceSynchronize()
