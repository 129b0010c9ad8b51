"""As deepspeed/runtime/zero/partition_parameters.py: each parameter cut into this rank's
partition (`ds_tensor`), the whole gathered again before the module that uses it runs (in its
forward and again in its backward) and let go after it."""
from deepspeed.utils.nvtx import instrument_w_nvtx
from torch import _standin


class Init:
    """As ZeRO-3's `Init`, which the engine runs over a model built without it: each of its
    parameters cut into this rank's partition."""

    def __init__(self, params, nbytes, world):
        self.partitions = [_partition_param(p, nbytes, world) for p in params]


def _partition_param(param, nbytes, world):
    part = _standin._lib.standin_malloc(nbytes // world)
    _standin.free(param)
    return part


def _allgather_params_coalesced(nbytes):
    return _standin._lib.standin_malloc(nbytes)


_all_gather = instrument_w_nvtx(_allgather_params_coalesced)


def fetch(nbytes):
    return _all_gather(nbytes)


def release(gathered):
    _standin.free(gathered)
