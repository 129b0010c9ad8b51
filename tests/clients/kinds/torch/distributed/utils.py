"""As torch/distributed/utils.py's storage helper, which FSDP1 makes its gathered flat parameter
with: the storage grown through torch/storage.py (the frame innermost to the allocation)."""
from torch.storage import TypedStorage


def _alloc_storage(nbytes):
    return TypedStorage()._resize_(nbytes)


def _sync_module_states(nbytes):
    """DDP's broadcast of the module's states as it wraps the model: `_broadcast_coalesced`
    (C++, under `_sync_params_and_buffers`) joins them into one buffer of their size and lets
    it go."""
    _sync_params_and_buffers(nbytes)


def _sync_params_and_buffers(nbytes):
    from torch import _standin

    _standin.free(_standin._lib.standin_malloc(nbytes))


def _broadcast_states_elsewhere(nbytes):
    """The same broadcast under a name the frames do not know (a release that renames it)."""
    from torch import _standin

    _standin.free(_standin._lib.standin_malloc(nbytes))
