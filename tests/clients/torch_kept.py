"""The metric leak as PyTorch makes it, on the stand-in for PyTorch's caching allocator: every
step computes three activations (4, 2 and 1 MiB) and a metric from them (4 B); the metric is
kept, and its autograd graph keeps the activations alive. When the list of metrics goes (here at
the end of train, as at a function's return or the interpreter's exit), each metric is freed and
then the activations it kept, as PyTorch's destructors do. A layer also keeps a copy of each
output (4 MiB) in a list of its own, freed after the metrics. The rest is freed every step.

usage: torch_kept.py STANDIN_LIB [STEPS] [release|never]"""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.standin_malloc.restype = ctypes.c_void_p
lib.standin_malloc.argtypes = (ctypes.c_size_t,)
lib.standin_free.argtypes = (ctypes.c_void_p,)
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
release = (sys.argv[3] if len(sys.argv) > 3 else "release") == "release"
MiB = 1 << 20


def empty(n):
    p = lib.standin_malloc(n)
    assert p, "out of memory"
    return p


def train(steps):
    metrics, copies = [], []
    for step in range(steps):
        x = empty(2 * MiB)
        act = empty(4 * MiB)  # the activation a metric's graph keeps
        copies.append(empty(4 * MiB))  # a copy of every output, kept on its own
        metric = empty(4)  # the metric, kept with its graph
        mid = empty(2 * MiB)  # two more activations the graph keeps
        last = empty(1 * MiB)
        metrics.append((metric, act, mid, last))
        grad = empty(8 * MiB)
        for p in (grad, x):
            lib.standin_free(p)
    if release:
        for kept in metrics:
            for p in kept:
                lib.standin_free(p)
        for c in copies:
            lib.standin_free(c)


train(steps)
