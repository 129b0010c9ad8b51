"""What fits, the truth found by running, for scripts/gpu.sh fit. A training loop written the
usual way (AdamW), on a model built from its config (no download), at a batch given.

usage: fit_truth.py run MODEL BATCH STEPS [LIMIT_BYTES]
         trains STEPS steps at BATCH, PyTorch's allocator held to LIMIT_BYTES if given
         (set_per_process_memory_fraction); prints 'TRUTH {json}': the batch, the setting
         (PYTORCH_CUDA_ALLOC_CONF), the limit, max_memory_reserved and max_memory_allocated,
         or "oom": true
       fit_truth.py largest MODEL LIMIT_BYTES HI
         the largest batch (1..HI) whose 2 steps run with PyTorch's allocator held to
         LIMIT_BYTES (set_per_process_memory_fraction), found by bisection in this process,
         each try after empty_cache(); prints 'LARGEST {json}'
  MODEL  gpt2 (GPT2LMHeadModel(GPT2Config()), sequence 512), resnet50 (torchvision, 224 x 224),
         vit (torchvision vit_b_16, 224 x 224), vitmha (a ViT written by hand: six blocks of
         nn.MultiheadAttention and an MLP, 384 wide; FIT_CKPT=1 checkpoints each block in
         its forward, use_reentrant=False), bert (BertForMaskedLM(BertConfig()), sequence 256)
         llama (LlamaForCausalLM, 8 layers of 1024, no biases, sequence 512), convnext
         (torchvision convnext_tiny, 224 x 224), t5 (T5ForConditionalGeneration of t5-small's
         shape, sequence 512), mixtral (MixtralForCausalLM, 8 experts, 2 a token, 6 blocks of
         512, sequence 512)
  FIT_SEQ=N      the sequence length of gpt2, bert and llama instead
  FIT_AMP=bf16   each step's forward under torch.autocast(bfloat16)
  FIT_ATTN=NAME  their attention implementation (transformers' attn_implementation: eager
                 keeps attention's scores, the square of the length; sdpa does not)
  FIT_GRAPH=PATH the second step's autograd graph written to PATH as JSON lines, one node
                 each (walked from the loss before its backward): its sequence number, class,
                 the nodes its inputs came from, the metadata of the tensors it takes the
                 gradients of, and the shapes and dtypes of what it saved for the backward
  FIT_VARY=1     gpt2, bert and llama: each step's sequence a length of its own, drawn between
                 half the sequence and the whole (seeded): shapes that change every step
  FIT_CKPT=1     activation checkpointing of the repeated blocks: gpt2, bert and llama through
                 transformers' gradient_checkpointing_enable(), vit each encoder block and
                 resnet50 each Bottleneck through torch.utils.checkpoint (use_reentrant=False)
"""
import json
import os
import sys

import torch

dev = "cuda"
torch.manual_seed(0)


_lengths = __import__("random").Random(0)


