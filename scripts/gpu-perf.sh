#!/usr/bin/env bash
# Issue 12 on the GPU machine: per-tensor PyTorch under the shim against PyTorch's own
# allocator on real workloads with shapes that change every step, modes alternated
# (A B C D E, A B C D E, ...) so a drifting machine cancels out. Modes: PyTorch's default;
# pertensor (`gpushim run --per-tensor`: caching off, pool:caching); pluggable (the pluggable
# allocator over pool:expandable); plugcaching (over pool:caching); PyTorch's expandable
# segments, for memory; ptnoframes (pertensor with stacks:off: what Python frames cost, issue
# 13). MODES (environment) picks a subset, in order. Prints one table per workload:
# median step time over the rounds, × PyTorch's default of the same run, NVML peak.
#   bash scripts/gpu-perf.sh WORKLOAD [ROUNDS] [STEPS]    (transformer, gpt2, resnet50)
# Build and carry .gpu as for scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:?usage: gpu-perf.sh WORKLOAD [ROUNDS] [STEPS]}
rounds=${2:-3}
steps=${3:-15}
export GPUSHIM_LIB="$PWD/.gpu/libgpushim.so"
work=$(mktemp -d)
out="$work/results.jsonl"
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); torch $(python3 -c 'import torch; print(torch.__version__)'); $(date -u +%F)"
for r in $(seq "$rounds"); do
  for mode in ${MODES:-default pertensor ptnoframes pluggable plugcaching expandable}; do
    case $mode in
      default|expandable) python3 scripts/gpu/workloads.py "$workload" $mode "$steps" ;;
      pertensor) .gpu/gpushim run --per-tensor --trace "$work/pt.%p.trace" -- \
                   python3 scripts/gpu/workloads.py "$workload" $mode "$steps" ;;
      ptnotrace) GPUSHIM_TRACE=off .gpu/gpushim run --per-tensor --conf stacks:off -- \
                   python3 scripts/gpu/workloads.py "$workload" pertensor "$steps" \
                   | sed 's/"mode": "pertensor"/"mode": "ptnotrace"/' ;;
      ptnoframes) .gpu/gpushim run --per-tensor --conf stacks:off --trace "$work/pn.%p.trace" -- \
                   python3 scripts/gpu/workloads.py "$workload" pertensor "$steps" \
                   | sed 's/"mode": "pertensor"/"mode": "ptnoframes"/' ;;
      pluggable) .gpu/gpushim run --conf pool:expandable --trace "$work/pl.%p.trace" -- \
                   python3 scripts/gpu/workloads.py "$workload" $mode "$steps" ;;
      plugcaching) .gpu/gpushim run --conf pool:caching --trace "$work/pc.%p.trace" -- \
                   python3 scripts/gpu/workloads.py "$workload" pluggable "$steps" \
                   | sed 's/"mode": "pluggable"/"mode": "plugcaching"/' ;;
    esac 2>/dev/null | grep '^RESULT' | sed 's/^RESULT //' >> "$out"
    rm -f "$work"/*.trace
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["mode"], []).append(r)
base = statistics.median(r["step_ms"] for r in by["default"])
print(f"{rows[0]['workload']}: {len(by['default'])} rounds")
print(f"{'mode':12} {'step ms':>9} {'x default':>10} {'NVML peak MiB':>14}")
for mode in ["default", "pertensor", "ptnoframes", "ptnotrace", "pluggable", "plugcaching", "expandable"]:
    rs = by.get(mode, [])
    if not rs:
        print(f"{mode:12} {'(no result)':>9}")
        continue
    ms = statistics.median(r["step_ms"] for r in rs)
    peak = max(r["nvml_peak"] for r in rs) / 2**20
    print(f"{mode:12} {ms:9.2f} {ms / base:10.3f} {peak:14.0f}")
PY
