#!/usr/bin/env bash
# what fits: peak reserved at 4x and 8x the batch and the largest batch under a limit, predicted from one run, against real runs.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ResNet-50, ViT-B/16, BERT;
# AdamW, 3 steps) traced at a small batch under `gpushim run`, nothing set; `gpushim fit` on
# that trace predicts the peak reserved memory at 4x and 8x the batch, under the defaults and
# under expandable segments, and the largest batch that runs with PyTorch's allocator held to
# 20 GiB (`--limit`, as set_per_process_memory_fraction holds it). Real runs, a fresh process
# each, give max_memory_reserved() at 4x and 8x, and, under the same limit, whether the
# predicted largest batch runs and the next does not (stepping down or up until the truth is
# found, three steps at most). One table (scripts/gpu/fit_table.py): each peak's error (within
# 3% asked) and the largest batches (within one asked). The traces and the truth are left in
# $OUT/fit when OUT is set.
#   bash scripts/gpu.sh fit[:MODEL,...]   MODEL is gpt2, resnet50, vit, bert, llama, convnext, t5 or mixtral (FIT_AMP=bf16: under autocast)
set -euo pipefail
models=${*:-gpt2 resnet50 vit bert}
declare -A base=([gpt2]=2 [resnet50]=16 [vit]=8 [bert]=8 [llama]=2 [convnext]=16 [t5]=4 [mixtral]=4)
source scripts/gpu/fit_runs.sh
fit_setup fit
for m in $models; do
  b=${base[$m]}
  fit_traced "$m" "$b" || continue
  for setting in "" "expandable_segments:True"; do
    for k in 4 8; do fit_one "$m" $((b * k)) "$setting" || true; done
    fit_largest "$m" "$(fit_predicted "$m" "$setting")" "$setting" "$limit"
  done
done
python3 scripts/gpu/fit_table.py "$work" $models
