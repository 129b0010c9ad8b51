#!/usr/bin/env bash
# Python frames name the leaking line, per-tensor and PyTorch's default.
# On the GPU machine: Python frames name the line that leaks. Runs the two leaking
# loops of scripts/gpu/pyleaks.py under `gpushim run` in per-tensor mode and in PyTorch's
# default (caching) mode, and prints one table: what `gpushim leaks` names as the biggest
# grower, the growth per iteration, and whether that names the line marked LEAK(...) in the
# program. Run through scripts/gpu.sh.
set -euo pipefail
work=$(mktemp -d)
printf "%-7s %-10s %-9s %-13s %s\n" leak mode "named" "per iter" "biggest grower (gpushim leaks)"
for kind in losses cache; do
  line=$(grep -n "LEAK($kind)" scripts/gpu/pyleaks.py | cut -d: -f1)
  for mode in pertensor default; do
    flag=""; [ $mode = pertensor ] && flag="--per-tensor"
    t="$work/$kind.$mode.trace"
    "$GPUSHIM_BIN" run $flag --trace "$t" -- python3 scripts/gpu/pyleaks.py "$kind" 30 >/dev/null 2>"$work/err" \
      || { echo "$kind $mode: run failed"; tail -5 "$work/err"; continue; }
    "$GPUSHIM_BIN" leaks --json "$t" > "$work/leaks.json"
    "$GPUSHIM_BIN" leaks "$t" > "$work/$kind.$mode.txt"
    python3 - "$work/leaks.json" "$line" "$kind" "$mode" <<'PY'
import json, sys
l = json.load(open(sys.argv[1])); line = sys.argv[2]
g = (l.get("iterations") or {}).get("growing") or []
if not g:
    print(f"{sys.argv[3]:7} {sys.argv[4]:10} {'no':9} {'-':13} (nothing grows)")
else:
    top = max(g, key=lambda r: r["bytes_per_iteration"])
    ok = f"pyleaks.py:{line} " in top["call_site"] + " "
    print(f"{sys.argv[3]:7} {sys.argv[4]:10} {'yes' if ok else 'NO':9} {top['bytes_per_iteration']:>9} B   {top['call_site']}")
PY
  done
done
echo
for f in "$work"/*.txt; do echo "== gpushim leaks ($(basename "$f" .txt))"; head -12 "$f"; done
"$GPUSHIM_BIN" summary "$work/losses.pertensor.trace" | grep -E "Python frames|events over" || true
