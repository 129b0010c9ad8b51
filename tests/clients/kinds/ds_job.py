"""One rank of a DeepSpeed job on the stand-ins (tests/kinds_zero.rs): two layers of 4 MiB of
16-bit parameters, one process per rank (RANK and WORLD_SIZE from the environment, as
torchrun sets them), DeepSpeed's files and order of requests (tests/clients/kinds/deepspeed).
No communication happens. With W ranks, at the end of a step:
  zero2  parameters 8 MiB (the flat 16-bit buffer, whole), no gradients, optimizer state
         2 x 8/W MiB (the fp32 master partition) + twice that (the client optimizer's);
         in each backward the gradient bucket (6 MiB) and the partition's gradients (8/W MiB)
  zero3  parameters 8/W MiB (this rank's partitions, packed), gradients 8/W MiB (their flat
         buffer), optimizer state as zero2's, the gradient bucket (6 MiB) kept for the run;
         each layer's whole weight gathered (4 MiB) before its forward and its backward, let
         go after
  fp16   no ZeRO, 16 bits (FP16_UnfusedOptimizer): parameters 8 MiB (the model's own), no
         gradients, optimizer state 16 MiB (fp32 master weights of every parameter) + twice
         that (the client optimizer's); each step's fp32 gradients let go within it
  bf16   ZeRO-1 in bf16 with fp32 gradient accumulation (BF16_Optimizer): parameters 8 MiB
         (the flat buffer, whole), gradients 16 MiB (the fp32 buffer they accumulate in),
         optimizer state 2 x 8/W MiB (the master partition) + twice that
usage: ds_job.py LIBTORCH_CPU LIBC10_CUDA STEPS MODE"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

from deepspeed.runtime.bf16_optimizer import BF16_Optimizer  # noqa: E402
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer  # noqa: E402
from deepspeed.runtime.zero import partition_parameters as zp  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402
from torch.autograd.function import BackwardCFunction  # noqa: E402
from torch.nn.modules.linear import Linear  # noqa: E402
from torch.nn.modules.module import Module  # noqa: E402

MiB = 1 << 20
BUCKET = 6 * MiB
steps, mode = int(sys.argv[3]), sys.argv[4]
world = int(os.environ["WORLD_SIZE"])


class Gathered(Module):
    """A layer under ZeRO-3: its weight gathered before its forward, let go after it."""

    def __init__(self, layer):
        self.layer = layer

    def forward(self, x, saved):
        whole = zp.fetch(4 * MiB)
        out = self.layer(x, saved)
        zp.release(whole)
        return out


def gather_for_backward():
    # ZeRO-3's hook before a module's backward, run by the engine: the weight gathered again.
    return zp.fetch(4 * MiB)


layers = [Linear(4 * MiB), Linear(4 * MiB)]
if mode == "zero2":
    zopt = DeepSpeedZeroOptimizer([a.weight for a in layers], 8 * MiB, world, 2, BUCKET)
    run = layers
elif mode == "zero3":
    parts = zp.Init([a.weight for a in layers], 4 * MiB, world).partitions
    for a in layers:
        a.weight = None
    zopt = DeepSpeedZeroOptimizer_Stage3(parts, 8 * MiB // world, BUCKET)
    run = [Gathered(a) for a in layers]
elif mode == "fp16":
    zopt = FP16_UnfusedOptimizer(layers, 4 * MiB)
    run = layers
elif mode == "bf16":
    zopt = BF16_Optimizer([a.weight for a in layers], 8 * MiB, world)
    run = layers
else:
    sys.exit("mode: zero2, zero3, fp16 or bf16")

for step in range(steps):
    x = _standin.empty(1 * MiB * _standin.BATCH)
    saved = []
    for layer in run:
        layer(x, saved)
    if mode == "zero2":
        zopt.backward()
    grads = []
    for a in reversed(saved):
        whole = BackwardCFunction().apply(gather_for_backward) if mode == "zero3" else None
        grad = _standin.backward_tensor(4 * MiB)
        _standin.free(a)
        if mode == "zero2":
            zopt.reduce_ready_partitions_and_remove_grads(grad)
        elif mode == "zero3":
            zopt.reduce_partition_and_remove_grads(grad)
            zp.release(whole)
        elif mode == "bf16":
            zopt.accumulate_hp_grads_and_remove_lp(grad)
        else:
            grads.append(grad)
    if mode == "fp16":
        zopt.step(grads)
    else:
        zopt.step()
    _standin.free(x)
print("trained", steps)
