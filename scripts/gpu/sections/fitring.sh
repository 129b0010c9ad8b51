#!/usr/bin/env bash
# what fits, from a ring: the same predictions from a long run read through a small ring as from its whole trace.
# On the GPU machine: each model (scripts/gpu/fit_truth.py: GPT-2, ResNet-50, ViT-B/16, BERT;
# AdamW) trains STEPS steps (default 120) at its small batch under `gpushim run` twice: through
# a 4 MiB ring (`trace_max:4MiB`, lapped several times: what a run past a quarter hour always is)
# and into a whole trace. `gpushim fit` on each predicts the peak reserved memory at 4x and 8x
# the batch, under the defaults and under expandable segments, and the largest batch under
# 20 GiB. The whole trace's predictions are those `scripts/gpu.sh fit` holds to real runs
# (within 3%); here the ring's are held to them: each peak within FITRING_WITHIN percent (12),
# each largest batch within a tenth (a ring that never lapped counts as off: it would prove
# nothing). A ring does not hold the run's first steps, whose fragmentation under the
# defaults the whole trace replays (docs/fit.md): the bound is the ring's, not the truth's.
# One table; its last column, how many backward passes the ring's replay held (`fit`'s `ring`),
# says whether the replay saw the training (fewer than three, and `fit` warns). The traces and predictions are left in $OUT/fitring when OUT is set.
#   bash scripts/gpu.sh fitring[:STEPS]
set -euo pipefail
steps=${1:-120}
models="gpt2 resnet50 vit bert"
declare -A base=([gpt2]=2 [resnet50]=16 [vit]=8 [bert]=8)
work=${OUT:+$OUT/fitring}
work=${work:-$(mktemp -d)}
mkdir -p "$work"
limit=$((20 << 30))
for m in $models; do
  b=${base[$m]}
  for t in ring whole; do
    case $t in ring) max=4MiB ;; whole) max=16GiB ;; esac
    if ! "$GPUSHIM_BIN" run --conf "trace_max:$max" --trace "$work/$m.$t.trace" -- \
        python3 scripts/gpu/fit_truth.py run "$m" "$b" "$steps" >/dev/null 2>"$work/$m.$t.err"; then
      echo "$m $t: traced run failed"; tail -3 "$work/$m.$t.err"; continue
    fi
    "$GPUSHIM_BIN" fit "$work/$m.$t.trace" --at "$b" --batch "$b,$((4 * b)),$((8 * b))" \
      --limit "$limit" --json >"$work/$m.$t.fit.json" 2>"$work/$m.$t.fit.err" \
      || { echo "$m $t: fit failed"; tail -3 "$work/$m.$t.fit.err"; }
    "$GPUSHIM_BIN" summary --json "$work/$m.$t.trace" >"$work/$m.$t.summary.json" 2>/dev/null || true
  done
done
python3 - "$work" $models <<'PY'
import json, os, sys
work, models = sys.argv[1], sys.argv[2:]
within = float(os.environ.get("FITRING_WITHIN", "12"))
GiB = 1 << 30
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
print(f"{'model':9} {'setting':25} {'batch':>5} {'whole':>9} {'ring':>9} {'diff':>7}   largest: whole, ring   ring lapped (records summarized), backward passes its replay holds")
bad = 0
for m in models:
    w, r = load(f"{work}/{m}.whole.fit.json"), load(f"{work}/{m}.ring.fit.json")
    s = load(f"{work}/{m}.ring.summary.json") or {}
    lapped = s.get("health", {}).get("summarized", 0)
    passes = ((r or {}).get("ring") or {}).get("backwards", "-")
    if not lapped:
        print(f"{m:9} the ring never lapped: more steps"); bad += 1
    if not w or not r:
        print(f"{m:9} (no prediction: whole {bool(w)}, ring {bool(r)})"); bad += 1; continue
    for ws in w["settings"]:
        rs = next((x for x in r["settings"] if x["setting"] == ws["setting"]), None)
        name = ws["setting"] or "(defaults)"
        if rs is None:
            print(f"{m:9} {name:25} (not in the ring's)"); bad += 1; continue
        for wr in ws["rows"][1:]:
            rr = next((x for x in rs["rows"] if x["batch"] == wr["batch"]), None)
            if rr is None:
                print(f"{m:9} {name:25} {wr['batch']:>5} (no row from the ring)"); bad += 1; continue
            a, b = wr["peak_reserved_bytes"], rr["peak_reserved_bytes"]
            d = (b - a) / a if a else 0.0
            bad += abs(d) > within / 100
            print(f"{m:9} {name:25} {wr['batch']:>5} {a / GiB:>8.2f}G {b / GiB:>8.2f}G {100 * d:>+6.2f}%")
        same = abs(ws["largest_batch"] - rs["largest_batch"]) <= max(1, ws["largest_batch"] // 10)
        bad += not same
        print(f"{m:9} {name:25} {'':>5} {'':>9} {'':>9} {'':>7}   {ws['largest_batch']}, {rs['largest_batch']}{'' if same else '  OFF'}   {lapped}, {passes}")
print(f"every ring's peak within {within:g}% of the whole trace's, its largest batch within a tenth" if not bad else f"{bad} off")
sys.exit(1 if bad else 0)
PY
