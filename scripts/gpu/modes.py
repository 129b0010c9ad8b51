"""PyTorch's allocator in one of the modes scripts/gpu.sh perf compares, set up before anything
else imports torch (the environment is read when PyTorch's CUDA allocator starts):
  default     PyTorch's caching allocator
  expandable  its expandable segments
  pertensor   its cache off: one cudaMalloc/cudaFree per tensor (run under the shim's pool)
  pluggable   the shim's gpushim_alloc/gpushim_free through CUDAPluggableAllocator
              (GPUSHIM_LIB names the library)
  history     PyTorch's caching allocator with its own memory history on, Python stacks
              (torch.cuda.memory._record_memory_history(stacks="python")), for comparison
swap_allocators() puts PyTorch's caching allocator and the pluggable one in one process, to
time them within it (scripts/gpu.sh inproc)."""
import ctypes
import os


def set_up(mode):
    """Sets the allocator up for MODE and returns the torch module."""
    if mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif mode == "pertensor":
        os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    import torch

    if mode == "pluggable":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            os.environ["GPUSHIM_LIB"], "gpushim_alloc", "gpushim_free")
        torch.cuda.memory.change_current_allocator(alloc)
    elif mode == "history":
        torch.cuda.memory._record_memory_history(stacks="python")
    return torch


# PyTorch keeps the allocator every CUDA tensor comes from in one atomic pointer,
# c10::cuda::CUDACachingAllocator::allocator (libc10_cuda.so; a variable's mangled name does not
# depend on its type): torch.cuda.memory.change_current_allocator stores into it, and only
# before PyTorch's allocator has started.
CURRENT_ALLOCATOR = "_ZN3c104cuda20CUDACachingAllocator9allocatorE"


def swap_allocators(torch):
    """For timing only: both PyTorch's caching allocator and the pluggable one over
    GPUSHIM_LIB's gpushim_alloc/gpushim_free in this process, CUDA not started yet. Returns
    use_cache(on): on, PyTorch's caching allocator serves the next tensors; off, the pluggable
    one; use_cache.current() says which. Call it only while no other thread allocates (between
    steps, after a synchronize). A tensor is freed by the allocator that made it whatever is
    current then (PyTorch binds the deleter at allocation), so tensors may outlive a swap; a
    raw allocation (raw_alloc/raw_delete) must not: its free goes to the allocator current then,
    and either allocator refuses a pointer it did not make (an error, not a wrong free). The
    workloads of scripts/gpu/workloads.py ran to the end through hundreds of swaps."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))
    slot = ctypes.c_void_p.in_dll(lib, CURRENT_ALLOCATOR)
    native = slot.value
    plug = torch.cuda.memory.CUDAPluggableAllocator(
        os.environ["GPUSHIM_LIB"], "gpushim_alloc", "gpushim_free")
    # Allowed now: PyTorch's allocator has not started. This also makes PyTorch hold the
    # pluggable allocator for the life of the process (its tensors' deleters use it).
    torch.cuda.memory.change_current_allocator(plug)
    pluggable = slot.value
    if not native or not pluggable or native == pluggable:
        raise RuntimeError(f"swap_allocators: {CURRENT_ALLOCATOR} did not change "
                           f"({native or 0:#x} -> {pluggable or 0:#x}): not this PyTorch's layout")
    # PyTorch's own allocator current again when CUDA starts, so it is the one started.
    slot.value = native
    torch.cuda.init()

    def use_cache(on):
        slot.value = native if on else pluggable

    use_cache.current = lambda: slot.value == native
    use_cache.keep = plug
    return use_cache
