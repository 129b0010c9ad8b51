#!/usr/bin/env bash
# the autograd graph the shim records when a backward pass begins, against PyTorch's own walk.
# On the GPU machine: GPT-2, ViT-B/16 and the Llama of scripts/gpu/fit_truth.py (AdamW, 3
# steps), in fp32 and under bf16 autocast, each under `gpushim run` with GPUSHIM_COSTS=1 and
# FIT_GRAPH (the second step's graph as PyTorch's Python API walks it from the loss).
# scripts/gpu/graph_check.py takes the shim's walk that shares most nodes with it and counts, of
# the shim's nodes, those whose class differs and those with any input whose source differs (a
# node and which output, a parameter, none): both 0 asked. Also: Python's nodes the shim's walk
# did not reach (those above the first node that allocates: the loss's), the walks in the
# trace, and the time one walk took (the shim's own count). The traces are left in $OUT/graph
# when OUT is set.
#   bash scripts/gpu.sh graph[:MODEL,...]   MODEL is gpt2, vit, llama, bert or resnet50
set -euo pipefail
models=${*:-gpt2 vit llama}
declare -A base=([gpt2]=2 [vit]=8 [llama]=2 [bert]=8 [resnet50]=16)
work=${OUT:+$OUT/graph}
work=${work:-$(mktemp -d)}
mkdir -p "$work"
python3 scripts/gpu/graph_check.py --header
for m in $models; do
  b=${base[$m]}
  for amp in fp32 bf16; do
    a=""; [ "$amp" = bf16 ] && a=bf16
    if ! FIT_AMP=$a FIT_GRAPH="$work/$m-$amp.graph.jsonl" GPUSHIM_COSTS=1 "$GPUSHIM_BIN" run \
        --trace "$work/$m-$amp.trace" -- python3 scripts/gpu/fit_truth.py run "$m" "$b" 3 \
        >"$work/$m-$amp.out" 2>"$work/$m-$amp.err"; then
      echo "$m $amp: run failed"; tail -3 "$work/$m-$amp.err"; continue
    fi
    python3 scripts/gpu/graph_check.py "$GPUSHIM_BIN" "$work/$m-$amp.trace" \
      "$work/$m-$amp.graph.jsonl" "$m $amp" "$work/$m-$amp.err"
  done
done
