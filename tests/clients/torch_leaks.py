"""A training loop with the two classic leaks of PyTorch users, on the stand-in for PyTorch's
caching allocator (tests/standin/c10_cuda.cpp): a layer that keeps a copy of its output on
every call, and a metric kept with the activation it was computed from. Each keeps 4 MiB per
step; everything else is freed. The allocator caches, so after the first steps it takes no new
segment for the freed tensors.

usage: torch_leaks.py STANDIN_LIB [STEPS]"""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.standin_malloc.restype = ctypes.c_void_p
lib.standin_malloc.argtypes = (ctypes.c_size_t,)
lib.standin_free.argtypes = (ctypes.c_void_p,)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
MiB = 1 << 20


def empty(n):
    p = lib.standin_malloc(n)
    assert p, "out of memory"
    return p


class CachingLayer:
    def __init__(self):
        self.seen = []

    def __call__(self, x):
        y = empty(8 * MiB)
        self.seen.append(empty(4 * MiB))  # leak (a): a copy of every output, kept
        return y


def train(steps):
    layer = CachingLayer()
    norms = []
    for step in range(steps):
        x = empty(2 * MiB)
        h = layer(x)
        norms.append(empty(4 * MiB))  # leak (b): the metric keeps its activation alive
        grad = empty(8 * MiB)
        for p in (grad, h, x):
            lib.standin_free(p)


train(steps)
