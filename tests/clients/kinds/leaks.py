"""A training loop with the two leaks PyTorch users write most, on the stand-ins for PyTorch
(tests/standin, the modules under tests/clients/kinds/torch): a layer whose forward keeps a
copy of its output on every call, and a metric the loop computes from the model's output and
keeps with its graph. Each keeps 4 MiB a step; everything else is freed (the batch, the
forward's activations in the backward) or made once (the weights, their gradients, Adam's
state). Both leaks are activations: made in a forward, or from its output before the backward,
and never freed. The README's first example and scripts/demo.sh run it.

usage: leaks.py LIBTORCH_CPU LIBC10_CUDA [STEPS]"""
import os
import sys

if len(sys.argv) < 3:
    sys.exit(
        "usage: leaks.py LIBTORCH_CPU LIBC10_CUDA [STEPS]\n"
        "the two libraries are the stand-ins scripts/build-sim.sh DIR builds into DIR/torch/lib:\n"
        "  scripts/build-sim.sh /tmp/sim\n"
        "  LD_LIBRARY_PATH=/tmp/sim gpushim run -- python3 tests/clients/kinds/leaks.py \\\n"
        "      /tmp/sim/torch/lib/libtorch_cpu.so /tmp/sim/torch/lib/libc10_cuda.so"
    )
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

import torch.autograd  # noqa: E402
from torch.nn.modules.linear import Linear  # noqa: E402
from torch.nn.modules.module import Module  # noqa: E402
from torch.optim.adam import Adam  # noqa: E402

MiB = 1 << 20
# The allocator's own call, as PyTorch's C++ makes a tensor: no Python frame of the stand-in's
# between the program's line and the allocation.
empty = _standin._lib.standin_malloc


class CachingLayer(Module):
    def __init__(self):
        self.inner = Linear(4 * MiB)
        self.seen = []

    def forward(self, x, saved):
        y = self.inner(x, saved)
        self.seen.append(empty(4 * MiB))  # leak (a): a copy of every output, kept
        return y


def train(steps):
    layer = CachingLayer()
    opt = Adam([layer.inner], 8 * MiB)
    norms = []
    for _ in range(steps):
        x = empty(2 * MiB)
        saved = []
        h = layer(x, saved)
        norms.append(empty(4 * MiB))  # leak (b): the metric keeps its graph alive
        torch.autograd.backward(saved, [layer.inner], 4 * MiB)
        opt.step()
        _standin.free(x)
        del h


train(int(sys.argv[3]) if len(sys.argv) > 3 else 30)
