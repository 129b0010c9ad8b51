"""Memory a program gives back reaches other processes (contract 8), measured with NVML.

`python3 giveback.py run` prints one table: for each way of giving memory back (PyTorch's
empty_cache, CuPy's free_all_blocks, a plain cudaFree loop through ctypes) and each shim mode,
the device memory NVML shows in use 2.5 s after the program freed 60% of the GPU (above what
was used before it started), and whether a second process, without the shim, could then
allocate 60% of the GPU while the first one still runs. NVML is not intercepted by the shim.
Environment: GPUSHIM_LIB (the shim), GPUSHIM_MODES (default: all rows below).
"""
import os
import subprocess
import sys
import time

import pynvml

FRACTION = 0.6
CHUNK = 1 << 30


def used_mib():
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetMemoryInfo(h).used / (1 << 20)


def total_bytes():
    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total


def holder(kind):
    n = int(total_bytes() * FRACTION) // CHUNK
    if kind == "torch":
        import torch
        xs = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(n)]
        torch.cuda.synchronize()
        print("held", flush=True)
        del xs
        torch.cuda.empty_cache()
    elif kind == "cupy":
        import cupy
        xs = [cupy.empty(CHUNK, dtype=cupy.uint8) for _ in range(n)]
        cupy.cuda.Device(0).synchronize()
        print("held", flush=True)
        del xs
        cupy.get_default_memory_pool().free_all_blocks()
    else:
        import ctypes
        import cudart
        rt = cudart.load()
        ps = []
        for _ in range(n):
            p = ctypes.c_void_p()
            assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(CHUNK)) == 0
            ps.append(p)
        print("held", flush=True)
        for p in ps:
            assert rt.cudaFree(p) == 0
    print("freed", flush=True)
    time.sleep(60)


def taker():
    import torch
    n = int(total_bytes() * FRACTION) // CHUNK
    try:
        xs = [torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(n)]
        torch.cuda.synchronize()
        print("ok", len(xs))
    except RuntimeError:
        print("failed")


def run():
    shim = os.environ["GPUSHIM_LIB"]
    modes = {
        "no shim": {},
        "pool:off": {"LD_PRELOAD": shim, "GPUSHIM_CONF": "pool:off"},
        "default": {"LD_PRELOAD": shim},
        "pool:caching": {"LD_PRELOAD": shim, "GPUSHIM_CONF": "pool:caching"},
        "pool:expandable": {"LD_PRELOAD": shim, "GPUSHIM_CONF": "pool:expandable"},
        "pool:caching,trim:off": {"LD_PRELOAD": shim, "GPUSHIM_CONF": "pool:caching,trim:off"},
    }
    wanted = os.environ.get("GPUSHIM_MODES")
    if wanted:
        modes = {k: v for k, v in modes.items() if k in wanted.split(";")}
    rows = []
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSHIM_") and k != "LD_PRELOAD"}
    base_env["GPUSHIM_TRACE"] = "off"
    for kind in ["torch", "cupy", "cudart"]:
        for mode, extra in modes.items():
            before = used_mib()
            env = dict(base_env, **extra)
            p = subprocess.Popen([sys.executable, __file__, "holder", kind], env=env,
                                 stdout=subprocess.PIPE, text=True)
            held = None
            for line in p.stdout:
                if line.strip() == "held":
                    held = used_mib() - before
                if line.strip() == "freed":
                    break
            time.sleep(2.5)
            after = used_mib() - before
            t = subprocess.run([sys.executable, __file__, "taker"], env=base_env,
                               capture_output=True, text=True)
            p.kill()
            p.wait()
            rows.append((kind, mode, held or 0.0, after, t.stdout.strip().split()[0] if t.stdout else "error"))
            time.sleep(1)
    print(f"{'program':8} {'mode':24} {'held MiB':>10} {'2.5 s after free MiB':>22} {'second process 60%':>20}")
    for kind, mode, held, after, taken in rows:
        print(f"{kind:8} {mode:24} {held:10.0f} {after:22.0f} {taken:>20}")


if __name__ == "__main__":
    {"holder": lambda: holder(sys.argv[2]), "taker": taker, "run": run}[sys.argv[1]]()
