"""A training run for checking `gpushim simulate --torch`: the same steps every time it runs
(shapes from a seed, changing every step), under whatever PYTORCH_CUDA_ALLOC_CONF the
environment sets. Prints one 'RESULT {json}' line with what PyTorch's allocator itself counted.

usage: torch_replay.py WORKLOAD STEPS [tiny]
  WORKLOAD  gpt2 (GPT2LMHeadModel, bf16 autocast, AdamW, 8 sequences of 64..575 tokens)
            resnet50 (torchvision, channels-last, bf16, AdamW, batch 16..76, 160..256 pixels)
            transformer (nn.TransformerEncoder, 6 layers of width 768, batch 4..19 of 32..543)
            streams (the transformer, its batches made on a side stream and handed over with
            record_stream, so their memory comes back only once the main stream's work passed)
  tiny      a small model of the same kind (the traces kept as test data)
After step 3 the run calls torch.cuda.empty_cache() once, as programs do between phases."""
import json
import random
import sys

import torch

workload, steps = sys.argv[1], int(sys.argv[2])
tiny = len(sys.argv) > 3 and sys.argv[3] == "tiny"
rng = random.Random(1234)
torch.manual_seed(0)
dev = "cuda"

if workload == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=128, n_head=4) if tiny else GPT2Config()
    model = GPT2LMHeadModel(cfg).to(dev)

    def batch():
        seq = rng.randrange(64, 576)
        x = torch.randint(0, cfg.vocab_size, (2 if tiny else 8, seq), device=dev)
        return x, x

    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
elif workload == "resnet50":
    import torchvision
    model = (torchvision.models.resnet18() if tiny else torchvision.models.resnet50()).to(dev)
    model = model.to(memory_format=torch.channels_last)

    def batch():
        b = rng.randrange(4, 12) if tiny else rng.randrange(16, 77)
        r = rng.choice([160, 192, 224, 256])
        x = torch.randn(b, 3, r, r, device=dev).to(memory_format=torch.channels_last)
        return x, torch.randint(0, 1000, (b,), device=dev)

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)
elif workload in ("transformer", "streams"):
    import torch.nn as nn
    width, layers = (128, 2) if tiny else (768, 6)
    layer = nn.TransformerEncoderLayer(width, 8, 4 * width, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(8000, width),
                          nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
                          nn.Linear(width, 8000)).to(dev)

    side = torch.cuda.Stream()

    def batch():
        shape = (rng.randrange(4, 20), rng.randrange(32, 544))
        if workload == "transformer":
            x = torch.randint(0, 8000, shape, device=dev)
            return x, x
        with torch.cuda.stream(side):
            x = torch.randint(0, 8000, shape, device=dev)
            y = x.clone()
        torch.cuda.current_stream().wait_stream(side)
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        return x, y

    def loss_of(x, y):
        out = model(x)
        return torch.nn.functional.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
else:
    sys.exit(f"unknown workload {workload}")

opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for i in range(steps):
    x, y = batch()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_of(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    del x, y, loss
    if i == 3:
        torch.cuda.empty_cache()
torch.cuda.synchronize()
s = torch.cuda.memory_stats()
print("RESULT " + json.dumps({
    "workload": workload + ("-tiny" if tiny else ""),
    "max_reserved": s["reserved_bytes.all.peak"],
    "max_allocated": s["allocated_bytes.all.peak"],
    "device_allocs": s.get("num_device_alloc", 0),
    "device_frees": s.get("num_device_free", 0),
}), flush=True)
