"""As FSDP2's collectives (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): under
mixed precision, a unit's all-gather inputs are its shards cast to the parameters' 16-bit
dtype, asked on the all-gather stream before the all-gather's output and let go once it is
made (as traces of FSDP2 with MixedPrecisionPolicy(param_dtype=bfloat16) on an H200 show). Asked
of the allocator from this function, as PyTorch's C++ asks for FSDP2's: no Python frame of the
stand-in's below it."""
from torch import _standin


def _get_param_all_gather_inputs(shards, stream):
    """The 16-bit casts of `shards` (their bytes) on `stream`: half their bytes, one request."""
    _standin._lib.standin_use_stream(stream)
    try:
        p = _standin._lib.standin_malloc(sum(shards) // 2)
    finally:
        _standin._lib.standin_use_stream(0)
    assert p, "out of memory"
    return p
