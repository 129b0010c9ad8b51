"""Two PyTorch training loops that leak the way people's do, for scripts/gpu.sh pyframes:

  losses   keeps every step's loss tensor (losses.append(loss) instead of loss.item())
  cache    a custom layer keeps a copy of its output every step

usage: pyleaks.py losses|cache [STEPS]"""
import sys

import torch
import torch.nn as nn

kind = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
dev = "cuda"
torch.manual_seed(0)


class CachingLayer(nn.Module):
    """A layer that remembers what it computed (for a later look, say): a tensor per step."""

    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.seen = []

    def forward(self, x):
        y = torch.relu(self.lin(x))
        self.seen.append(y.detach().clone())  # LEAK(cache): one copy per step, never dropped
        return y


def train_losses():
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        x = torch.randn(256, 512, device=dev)
        y = torch.randint(0, 10, (256,), device=dev)
        loss = nn.functional.cross_entropy(model(x), y)  # LEAK(losses): kept below
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss)  # keeps the tensor (and its graph) alive
    torch.cuda.synchronize()


def train_cache():
    model = nn.Sequential(nn.Linear(512, 1024), CachingLayer(1024), nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x = torch.randn(128, 512, device=dev)
        y = torch.randint(0, 10, (128,), device=dev)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()


{"losses": train_losses, "cache": train_cache}[kind]()
