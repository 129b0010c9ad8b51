"""The models the data-parallel checks train (scripts/gpu/dist_kinds.py, ds_kinds.py), each of
6 blocks, built from its config (no download): DIST_MODEL gpt2 (a decoder, the default), bert
(an encoder, masked LM), vit (a vision transformer, 224 x 224 images, 1000 classes), llama
(a decoder of RMSNorm, rotary positions, a gated MLP and untied embeddings), t5 (an
encoder-decoder: 6 blocks each side, the decoder's larger), mixtral (a mixture of 8 experts,
2 a token: the experts' activations change size every step) or resnet50 (torchvision's,
convolutions and batch norms, 16 Bottleneck blocks: the one not of 6); and
their truth's measure, the bytes tensors asked of PyTorch's allocator; with DIST_PEAK set, the
same truth at the moment of the most bytes allocated, from PyTorch's own record of every
allocation and free (torch.cuda.memory._record_memory_history). DIST_LAYERS=N: the transformers'
blocks N rather than 6 (gpt2 at 80: some 600 million parameters, more than one of DeepSpeed's
default gradient buckets holds)."""
import json
import os
import sys

import torch


def build(kind=None):
    """The model (on the CPU) and the class of its blocks."""
    kind = kind or os.environ.get("DIST_MODEL", "gpt2")
    layers = int(os.environ.get("DIST_LAYERS", "6"))
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block as Block

        return GPT2LMHeadModel(GPT2Config(n_layer=layers)), Block
    if kind == "bert":
        from transformers import BertConfig, BertForMaskedLM
        from transformers.models.bert.modeling_bert import BertLayer as Block

        return BertForMaskedLM(BertConfig(num_hidden_layers=layers)), Block
    if kind == "vit":
        from transformers import ViTConfig, ViTForImageClassification
        from transformers.models.vit.modeling_vit import ViTLayer as Block

        return ViTForImageClassification(ViTConfig(num_hidden_layers=layers, num_labels=1000)), Block
    if kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer as Block

        config = LlamaConfig(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=layers,
            num_attention_heads=12,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=1024,
        )
        return LlamaForCausalLM(config), Block
    if kind == "t5":
        # An encoder-decoder: blocks of one class in two sizes (the decoder's attend to the
        # encoder too), 6 of each.
        from transformers import T5Config, T5ForConditionalGeneration
        from transformers.models.t5.modeling_t5 import T5Block as Block

        config = T5Config(d_model=512, d_ff=2048, num_layers=layers, num_decoder_layers=layers,
                          num_heads=8, vocab_size=32128, decoder_start_token_id=0,
                          pad_token_id=0)
        return T5ForConditionalGeneration(config), Block
    if kind == "mixtral":
        # A mixture of experts: each step routes a different number of tokens to each expert,
        # so the experts' activations change size from step to step.
        from transformers import MixtralConfig, MixtralForCausalLM
        from transformers.models.mixtral.modeling_mixtral import MixtralDecoderLayer as Block

        config = MixtralConfig(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_local_experts=8,
            num_experts_per_tok=2,
            vocab_size=32000,
            max_position_embeddings=1024,
        )
        return MixtralForCausalLM(config), Block
    if kind == "resnet50":
        import types

        import torchvision
        from torchvision.models.resnet import Bottleneck as Block

        import dataclasses

        from transformers.modeling_outputs import ModelOutput

        @dataclasses.dataclass
        class Output(ModelOutput):
            """A forward's output as transformers' models give it (FSDP hooks the tensors it
            finds in a forward's output through PyTorch's pytree, which knows this type)."""

            loss: torch.Tensor = None

        class Classifier(torch.nn.Module):
            """torchvision's ResNet-50 called as the transformers models are: keyword
            arguments in, an object with the loss out."""

            def __init__(self):
                super().__init__()
                self.net = torchvision.models.resnet50()
                self.config = types.SimpleNamespace(image_size=224)

            def forward(self, pixel_values, labels):
                logits = self.net(pixel_values)
                return Output(loss=torch.nn.functional.cross_entropy(logits, labels))

        return Classifier(), Block
    sys.exit(f"unknown DIST_MODEL {kind}")


def batch(model, n, gen):
    """A batch of `n` (sequences of 512 tokens, or images) as the model's keyword arguments,
    on the GPU, labels included."""
    if hasattr(model.config, "vocab_size") and not hasattr(model.config, "image_size"):
        x = torch.randint(0, model.config.vocab_size, (n, 512), generator=gen).cuda()
        return {"input_ids": x, "labels": x}
    x = torch.randn(n, 3, 224, 224, generator=gen).cuda()
    y = torch.randint(0, 1000, (n,), generator=gen).cuda()
    return {"pixel_values": x, "labels": y}


