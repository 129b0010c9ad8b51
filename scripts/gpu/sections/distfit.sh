#!/usr/bin/env bash
# what fits for a job at another world size: each rank's peak reserved at 4 ranks predicted from a run at 2 (fit --world-size 4), against real runs at 4.
# On a machine of four GPUs (else rank 0 alone on one, through PyTorch's fake process group):
# scripts/gpu/dist_kinds.py (a 6-block GPT-2, BERT or ViT from its
# config, AdamW, batch B per rank) under `gpushim run -- torchrun --nproc-per-node 2`, nothing
# set, then the same job at 4 ranks without the shim; for each MODEL and MODE (ddp, fsdp2,
# fsdp1; DISTFIT_MODES may add zero1, zero2, zero3: DeepSpeed's engine through
# scripts/gpu/ds_kinds.py, bf16, from .gpu/dssite), `gpushim fit r.0.trace --at B --batch B --world-size 4` against every rank's
# max_memory_reserved() at 4 ranks, under PyTorch's defaults (the answers and truths kept in
# $OUT/distfit-answers.tar.gz where OUT is set). One table.
#   bash scripts/gpu.sh distfit[:MODEL,...]      (gpt2 bert vit)
set -euo pipefail
models=${*:-gpt2 bert vit}
modes=${DISTFIT_MODES:-ddp fsdp2 fsdp1}
batch=${DISTFIT_BATCH:-4}
n=$(nvidia-smi -L | wc -l)
# With fewer than four GPUs, rank 0 alone on one GPU through PyTorch's fake process group (no
# communication, every collective's buffer made): the same requests, without NCCL's own.
fake=""
[ "$n" -ge 4 ] || fake=1
work=$(mktemp -d)
export DIST_TRUTH_DIR="$work"
[ ! -d .gpu/dssite ] || export PYTHONPATH="$PWD/.gpu/dssite${PYTHONPATH:+:$PYTHONPATH}" DS_BUILD_OPS=0
[ -z "$fake" ] || echo "distfit: $n GPU(s): rank 0 alone through PyTorch's fake process group"
printf '%-6s %-6s %5s %6s %18s %18s %8s %18s %24s\n' model mode batch rank "real@4 MiB" "fit@4 from 2 MiB" err "run@2 MiB" "its own replay@2 MiB"
for model in $models; do
  for m in $modes; do
    d="$work/$model.$m"
    mkdir -p "$d"
    export DIST_MODEL=$model
    if [ -n "$fake" ]; then
      at2=(env DIST_FAKE=1 RANK=0 WORLD_SIZE=2 python3)
      at4=(env DIST_FAKE=1 RANK=0 WORLD_SIZE=4 python3)
    else
      at2=(env CUDA_VISIBLE_DEVICES=0,1 torchrun --standalone --nproc-per-node 2)
      at4=(torchrun --standalone --nproc-per-node 4)
    fi
    # DeepSpeed's ZeRO (zero1, zero2, zero3) through its engine, from .gpu/dssite.
    prog=scripts/gpu/dist_kinds.py
    case $m in zero*) prog=scripts/gpu/ds_kinds.py ;; esac
    if ! DIST_TRUTH_NAME="$model.$m.w2" "$GPUSHIM_BIN" run --trace "$d/r.%r.trace" -- \
        "${at2[@]}" "$prog" "$m" 4 "$batch" >"$d/w2.out" 2>"$d/w2.err"; then
      echo "$model $m: the run at 2 failed"; tail -5 "$d/w2.err"; continue
    fi
    if ! DIST_TRUTH_NAME="$model.$m.w4" "${at4[@]}" "$prog" "$m" 4 "$batch" \
        >"$d/w4.out" 2>"$d/w4.err"; then
      echo "$model $m: the run at 4 failed"; tail -5 "$d/w4.err"; continue
    fi
    "$GPUSHIM_BIN" fit "$d/r.0.trace" --at "$batch" --batch "$batch" --world-size 4 --json \
      >"$d/fit.json" 2>"$d/fit.err" || { echo "$model $m: fit failed"; tail -3 "$d/fit.err"; continue; }
    # The run's own replay, at its own world: what the model of the allocator misses anyway.
    "$GPUSHIM_BIN" fit "$d/r.0.trace" --at "$batch" --batch "$batch" --json >"$d/own.json" 2>/dev/null || true
    python3 - "$work" "$model" "$m" "$d/fit.json" "$batch" <<'PY'
import json, sys
work, model, mode, fit, batch = sys.argv[1:6]
MiB = 1 << 20
f = json.load(open(fit))
recorded = next(s for s in f["settings"] if s["recorded"])
pred = next(r for r in recorded["rows"] if r["batch"] == int(batch))["peak_reserved_bytes"]
at2 = json.load(open(f"{work}/{model}.{mode}.w2.0.json"))["reserved_peak"]
try:
    o = json.load(open(fit.replace("fit.json", "own.json")))
    o = next(s for s in o["settings"] if s["recorded"])
    own = next(r for r in o["rows"] if r["batch"] == int(batch))["peak_reserved_bytes"]
    own = f"{own / MiB:.2f} ({(own - at2) / at2 * 100:+.2f}%)"
except (OSError, ValueError, StopIteration, KeyError):
    own = "-"
for r in range(4):
    try:
        real = json.load(open(f"{work}/{model}.{mode}.w4.{r}.json"))["reserved_peak"]
    except OSError:
        continue
    err = (pred - real) / real * 100
    print(f"{model:6} {mode:6} {batch:>5} {r:>6} {real / MiB:18.2f} {pred / MiB:18.2f} {err:+7.2f}% {at2 / MiB:18.2f} {own:>24}")
PY
  done
done
if [ -n "${OUT:-}" ]; then
  (cd "$work" && tar -czf "$OUT/distfit-answers.tar.gz" $(find . -name '*.json') 2>/dev/null) || true
fi
