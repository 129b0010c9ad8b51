"""Memory by kind, the truth computed inside the program, for scripts/gpu.sh kinds. A training
loop written the usual way, on a model built from its config (no download), at fixed shapes.
Prints one 'TRUTH {json}' line at exit, in the bytes each tensor asked PyTorch's allocator for
(its blocks' requested sizes, read from torch.cuda.memory_snapshot() once the loop is over, so
the loop itself is untouched; what the trace records of each tensor):
  parameter        the parameters' and buffers' blocks (a tied weight once)
  gradient         the blocks of the parameters' .grad
  optimizer_state  the blocks of the optimizer's CUDA state tensors (and the grad scaler's)
  activation       memory_allocated() at the end of the last forward (loss computed) less at
                   its start: what the forward left for the backward
  peak             max_memory_allocated()

usage: kinds_truth.py MODEL STEPS [VARIANT]
  MODEL    gpt2 (GPT2LMHeadModel(GPT2Config()), AdamW, batch 4 x 512, fp32)
           resnet50 (torchvision, SGD with momentum, batch 32 x 224, fp32)
           amp (nn.TransformerEncoder 6 x 1024, fp16 autocast, GradScaler, Adam, batch 16 x 256)
  VARIANT  keepgrad: zero_grad(set_to_none=False), so the gradients live through every
           peak (the default drops them at each step's start, as PyTorch does by default)
           frozen: the first half of the parameters frozen (requires_grad False)
           accum: gradient accumulation, two backward passes per optimizer step
           shutdown: the model and the optimizer freed as the interpreter's shutdown begins
           (judged against summary's kinds as the program's code ended)
           ckpt: activation checkpointing (GPT-2's gradient_checkpointing_enable: every
           block's forward recomputed in the backward)
           late: the optimizer made before the model is moved to the GPU
           twoopt: two optimizers, one for each half of the parameters
"""
import json
import sys

import torch

name, steps = sys.argv[1], int(sys.argv[2])
variant = sys.argv[3] if len(sys.argv) > 3 else ""
dev = "cuda"
torch.manual_seed(0)
scaler = None
autocast = None

late = variant == "late"
place = (lambda m: m) if late else (lambda m: m.to(dev))

if name == "gpt2":
    from transformers import GPT2Config, GPT2LMHeadModel
    model = place(GPT2LMHeadModel(GPT2Config()))
    if variant == "ckpt":
        model.gradient_checkpointing_enable()

    def batch():
        x = torch.randint(0, 50257, (4, 512), device=dev)
        return x, x

    def loss_of(x, y):
        return model(input_ids=x, labels=y).loss
elif name == "resnet50":
    import torchvision
    model = place(torchvision.models.resnet50())

    def batch():
        return torch.randn(32, 3, 224, 224, device=dev), torch.randint(0, 1000, (32,), device=dev)

    def loss_of(x, y):
        return torch.nn.functional.cross_entropy(model(x), y)
elif name == "amp":
    import torch.nn as nn
    layer = nn.TransformerEncoderLayer(1024, 16, 4096, batch_first=True)
    model = place(nn.Sequential(nn.Embedding(32000, 1024),
                                nn.TransformerEncoder(layer, 6, enable_nested_tensor=False),
                                nn.Linear(1024, 32000)))
    scaler = torch.amp.GradScaler("cuda")
    autocast = torch.float16

    def batch():
        x = torch.randint(0, 32000, (16, 256), device=dev)
        return x, x

    def loss_of(x, y):
        out = model(x)
        return nn.functional.cross_entropy(out.view(-1, out.size(-1)), y.view(-1))
else:
    sys.exit(f"unknown model {name}")

if variant == "frozen":
    params = list(model.parameters())
    for p in params[: len(params) // 2]:
        p.requires_grad_(False)
trainable = [p for p in model.parameters() if p.requires_grad]


def make_opt(params):
    if name == "resnet50":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    if name == "amp":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.AdamW(params, lr=1e-4)


class Both:
    """Two optimizers stepped together (each half of the parameters its own)."""

    def __init__(self, params):
        half = len(params) // 2
        self.opts = [make_opt(params[:half]), make_opt(params[half:])]
        self.state = {k: v for o in self.opts for k, v in o.state.items()}

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()
        self.state = {k: v for o in self.opts for k, v in o.state.items()}


opt = Both(trainable) if variant == "twoopt" else make_opt(trainable)
if late:
    model = model.to(dev)

activation = 0
micro = 2 if variant == "accum" else 1
for step in range(steps):
    opt.zero_grad(set_to_none=variant != "keepgrad")
    for _ in range(micro):
        x, y = batch()
        before = torch.cuda.memory_allocated()
        if autocast:
            with torch.autocast("cuda", dtype=autocast):
                loss = loss_of(x, y)
        else:
            loss = loss_of(x, y)
        activation = torch.cuda.memory_allocated() - before
        (scaler.scale(loss) if scaler else loss).backward()
        del loss
    if scaler and variant == "twoopt":
        for o in opt.opts:
            scaler.step(o)
        scaler.update()
    elif scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
torch.cuda.synchronize()

# The blocks of PyTorch's allocator, by address: a tensor's bytes in its own units.
blocks = {}
for seg in torch.cuda.memory_snapshot():
    for b in seg["blocks"]:
        if b["state"] == "active_allocated":
            blocks[b["address"]] = b.get("requested_size", b["size"])


def block_bytes(tensors):
    seen = set()
    total = 0
    for t in tensors:
        if t is None or not t.is_cuda:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += blocks.get(ptr, t.untyped_storage().nbytes())
    return total


optimizers = opt.opts if variant == "twoopt" else [opt]
state = [v for o in optimizers for s in o.state.values() for v in s.values() if torch.is_tensor(v)]
if scaler is not None:
    state += [t for t in (getattr(scaler, "_scale", None), getattr(scaler, "_growth_tracker", None))
              if torch.is_tensor(t)]
truth = {
    "parameter": block_bytes(list(model.parameters()) + list(model.buffers())),
    "gradient": block_bytes([p.grad for p in model.parameters()]),
    "optimizer_state": block_bytes(state),
    "activation": activation,
    "peak": torch.cuda.max_memory_allocated(),
    "allocated_at_exit": torch.cuda.memory_allocated(),
}
print("TRUTH " + json.dumps(truth))
if variant == "shutdown":
    # As the interpreter's shutdown does with what a program's last lines hold: the model,
    # its gradients and the optimizer's state freed as shutdown begins, no line of the program's.
    import atexit
    import gc

    atexit.register(lambda: (globals().clear(), gc.collect()))
