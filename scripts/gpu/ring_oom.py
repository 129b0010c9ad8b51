"""GPT-2 training that keeps every step's logits (a leak of some 400 MiB a step at batch 4 x 512)
until the device runs out, for scripts/gpu.sh ringoom. All of the device but FREE_GIB (the
environment, default 40) is first taken by a plain cudaMalloc outside PyTorch, so the run fails
within some 90 steps. The out-of-memory error is not caught: the program dies of it, as a
real run does. Prints 'STEP N' after each step.
usage: ring_oom.py [--batch-size B] [--steps N]"""
import argparse
import ctypes
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import cudart

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
free, _ = torch.cuda.mem_get_info()
leave = int(os.environ.get("FREE_GIB", "40")) << 30
hog = ctypes.c_void_p()
if free > leave:
    rc = cudart.load().cudaMalloc(ctypes.byref(hog), ctypes.c_size_t(free - leave))
    assert rc == 0, f"cudaMalloc of all but {leave} bytes: {rc}"

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
kept = []
for step in range(args.steps):
    x = torch.randint(0, 50257, (args.batch_size, 512), device="cuda")
    out = model(x, labels=x)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    kept.append(out.logits.detach())  # the leak: every step's logits, kept
    print(f"STEP {step}", flush=True)
