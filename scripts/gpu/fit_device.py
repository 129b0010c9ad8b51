"""The largest batch on the whole device, against real runs: scripts/gpu.sh fitdevice.

usage: fit_device.py facts
       fit_device.py search WORK MODEL SETTING PREDICTED
facts: the device's memory as each source gives it (NVML's two calls, CUDA's driver, PyTorch).
search: from the predicted largest batch, real runs (a fresh process each, fit_truth.py, 3
steps, nothing set but the setting) until the largest that runs is known (one that runs and
the next that does not), galloping then halving; appends its TRUTH lines to WORK/truth.jsonl
and prints 'LARGEST model setting batch'."""
import ctypes
import json
import os
import subprocess
import sys


def facts():
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    nvml.nvmlInit_v2()
    h = ctypes.c_void_p()
    nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))

    class V1(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class V2(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                    ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
    v1 = V1()
    nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(v1))
    v2 = V2()
    v2.version = ctypes.sizeof(V2) | (2 << 24)
    rc2 = nvml.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(v2))
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuInit(0)
    total = ctypes.c_size_t()
    cuda.cuDeviceTotalMem_v2(ctypes.byref(total), 0)
    import torch
    free, t_total = torch.cuda.mem_get_info()
    MiB = 1 << 20
    print(f"{'source':44} {'MiB':>8}")
    print(f"{'NVML nvmlDeviceGetMemoryInfo total':44} {v1.total // MiB:>8}")
    if rc2 == 0:
        print(f"{'NVML nvmlDeviceGetMemoryInfo_v2 total':44} {v2.total // MiB:>8}")
        print(f"{'NVML nvmlDeviceGetMemoryInfo_v2 reserved':44} {v2.reserved // MiB:>8}")
    print(f"{'CUDA cuDeviceTotalMem':44} {total.value // MiB:>8}")
    print(f"{'PyTorch mem_get_info total':44} {t_total // MiB:>8}")
    print(f"{'PyTorch get_device_properties total_memory':44} {torch.cuda.get_device_properties(0).total_memory // MiB:>8}")
    print(f"{'free with a context (mem_get_info)':44} {free // MiB:>8}")


def runs(work, model, setting, batch):
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=setting)
    out = subprocess.run([sys.executable, "scripts/gpu/fit_truth.py", "run", model, str(batch), "3"],
                         env=env, capture_output=True, text=True)
    line = next((l[6:] for l in out.stdout.splitlines() if l.startswith("TRUTH ")), None)
    if line is None:
        raise SystemExit(f"{model} {batch} '{setting}': the run failed: {out.stderr[-400:]}")
    with open(os.path.join(work, "truth.jsonl"), "a") as f:
        f.write(line + "\n")
    return not json.loads(line).get("oom")


def search(work, model, setting, predicted):
    known = {}

    def ok(b):
        if b not in known:
            known[b] = runs(work, model, setting, b)
        return known[b]
    step = 1
    if ok(predicted):
        lo, hi = predicted, None
        while hi is None:
            b = lo + step
            if ok(b):
                lo, step = b, step * 2
            else:
                hi = b
    else:
        lo, hi = None, predicted
        while lo is None:
            b = max(1, hi - step)
            if ok(b):
                lo = b
            else:
                hi, step = b, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    print(f"LARGEST {model} {setting or '-'} {lo} ({len(known)} runs)", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "facts":
        facts()
    else:
        search(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
