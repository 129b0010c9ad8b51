#!/usr/bin/env bash
# activation checkpointing as a what-if: peaks at 4x and 8x the batch and the largest batch under a limit, predicted from one run without it, against real runs with it.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ViT-B/16 and ResNet-50; AdamW,
# 3 steps)
# traced at a small batch under `gpushim run` WITHOUT checkpointing; `gpushim fit --checkpoint
# auto` on that trace predicts the peak reserved memory at 4x and 8x the batch with the blocks
# checkpointed (the class found from the frames), under the defaults and under expandable
# segments, and the largest batch that runs with PyTorch's allocator held to 20 GiB. Real runs
# with checkpointing (FIT_CKPT=1: transformers' gradient_checkpointing_enable() for GPT-2,
# torch.utils.checkpoint per encoder block for the ViT and per Bottleneck for ResNet-50, whose
# blocks free nothing they make inside them), a fresh process each, give
# max_memory_reserved() at 4x and 8x and, under the limit and the run's setting, whether the
# predicted largest batch runs and the next does not (stepping until the truth is found, three
# steps at most). One table (scripts/gpu/fit_table.py). The traces and the truth are left in
# $OUT/fitckpt when OUT is set.
#   bash scripts/gpu.sh fitckpt[:MODEL,...]   MODEL is gpt2, vit, resnet50, vitmha or t5 (an
#   encoder-decoder: transformers' gradient_checkpointing_enable() per T5Block)
set -euo pipefail
models=${*:-gpt2 vit resnet50}
declare -A base=([gpt2]=2 [vit]=8 [resnet50]=8 [vitmha]=64 [t5]=4)
source scripts/gpu/fit_runs.sh
fit_setup fitckpt
for m in $models; do
  b=${base[$m]}
  fit_traced "$m" "$b" --checkpoint auto || continue
  python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['checkpoint']; print(sys.argv[2], 'blocks:', c['class'], c['per_step'], 'a step')" "$work/$m.fit.json" "$m"
  for setting in "" "expandable_segments:True"; do
    for k in 4 8; do FIT_CKPT=1 fit_one "$m" $((b * k)) "$setting" || true; done
  done
  # The largest under the limit, under the run's setting (the defaults).
  FIT_CKPT=1 fit_largest "$m" "$(fit_predicted "$m" "")" "" "$limit"
done
FIT_WITHIN=5 python3 scripts/gpu/fit_table.py "$work" $models
