"""As FSDP2's parameter group (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): one
per module `fully_shard` was given, holding that module's parameters as this rank's shards
(the whole over the world), in the order FSDP2's hooks make and let go of its buffers (as
traces of FSDP2 on an H200 show them):
  unshard    before the module's forward (pre_forward): an all-gather output of the whole on the
             all-gather stream, then the gathered parameters on the default stream
             (wait_for_unshard); at a world of one no all-gather output; in the forward the
             output is held until the next module's parameters are gathered (the module
             before's is let go then), in the backward it goes at once and the next module's
             all-gather is issued (its output held until that module gathers)
  reshard    the gathered parameters let go (after the forward when resharding, and after the
             backward)
  post_backward  the gathered parameters let go, the reduce-scatter before's input let go,
             this one's made (the gradients' bytes), the module's unsharded gradients let go,
             the rank's shard of them made on the reduce-scatter stream: its gradient
forward_end and step_end let go of the last all-gather output (and reduce-scatter input) held.
fully_shard cuts a module's weight as FSDP2 does where it is applied: the shard made, then the
whole let go (a `row`, of first dimension 1, kept whole on every rank, as FSDP2 pads a first
dimension to the world). Its tensors are asked of the allocator from this file, as PyTorch's C++ asks for
FSDP2's: no Python frame of the stand-in's below it. No communication happens. With BLOCKS_MP set
(mixed precision), each all-gather's inputs are the shards' 16-bit casts (_fsdp_collectives.py),
asked before its output, and at a world of one each shard's cast (_fsdp_param.py) just before its
gathered parameter, let go once that is made; the weights themselves are kept as they are."""
import os

from torch import _standin
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_param_all_gather_inputs
from torch.distributed.fsdp._fully_shard._fsdp_param import all_gather_inputs

ALL_GATHER_STREAM = 0x5A01
REDUCE_SCATTER_STREAM = 0x5A02
# BLOCKS_MP: mixed precision's casts (the all-gather inputs; the root's input, in blocks.py).
MP = bool(os.environ.get("BLOCKS_MP"))
# What FSDP2 holds of its last all-gather (the output) and reduce-scatter (the input).
_held = {"all_gather": None, "scatter": None}


def _empty(n):
    p = _standin._lib.standin_malloc(n)
    assert p, "out of memory"
    return p


def _on(stream, n):
    _standin._lib.standin_use_stream(stream)
    try:
        return _empty(n)
    finally:
        _standin._lib.standin_use_stream(0)


def fully_shard(module, world):
    """The module given to FSDP2: its parameter group, which cuts its weight."""
    return FSDPParamGroup(module, world)


class FSDPParamGroup:
    def __init__(self, module, world):
        # The module's parameters cut to this rank's shards (as FSDPParam's __init__ does),
        # one after another: each shard made, its whole let go. A parameter of first
        # dimension 1 (the module's `row`, where it has one) keeps that row on every rank:
        # its shard is its whole, whatever the world.
        self.world = world
        self.gathered = []
        params = []
        if getattr(module, "weight", None) is not None:
            params.append(("weight", module.weight_bytes // world))
        if getattr(module, "row", None) is not None:
            params.append(("row", module.row_bytes))
        self.shards = []
        for name, shard in params:
            whole = getattr(module, name)
            setattr(module, name, _empty(shard))
            _standin.free(whole)
            self.shards.append(shard)
        # A module of several weights (`weights`, each `weight_bytes`): every shard made, then
        # the wholes let go (as FSDP2 cuts a module's parameters).
        wholes = list(getattr(module, "weights", None) or [])
        for i in range(len(wholes)):
            shard = module.weight_bytes // world
            module.weights[i] = _empty(shard)
            self.shards.append(shard)
        for whole in wholes:
            _standin.free(whole)
        # The all-gather's output: the world times the shards.
        self.unsharded_bytes = world * sum(self.shards)

    def pre_forward(self):
        """Before the module's forward (a hook): its parameters gathered."""
        self.unshard()

    def unshard(self, backward=False, next_group=None):
        if self.world == 1:
            # At a world of one FSDP2 all-gathers nothing: no all-gather output, the gathered
            # parameters made and copied from the shards.
            self.wait_for_unshard()
            return
        output = _held["all_gather"] if backward else None
        if output is None:
            output = self.all_gather()
        elif backward:
            _held["all_gather"] = None
        self.wait_for_unshard()
        if not backward:
            if _held["all_gather"] is not None:
                _standin.free(_held["all_gather"])
            _held["all_gather"] = output
            return
        _standin.free(output)
        if next_group is not None:
            _held["all_gather"] = next_group.all_gather()

    def all_gather(self):
        """The all-gather's output on its stream; under mixed precision (BLOCKS_MP) the shards
        cast to 16 bits first, let go once the output is made."""
        cast = _get_param_all_gather_inputs(self.shards, ALL_GATHER_STREAM) if MP else None
        output = _on(ALL_GATHER_STREAM, self.unsharded_bytes)
        if cast is not None:
            _standin.free(cast)
        return output

    def wait_for_unshard(self):
        """Each parameter gathered (the world times its shard), copied out of the all-gather; at
        a world of one under mixed precision, from its shard's cast."""
        self.gathered = []
        for shard in self.shards:
            cast = all_gather_inputs(shard) if MP and self.world == 1 else None
            self.gathered.append(_empty(self.world * shard))
            if cast is not None:
                _standin.free(cast)

    def pre_backward(self, next_group=None):
        """Before the module's backward (a hook, no frame of the engine's): gathered again."""
        self.unshard(True, next_group)

    def reshard(self):
        for g in self.gathered:
            _standin.free(g)
        self.gathered = []

    def post_backward(self, grads, grad_bytes):
        """The module's backward is over: its unsharded gradients (`grads`, of `grad_bytes`)
        reduce-scattered. Returns the rank's shard of them, its gradient from now on (None
        where the backward made none)."""
        self.reshard()
        if _held["scatter"] is not None:
            _standin.free(_held["scatter"])
        _held["scatter"] = _empty(grad_bytes if grads else self.unsharded_bytes)
        for g in grads:
            _standin.free(g)
        if not grads:
            return None
        return _on(REDUCE_SCATTER_STREAM, -(-grad_bytes // self.world))


def forward_end():
    if _held["all_gather"] is not None:
        _standin.free(_held["all_gather"])
        _held["all_gather"] = None


def step_end():
    forward_end()
    if _held["scatter"] is not None:
        _standin.free(_held["scatter"])
        _held["scatter"] = None
