"""CUDA's runtime through ctypes, for the GPU scripts that call it directly (memory taken
outside PyTorch, stream-ordered and graph allocations): the first libcudart on
LD_LIBRARY_PATH (scripts/gpu.sh puts PyTorch's wheel's there), else the wheel's own."""
import ctypes
import glob
import os


def load():
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        found = sorted(glob.glob(os.path.join(d, "libcudart.so.1*")))
        if found:
            return ctypes.CDLL(found[0])
    import nvidia.cu13
    return ctypes.CDLL(os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13"))
