"""Real training workloads whose shapes change every step, timed per step, in one allocator
mode. Prints one 'RESULT {json}' line. Used by scripts/gpu-perf.sh, which alternates modes.

usage: workloads.py WORKLOAD MODE [STEPS]
  WORKLOAD  transformer (8 layers, width 1024, sequences 64..319)
            gpt2 (GPT2LMHeadModel from GPT2Config(), bf16 autocast, AdamW, sequences 64..509)
            resnet50 (torchvision, channels-last, bf16, batch 16..44, resolution 160..256)
            Each changes its shape every step, cycling through 6 shapes; the first 6 steps
            (one cycle) are warm-up and not timed.
  MODE      default | expandable | pertensor | pluggable (modes.py)
Device memory is NVML's (the shim does not intercept it), sampled after every step. host_ms is
the time the host took to enqueue the step (until `loss.item()` waits for the GPU): a step whose
host_ms is close to step_ms is bound by the host, and any host cost of the allocator adds to it."""
import json
import statistics
import sys
import time

from modes import set_up

workload, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 15
torch = set_up(mode)
import pynvml  # noqa: E402

pynvml.nvmlInit()
nvml = pynvml.nvmlDeviceGetHandleByIndex(0)
torch.manual_seed(0)
dev = "cuda"

if workload == "transformer":
    import torch.nn as nn
    layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(32000, 1024),
                          nn.TransformerEncoder(layer, 8, enable_nested_tensor=False),
                          nn.Linear(1024, 32000)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        seq = 64 + (i * 51) % 257
        x = torch.randint(0, 32000, (8, seq), device=dev)
        return x, x

    def loss_of(x, y):
        out = model(x)
        return torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
elif workload == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        seq = 64 + (i * 89) % 449
        x = torch.randint(0, 50257, (8, seq), device=dev)
        return x, x

    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
elif workload == "resnet50":
    import torchvision
    model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch(i):
        b = 16 + (i * 7) % 33
        r = 160 + ((i * 13) % 4) * 32
        x = torch.randn(b, 3, r, r, device=dev).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device=dev)
        return x, y

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)
else:
    sys.exit(f"unknown workload {workload}")

# Shapes change every step, cycling through SHAPES of them; the first cycle is warm-up, so
# what is timed is steady training, not cuDNN and cuBLAS meeting a shape for the first time
# (which made single runs differ by 20%).
SHAPES = 6
times, host, peak = [], [], 0
for i in range(steps + SHAPES):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x, y = batch(i % SHAPES)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    value = loss.item()
    torch.cuda.synchronize()
    if i >= SHAPES:
        times.append((time.perf_counter() - t0) * 1000)
        host.append((t1 - t0) * 1000)
    peak = max(peak, pynvml.nvmlDeviceGetMemoryInfo(nvml).used)
print("RESULT " + json.dumps({"workload": workload, "mode": mode,
                              "step_ms": statistics.median(times), "nvml_peak": peak,
                              "host_ms": statistics.median(host),
                              "loss": value}), flush=True)
