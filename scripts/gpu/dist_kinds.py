"""Memory by kind on every rank of a data-parallel or sharded job, the truth computed inside the
program, for scripts/gpu.sh dist and distfit. A 6-layer GPT-2 (or another model: DIST_MODEL)
built from its config (no download), AdamW, batch 4 x 512 tokens (or 4 images) per rank, fp32,
STEPS steps; launched by torchrun, NCCL, one GPU a rank.
Each rank prints one 'TRUTH {json}' line after its last optimizer step, in the bytes each tensor
asked PyTorch's allocator for (its blocks' requested sizes, from torch.cuda.memory_snapshot()):
  parameter        this rank's parameters and buffers (FSDP: its shards; a flat parameter once)
  gradient         the blocks of this rank's gradients (DDP with gradient_as_bucket_view: the
                   buckets they are views of)
  optimizer_state  the optimizer's state tensors (FSDP: its shards)
  allocated        memory_allocated() then; peak: max_memory_allocated()

  reserved_peak    max_memory_reserved() (scripts/gpu.sh distfit compares fit's answer with it)
  at_peak          with DIST_PEAK set: the same kinds at the moment of the most bytes allocated
                   (the last step then runs at half the batch again, so that it holds the peak)

With DIST_LIMIT=BYTES, PyTorch's allocator is held to that many bytes
(set_per_process_memory_fraction) and a step out of memory ends the run with 'oom': true in its
truth (scripts/gpu.sh distfit's largest batch under a limit).

usage: torchrun --nproc-per-node N dist_kinds.py MODE STEPS [BATCH]
  BATCH  sequences of 512 tokens per rank (default 4)
  MODE  ddp, ddp-view (gradient_as_bucket_view=True), fsdp2 (fully_shard per block and the
        root), fsdp2-keep (reshard_after_forward=False), fsdp1 (FullyShardedDataParallel per
        block, use_orig_params=False), fsdp1-orig (use_orig_params=True), fsdp1-grad-op
        (sharding_strategy=SHARD_GRAD_OP: parameters kept gathered from forward to backward);
        fsdp2-mp and fsdp1-mp: fsdp2 and fsdp1 with mixed precision as jobs set it (parameters
        gathered and computed in bf16, gradients reduced in fp32, the shards fp32)
"""
import os
import sys

import torch
import torch.distributed as dist

# DIST_MODEL: gpt2 (a decoder, the default), bert (an encoder), vit, llama or resnet50
# (scripts/gpu/dist_models.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_models  # noqa: E402

mode, steps = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 4
# DIST_FAKE set: one process plays rank RANK of WORLD_SIZE on one GPU through PyTorch's fake
# process group (no communication; every buffer of the collectives is still made).
fake = os.environ.get("DIST_FAKE") is not None
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = 0 if fake else int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
limit = dist_models.limit_from_env(local)
peak = dist_models.peak_wanted()
if fake:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
else:
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
torch.manual_seed(0)

model, Block = dist_models.build()
model = model.cuda()
blocks = [m for m in model.modules() if isinstance(m, Block)]
if mode in ("ddp", "ddp-view"):
    from torch.nn.parallel import DistributedDataParallel as DDP
    wrapped = DDP(model, device_ids=[local], gradient_as_bucket_view=mode == "ddp-view")
    if fake:
        # The fake group's all-reduce gives no result to DDP's default hook: the bucket as is.
        def as_is(state, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        wrapped.register_comm_hook(None, as_is)
elif mode in ("fsdp2", "fsdp2-keep", "fsdp2-mp"):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    reshard = mode != "fsdp2-keep"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mode == "fsdp2-mp" else MixedPrecisionPolicy()
    for block in blocks:
        fully_shard(block, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=mp)
    wrapped = model
elif mode in ("fsdp1", "fsdp1-orig", "fsdp1-grad-op", "fsdp1-mp"):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = ShardingStrategy.SHARD_GRAD_OP if mode == "fsdp1-grad-op" else ShardingStrategy.FULL_SHARD
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mode == "fsdp1-mp" else None
    wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=strategy,
                   device_id=local, use_orig_params=mode == "fsdp1-orig", mixed_precision=mp)
else:
    sys.exit(f"unknown mode {mode}")
opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-4)
gen = torch.Generator(device="cpu").manual_seed(100 + rank)


def train():
    for step in range(steps):
        torch.cuda.nvtx.range_push("step")
        opt.zero_grad(set_to_none=True)
        n = batch + max(1, batch // 2) if peak and step == steps - 1 else batch
        loss = wrapped(**dist_models.batch(model, n, gen)).loss
        loss.backward()
        del loss
        opt.step()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


dist_models.train_within(train, limit, {"mode": mode, "rank": rank, "world": world, "batch": batch},
                         mode, rank)

block_bytes = dist_models.block_bytes
params = list(wrapped.parameters()) + list(wrapped.buffers())
state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
truth = {
    "mode": mode,
    "rank": rank,
    "world": world,
    "parameter": block_bytes(params),
    "gradient": block_bytes([p.grad for p in wrapped.parameters()]),
    "optimizer_state": block_bytes(state),
    "batch": batch,
    "limit": limit,
    "oom": False,
}
if peak:
    torch.cuda.nvtx.mark("truth")
    truth["at_peak"], truth["live_now"] = dist_models.at_peak({
        "parameter": params, "gradient": [p.grad for p in wrapped.parameters()],
        "optimizer_state": state})
dist_models.say_truth(truth, mode, rank)
dist.barrier()
dist.destroy_process_group()
