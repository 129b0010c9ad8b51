"""One rank of a data-parallel job on the stand-ins for PyTorch (tests/kinds.rs): the kinds
program's two layers of 4 MiB parameters, trained as FSDP1 shards them or as DDP keeps its
buckets, one process per rank (RANK and WORLD_SIZE from the environment, as torchrun sets
them). No communication happens; the frames and the order of requests are the frameworks'.
  fsdp1  each rank keeps its shard of the flat parameter (8 MiB / WORLD_SIZE, cut by FSDP's
         own code), the optimizer's state of the shard (twice it), and, from the post-backward
         hook (no frame of the engine's), its shard of the gradient; the unsharded gradient is
         let go; the optimizer's temporaries are the shard's size; the whole flat parameter
         gathered for each forward (8 MiB), let go after it, and gathered again before the
         backward (FULL_SHARD), let go by the post-backward hook
  fsdp1-grad-op  as fsdp1, the gathered flat parameter kept from the forward to the
         post-backward hook (SHARD_GRAD_OP)
  ddp    the whole parameters, DDP's buckets (8 MiB: the gradients, as views) made at build and
         again before the second forward; the optimizer's state (16 MiB)
  ddp-apart  as ddp without gradient_as_bucket_view: each backward's gradients (two of 4 MiB,
         made by the engine) beside the buckets, let go as the next step begins
         (zero_grad(set_to_none=True)); the buckets DDP's own buffers
KINDS_BATCH=N: a batch N times as large (the input and the forward's tensors).
JOB_FORWARD_TEMP_MIB=N: the wrapped model's forward (inside FSDP1's) also makes a temporary of N
MiB, let go at once: at N = 4 a shard's size at two ranks by chance.
JOB_LEAK_RANK=N: that rank alone keeps each step's last activation (3 MiB a step).
JOB_HELD_GRAD_MIB=N (fsdp1): the engine makes a weight's gradient of N MiB before FSDP1's
pre-backward hook gathers the flat parameter, and lets it go once the split's backward has
joined it into the flat parameter's gradient (as a ResNet's classifier's, held across its unit's
whole backward): a temporary of the backward, never a gradient kept. JOB_HELD_DEFERRED: in
the last step it is let go of while another stream still uses it (its free asked for, never
completed before the program ends).
usage: job.py LIBTORCH_CPU LIBC10_CUDA STEPS MODE"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch import _standin  # noqa: E402

_standin.load(sys.argv[1], sys.argv[2])

from torch.distributed.fsdp._flat_param import FlatParamHandle  # noqa: E402
from torch.distributed.fsdp._runtime_utils import (  # noqa: E402
    _post_backward_hook,
    _pre_backward_hook,
)
from torch.distributed.fsdp.fully_sharded_data_parallel import (  # noqa: E402
    FullyShardedDataParallel,
)
from torch.nn.modules.linear import Linear  # noqa: E402
from torch.nn.modules.module import Module  # noqa: E402
from torch.nn.parallel.distributed import DistributedDataParallel  # noqa: E402
from torch.optim.adam import Adam  # noqa: E402

MiB = 1 << 20
steps, mode = int(sys.argv[3]), sys.argv[4]
# JOB_WORLD: the world without WORLD_SIZE set (a trace that does not say it; tests/fit_world.rs).
world = int(os.environ.get("WORLD_SIZE") or os.environ["JOB_WORLD"])
leaks = os.environ.get("JOB_LEAK_RANK") == os.environ["RANK"]
kept = []


class Sharded(Linear):
    """A layer whose weight is a view of the flat parameter's gathered copy: none of its own."""

    def __init__(self):
        self.weight = None
        self.grad = None


class Net(Module):
    def __init__(self, nbytes):
        self.layers = [Linear(nbytes), Linear(nbytes)] if nbytes else [Sharded(), Sharded()]

    def forward(self, x, saved):
        if os.environ.get("JOB_FORWARD_TEMP_MIB"):
            _standin.free(_standin.empty(int(os.environ["JOB_FORWARD_TEMP_MIB"]) * MiB))
        for layer in self.layers:
            x = layer(x, saved)
        return x


fsdp = mode in ("fsdp1", "fsdp1-grad-op")
grads = []
if fsdp:
    # Built sharded: each rank holds its part of the flat parameter.
    handle = FlatParamHandle(8 * MiB, world)
    model = Net(0)
    opt = Adam([handle], 2 * (8 * MiB // world), 8 * MiB // world)
    wrapped = FullyShardedDataParallel(model, handle, mode == "fsdp1")
elif mode in ("ddp", "ddp-apart"):
    model = Net(4 * MiB)
    wrapped = DistributedDataParallel(model, 8 * MiB, world)
    opt = Adam(model.layers, 8 * MiB)
else:
    sys.exit("mode: fsdp1, fsdp1-grad-op, ddp or ddp-apart")

for step in range(steps):
    # zero_grad(set_to_none=True): the last step's gradients (DDP without the view) let go.
    for g in grads:
        _standin.free(g)
    x = _standin.empty(1 * MiB * _standin.BATCH)
    saved = []
    wrapped(x, saved)
    if leaks:
        kept.append(saved.pop())
    for a in saved:
        _standin.free(a)
    if fsdp:
        # Before the backward the flat parameter gathered again (FULL_SHARD); the engine's
        # gradient of the whole of it (made on its thread, by the backward of the split into
        # the parameters' views), then the hook, outside the engine's frames.
        held_mib = int(os.environ.get("JOB_HELD_GRAD_MIB", "0"))
        held = _standin.backward_tensor(held_mib * MiB) if held_mib else None
        _pre_backward_hook(handle)
        unsharded = _standin.backward_split(8 * MiB)
        if held and os.environ.get("JOB_HELD_DEFERRED") and step == steps - 1:
            _standin.free_deferred(held)
        elif held:
            _standin.free(held)
        _post_backward_hook(handle, unsharded, world)
    if mode == "ddp-apart":
        grads = [_standin.backward_tensor(4 * MiB), _standin.backward_tensor(4 * MiB)]
    if not fsdp:
        wrapped._backward_done()
    opt.step()
    _standin.free(x)
print("trained", steps)
