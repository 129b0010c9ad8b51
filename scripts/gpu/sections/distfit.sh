#!/usr/bin/env bash
# what fits for a job at another world size: rank 0's peak reserved at 4 ranks (DISTFIT_TO) and batches 4 and 16, and its largest batch under a limit, predicted from a run at 2 (DISTFIT_FROM; fit --world-size 4), against real runs at 4, under both settings.
# scripts/gpu/dist_kinds.py (a 6-block GPT-2, BERT or ViT from its config, AdamW, 4 steps) at
# 2 ranks and batch 4 a rank under `gpushim run`, nothing set, for each MODEL and MODE (ddp,
# fsdp2, fsdp1; DISTFIT_MODES may add fsdp2-mp and fsdp1-mp, FSDP in bf16 with fp32 reduction, and zero1, zero2, zero3: DeepSpeed's engine through
# scripts/gpu/ds_kinds.py, bf16, from .gpu/dssite). Then `gpushim
# fit r.0.trace --at 4 --batch 4,16 --world-size 4` under both of PyTorch's settings against
# real runs at 4 ranks without the shim (max_memory_reserved() at batches 4 and 16; "ranks"
# the spread of the real job's ranks' peaks, where they ran as a job), and fit's
# largest batch under L (`--limit`; DISTFIT_LIMIT, 6 GiB) against real runs held to L
# (set_per_process_memory_fraction) a batch apart from it, until one runs and the next does
# not. With fewer than four GPUs, rank 0 alone on one through PyTorch's fake process group
# (every collective's buffer made, no NCCL), DISTFIT_PAR (12) processes at a time. The traces
# at 2 (and at 4, batch 16, defaults; every run at 4 with DISTFIT_TRACE set), answers and
# truths are kept in $OUT/distfit-answers.tar.gz where OUT is set. DISTFIT_FROM and DISTFIT_TO
# (2 and 4) change the world sizes (from 1: FSDP2 and DDP, whose runs at one rank say
# something of more; FSDP1 runs as NO_SHARD there), DISTFIT_LIMIT=none leaves out the largest
# batches. One table.
#   bash scripts/gpu.sh distfit[:MODEL,...]      (gpt2 bert vit; also llama, resnet50, t5, mixtral)
set -euo pipefail
models=${*:-gpt2 bert vit}
modes=${DISTFIT_MODES:-ddp fsdp2 fsdp1}
limit=${DISTFIT_LIMIT:-$((6 << 30))}
from=${DISTFIT_FROM:-2}
to=${DISTFIT_TO:-4}
n=$(nvidia-smi -L | wc -l)
work=$(mktemp -d)
export DIST_TRUTH_DIR="$work"
[ ! -d .gpu/dssite ] || export PYTHONPATH="$PWD/.gpu/dssite${PYTHONPATH:+:$PYTHONPATH}" DS_BUILD_OPS=0
launch() { # WORLD: how a job of WORLD ranks is started here
  if [ "$n" -ge "$1" ]; then
    echo "torchrun --standalone --nproc-per-node $1"
  else
    echo "env DIST_FAKE=1 RANK=0 WORLD_SIZE=$1 python3"
  fi
}
prog() { case $1 in zero*) echo scripts/gpu/ds_kinds.py ;; *) echo scripts/gpu/dist_kinds.py ;; esac; }
# real MODEL MODE WORLD BATCH SETTING [LIMIT]: one run without the shim; its truth in
# $work/MODEL.MODE.wWORLD.bBATCH.SETTING[.lLIMIT].0.json
real() {
  local conf="" name="$1.$2.w$3.b$4.$5${6:+.l$6}"
  [ "$5" = defaults ] || conf="expandable_segments:True"
  local traced=()
  # Batch 16 under the defaults traced too (every run but the limit's with DISTFIT_TRACE set):
  # what differs at 4, to read beside the run at 2.
  if [ -z "${6:-}" ] && { [ -n "${DISTFIT_TRACE:-}" ] || [ "$4.$5" = 16.defaults ]; }; then
    traced=("$GPUSHIM_BIN" run --trace "$work/$name.r%r.trace" --)
  fi
  # A run held to a limit fails where it runs out of memory (its truth says so); each run is
  # stopped after DISTFIT_RUN_S seconds (300), so that no rank waiting on another holds the rest.
  PYTORCH_CUDA_ALLOC_CONF=$conf DIST_LIMIT=${6:-} DIST_MODEL=$1 DIST_TRUTH_NAME="$name" \
    timeout -k 10 "${DISTFIT_RUN_S:-300}" "${traced[@]}" $(launch "$3") $(prog "$2") "$2" 4 "$4" \
    >"$work/$name.out" 2>&1 || [ -n "${6:-}" ] \
    || echo "$*: the real run failed: $(tail -1 "$work/$name.out")"
}
# fits MODEL MODE SETTING LIMIT BATCH: whether the run at BATCH under LIMIT ran (1) or not (0).
fits() {
  real "$1" "$2" "$to" "$5" "$3" "$4" >&2
  python3 -c "import json,sys; print(0 if json.load(open(sys.argv[1])).get('oom') else 1)" \
    "$work/$1.$2.w$to.b$5.$3.l$4.0.json" 2>/dev/null || echo 0
}
# largest MODEL MODE SETTING LIMIT PREDICTED: the real largest batch near PREDICTED, stepping a
# batch at a time (four steps at most, then doubling the step); prints it.
largest() {
  local b=$5 step=1 k
  [ "$b" -ge 1 ] || b=1
  if [ "$(fits "$1" "$2" "$3" "$4" "$b")" = 1 ]; then
    for k in 1 2 3 4 5 6 7 8; do
      [ "$(fits "$1" "$2" "$3" "$4" $((b + step)))" = 1 ] || { echo "$b"; return; }
      b=$((b + step)); [ "$k" -lt 4 ] || step=$((step * 2))
    done
    echo ">=$b"
  else
    for k in 1 2 3 4 5 6 7 8; do
      [ $((b - step)) -ge 1 ] || { echo 0; return; }
      b=$((b - step))
      [ "$(fits "$1" "$2" "$3" "$4" "$b")" = 0 ] || { echo "$b"; return; }
      [ "$k" -lt 4 ] || step=$((step * 2))
    done
    echo "<$b"
  fi
}
export -f real fits largest launch prog
export n work DISTFIT_TRACE from to
[ "$n" -ge "$to" ] || echo "distfit: $n GPU(s): rank 0 alone through PyTorch's fake process group"
# The runs at 2, traced, and the real ones at 4.
jobs=()
for model in $models; do
  for m in $modes; do
    jobs+=("trace $model $m")
    for b in 4 16; do for s in defaults expandable; do jobs+=("real $model $m $to $b $s"); done; done
  done
