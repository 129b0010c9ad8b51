"""Allocations the way a PyTorch model makes them: a forward pass through nested modules
(each call two wrapper frames deep, as nn.Module's __call__ is), a different call site for
each allocation, through ctypes on the simulator. Prints nanoseconds per allocation.
Usage: py_model.py LIBCUDART STEPS"""
import ctypes
import sys
import time

rt = ctypes.CDLL(sys.argv[1])
steps = int(sys.argv[2])
malloc, free = rt.cudaMalloc, rt.cudaFree
live = []


def tensor(n):
    p = ctypes.c_void_p()
    malloc(ctypes.byref(p), ctypes.c_size_t(n))
    live.append(p)


class Module:
    def __call__(self, x):
        return self._call_impl(x)

    def _call_impl(self, x):
        return self.forward(x)


class Linear(Module):
    def forward(self, x):
        tensor(4096)
        return x


class Norm(Module):
    def forward(self, x):
        tensor(1024)
        tensor(1024)
        return x


class Attention(Module):
    def __init__(self):
        self.q, self.k, self.v, self.o = Linear(), Linear(), Linear(), Linear()

    def forward(self, x):
        x = self.q(x)
        x = self.k(x)
        x = self.v(x)
        tensor(8192)  # scores
        tensor(8192)  # softmax
        return self.o(x)


class Block(Module):
    def __init__(self):
        self.n1, self.attn, self.n2 = Norm(), Attention(), Norm()
        self.fc1, self.fc2 = Linear(), Linear()

    def forward(self, x):
        x = self.attn(self.n1(x))
        return self.fc2(self.fc1(self.n2(x)))


class Model(Module):
    def __init__(self, depth):
        self.blocks = [Block() for _ in range(depth)]

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def train(model, steps):
    n = 0
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        model(0)
        n += len(live)
        for p in live:
            free(p)
        live.clear()
    return (time.perf_counter_ns() - t0) / n


def nest(k, f):
    return f() if k == 0 else nest(k - 1, f)


model = Model(12)
nest(8, lambda: train(model, 5))  # warm up
print(f"{nest(8, lambda: train(model, steps)):.0f}")
