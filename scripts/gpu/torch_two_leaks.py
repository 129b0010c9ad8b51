"""A PyTorch training loop with the two classic leaks, 4 MiB per step each, for
scripts/gpu.sh tensors: a custom layer that keeps a copy of its output on every call, and a
metric kept with its autograd graph (which keeps the activation it was computed from alive).
Everything else is freed every step, so PyTorch's cache stops growing after the first steps.
With `release`, the program drops what it kept at the end (the metrics, then the copies).
usage: torch_two_leaks.py [STEPS] [release]"""
import sys

import torch
import torch.nn as nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
dev = "cuda"
WIDTH, BATCH = 1024, 1024  # one activation: 1024 x 1024 x 4 B = 4 MiB


class CachingLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.seen = []

    def forward(self, x):
        y = torch.relu(self.lin(x))
        self.seen.append(y.detach().clone())  # LEAK A: a copy of every output, kept
        return y


model = nn.Sequential(nn.Linear(WIDTH, WIDTH), CachingLayer(), nn.Linear(WIDTH, WIDTH)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
norms = []
for step in range(steps):
    x = torch.randn(BATCH, WIDTH, device=dev)
    h = model[1](model[0](x))
    out = model[2](h)
    loss = out.square().mean()
    norms.append((h * h).mean())  # LEAK B: the metric keeps its graph, and with it h
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"done: {len(norms)} steps, allocated {torch.cuda.memory_allocated() >> 20} MiB, "
      f"reserved {torch.cuda.memory_reserved() >> 20} MiB")
if "release" in sys.argv[2:]:  # what a program does at an epoch's end: drop what it kept
    norms.clear()
    model[1].seen.clear()
    torch.cuda.synchronize()
