"""A training loop whose memory by kind is known exactly, on the stand-ins for PyTorch
(tests/kinds.rs): two layers of 4 MiB parameters and a 2 MiB buffer made by moving the model,
per step a 1 MiB batch, per layer a 512 KiB temporary and a 3 MiB activation in the forward,
the loss's 256 KiB gradient and 4 MiB gradients from the backward (a temporary after the first step, added in place), 8 MiB of
optimizer state per layer and a 1 MiB temporary in each step; a 128 KiB loss computed in the
loop (outside any module), kept until the step ends; and, at the first layer's first forward,
a 1 MiB workspace kept for the whole run (as PyTorch's for cuBLASLt). With `leak`, the program
keeps each step's last activation in a list (a metric holding its graph).

usage: train.py LIBTORCH_CPU LIBC10_CUDA STEPS [leak] [--batch-size N]
KINDS_PACE set: a 2 ms pause every 50 steps. KINDS_BATCH=N: a batch N times as large (the
batch, the forward's tensors, the loss and its gradient N times their size; tests/fit.rs);
`--batch-size N` at the end of the command line says the same, as a training script's flag.
KINDS_AFFINE set: per step also 1 MiB plus 256 KiB a sample from the program's own line (a
buffer that grows with the batch only in part), freed at the step's end. KINDS_SEQ=N (or
`--seq-len N`): a sequence N times as long (the same tensors N times their size again);
KINDS_ATTENTION set: per layer also attention's scores, kept for the backward, N squared times
16 KiB. KINDS_REDUCE=N: in each backward, while the activations are live, a global reduction
over N rows a sample (its staging buffer sized as PyTorch sizes it: with the rows until the
device is full). KINDS_BIAS set: each layer
has a bias too, and its backward sums the bias's gradient over the rows, through a staging
buffer only from batch 6 on (torch/_standin.py); KINDS_BIAS=16: the node's gradients in 16
bits, as under autocast, from batch 3 on. KINDS_CONV=N: after each forward, a
convolution's workspace of N bytes a sample, done without when the allocator refuses it (as cuDNN's next algorithm needs none);
the program says how many times. KINDS_OWN set: after the forward, the program's own line makes
a 2 MiB tensor from its output (as `h = gelu(lin(x))`), kept in a list with its graph (a
metric's leak), then the last layer runs once more before the backward. KINDS_SHUTDOWN set: as
the interpreter's shutdown begins (an atexit handler), the parameters, their gradients and the
optimizer state are freed with no line of the program's, as Python's shutdown frees what a
program's last lines still held. KINDS_TAIL=N: after the last step, N tensors of 4 KiB made, then all
freed: the program's last allocation followed by N records of frees. KINDS_OPT_PAUSE=S: the
last step's optimizer makes its temporaries all first, as PyTorch's foreach steps do, with a
pause of S seconds after the first (a ring's checkpoint taken inside the step)."""
import os
import sys
import time

if len(sys.argv) < 4:
    sys.exit(
        "usage: train.py LIBTORCH_CPU LIBC10_CUDA STEPS [leak] [--batch-size N]\n"
        "the two libraries are the stand-ins scripts/build-sim.sh DIR builds into DIR/torch/lib:\n"
        "  scripts/build-sim.sh /tmp/sim\n"
        "  LD_LIBRARY_PATH=/tmp/sim gpushim run -- python3 tests/clients/kinds/train.py \\\n"
        "      /tmp/sim/torch/lib/libtorch_cpu.so /tmp/sim/torch/lib/libc10_cuda.so 20"
    )
if "--batch-size" in sys.argv[:-1]:
    os.environ["KINDS_BATCH"] = sys.argv[sys.argv.index("--batch-size") + 1]
if "--seq-len" in sys.argv[:-1]:
    os.environ["KINDS_SEQ"] = sys.argv[sys.argv.index("--seq-len") + 1]

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

import torch.autograd  # noqa: E402
from torch.nn.modules.conv import Conv2d  # noqa: E402
from torch.nn.modules.linear import Linear  # noqa: E402
from torch.nn.modules.module import Module  # noqa: E402
from torch.optim.adam import Adam  # noqa: E402

MiB = 1 << 20


class Net(Module):
    def __init__(self):
        self.layers = [Linear(4 * MiB), Linear(4 * MiB)]

    def forward(self, x, saved):
        for layer in self.layers:
            x = layer(x, saved)
        return x


model = Net()
model.to(2 * MiB)
if os.environ.get("KINDS_SHUTDOWN") is not None:
    import atexit

    def _shutdown():
        for state in opt.state.values():
            _standin.free(state)
        for layer in model.layers:
            _standin.free(layer.weight)
            if layer.grad:
                _standin.free(layer.grad)

    atexit.register(_shutdown)
opt = Adam(model.layers, 8 * MiB)
steps = int(sys.argv[3])
leak = len(sys.argv) > 4 and sys.argv[4] == "leak"
kept = []
pace = os.environ.get("KINDS_PACE") is not None
affine = os.environ.get("KINDS_AFFINE") is not None
conv = Conv2d(int(os.environ["KINDS_CONV"])) if os.environ.get("KINDS_CONV") else None
own = os.environ.get("KINDS_OWN") is not None
opt_pause = float(os.environ.get("KINDS_OPT_PAUSE", "0"))
metrics = []
for step in range(steps):
    if pace and step % 50 == 0:
        time.sleep(0.002)  # lets the shim's summarizer keep up with a ring on a busy machine
    x = _standin.empty(1 * MiB * _standin.BATCH * _standin.SEQ)
    extra = _standin.empty(1 * MiB + 256 * 1024 * _standin.BATCH) if affine else None
    saved = []
    out = model(x, saved)
    if conv is not None:
        conv(out, saved)
    if own:
        metrics.append(_standin.empty(2 * MiB))  # computed from the forward's output
        out = model.layers[-1](out, saved)
    loss = _standin.empty(128 * 1024 * _standin.BATCH * _standin.SEQ)  # outside any module
    if leak:
        kept.append(out)
    torch.autograd.backward(saved, model.layers, 4 * MiB, keep=kept)
    opt.step(opt_pause if step == steps - 1 else 0.0)
    _standin.free(loss)
    _standin.free(x)
    if extra is not None:
        _standin.free(extra)
tail = [_standin.empty(4096) for _ in range(int(os.environ.get("KINDS_TAIL", "0")))]
for t in tail:
    _standin.free(t)
if conv is not None:
    print("workspaces done without", conv.done_without)
print("trained", steps)
