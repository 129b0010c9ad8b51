"""The workspaces cuDNN asks of PyTorch's allocator for one convolution, batch by batch: a
vision transformer's patch embedding (3 channels to C, 16 x 16, stride 16, 224 x 224 images),
its forward and backward at each batch, every request PyTorch's allocator saw (its memory
history), in MiB. What a run at one batch cannot show of another: cuDNN's heuristics pick an
algorithm, and its workspace, by shape (docs/gpu-checks.md).

usage: conv_workspace.py [C]       (C: 384 by default)
prints one line a batch: the input's and output's MiB, then the forward's and the backward's
requests (the output, the workspace; the weight's gradient, the workspace, the bias's)."""
import sys

import torch

dev = "cuda"
torch.manual_seed(0)
channels = int(sys.argv[1]) if len(sys.argv) > 1 else 384
print("cudnn", torch.backends.cudnn.version(), "torch", torch.__version__,
      torch.cuda.get_device_name(), "channels", channels)
conv = torch.nn.Conv2d(3, channels, 16, 16).to(dev)


def requests(fn):
    """The sizes of the requests `fn` made of PyTorch's allocator, in order."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    fn()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return [e["size"] for trace in snap["device_traces"] for e in trace if e["action"] == "alloc"]


def mib(sizes):
    return ",".join(f"{s / 2**20:.2f}" for s in sizes)


for b in [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 2230]:
    x = torch.randn(b, 3, 224, 224, device=dev)
    out = {}
    forward = requests(lambda: out.setdefault("y", conv(x)))
    y = out["y"]
    g = torch.randn_like(y)
    backward = requests(lambda: y.backward(g))
    print(f"B={b} in={x.numel() * 4 / 2**20:.2f}M out={y.numel() * 4 / 2**20:.2f}M "
          f"fwd={mib(forward)} bwd={mib(backward)}")
    del x, y, g, out
    conv.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
