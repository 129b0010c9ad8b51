#!/usr/bin/env bash
# what fits, from a long ring, passing over repeating steps: the same answers as replaying every event, and how much sooner.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ResNet-50, ViT-B/16, BERT;
# AdamW) trains STEPS steps (default 800) at its small batch under `gpushim run` through a ring
# of RING (default 32MiB, lapped: a long run), and GPT-2 once more with a sequence length of its
# own each step (FIT_VARY=1: shapes that change every step, where nothing repeats). `gpushim
# fit` on each ring (the peaks at 1x, 4x and 8x the batch under a 20 GiB limit and the largest
# batch, both settings) runs four times, alternated: as it does by default (repeating steps
# passed over) and with every event replayed (GPUSHIM_REPLAY_EVERY=1). One table: per model,
# the ring's records and backward passes, the events the replays applied and passed over, each
# way's times, and whether the four answers were the same to the byte (they must be).
# FITREPEAT_MODELS="gpt2 bert": those alone (also llama, convnext, and llama-vary).
# GPUSHIM_BEFORE=PATH: another build's `fit` too, run twice by default after the others, its
# times in a column and its answers compared with this build's (they must be the same).
#   bash scripts/gpu.sh fitrepeat[:STEPS,RING]
set -euo pipefail
steps=${1:-800}
ring=${2:-32MiB}
declare -A base=([gpt2]=2 [resnet50]=16 [vit]=8 [bert]=8 [gpt2-vary]=2 [llama]=2 [convnext]=16 [llama-vary]=2)
work=${OUT:+$OUT/fitrepeat}
work=${work:-$(mktemp -d)}
mkdir -p "$work"
limit=$((20 << 30))
before=${GPUSHIM_BEFORE:-}
printf "%-10s %9s %6s %11s %11s %-23s %-23s %-15s %s\n" model "ring MiB" passes applied "passed over" "seconds, default" "seconds, every event" "seconds, before" "answers"
bad=0
for m in ${FITREPEAT_MODELS:-gpt2 resnet50 vit bert gpt2-vary}; do
  b=${base[$m]}
  model=${m%-vary}
  vary=$([ "$model" != "$m" ] && echo 1 || echo 0)
  t=$work/$m.trace
  if ! FIT_VARY=$vary "$GPUSHIM_BIN" run --conf "trace_max:$ring" --trace "$t" -- \
      python3 scripts/gpu/fit_truth.py run "$model" "$b" "$steps" >/dev/null 2>"$work/$m.err"; then
    echo "$m: traced run failed"; tail -3 "$work/$m.err"; bad=$((bad + 1)); continue
  fi
  args=(fit "$t" --at "$b" --batch "$b,$((4 * b)),$((8 * b))" --limit "$limit" --json)
  fast="" every="" counts=""
  for round in 1 2; do
    for mode in default every; do
      env=()
      [ "$mode" = every ] && env=(GPUSHIM_REPLAY_EVERY=1)
      s0=$(date +%s.%N)
      env "${env[@]}" GPUSHIM_READS=1 "$GPUSHIM_BIN" "${args[@]}" >"$work/$m.$mode.$round.json" 2>"$work/$m.$mode.$round.err" \
        || { echo "$m: fit failed ($mode)"; tail -3 "$work/$m.$mode.$round.err"; bad=$((bad + 1)); }
      s=$(awk -v a="$s0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
      if [ "$mode" = default ]; then fast="$fast $s"; else every="$every $s"; fi
    done
  done
  was="-"
  if [ -n "$before" ]; then
    was=""
    for round in 1 2; do
      s0=$(date +%s.%N)
      "$before" "${args[@]}" >"$work/$m.before.$round.json" 2>"$work/$m.before.$round.err" \
        || { echo "$m: fit failed (before)"; tail -3 "$work/$m.before.$round.err"; bad=$((bad + 1)); }
      was="$was $(awk -v a="$s0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    done
  fi
  counts=$(sed -n "s/^gpushim: .* replay(s) of PyTorch's allocator applied \([0-9]*\) events, passed over \([0-9]*\) as repeats$/\1 \2/p" "$work/$m.default.1.err")
  same=same
  for f in "$work/$m".*.json; do cmp -s "$f" "$work/$m.default.1.json" || same=DIFFERENT; done
  [ "$same" = same ] || bad=$((bad + 1))
  size=$(( $(stat -c %s "$t") >> 20 ))
  passes=$(python3 -c 'import json,sys; print((json.load(open(sys.argv[1])).get("ring") or {}).get("backwards","-"))' "$work/$m.default.1.json" 2>/dev/null || echo -)
  read -r applied passed <<<"${counts:-- -}"
  printf "%-10s %9s %6s %11s %11s %-23s %-23s %-15s %s\n" "$m" "$size" "$passes" "$applied" "$passed" "${fast# }" "${every# }" "${was# }" "$same"
done
echo "(ring MiB: the trace's size; passes: backward passes its replay holds; applied, passed over: events of all the replays of one fit; seconds: two runs each way, alternated; before: GPUSHIM_BEFORE's build, its answers compared too)"
[ "$bad" = 0 ] && echo "every answer the same to the byte either way" || echo "$bad off"
exit $((bad > 0))
