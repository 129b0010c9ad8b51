"""gpushim: written by `gpushim run --pluggable` into a private folder put first on PYTHONPATH,
so Python runs it at start-up as `sitecustomize`. When the program imports torch, PyTorch's CUDA
allocator becomes the shim's pool through PyTorch's pluggable allocator, before any CUDA memory
is allocated: one record per tensor with no change to the program. Then the sitecustomize this
one hides, if there is one further along the path, runs as it would have."""
import os
import sys


def _gpushim_install(torch):
    lib = os.environ.get("GPUSHIM_TORCH_PLUGGABLE")
    if not lib:
        return
    try:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "gpushim_alloc", "gpushim_free")
        torch.cuda.memory.change_current_allocator(allocator)
    except Exception as e:  # the program runs on, on PyTorch's own allocator
        sys.stderr.write(
            f"gpushim: --pluggable: PyTorch kept its own allocator ({type(e).__name__}: {e})\n")
        return
    # PyTorch holds it too; this keeps the Python object for as long as torch lives.
    torch._gpushim_allocator = allocator


class _GpushimTorchFinder:
    """Finds torch with the finders after it, and installs the allocator once torch's own
    module has run (it starts no CUDA). Leaves sys.meta_path once it has found torch."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        spec = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _gpushim_install(module)

        # The loader was made for this spec alone.
        spec.loader.exec_module = exec_module
        return spec


def _gpushim_chain():
    """Runs the sitecustomize that this one hides, if any, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if "torch" not in sys.modules:
    sys.meta_path.insert(0, _GpushimTorchFinder())
_gpushim_chain()
