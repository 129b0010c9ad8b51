"""As torch/storage.py: a storage's resize, where the allocator is asked (the stand-in's C call,
no Python frame below this file's)."""
from torch import _standin


class TypedStorage:
    def _resize_(self, nbytes):
        return _standin._lib.standin_malloc(nbytes)