def length(seq):
    """The step's sequence length: `seq`, or under FIT_VARY=1 one drawn for the step."""
    if os.environ.get("FIT_VARY") == "1":
        return _lengths.randint(seq // 2, seq)
    return seq


def tokens(model, vocab, seq="512"):
    """A language model's step: a batch of token sequences of `vocab` (FIT_SEQ long, else
    `seq`), each its own labels."""
    seq = int(os.environ.get("FIT_SEQ", seq))

    def step_of(b):
        x = torch.randint(0, vocab, (b, length(seq)), device=dev)
        return model(input_ids=x, labels=x).loss
    return step_of


def build(name):
    attn = {"attn_implementation": os.environ["FIT_ATTN"]} if os.environ.get("FIT_ATTN") else {}
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config(**attn)).to(dev)
        step_of = tokens(model, 50257)
    elif name == "bert":
        from transformers import BertConfig, BertForMaskedLM
        model = BertForMaskedLM(BertConfig(**attn)).to(dev)
        step_of = tokens(model, 30522, "256")
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        model = LlamaForCausalLM(LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=32000, **attn)).to(dev)
        step_of = tokens(model, 32000)
    elif name == "t5":
        # An encoder-decoder (T5 of t5-small's shape): six blocks each side, the decoder's
        # larger, inside two T5Stacks.
        from transformers import T5Config, T5ForConditionalGeneration
        model = T5ForConditionalGeneration(T5Config(
            d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
            vocab_size=32128, decoder_start_token_id=0, pad_token_id=0, **attn)).to(dev)
        step_of = tokens(model, 32128)
    elif name == "mixtral":
        # A mixture of experts (8, 2 a token, 6 blocks of 512): each step routes a different
        # number of tokens to each expert, so the experts' activations change size every step.
        from transformers import MixtralConfig, MixtralForCausalLM
        model = MixtralForCausalLM(MixtralConfig(
            hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
            num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
            max_position_embeddings=1024, **attn)).to(dev)
        step_of = tokens(model, 32000)
    elif name in ("resnet50", "vit", "convnext"):
        import torchvision
        make = {"resnet50": torchvision.models.resnet50, "vit": torchvision.models.vit_b_16,
                "convnext": torchvision.models.convnext_tiny}[name]
        model = make().to(dev)

        def step_of(b):
            x = torch.randn(b, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (b,), device=dev)
            return torch.nn.functional.cross_entropy(model(x), y)
    elif name == "vitmha":
        # A vision transformer written by hand: 16 x 16 patches of 224 x 224 images, six blocks
        # of nn.MultiheadAttention and an MLP (384 wide, 6 heads), a class token and a head.
        class Block(torch.nn.Module):
            def __init__(self, d=384, heads=6):
                super().__init__()
                self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
                self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
                self.mlp = torch.nn.Sequential(
                    torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

            def forward(self, x):
                h = self.ln1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                return x + self.mlp(self.ln2(x))

        class ViT(torch.nn.Module):
            def __init__(self, d=384):
                super().__init__()
                self.patch = torch.nn.Conv2d(3, d, 16, 16)
                self.cls = torch.nn.Parameter(torch.zeros(1, 1, d))
                self.pos = torch.nn.Parameter(torch.zeros(1, 197, d))
                self.blocks = torch.nn.ModuleList(Block(d) for _ in range(6))
                self.ln = torch.nn.LayerNorm(d)
                self.head = torch.nn.Linear(d, 1000)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
                for block in self.blocks:
                    if os.environ.get("FIT_CKPT") == "1":
                        import torch.utils.checkpoint as ckpt
                        x = ckpt.checkpoint(block, x, use_reentrant=False)
                    else:
                        x = block(x)
                return self.head(self.ln(x[:, 0]))

        model = ViT().to(dev)

        def step_of(b):
            x = torch.randn(b, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (b,), device=dev)
            return torch.nn.functional.cross_entropy(model(x), y)
    else:
        sys.exit(f"unknown model {name}")
    if os.environ.get("FIT_CKPT") == "1" and name == "vitmha":
        pass  # its forward checkpoints each block itself, as the program was written
    elif os.environ.get("FIT_CKPT") == "1":
        if hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        elif name in ("vit", "resnet50"):
            import torch.utils.checkpoint as ckpt

            class Checkpointed(torch.nn.Module):
                def __init__(self, block):
                    super().__init__()
                    self.block = block

                def forward(self, x):
                    return ckpt.checkpoint(self.block, x, use_reentrant=False)
            if name == "vit":
                stages = [model.encoder.layers]
            else:
                stages = [model.layer1, model.layer2, model.layer3, model.layer4]
            for layers in stages:
                for name_ in list(layers._modules):
                    layers._modules[name_] = Checkpointed(layers._modules[name_])
        else:
            sys.exit(f"FIT_CKPT: no checkpointing for {name}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def steps(b, n):
        for i in range(n):
            opt.zero_grad(set_to_none=True)
            if os.environ.get("FIT_AMP") == "bf16":
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = step_of(b)
            else:
                loss = step_of(b)
            if i == 1 and os.environ.get("FIT_GRAPH"):
                write_graph(loss.grad_fn, os.environ["FIT_GRAPH"])
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
    return steps


def write_graph(root, path):
    """The autograd graph under `root`, a node a line (see FIT_GRAPH above)."""
    def tensor(t):
        return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                "leaf": bool(t.is_leaf and t.requires_grad)}
    seen, todo, lines = set(), [root], []
    while todo:
        node = todo.pop()
        # A node's Python object is made anew at each access, and ids are reused.
        if node is None or (node.name(), node._sequence_nr()) in seen:
            continue
        seen.add((node.name(), node._sequence_nr()))
        out = {"seq": node._sequence_nr(), "name": node.name(), "next": []}
        for child, nr in node.next_functions:
            if child is None:
                out["next"].append(None)
            elif hasattr(child, "variable"):
                out["next"].append({"leaf": tensor(child.variable)})
            else:
                out["next"].append({"seq": child._sequence_nr(), "nr": nr})
                todo.append(child)
        try:
            out["inputs"] = [{"shape": list(m.shape) if hasattr(m, "shape") else None,
                              "dtype": str(getattr(m, "dtype", "")).replace("torch.", "")}
                             for m in node._input_metadata]
        except Exception:
            pass
        saved = {}
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    v = getattr(node, attr)
                except Exception:
                    continue
                if isinstance(v, torch.Tensor):
                    saved[attr[7:]] = tensor(v)
                elif isinstance(v, (tuple, list)) and v and all(isinstance(x, torch.Tensor) for x in v):
                    saved[attr[7:]] = [tensor(x) for x in v]
        out["saved"] = saved
        lines.append(out)
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def run(name, batch, n, limit=None):
    if limit:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(limit / total)
    steps = build(name)
    out = {"model": name, "batch": batch, "setting": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "limit": limit}
    try:
        steps(batch, n)
        out["reserved"] = torch.cuda.max_memory_reserved()
        out["allocated"] = torch.cuda.max_memory_allocated()
    except torch.OutOfMemoryError:
        out["oom"] = True
    print("TRUTH " + json.dumps(out), flush=True)


def largest(name, limit, hi):
    steps = build(name)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(limit / total)

    def fits(b):
        torch.cuda.empty_cache()
        try:
            steps(b, 2)
            return True
        except torch.OutOfMemoryError:
            return False
    lo, top = 0, hi + 1  # lo fits (0: none known), top does not
    while top - lo > 1:
        mid = (lo + top) // 2
        if fits(mid):
            lo = mid
        else:
            top = mid
    print("LARGEST " + json.dumps({"model": name, "limit": limit, "batch": lo,
                                   "setting": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else None)
    else:
        largest(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
