"""Loads the CUDA runtime with ctypes (RTLD_LOCAL, functions found with dlsym on the handle)
and allocates and frees once. Prints each call's result."""
import ctypes
import sys

rt = ctypes.CDLL(sys.argv[1] if len(sys.argv) > 1 else "libcudart.so.13")
p = ctypes.c_void_p()
rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))
print("cudaMalloc", rc)
rc2 = rt.cudaFree(p)
print("cudaFree", rc2)
sys.exit(1 if rc or rc2 else 0)
