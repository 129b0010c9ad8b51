"""As FSDP1's flat parameter (torch/distributed/fsdp/_flat_param.py): the handle of a wrapped
module's parameters flattened into one, of which each rank keeps its shard (the unsharded
bytes over the world: the stand-in's sizes divide evenly, as FSDP pads them to), cut from the
whole flat parameter made first (the module's parameters joined) and let go. Before the
module's forward the shards are gathered into the whole flat parameter (through the storage
helper and torch/storage.py, as FSDP1 does), let go after it. Its tensors are asked of the
allocator as PyTorch's C++ asks: no Python frame of the stand-in's below those files'."""
from torch import _standin
from torch.distributed.utils import _alloc_storage


class FlatParamHandle:
    def __init__(self, unsharded_bytes, world):
        self.unsharded_bytes = unsharded_bytes
        self.weight = None
        self.grad = None
        self.unsharded = None
        self.shard(world)

    def shard(self, world):
        # As FSDP1: the whole flat parameter made (flatten_tensors), the rank's chunk of it
        # cloned, the whole let go: the whole is the unit's size at any world.
        whole = _standin._lib.standin_malloc(self.unsharded_bytes)
        self.weight = _standin._lib.standin_malloc(self.unsharded_bytes // world)
        _standin.free(whole)

    def unshard(self):
        self.unsharded = self._alloc_padded_unsharded_flat_param()

    def _alloc_padded_unsharded_flat_param(self):
        # As FSDP1: a storage grown by the package's helper (torch/distributed/utils.py).
        return _alloc_storage(self.unsharded_bytes)

    def reshard(self):
        _standin.free(self.unsharded)
        self.unsharded = None
