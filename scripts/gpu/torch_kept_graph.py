"""A loss kept with its whole autograd graph, for scripts/gpu.sh tensors: a three-layer model
whose forward makes its activations on lines of their own, trained for STEPS steps while every
step's loss is appended to a list (the graph, and every activation it saved, stays alive), the
list cleared at the end. `gpushim leaks` must join each activation's line to the loss's.

usage: torch_kept_graph.py [STEPS]"""
import sys

import torch
import torch.nn as nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
dev = "cuda"


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(width, width) for _ in range(3))

    def forward(self, x):
        h1 = torch.relu(self.a(x))  # ACT 1
        h2 = torch.tanh(self.b(h1))  # ACT 2
        return torch.sigmoid(self.c(h2))  # ACT 3


model = Mlp(1024).to(dev)
losses = []
for step in range(steps):
    x = torch.randn(512 + 32 * (step % 4), 1024, device=dev)  # shapes change every step
    loss = model(x).square().mean()  # LOSS
    losses.append(loss)  # KEPT: the loss keeps its graph and every activation in it
torch.cuda.synchronize()
losses.clear()
torch.cuda.synchronize()
print(f"done: {steps} steps")
