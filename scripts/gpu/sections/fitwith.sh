#!/usr/bin/env bash
# what fits, taught by a second run: peak reserved at 8x the batch from one run, and from two runs at b and 2b (`fit --with`), against a real run.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ViT-B/16, ResNet-50; AdamW,
# 3 steps) traced at a small batch b and at 2b under `gpushim run`, nothing set; `gpushim fit`
# predicts the peak reserved at 8b under the defaults from the first run alone (each request
# scaled by its kind) and with the second (`--with`: each request on the line through its two
# sizes); a real run at 8b, a fresh process, gives max_memory_reserved(). One table: each
# prediction's error. The traces are left in $OUT/fitwith when OUT is set.
#   bash scripts/gpu.sh fitwith[:MODEL,...]   MODEL is gpt2, vit or resnet50
set -uo pipefail
models=${*:-gpt2 vit resnet50}
w=${OUT:+$OUT/fitwith}
w=${w:-$(mktemp -d)}
mkdir -p "$w"
declare -A base=([gpt2]=2 [resnet50]=16 [vit]=8 [bert]=8)
printf "%-9s %4s %4s %5s %12s %12s %8s %12s %8s\n" model b 2b 8b real "one run" err "two runs" err
for m in $models; do
  b=${base[$m]}; b2=$((2 * b)); t=$((8 * b))
  "$GPUSHIM_BIN" run --trace "$w/$m.a.trace" -- python3 scripts/gpu/fit_truth.py run "$m" "$b" 3 >/dev/null 2>&1
  "$GPUSHIM_BIN" run --trace "$w/$m.b.trace" -- python3 scripts/gpu/fit_truth.py run "$m" "$b2" 3 >/dev/null 2>&1
  real=$(python3 scripts/gpu/fit_truth.py run "$m" "$t" 3 2>/dev/null | sed -n 's/^TRUTH //p')
  alone=$("$GPUSHIM_BIN" fit "$w/$m.a.trace" --at "$b" --batch "$t" --json)
  with=$("$GPUSHIM_BIN" fit "$w/$m.a.trace" --at "$b" --batch "$t" --with "$w/$m.b.trace" --with-at "$b2" --json)
  python3 - "$m" "$b" "$b2" "$t" "$real" "$alone" "$with" <<'PY'
import json, sys
m, b, b2, t, real, alone, with_ = sys.argv[1:]
real = json.loads(real)["reserved"]
peak = lambda f: json.loads(f)["settings"][0]["rows"][0]["peak_reserved_bytes"]
a, w = peak(alone), peak(with_)
scaled = json.loads(with_)["second"]["requests"]
M = 1 << 20
print(f"{m:9} {b:>4} {b2:>4} {t:>5} {real / M:>11.1f}M {a / M:>11.1f}M {100 * (a - real) / real:>+7.2f}% "
      f"{w / M:>11.1f}M {100 * (w - real) / real:>+7.2f}%  ({scaled} requests scaled by the second run)")
PY
done
