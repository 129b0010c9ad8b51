#!/usr/bin/env bash
# autocast as a what-if: peaks at 4x and 8x the batch and the largest batch under a limit, predicted from one run in fp32, against real runs under bf16 autocast.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ViT-B/16 and the Llama;
# AdamW, 3 steps) traced at a small batch under `gpushim run` in fp32; `gpushim fit --autocast
# bf16` on that trace predicts the peak reserved memory at 4x and 8x the batch with the forward
# under torch.autocast(dtype=torch.bfloat16), under the defaults and under expandable segments,
# and the largest batch that runs with PyTorch's allocator held to 20 GiB. Real runs under
# autocast (FIT_AMP=bf16), a fresh process each, give max_memory_reserved() at 4x and 8x and,
# under the limit and each setting, whether the predicted largest batch runs and the next does
# not (stepping until the truth is found, three steps at most). One table
# (scripts/gpu/fit_table.py, peaks within 5% asked). The traces and the truth are left in
# $OUT/fitamp when OUT is set.
#   bash scripts/gpu.sh fitamp[:MODEL,...]   MODEL is gpt2, vit, llama, bert or resnet50
set -euo pipefail
models=${*:-gpt2 vit llama}
declare -A base=([gpt2]=2 [vit]=8 [llama]=2 [bert]=8 [resnet50]=16)
source scripts/gpu/fit_runs.sh
fit_setup fitamp
for m in $models; do
  b=${base[$m]}
  fit_traced "$m" "$b" --autocast bf16 || continue
  for setting in "" "expandable_segments:True"; do
    for k in 4 8; do FIT_AMP=bf16 fit_one "$m" $((b * k)) "$setting" || true; done
    FIT_AMP=bf16 fit_largest "$m" "$(fit_predicted "$m" "$setting")" "$setting" "$limit"
  done
done
FIT_WITHIN=5 python3 scripts/gpu/fit_table.py "$work" $models
