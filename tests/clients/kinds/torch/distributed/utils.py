"""As torch/distributed/utils.py's storage helper, which FSDP1 makes its gathered flat parameter
with: the storage grown through torch/storage.py (the frame innermost to the allocation)."""
from torch.storage import TypedStorage


def _alloc_storage(nbytes):
    return TypedStorage()._resize_(nbytes)
