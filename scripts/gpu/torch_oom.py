"""An out-of-memory that one setting of PyTorch's allocator avoids: a 500 MiB tensor is freed,
a 5 MiB tensor then splits its cached segment (best fit) and stays, and a 600 MiB request
finds no room, because the split segment cannot go back to CUDA. All of the device but about
1 GiB is first taken by a plain cudaMalloc outside PyTorch, so the run fails in seconds.
Prints 'RESULT {json}': whether the 600 MiB request succeeded (under the environment's
PYTORCH_CUDA_ALLOC_CONF).
usage: torch_oom.py"""
import ctypes
import json

import torch

import cudart

MIB = 1 << 20
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
free, _ = torch.cuda.mem_get_info()
lib = cudart.load()
hog = ctypes.c_void_p()
rc = lib.cudaMalloc(ctypes.byref(hog), ctypes.c_size_t(free - 1024 * MIB))
assert rc == 0, f"cudaMalloc of the rest of the device: {rc}"


def request():
    x = torch.empty(500 * MIB, dtype=torch.uint8, device="cuda")
    del x
    keep = torch.empty(5 * MIB, dtype=torch.uint8, device="cuda")
    try:
        y = torch.empty(600 * MIB, dtype=torch.uint8, device="cuda")
        del y
        return keep, True
    except torch.OutOfMemoryError:
        return keep, False


keep, ok = request()
print("RESULT " + json.dumps({"served": ok, "reserved_peak": torch.cuda.max_memory_reserved()}), flush=True)
