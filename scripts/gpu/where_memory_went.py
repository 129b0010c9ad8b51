"""A workload whose device memory `gpushim summary` must account for, run under the shim by
scripts/gpu.sh memory. Before exit it reads NVML itself (this process's figure, as nvidia-smi
shows it) and prints one 'RESULT {json}' line with PyTorch's own counters beside it, then waits
so the shim's sampler has seen the final state.

usage: where_memory_went.py WORKLOAD
  context  the CUDA context, one bf16 matrix product (cuBLAS loaded) and nothing else: what a
           process holds that no allocating call made, for comparison with gpt2
  nccl-context  the same and a one-rank NCCL process group with one small all-reduce (NCCL's
           kernels loaded): the comparison for nccl
  gpt2     GPT2LMHeadModel from GPT2Config() (no download), bf16 autocast, AdamW, 20 steps of
           batch 8 with the sequence changing every step (64..509 tokens)
  nccl     a one-rank NCCL process group on this GPU (NCCL refuses two ranks on one GPU), 20
           all-reduces of 64 MiB, and a small model's gradients all-reduced as DDP does
  pools    what context does, and 2 MiB from CUDA's default pool (cudaMallocAsync) and 2 MiB
           of graph memory (a cudaMallocAsync captured in a graph, the graph launched), both
           kept: CUDA's pools reserve in larger chunks; the comparison is context
  created  what pools does, and pools of the program's own (cudaMemPoolCreate): 2 MiB kept from
           one, one left empty, one destroyed; the comparison is context
  nodes    what context does, and a graph built node by node whose memory node
           (cudaGraphAddMemAllocNode, not a capture) keeps 2 MiB, the graph launched; the
           comparison is context
Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK set) the NCCL group has every rank, each on the GPU
of its local rank."""
import ctypes
import json
import os
import sys
import time

import torch

workload = sys.argv[1]
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def nvml_mine():
    """NVML's figure for this process on its device (bytes), or None where it lists no such pid
    (NVML's index taken for the CUDA ordinal, as no CUDA_VISIBLE_DEVICES is set here)."""
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    assert nv.nvmlInit_v2() == 0
    h = ctypes.c_void_p()
    assert nv.nvmlDeviceGetHandleByIndex_v2(dev.index, ctypes.byref(h)) == 0

    class Info(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                    ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

    n = ctypes.c_uint(64)
    infos = (Info * 64)()
    assert nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), infos) == 0
    for i in infos[: n.value]:
        if i.pid == os.getpid():
            return i.used
    return None


def nccl_group():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(dev)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    return dist


if workload in ("context", "nccl-context"):
    x = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    (x @ x).sum().item()
    if workload == "nccl-context":
        nccl_group().all_reduce(torch.ones(1024, device=dev))
elif workload == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(20):
        seq = 64 + (i * 89) % 446
        ids = torch.randint(0, 50257, (8, seq), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    loss.item()
elif workload in ("pools", "created"):
    import cudart
    x = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    (x @ x).sum().item()
    rt = cudart.load()
    kept, s = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaMallocAsync(ctypes.byref(kept), ctypes.c_size_t(2 << 20), None) == 0
    assert rt.cudaStreamCreate(ctypes.byref(s)) == 0
    g, ge, node_mem = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamBeginCapture(s, 0) == 0  # global mode
    assert rt.cudaMallocAsync(ctypes.byref(node_mem), ctypes.c_size_t(2 << 20), s) == 0
    assert rt.cudaStreamEndCapture(s, ctypes.byref(g)) == 0
    assert rt.cudaGraphInstantiate(ctypes.byref(ge), g, ctypes.c_ulonglong(0)) == 0
    assert rt.cudaGraphLaunch(ge, s) == 0
    assert rt.cudaStreamSynchronize(s) == 0
    if workload == "created":
        # cudaMemPoolProps: pinned allocations (1) on a device (location type 1, id at byte 12).
        props = (ctypes.c_int * 22)(1, 0, 1, dev.index)
        pools = [ctypes.c_void_p() for _ in range(3)]
        for p in pools:
            assert rt.cudaMemPoolCreate(ctypes.byref(p), props) == 0
        from_pool = ctypes.c_void_p()
        assert rt.cudaMallocFromPoolAsync(ctypes.byref(from_pool), ctypes.c_size_t(2 << 20),
                                          pools[0], s) == 0
        assert rt.cudaStreamSynchronize(s) == 0
        assert rt.cudaMemPoolDestroy(pools[2]) == 0
elif workload == "nodes":
    import cudart
    x = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    (x @ x).sum().item()
    rt = cudart.load()
    # cudaMemAllocNodeParams: the pool properties (pinned, on a device: location type 1, id at
    # byte 12), then the size at byte 104 and the address CUDA writes at 112.
    params = (ctypes.c_ubyte * 120)()
    ctypes.memmove(params, (ctypes.c_int * 4)(1, 0, 1, dev.index), 16)
    ctypes.c_size_t.from_buffer(params, 104).value = 2 << 20
    g, ge, node, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreate(ctypes.byref(s)) == 0
    assert rt.cudaGraphCreate(ctypes.byref(g), 0) == 0
    assert rt.cudaGraphAddMemAllocNode(ctypes.byref(node), g, None, ctypes.c_size_t(0), params) == 0
    assert rt.cudaGraphInstantiate(ctypes.byref(ge), g, ctypes.c_ulonglong(0)) == 0
    assert rt.cudaGraphLaunch(ge, s) == 0
    assert rt.cudaStreamSynchronize(s) == 0
elif workload == "nccl":
    dist = nccl_group()
    buf = torch.ones(16 << 20, device=dev)
    for _ in range(20):
        dist.all_reduce(buf)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(dev))
    for _ in range(5):
        model(torch.randn(64, 2048, device=dev)).sum().backward()
    torch.cuda.synchronize()
else:
    sys.exit(f"where_memory_went.py: unknown workload {workload!r} (context, nccl-context, gpt2, nccl, pools)")

torch.cuda.synchronize()
time.sleep(0.6)
print("RESULT " + json.dumps({
    "workload": workload,
    "rank": int(os.environ.get("RANK", "0")),
    "nvml_at_exit": nvml_mine(),
    "allocated": torch.cuda.memory_allocated(dev),
    "reserved": torch.cuda.memory_reserved(dev),
    "max_reserved": torch.cuda.max_memory_reserved(dev),
}), flush=True)
# NCCL's process group is left to the process's exit, so its buffers are held when the shim's
# sampler reads the final state (destroying it would free them first).
time.sleep(0.4)
