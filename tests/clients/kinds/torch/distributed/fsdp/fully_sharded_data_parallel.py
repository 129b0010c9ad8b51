"""As FSDP1's wrapper (torch/distributed/fsdp/fully_sharded_data_parallel.py): a module whose
forward gathers the flat parameter, runs the wrapped module (its tensors made inside, under
this file's frames), and lets the gathered copy go (FULL_SHARD) or keeps it for the backward
(SHARD_GRAD_OP: reshard_after_forward False)."""
from torch.distributed.fsdp import _runtime_utils
from torch.nn.modules.module import Module


class FullyShardedDataParallel(Module):
    def __init__(self, module, handle, reshard_after_forward=True):
        self._fsdp_wrapped_module = module
        self._handle = handle
        self._reshard_after_forward = reshard_after_forward

    def forward(self, x, saved):
        _runtime_utils._pre_forward_unshard(self._handle)
        out = self._fsdp_wrapped_module(x, saved)
        if self._reshard_after_forward:
            _runtime_utils._post_forward_reshard(self._handle)
        return out