done
one() {
  set -- $1
  if [ "$1" = trace ]; then
    DIST_MODEL=$2 DIST_TRUTH_NAME="$2.$3.w$from" timeout -k 10 "${DISTFIT_RUN_S:-300}" \
      "$GPUSHIM_BIN" run --trace "$work/$2.$3.r%r.trace" -- \
      $(launch "$from") $(prog "$3") "$3" 4 4 >"$work/$2.$3.w$from.out" 2>&1 \
      || echo "$2 $3: the run at $from failed: $(tail -1 "$work/$2.$3.w$from.out")"
  else
    shift; real "$@"
  fi
}
export -f one
# DISTFIT_PAR: how many jobs at once (a rank's timing moves what FSDP's streams hold): 12 on
# one GPU, one where there are GPUs for a job unless DISTFIT_PAR says more (each process's own
# peak is what is measured, so jobs sharing GPUs leave it be; NCCL's own memory is not in it).
par=${DISTFIT_PAR:-12}
[ "$n" -lt 2 ] || par=${DISTFIT_PAR:-1}
printf '%s\n' "${jobs[@]}" | xargs -r -P "$par" -I{} bash -c 'one "{}"'
# fit's answers, then the real largest batches near them.
searches=()
for model in $models; do
  for m in $modes; do
    t="$work/$model.$m.r0.trace"
    [ -f "$t" ] || continue
    # The peaks on the whole device (the rows), then the largest batch under the limit.
    "$GPUSHIM_BIN" fit "$t" --at 4 --batch 4,16 --world-size "$to" --max-batch 16 --json --quiet \
      >"$work/$model.$m.fit.json" 2>"$work/$model.$m.fit.err" \
      || { echo "$model $m: fit failed: $(tail -2 "$work/$model.$m.fit.err")"; continue; }
    [ "$limit" != none ] || continue
    "$GPUSHIM_BIN" fit "$t" --at 4 --batch 4 --world-size "$to" --limit "$limit" --json --quiet \
      >"$work/$model.$m.limit.json" 2>"$work/$model.$m.fit.err" \
      || { echo "$model $m: fit failed: $(tail -2 "$work/$model.$m.fit.err")"; continue; }
    for s in defaults expandable; do
      p=$(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
want = sys.argv[2] == 'defaults'
print(next(s['largest_batch'] for s in d['settings'] if ('expandable_segments:True' not in s['setting']) == want))" \
        "$work/$model.$m.limit.json" "$s")
      searches+=("$model $m $s $p")
    done
  done
done
search() { set -- $1; echo "$1 $2 $3 $4 $(largest "$1" "$2" "$3" "$limit" "$4" 2>/dev/null)"; }
export -f search
export limit
# Each search's runs are held to the limit: all of them at once on one GPU.
[ "$n" -ge 2 ] || par=${#searches[@]}
printf '%s\n' "${searches[@]}" | xargs -r -P "$par" -I{} bash -c 'search "{}"' >"$work/largest.txt"
python3 - "$work" "$limit" "$from" "$to" $models <<'PY'
import json, sys
work, limit, frm, to, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
limit = int(limit) if limit != "none" else 0
MiB = 1 << 20
largest = {}
for line in open(f"{work}/largest.txt"):
    model, mode, setting, pred, real = line.split()
    largest[(model, mode, setting)] = (pred, real)
print(f"{'model':6} {'mode':8} {'setting':11} {'batch':>5} {f'real@{to} MiB':>11} {f'fit@{to} from {frm}':>13} {'err':>8} {'ranks':>13}   "
      + (f"largest under {limit / (1 << 30):g} GiB: fit, real" if limit else ""))
worst = []
for model in models:
    for mode in ("ddp", "fsdp2", "fsdp1", "fsdp2-mp", "fsdp1-mp", "zero1", "zero2", "zero3"):
        try:
            f = json.load(open(f"{work}/{model}.{mode}.fit.json"))
        except OSError:
            continue
        for setting in ("defaults", "expandable"):
            s = next(s for s in f["settings"] if ("expandable_segments:True" not in s["setting"]) == (setting == "defaults"))
            for b in (4, 16):
                try:
                    real = json.load(open(f"{work}/{model}.{mode}.w{to}.b{b}.{setting}.0.json"))["reserved_peak"]
                except (OSError, KeyError):
                    continue
                pred = next(r for r in s["rows"] if r["batch"] == b)["peak_reserved_bytes"]
                err = (pred - real) / real * 100
                worst.append(abs(err))
                lg = ""
                if b == 16:
                    p, r = largest.get((model, mode, setting), ("-", "-"))
                    lg = f"{p}, {r}"
                # The spread of the real job's ranks' peaks (those that said theirs).
                ranks = []
                for r in range(int(to)):
                    try:
                        ranks.append(json.load(open(f"{work}/{model}.{mode}.w{to}.b{b}.{setting}.{r}.json"))["reserved_peak"] // MiB)
                    except (OSError, KeyError):
                        pass
                spread = f"{min(ranks)}-{max(ranks)}" if ranks else "-"
                print(f"{model:6} {mode:8} {setting:11} {b:>5} {real / MiB:11.2f} {pred / MiB:13.2f} {err:+7.2f}% {spread:>13}   {lg}")
if worst:
    print(f"rows {len(worst)}, within 3%: {sum(e <= 3 for e in worst)}, largest error {max(worst):.2f}%")
PY
if [ -n "${OUT:-}" ]; then
  (cd "$work" && tar -czf "$OUT/distfit-answers.tar.gz" $(find . -name '*.json' -o -name '*.trace' -o -name 'largest.txt') 2>/dev/null) || true
fi
