#!/usr/bin/env bash
# --pluggable and --per-tensor with real PyTorch: its counters, graphs, a workload.
# `gpushim run --pluggable` and `--per-tensor` with real PyTorch on the GPU machine (
# deliverable 3): what PyTorch's own memory counters, CUDA graphs and a few training steps do
# under each, beside PyTorch alone and PyTorch with its cache off without the shim (what
# --per-tensor sets; scripts/gpu/pluggable_probe.py, one column each); then a real workload
# (ResNet-50, shapes changing every step) under `--pluggable` with its trace: the calls by API
# (torch_pluggable when the pluggable allocator served the tensors), NVML peak beside the same
# workload on PyTorch's expandable segments, and the Python lines that held the peak. Prints
# one table per part.
#   bash scripts/gpu.sh pluggable[:WORKLOAD,STEPS]     (default resnet50 24)
# Run through scripts/gpu.sh.
set -euo pipefail
workload=${1:-resnet50}
steps=${2:-24}
bin=$GPUSHIM_BIN
work=${GPUSHIM_WORK:-/tmp/gpushim-pluggable}
rm -rf "$work" && mkdir -p "$work"

probe() { # NAME CMD...: the probe's JSON line into $work/NAME.json
  local name=$1; shift
  "$@" > "$work/$name.log" 2>&1 || true
  grep '^PROBE ' "$work/$name.log" | sed 's/^PROBE //' > "$work/$name.json" || true
  [ -s "$work/$name.json" ] || { echo "probe $name printed nothing; its output:" >&2; tail -20 "$work/$name.log" >&2; }
}
probe alone python3 scripts/gpu/pluggable_probe.py
probe nocache env PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 scripts/gpu/pluggable_probe.py
probe pluggable "$bin" run --pluggable --trace "$work/probe-pl.%p.trace" -- python3 scripts/gpu/pluggable_probe.py
probe pertensor "$bin" run --per-tensor --trace "$work/probe-pt.%p.trace" -- python3 scripts/gpu/pluggable_probe.py
python3 - "$work" <<'EOF'
import json, os, sys
work = sys.argv[1]
cols = ["alone", "nocache", "pluggable", "pertensor"]
runs = {}
for c in cols:
    try:
        runs[c] = json.load(open(os.path.join(work, c + ".json")))
    except (OSError, ValueError):
        runs[c] = {}
keys = []
for c in cols:
    keys += [k for k in runs[c] if k not in keys]
print("\n| PyTorch call | PyTorch alone | PyTorch, cache off (no shim) | `gpushim run --pluggable` | `gpushim run --per-tensor` |")
print("| --- | --- | --- | --- | --- |")
for k in keys:
    print(f"| {k} | " + " | ".join(str(runs[c].get(k, "(no answer)")) for c in cols) + " |")
for c in ("pluggable", "pertensor"):
    stray = [l for l in open(os.path.join(work, c + ".log")) if l.startswith("gpushim:") and "trace" not in l]
    for l in stray[:3]:
        print(f"{c} said: {l.rstrip()}")
EOF

# A real workload under --pluggable, and the same on PyTorch's expandable segments (NVML peak).
result() { grep '^RESULT ' "$1" | sed 's/^RESULT //' || true; }
"$bin" run --pluggable --trace "$work/wl.%p.trace" -- python3 scripts/gpu/workloads.py "$workload" default "$steps" > "$work/wl-pl.log" 2>&1 || echo "pluggable run failed: $(tail -3 "$work/wl-pl.log")"
python3 scripts/gpu/workloads.py "$workload" expandable "$steps" > "$work/wl-ex.log" 2>&1 || echo "expandable run failed: $(tail -3 "$work/wl-ex.log")"
trace=$(ls "$work"/wl.*.trace 2>/dev/null | head -1 || true)
python3 - "$(result "$work/wl-pl.log")" "$(result "$work/wl-ex.log")" "$workload" <<'EOF'
import json, sys
def load(s):
    try:
        return json.loads(s)
    except ValueError:
        return {}
pl, ex, w = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
print(f"\n| {w} (separate processes) | step ms (median) | NVML peak MiB | loss |")
print("| --- | --- | --- | --- |")
for name, r in (("`gpushim run --pluggable`", pl), ("PyTorch expandable segments, no shim", ex)):
    if r:
        print(f"| {name} | {r['step_ms']:.1f} | {r['nvml_peak'] / 2**20:,.0f} | {r['loss']:.4f} |")
    else:
        print(f"| {name} | failed | | |")
EOF
if [ -n "$trace" ]; then
  echo; echo "gpushim summary (the --pluggable workload's trace):"
  "$bin" summary --quiet "$trace" | head -40
  echo; echo "gpushim peak (who held the peak):"
  "$bin" peak --quiet "$trace" 2>&1 | head -25
else
  echo "no trace from the --pluggable workload"
fi
