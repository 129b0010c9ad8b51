"""The models the data-parallel checks train (scripts/gpu/dist_kinds.py, ds_kinds.py), each of
6 blocks, built from its config (no download): DIST_MODEL gpt2 (a decoder, the default), bert
(an encoder, masked LM) or vit (a vision transformer, 224 x 224 images, 1000 classes)."""
import os
import sys

import torch


def build(kind=None):
    """The model (on the CPU) and the class of its blocks."""
    kind = kind or os.environ.get("DIST_MODEL", "gpt2")
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.models.gpt2.modeling_gpt2 import GPT2Block as Block

        return GPT2LMHeadModel(GPT2Config(n_layer=6)), Block
    if kind == "bert":
        from transformers import BertConfig, BertForMaskedLM
        from transformers.models.bert.modeling_bert import BertLayer as Block

        return BertForMaskedLM(BertConfig(num_hidden_layers=6)), Block
    if kind == "vit":
        from transformers import ViTConfig, ViTForImageClassification
        from transformers.models.vit.modeling_vit import ViTLayer as Block

        return ViTForImageClassification(ViTConfig(num_hidden_layers=6, num_labels=1000)), Block
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
