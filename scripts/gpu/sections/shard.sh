#!/usr/bin/env bash
# sharding as a what-if: each rank's peaks under FSDP2 (or DeepSpeed's ZeRO) at 2 and 4 ranks, predicted from one DDP run at 2 (fit --shard full|grad-op|zero1|zero2|zero3), against real runs.
# scripts/gpu/dist_kinds.py (a 6-block GPT-2, BERT or ViT from its config, AdamW, 4 steps) as
# DDP at 2 ranks and batch 4 per rank under `gpushim run`, PyTorch's defaults; then `gpushim fit
# r.0.trace --at 4 --batch 4,16 --shard full|grad-op --world-size W` for W of 2 and 4, against
# real runs without the shim of fsdp2 (fully_shard per block and the root) and fsdp2-keep
# (reshard_after_forward=False) at W ranks and batches 4 and 16, under the defaults and under
# expandable segments (max_memory_reserved() and max_memory_allocated() of rank 0). With fewer
# GPUs than ranks, rank 0 alone on one GPU through PyTorch's fake process group (every buffer
# of the collectives made, no NCCL), those runs eight at a time. One table; the answers and
# truths kept in $OUT/shard-answers.tar.gz where OUT is set.
# SHARD_BATCHES (default "4 16"): the batches a rank compared. SHARD_WAYS (default "full
# grad-op"): zero1, zero2 and zero3 too are `fit --shard zeroN` against DeepSpeed's
# ZeRO-N in fp32 (scripts/gpu/ds_kinds.py zeroN, DeepSpeed's defaults, from .gpu/dssite).
# On two GPUs or more each 2-rank job runs on them (NCCL), one at a time (some 30 s each): one
# model a call keeps the section inside ten minutes; SHARD_PAR jobs at once where it is more
# (each process's own peak is what is measured, so jobs sharing GPUs leave it be).
#   bash scripts/gpu.sh shard[:MODEL,...]      (gpt2 bert vit; also llama, t5, mixtral)
set -euo pipefail
models=${*:-gpt2 bert vit}
ways=${SHARD_WAYS:-full grad-op}
batches=${SHARD_BATCHES:-4 16}
export PYTHONPATH="$PWD/.gpu/dssite${PYTHONPATH:+:$PYTHONPATH}" DS_BUILD_OPS=0 DS_DTYPE=fp32
n=$(nvidia-smi -L | wc -l)
work=$(mktemp -d)
export DIST_TRUTH_DIR="$work"
launch() { # WORLD: how a job of WORLD ranks is started here
  if [ "$n" -ge "$1" ]; then
    echo "torchrun --standalone --nproc-per-node $1"
  else
    echo "env DIST_FAKE=1 RANK=0 WORLD_SIZE=$1 python3"
  fi
}
[ "$n" -ge 4 ] || echo "shard: $n GPU(s): rank 0 alone through PyTorch's fake process group where the job has more ranks"
# The DDP runs, traced.
for model in $models; do
  if ! DIST_MODEL=$model DIST_TRUTH_NAME="$model.ddp" "$GPUSHIM_BIN" run --trace "$work/$model.r%r.trace" -- \
      $(launch 2) scripts/gpu/dist_kinds.py ddp 4 4 >"$work/$model.ddp.out" 2>"$work/$model.ddp.err"; then
    echo "$model: the DDP run failed"; tail -5 "$work/$model.ddp.err"
  fi
done
# The real FSDP2 runs, without the shim.
mode_of() { case $1 in full) echo fsdp2 ;; grad-op) echo fsdp2-keep ;; *) echo "$1" ;; esac; }
jobs=()
for model in $models; do
  for way in $ways; do
    mode=$(mode_of "$way")
    for w in 2 4; do
      for b in $batches; do
        for conf in defaults expandable; do
          jobs+=("$model $mode $w $b $conf")
        done
      done
    done
  done
