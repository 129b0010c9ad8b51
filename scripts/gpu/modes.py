"""PyTorch's allocator in one of the modes scripts/gpu-perf.sh compares, set up before anything
else imports torch (the environment is read when PyTorch's CUDA allocator starts):
  default     PyTorch's caching allocator
  expandable  its expandable segments
  pertensor   its cache off: one cudaMalloc/cudaFree per tensor (run under the shim's pool)
  pluggable   the shim's gpushim_alloc/gpushim_free through CUDAPluggableAllocator
              (GPUSHIM_LIB names the library)"""
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
    return torch
