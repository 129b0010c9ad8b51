"""Memory by kind on a rank of a DeepSpeed ZeRO job, the truth computed inside the program, for
scripts/gpu.sh dskinds and distfit. A 6-layer GPT-2 (or BERT, or ViT: DIST_MODEL,
scripts/gpu/dist_models.py) built from its config (no download), PyTorch's AdamW as
DeepSpeed's client optimizer (no DeepSpeed op is built), batch 4 x 512 tokens per rank, bf16
(DS_DTYPE=fp32: fp32), STEPS steps through DeepSpeed's engine, DeepSpeed's defaults otherwise.
Each rank prints one 'TRUTH {json}' line after its last step, in the bytes each tensor asked
PyTorch's allocator for (its blocks' requested sizes, from torch.cuda.memory_snapshot()):
  parameter        the model's parameters and buffers as DeepSpeed keeps them on this rank (ZeRO-1
                   and 2: the flat 16-bit buffer the parameters are views of; ZeRO-3: this rank's
                   partitions, ds_tensor)
  gradient         this rank's gradients still held (ZeRO-2's partition of them, the fp32
                   partition's .grad, any parameter's .grad)
  optimizer_state  the fp32 master partition DeepSpeed keeps for the optimizer, and the
                   optimizer's own state (exp_avg, exp_avg_sq, step)
  communication    the gradient buckets (the ipg buffers; ZeRO-3 keeps them for the run)
  allocated        memory_allocated() then; peak: max_memory_allocated()

usage: python3 ds_kinds.py MODE STEPS [BATCH]   (RANK, WORLD_SIZE as torchrun sets them)
  MODE  zero1, zero2, zero3; zero0 (no ZeRO: bf16 through DeepSpeed's FP16_Optimizer, which
        keeps fp32 master weights of the whole model); zero1-acc32 (ZeRO-1 in bf16 with fp32
        gradient accumulation: DeepSpeed's BF16_Optimizer)
With DIST_PEAK set, 'at_peak' too: the same kinds at the moment of the most bytes allocated (the
last step then runs at half the batch again, so that it holds the peak; scripts/gpu/dist_models.py).
DIST_FAKE set: one process plays rank RANK of WORLD_SIZE on one GPU through PyTorch's fake
process group (no communication; every buffer of the collectives is still made).
With DIST_LIMIT=BYTES, PyTorch's allocator is held to that many bytes
(set_per_process_memory_fraction) and a step out of memory ends the run with 'oom': true in its
truth (scripts/gpu.sh distfit's largest batch under a limit).
"""
import os
import sys

import torch
import torch.distributed as dist

mode, steps = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 4
stage = {"zero0": 0, "zero1": 1, "zero1-acc32": 1, "zero2": 2, "zero3": 3}.get(mode)
if stage is None:
    sys.exit(f"unknown mode {mode}: zero0, zero1, zero1-acc32, zero2 or zero3")
fake = os.environ.get("DIST_FAKE") is not None
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local = 0 if fake else int(os.environ.get("LOCAL_RANK", "0"))
os.environ.setdefault("LOCAL_RANK", str(local))  # DeepSpeed asks for it
torch.cuda.set_device(local)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_models  # noqa: E402

limit = dist_models.limit_from_env(local)

peak = dist_models.peak_wanted()
if fake:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
else:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
torch.manual_seed(0)

import deepspeed  # noqa: E402

bf16 = os.environ.get("DS_DTYPE", "bf16") == "bf16"
model, _ = dist_models.build()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
config = {
    "train_micro_batch_size_per_gpu": batch,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": stage},
    "bf16": {"enabled": bf16},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1 << 30,
}
if mode == "zero1-acc32":
    config["data_types"] = {"grad_accum_dtype": "fp32"}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config,
                                       dist_init_required=False)
gen = torch.Generator(device="cpu").manual_seed(100 + rank)


def train():
    for step in range(steps):
        torch.cuda.nvtx.range_push("step")
        n = batch + max(1, batch // 2) if peak and step == steps - 1 else batch
        loss = engine(**dist_models.batch(model, n, gen)).loss
        engine.backward(loss)
        del loss
        engine.step()
        torch.cuda.nvtx.range_pop()


dist_models.train_within(train, limit, {"mode": mode, "rank": rank, "world": world, "batch": batch},
                         mode, rank)
torch.cuda.synchronize()

block_bytes = dist_models.block_bytes
zopt = engine.optimizer
inner = zopt.optimizer if hasattr(zopt, "optimizer") else zopt
state = [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]
grads = [p.grad for p in model.parameters()]
comm = []
if stage == 3:
    params = [p.ds_tensor for p in model.parameters()] + list(model.buffers())
    master = list(zopt.fp32_partitioned_groups_flat)
    grads.append(getattr(zopt, "grad_partitions_flat_buffer", None))
elif hasattr(zopt, "single_partition_of_fp32_groups"):
    params = list(model.parameters()) + list(model.buffers())
    master = list(zopt.single_partition_of_fp32_groups)
    grads.append(getattr(zopt, "grads_in_partition", None))
elif hasattr(zopt, "fp32_groups_flat_partition"):
    # BF16_Optimizer: the fp32 partition, and the fp32 buffer gradients accumulate in.
    params = list(model.parameters()) + list(model.buffers())
    master = list(zopt.fp32_groups_flat_partition)
    grads.extend(zopt.fp32_groups_gradients_flat)
else:
    # FP16_Optimizer (no ZeRO, 16-bit): fp32 master weights of the whole model; or, in fp32,
    # the client optimizer alone.
    params = list(model.parameters()) + list(model.buffers())
    # (FP16_UnfusedOptimizer keeps one fp32 copy per parameter: fp32_groups.)
    master = list(getattr(zopt, "fp32_groups_flat", None)
                  or [p for g in getattr(zopt, "fp32_groups", []) for p in g])
for bucket in getattr(zopt, "ipg_buckets", {}).values():
    buf = bucket.buffer
    comm.extend(buf if isinstance(buf, (list, tuple)) else [buf])
grads.extend(t.grad for t in master)
truth = {
    "mode": mode,
    "rank": rank,
    "world": world,
    "parameter": block_bytes(params),
    "gradient": block_bytes(grads),
    "optimizer_state": block_bytes(master + state),
    "communication": block_bytes(comm),
    "batch": batch,
    "limit": limit,
    "oom": False,
}
if peak:
    torch.cuda.nvtx.mark("truth")
    truth["at_peak"], truth["live_now"] = dist_models.at_peak({
        "parameter": params, "gradient": grads, "optimizer_state": master + state,
        "communication": comm})
dist_models.say_truth(truth, mode, rank)
dist.barrier()
dist.destroy_process_group()