done
one() {
  set -- $1
  local setting=""
  [ "$5" = defaults ] || setting="expandable_segments:True"
  local script=scripts/gpu/dist_kinds.py
  case $2 in zero*) script=scripts/gpu/ds_kinds.py ;; esac
  PYTORCH_CUDA_ALLOC_CONF=$setting DIST_MODEL=$1 DIST_TRUTH_NAME="$1.$2.w$3.b$4.$5" \
    $(launch "$3") $script "$2" 4 "$4" >"$work/$1.$2.w$3.b$4.$5.out" 2>&1 \
    || echo "$*: the real run failed: $(tail -1 "$work/$1.$2.w$3.b$4.$5.out")"
}
export -f one launch
export n work
# Jobs on real GPUs one at a time; those through the fake group (one process) eight at a time.
printf '%s\n' "${jobs[@]}" | awk -v n="$n" '$3 <= n' | xargs -r -P "${SHARD_PAR:-1}" -I{} bash -c 'one "{}"'
printf '%s\n' "${jobs[@]}" | awk -v n="$n" '$3 > n' | xargs -r -P 8 -I{} bash -c 'one "{}"'
# The answers.
for model in $models; do
  [ -f "$work/$model.r0.trace" ] || continue
  for way in $ways; do
    for w in 2 4; do
      "$GPUSHIM_BIN" fit "$work/$model.r0.trace" --at 4 --batch "$(echo $batches | tr ' ' ,)" --shard "$way" --world-size "$w" \
        --json --quiet >"$work/$model.$way.w$w.fit.json" 2>"$work/$model.$way.w$w.fit.err" \
        || { echo "$model $way $w: fit failed: $(tail -2 "$work/$model.$way.w$w.fit.err")"; }
    done
  done
done
SHARD_WAYS="$ways" python3 - "$work" $models <<'PY'
import json, os, sys
work, models = sys.argv[1], sys.argv[2:]
modes = {"full": "fsdp2", "grad-op": "fsdp2-keep"}
MiB = 1 << 20
print(f"{'model':6} {'way':8} {'ranks':>5} {'batch':>5} {'setting':11} {'real reserved':>14} {'fit':>10} {'err':>8} {'real allocated':>15} {'fit':>10} {'err':>8}")
errs = []
for model in models:
    for way in os.environ["SHARD_WAYS"].split():
        mode = modes.get(way, way)
        for w in (2, 4):
            try:
                f = json.load(open(f"{work}/{model}.{way}.w{w}.fit.json"))
            except (OSError, ValueError):
                continue
            for s in f["settings"]:
                conf = "defaults" if "expandable_segments:True" not in s["setting"] else "expandable"
                for r in s["rows"]:
                    b = r["batch"]
                    try:
                        t = json.load(open(f"{work}/{model}.{mode}.w{w}.b{b}.{conf}.0.json"))
                    except OSError:
                        continue
                    res = (r["peak_reserved_bytes"] - t["reserved_peak"]) / t["reserved_peak"] * 100
                    alc = (r["peak_allocated_bytes"] - t["peak"]) / t["peak"] * 100
                    errs.append(abs(res))
                    print(f"{model:6} {way:8} {w:>5} {b:>5} {conf:11} {t['reserved_peak'] / MiB:14.2f} {r['peak_reserved_bytes'] / MiB:10.2f} {res:+7.2f}% {t['peak'] / MiB:15.2f} {r['peak_allocated_bytes'] / MiB:10.2f} {alc:+7.2f}%")
if errs:
    print(f"peak reserved: {len(errs)} rows, the largest error {max(errs):.2f}%, {sum(e <= 5 for e in errs)} within 5%")
PY
if [ -n "${OUT:-}" ]; then
  (cd "$work" && tar -czf "$OUT/shard-answers.tar.gz" $(find . -name '*.json') $(find . -name '*.trace') 2>/dev/null) || true
fi
