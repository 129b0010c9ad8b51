"""gpushim: written by `gpushim run --pluggable` (and `--per-tensor`) into a private folder put
first on PYTHONPATH, so Python runs it at start-up as `sitecustomize`. When the program imports
torch, PyTorch's CUDA allocator becomes the shim's pool through PyTorch's pluggable allocator,
before any CUDA memory is allocated: one record per tensor with no change to the program.
PyTorch's pluggable allocator keeps no memory statistics (`torch.cuda.memory_allocated` and the
calls built on `torch.cuda.memory_stats` raise); these then answer from the shim's pool, which
keeps them per device. Under `--per-tensor` (PyTorch's cache off, so its counters read 0) only
the statistics are installed. Then the sitecustomize this one hides, if there is one further
along the path, runs as it would have."""
import os
import sys


def _gpushim_install(torch):
    lib = os.environ.get("GPUSHIM_TORCH_PLUGGABLE")
    if not lib:
        # `--per-tensor`: PyTorch's cache is off and its counters would read 0.
        lib = os.environ.get("GPUSHIM_TORCH_STATS")
        if lib:
            _gpushim_counters_or_say(torch, lib)
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
    _gpushim_counters_or_say(torch, lib)


def _gpushim_counters_or_say(torch, lib):
    try:
        _gpushim_counters(torch, lib)
    except Exception as e:  # PyTorch's statistics calls stay as they were
        sys.stderr.write(
            f"gpushim: torch.cuda.memory_stats stays PyTorch's ({type(e).__name__}: {e})\n")


# The pool's figures per device, in the order gpushim_device_stats writes them: four numbers
# (current, peak, allocated, freed) for each of these, named as PyTorch names its own, then the
# out-of-memory answers and the retries after the idle cache was given back.
_FIGURES = ("allocated_bytes", "requested_bytes", "reserved_bytes", "allocation", "segment")
_PARTS = ("current", "peak", "allocated", "freed")
_COUNT = 4 * len(_FIGURES) + 2


def _gpushim_counters(torch, lib):
    """Makes torch.cuda.memory_stats (and memory_allocated, max_memory_allocated,
    memory_reserved, max_memory_reserved, reset_peak_memory_stats,
    reset_accumulated_memory_stats, memory_summary, all built on it) answer from the shim's
    pool. PyTorch looks its C functions up at each call, so replacing them here is enough. Only
    the "all" figures exist: the pool does not split PyTorch's small and large pools."""
    import ctypes

    so = ctypes.CDLL(lib)
    read = so.gpushim_device_stats
    read.restype = ctypes.c_int
    read.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    reset = so.gpushim_reset_device_stats
    reset.restype = ctypes.c_int
    reset.argtypes = (ctypes.c_int, ctypes.c_int)

    def memory_stats(device):
        buf = (ctypes.c_uint64 * _COUNT)()
        if read(int(device), buf, _COUNT) != _COUNT:
            raise RuntimeError("gpushim: the shim keeps no memory figures without its pool "
                               "(GPUSHIM_CONF pool:off, or GPUSHIM_DISABLE=1)")
        stats = {name: {"all": dict(zip(_PARTS, buf[4 * i:4 * i + 4]))}
                 for i, name in enumerate(_FIGURES)}
        stats["num_ooms"] = buf[4 * len(_FIGURES)]
        stats["num_alloc_retries"] = buf[4 * len(_FIGURES) + 1]
        return stats

    def reset_peaks(device):
        reset(int(device), 1)

    def reset_totals(device):
        reset(int(device), 2)

    def index(device):
        if device is None:
            return torch.cuda.current_device()
        if isinstance(device, int):
            return device
        i = torch.device(device).index
        return torch.cuda.current_device() if i is None else i

    def memory_summary(device=None, abbreviated=False):
        d = index(device)
        s = memory_stats(d)

        def size(n):
            for unit in ("B", "KiB", "MiB", "GiB"):
                if n < 1024 or unit == "GiB":
                    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
                n /= 1024

        rows = [("allocated memory", "allocated_bytes", size),
                ("requested memory", "requested_bytes", size),
                ("reserved memory", "reserved_bytes", size),
                ("allocations", "allocation", str), ("segments", "segment", str)]
        out = [f"gpushim: memory of device {d} in the shim's pool (`gpushim summary` and "
               "`gpushim peak` on the run's trace say who holds it)",
               f"{'':18}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
        for label, key, fmt in rows:
            c = s[key]["all"]
            out.append(f"{label:18}" + "".join(f"{fmt(c[p]):>14}" for p in _PARTS))
        out.append(f"out of memory: {s['num_ooms']}, retried after giving the cache back: "
                   f"{s['num_alloc_retries']}")
        return "\n".join(out) + "\n"

    torch._C._cuda_memoryStats = memory_stats
    torch._C._cuda_resetPeakMemoryStats = reset_peaks
    torch._C._cuda_resetAccumulatedMemoryStats = reset_totals
    torch.cuda.memory.memory_summary = memory_summary
    torch.cuda.memory_summary = memory_summary


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
