"""As FSDP2's common helpers (torch/distributed/fsdp/_fully_shard/_fsdp_common.py): under mixed
precision the root's forward casts its inputs to the parameters' 16-bit dtype (`_cast_fp_tensor`),
a tensor of the batch: half the input's bytes, on the default stream."""
from torch import _standin


def _cast_fp_tensor(nbytes):
    """The 16-bit cast of an fp32 input of `nbytes`."""
    p = _standin._lib.standin_malloc(nbytes // 2)
    assert p, "out of memory"
    return p