def block_bytes(tensors):
    """The bytes the live blocks of `tensors` asked PyTorch's allocator for (their requested
    sizes, from torch.cuda.memory_snapshot()), each block once; a DTensor by its local part."""
    blocks = {}
    for seg in torch.cuda.memory_snapshot():
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                blocks[b["address"]] = b.get("requested_size", b["size"])
    seen, total = set(), 0
    for t in tensors:
        if hasattr(t, "to_local"):
            t = t.to_local()
        if t is None or not torch.is_tensor(t) or not t.is_cuda or t.numel() == 0:
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or ptr not in blocks:
            continue
        seen.add(ptr)
        total += blocks[ptr]
    return total


def say_truth(truth, mode, rank):
    """A rank's truth: one 'TRUTH {json}' line, with the allocator's figures added (allocated
    now, its peaks), and, where DIST_TRUTH_DIR is set, the rank's own file there (torchrun
    interleaves the ranks' output): DIST_TRUTH_NAME (else the mode).RANK.json."""
    truth.update({
        "allocated": torch.cuda.memory_allocated(),
        "peak": torch.cuda.max_memory_allocated(),
        "reserved_peak": torch.cuda.max_memory_reserved(),
    })
    live = truth.pop("live_now", None)
    print("TRUTH " + json.dumps(truth), flush=True)
    if os.environ.get("DIST_TRUTH_DIR"):
        name = os.environ.get("DIST_TRUTH_NAME", mode)
        with open(os.path.join(os.environ["DIST_TRUTH_DIR"], f"{name}.{rank}.json"), "w") as f:
            json.dump(truth, f)
        if live is not None:
            with open(os.path.join(os.environ["DIST_TRUTH_DIR"], f"{name}.{rank}.live"), "w") as f:
                f.writelines(f"{a:#x} {n}\n" for a, n in live)
def limit_from_env(device):
    """DIST_LIMIT=BYTES: PyTorch's allocator held to that many bytes on `device`
    (set_per_process_memory_fraction); returns the limit, 0 without one."""
    limit = int(os.environ.get("DIST_LIMIT") or 0)
    if limit:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(limit / total)
    return limit


def train_within(train, limit, truth, mode, rank):
    """Runs `train`; under a limit, a step out of memory ends the program (a failure among ranks
    of NCCL), its truth `truth` with 'oom': true (scripts/gpu.sh distfit's largest batch under a
    limit)."""
    try:
        train()
    except torch.OutOfMemoryError:
        if not limit:
            raise
        say_truth({**truth, "limit": limit, "oom": True}, mode, rank)
        # Among ranks of NCCL the others wait in a collective for this one for ever: a failure
        # makes torchrun stop them (the fake group's one process has none to stop).
        os._exit(0 if os.environ.get("DIST_FAKE") else 3)


def peak_wanted():
    """DIST_PEAK set: start PyTorch's own record of every allocation and free (call before the
    first allocation) and say so; the program then runs its last step at a larger batch, so that
    the run's peak falls in it, where the tensors live then are still known at the end."""
    if not os.environ.get("DIST_PEAK"):
        return False
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=1 << 24)
    return True


def _blocks(tensors):
    """The block addresses of `tensors` (a DTensor by its local part)."""
    out = set()
    for t in tensors:
        if hasattr(t, "to_local"):
            t = t.to_local()
        if t is None or not torch.is_tensor(t) or not t.is_cuda or t.numel() == 0:
            continue
        out.add(t.untyped_storage().data_ptr())
    return out


def at_peak(groups):
    """At the moment the most bytes were allocated (requested bytes, as PyTorch's record has
    them: an allocation counts until its free is asked for), the bytes of each group {kind:
    tensors live now} whose allocation live then is the one still live now; 'allocated' all of
    them then. Also writes the record's allocations live now (address, bytes) beside the truth
    file where DIST_TRUTH_DIR is set, for a check of what a trace's tensors miss."""
    dev = torch.cuda.current_device()
    events = torch.cuda.memory._snapshot()["device_traces"][dev]
    cur = best = 0
    at = -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            cur += e["size"]
        elif e["action"] == "free_requested":
            cur -= e["size"]
        if cur > best:
            best, at = cur, i
    live, then = {}, None
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = (i, e["size"])
        elif e["action"] == "free_requested":
            live.pop(e["addr"], None)
        if i == at:
            then = dict(live)
    then = then or {}
    # PyTorch's own count of the same, as a check that the record holds the whole run.
    out = {"allocated": best, "requested_peak": torch.cuda.memory_stats()["requested_bytes.all.peak"]}
    for kind, tensors in groups.items():
        out[kind] = sum(then[a][1] for a in _blocks(tensors) if a in then and live.get(a) == then[a])
    return out, sorted((a, n) for a, (_, n) in live.items())
