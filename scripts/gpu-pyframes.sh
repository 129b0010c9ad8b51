#!/usr/bin/env bash
# On the GPU machine: Python frames name the line that leaks. Runs the two leaking
# loops of scripts/gpu/pyleaks.py under `gpushim run` in per-tensor mode and in PyTorch's
# default (caching) mode, and prints one table: what `gpushim leaks` names as the biggest
# grower, the growth per iteration, and whether that names the line marked LEAK(...) in the
# program. Build and carry .gpu as for scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); torch $(python3 -c 'import torch; print(torch.__version__)'); python $(python3 -c 'import sys; print(sys.version.split()[0])'); $(date -u +%F)"
printf "%-7s %-10s %-9s %-13s %s\n" leak mode "named" "per iter" "biggest grower (gpushim leaks)"
for kind in losses cache; do
  line=$(grep -n "LEAK($kind)" scripts/gpu/pyleaks.py | cut -d: -f1)
  for mode in pertensor default; do
    flag=""; [ $mode = pertensor ] && flag="--per-tensor"
    t="$work/$kind.$mode.trace"
    .gpu/gpushim run $flag --trace "$t" -- python3 scripts/gpu/pyleaks.py "$kind" 30 >/dev/null 2>"$work/err" \
      || { echo "$kind $mode: run failed"; tail -5 "$work/err"; continue; }
    .gpu/gpushim leaks --json "$t" > "$work/leaks.json"
    .gpu/gpushim leaks "$t" > "$work/$kind.$mode.txt"
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
.gpu/gpushim summary "$work/losses.pertensor.trace" | grep -E "Python frames|events over" || true
