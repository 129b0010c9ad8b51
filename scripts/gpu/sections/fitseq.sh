#!/usr/bin/env bash
# what fits at another sequence length: peak reserved at 4x the length and the largest batch there, from two runs at L and 2L, against real runs.
# On the GPU machine: GPT-2 with eager attention (attention's scores kept: the square of the
# length), GPT-2 with SDPA (none kept) and BERT (scripts/gpu/fit_truth.py; AdamW, 3 steps),
# traced at batch b and lengths L and 2L under `gpushim run`, nothing set; `gpushim fit A
# --with B --seq-at L --with-seq 2L --seq 4L --limit 20GiB` predicts the peak reserved at 4L
# and batch b, under the defaults and with expandable segments, and the largest batch that runs
# at 4L with PyTorch's allocator held to 20 GiB. Real runs, a fresh process each, give
# max_memory_reserved() at 4L, and whether the predicted largest batch runs under the limit and
# the next does not (stepping until the truth is found, three steps at most). One table. The
# traces are left in $OUT/fitseq when OUT is set.
#   bash scripts/gpu.sh fitseq[:CASE,...]   CASE is gpt2-eager, gpt2-sdpa or bert
set -uo pipefail
cases=${*:-gpt2-eager gpt2-sdpa bert}
w=${OUT:+$OUT/fitseq}
w=${w:-$(mktemp -d)}
mkdir -p "$w"
limit=$((20 << 30))
declare -A model=([gpt2-eager]=gpt2 [gpt2-sdpa]=gpt2 [bert]=bert)
declare -A attn=([gpt2-eager]=eager [gpt2-sdpa]=sdpa [bert]=eager)
declare -A len=([gpt2-eager]=256 [gpt2-sdpa]=256 [bert]=128)
declare -A base=([gpt2-eager]=4 [gpt2-sdpa]=4 [bert]=8)
# One real run: CASE LENGTH BATCH SETTING [LIMIT]: its TRUTH line.
one() {
  FIT_ATTN=${attn[$1]} FIT_SEQ=$2 PYTORCH_CUDA_ALLOC_CONF=$4 \
    python3 scripts/gpu/fit_truth.py run "${model[$1]}" "$3" 3 ${5:-} 2>/dev/null | sed -n 's/^TRUTH //p'
}
runs() { ! grep -q '"oom": true' <<< "$1" && [ -n "$1" ]; }
rows=()
for c in $cases; do
  l=${len[$c]}; b=${base[$c]}
  for k in 1 2; do
    FIT_ATTN=${attn[$c]} FIT_SEQ=$((k * l)) "$GPUSHIM_BIN" run --trace "$w/$c.$k.trace" -- \
      python3 scripts/gpu/fit_truth.py run "${model[$c]}" "$b" 3 >/dev/null 2>&1 || echo "$c: traced run at $((k * l)) failed"
  done
  "$GPUSHIM_BIN" fit "$w/$c.1.trace" --at "$b" --with "$w/$c.2.trace" --seq-at "$l" \
    --with-seq $((2 * l)) --seq $((4 * l)) --limit "$limit" --json > "$w/$c.fit.json" 2>"$w/$c.fit.err"
  for s in "" "expandable_segments:True"; do
    real=$(one "$c" $((4 * l)) "$b" "$s")
    predicted=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=next(x for x in d['seq']['lengths'][0]['settings'] if x['setting']==sys.argv[2]); print(r['row']['peak_reserved_bytes'], r['largest_batch'])" "$w/$c.fit.json" "$s")
    read -r peak big <<< "$predicted"
    # The truth about the largest batch at 4L under the limit: it runs and the next does not.
    truth=$big
    if runs "$(one "$c" $((4 * l)) "$big" "$s" "$limit")"; then
      for n in 1 2 3; do runs "$(one "$c" $((4 * l)) $((big + n)) "$s" "$limit")" || break; truth=$((big + n)); done
    else
      truth=$((big - 1))
      for n in 2 3 4; do [ "$truth" -ge 1 ] || break; runs "$(one "$c" $((4 * l)) "$truth" "$s" "$limit")" && break; truth=$((big - n)); done
    fi
    rows+=("$c|$l|$b|${s:-(defaults)}|$peak|$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['reserved'])" "$real" 2>/dev/null || echo 0)|$big|$truth")
  done
done
python3 - "${rows[@]}" <<'PY'
import sys
M = 1 << 20
print(f"{'case':11} {'L->4L':>9} {'b':>3} {'setting':26} {'predicted':>10} {'real':>10} {'err':>8}  largest at 4L under 20 GiB: predicted, real")
bad = 0
for row in sys.argv[1:]:
    c, l, b, s, p, r, big, truth = row.split("|")
    p, r, l = int(p), int(r), int(l)
    err = 100 * (p - r) / r if r else float("nan")
    off = abs(err) > 3 or abs(int(big) - int(truth)) > 1
    bad += off
    print(f"{c:11} {l:>4}->{4 * l:<4} {b:>3} {s:26} {p / M:>9.1f}M {r / M:>9.1f}M {err:>+7.2f}%  {big}, {truth}{'  OFF' if off else ''}")
print("every prediction within 3% and one batch" if not bad else f"{bad} off")
PY
