"""As FSDP1's post-backward (torch/distributed/fsdp/_runtime_utils.py): run from a hook on a
flat parameter's AccumulateGrad, so no frame of the autograd engine's is on the stack. It
reduce-scatters the unsharded gradient into this rank's shard, which lives on as the flat
parameter's gradient; the unsharded gradient is let go. Before the backward, FULL_SHARD gathers
the flat parameter again (`_pre_backward_hook`), let go by the post-backward; SHARD_GRAD_OP
kept it from the forward, and lets it go there."""
from torch import _standin


def _get_reduce_scatter_tensors(unsharded_bytes, world):
    return _standin._lib.standin_malloc(unsharded_bytes // world)


def _reduce_grad(handle, unsharded, world):
    shard = _get_reduce_scatter_tensors(handle.unsharded_bytes, world)
    _standin.free(unsharded)
    if handle.grad is None:
        handle.grad = shard
    else:
        _standin.free(shard)


def _pre_forward_unshard(handle):
    handle.unshard()


def _post_forward_reshard(handle):
    handle.reshard()


def _pre_backward_hook(handle):
    if handle.unsharded is None:
        handle.unshard()


def _post_backward_hook(handle, unsharded, world):
    _reduce_grad(handle, unsharded, world)
    handle.reshard()
