#!/usr/bin/env bash
# the largest batch on the whole device: predicted from one small run (the limit CUDA's total, and NVML's as before), against real runs; the device's memory as each source gives it.
# On the GPU machine: first the device's memory as NVML (both calls), CUDA's driver and PyTorch
# give it. Then each model (scripts/gpu/fit_truth.py; AdamW, 3 steps) traced at a small batch
# under `gpushim run`, nothing set; `gpushim fit` predicts the largest batch that runs on the
# whole device, under the defaults and with expandable segments, its limit CUDA's total (kept
# in the trace's header) less what the context and libraries took; and, for comparison, with
# NVML's total in its place (`--device-memory`, what fit used before). Real runs, a fresh
# process each (scripts/gpu/fit_device.py), find the largest batch that runs: one that runs and
# the next that does not. One table. The traces are left in $OUT/fitdevice when OUT is set.
#   bash scripts/gpu.sh fitdevice[:MODEL,...]   MODEL is resnet50, vit, gpt2, bert, llama or convnext
set -euo pipefail
models=${*:-resnet50 vit}
work=${OUT:+$OUT/fitdevice}
work=${work:-$(mktemp -d)}
mkdir -p "$work"
declare -A base=([gpt2]=2 [resnet50]=16 [vit]=8 [bert]=8 [llama]=2 [convnext]=16)
python3 scripts/gpu/fit_device.py facts
nvml_total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
rows=()
for m in $models; do
  b=${base[$m]}
  "$GPUSHIM_BIN" run --trace "$work/$m.trace" -- python3 scripts/gpu/fit_truth.py run "$m" "$b" 3 \
    >/dev/null 2>"$work/$m.err" || { echo "$m: traced run failed"; tail -3 "$work/$m.err"; continue; }
  "$GPUSHIM_BIN" fit "$work/$m.trace" --at "$b" --json > "$work/$m.fit.json"
  "$GPUSHIM_BIN" fit "$work/$m.trace" --at "$b" --device-memory "${nvml_total}MiB" --json > "$work/$m.nvml.json"
  for setting in "" "expandable_segments:True"; do
    pick='import json,sys; d=json.load(open(sys.argv[1])); print(next(s["largest_batch"] for s in d["settings"] if s["setting"] == sys.argv[2]))'
    p=$(python3 -c "$pick" "$work/$m.fit.json" "$setting")
    old=$(python3 -c "$pick" "$work/$m.nvml.json" "$setting")
    real=$(python3 scripts/gpu/fit_device.py search "$work" "$m" "$setting" "$p" | sed -n 's/^LARGEST [^ ]* [^ ]* //p')
    rows+=("$(printf '%-9s %-25s %10s %12s %s' "$m" "${setting:-(defaults)}" "$p" "$old" "$real")")
  done
done
printf '%-9s %-25s %10s %12s %s\n' model setting "CUDA total" "NVML total" "real largest"
printf '%s\n' "${rows[@]}"
