"""A small model whose forward ops stand on lines of their own (each marked FWD(name)), trained
a few steps with backward, for `scripts/gpu.sh backward`: the tensors PyTorch's autograd thread
allocates must name the line of the forward op that made their backward function.

usage: backward_lines.py [STEPS]"""
import sys

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
dev = torch.device("cuda")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(1024, 4096)
        self.fc2 = torch.nn.Linear(4096, 1024)

    def forward(self, x):
        h = self.fc1(x)  # FWD(fc1)
        h = torch.relu(h)  # FWD(relu)
        h = h * torch.sigmoid(h)  # FWD(gate)
        return self.fc2(h)  # FWD(fc2)


model = Net().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(steps):
    x = torch.randn(256 + 32 * step, 1024, device=dev)
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
