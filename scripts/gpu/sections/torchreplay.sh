#!/usr/bin/env bash
# `gpushim simulate --torch` against PyTorch itself. Each workload of
# scripts/gpu/torch_replay.py (shapes from a seed, changing every step, one empty_cache) runs
# under the shim with PyTorch's defaults and with expandable_segments:True; the replay of the
# recorded setting is compared with the segments the run took (the same sequence, peak reserved
# to the byte, tensors at the run's own address) and with PyTorch's own max_memory_reserved.
# Then `simulate --recommend` picks a setting for each default run, the workload runs again
# under it, and the predicted peak reserved is printed beside the measured one.
# Last, an out-of-memory that a setting avoids (scripts/gpu/torch_oom.py): `gpushim oom` names
# the settings that would have served the request, and the script runs it again under the one
# it advises. WORKLOADS (environment) picks some of gpt2 resnet50 transformer streams.
# SAVE_TRACES=DIR copies the tiny workloads' traces and the out-of-memory's there
# (the repository's test data).
#   bash scripts/gpu.sh torchreplay[:STEPS[,oom]]   (oom: the out-of-memory part only)
set -euo pipefail
steps=${1:-12}
only=${2:-}
work=$(mktemp -d)
keep_records() { # SRC DST: the trace's records only, the file ending after the last one claimed
  # (a short run's ring never wrapped, and its checkpoint area is empty)
  mkdir -p "$(dirname "$2")"
  python3 - "$1" "$2" <<'PY'
import struct, sys
src, dst = sys.argv[1:]
with open(src, "rb") as f:
    h = f.read(4096)
    claimed = struct.unpack_from("<Q", h, 64)[0]
    f.seek(0)
    data = f.read(4096 + 32 * claimed)
open(dst, "wb").write(data)
PY
}
[ "$only" = oom ] || {
printf '%-22s %-26s %14s %14s %14s %7s %9s\n' workload setting "torch peak" "trace peak" "replay peak" exact "at addr"
row() { # workload-label conf trace result-json
  local sim
  sim=$("$GPUSHIM_BIN" simulate "$3" --torch "" --json)
  python3 - "$1" "$2" "$4" "$sim" <<'PY'
import json, sys
label, conf, res, sim = sys.argv[1], sys.argv[2] or "(defaults)", json.loads(sys.argv[3]), json.loads(sys.argv[4])[0]
f = sim["fidelity"][0]
at = 100.0 * f["tensors_at_recorded_address"] / max(1, f["tensors"])
print(f"{label:22} {conf:26} {res['max_reserved']:14d} {f['recorded_peak_reserved_bytes']:14d} "
      f"{f['replayed_peak_reserved_bytes']:14d} {'yes' if f['first_difference'] is None else 'NO':>7} {at:8.1f}%")
if f["first_difference"] is not None:
    print("   first difference:", f["first_difference"], f"of {f['recorded_segment_events']} events")
PY
}
for w in ${WORKLOADS:-gpt2 resnet50 transformer streams}; do
  for size in full tiny; do
    for conf in "" "expandable_segments:True"; do
      tag="$w-$size-${conf:+expandable}"
      extra=(); [ "$size" = tiny ] && extra=(tiny)
      stacks=(); [ "$size" = tiny ] && stacks=(--conf stacks:off)
      PYTORCH_CUDA_ALLOC_CONF="$conf" "$GPUSHIM_BIN" run "${stacks[@]}" --trace "$work/$tag.trace" -- \
        python3 scripts/gpu/torch_replay.py "$w" "$steps" "${extra[@]}" 2>"$work/err" | grep '^RESULT' | sed 's/^RESULT //' >"$work/$tag.json" \
        || { tail -5 "$work/err"; continue; }
      row "$w${extra:+-tiny}" "$conf" "$work/$tag.trace" "$(cat "$work/$tag.json")"
      if [ -n "${SAVE_TRACES:-}" ] && [ "$size" = tiny ]; then
        keep_records "$work/$tag.trace" "$SAVE_TRACES/$w${conf:+-expandable}.trace"
      fi
    done
  done
done
echo
printf '%-12s %-44s %14s %14s %14s %8s\n' workload "recommended setting" "run's peak" predicted measured error
for w in ${WORKLOADS:-gpt2 resnet50 transformer streams}; do
  t="$work/$w-full-.trace"
  [ -f "$t" ] || continue
  rec=$("$GPUSHIM_BIN" simulate "$t" --recommend --json 2>/dev/null)
  best=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1])[0]; print(r["recommended"][0]["setting"])' "$rec")
  pred=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1])[0]; print(r["recommended"][0]["peak_reserved_bytes"])' "$rec")
  runs=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1])[0]; print(r["outcomes"][0]["peak_reserved_bytes"])' "$rec")
  meas=$(PYTORCH_CUDA_ALLOC_CONF="$best" python3 scripts/gpu/torch_replay.py "$w" "$steps" 2>/dev/null | grep '^RESULT' | sed 's/^RESULT //' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_reserved"])')
  python3 - "$w" "$best" "$runs" "$pred" "$meas" <<'PY'
import sys
w, b, r, p, m = sys.argv[1:]
r, p, m = int(r), int(p), int(m)
print(f"{w:12} {b or '(defaults)':44} {r:14d} {p:14d} {m:14d} {100 * (p - m) / m:+7.2f}%")
PY
done
}
echo
echo "an out-of-memory a setting avoids (scripts/gpu/torch_oom.py): what gpushim oom advises, then that setting run"
"$GPUSHIM_BIN" run --trace "$work/oom.trace" -- python3 scripts/gpu/torch_oom.py 2>/dev/null | grep '^RESULT' || true
"$GPUSHIM_BIN" oom "$work/oom.trace" | tail -6
advised=$("$GPUSHIM_BIN" oom "$work/oom.trace" | sed -n 's/^  export PYTORCH_CUDA_ALLOC_CONF=//p' | head -1)
echo "run again with PYTORCH_CUDA_ALLOC_CONF=$advised:"
PYTORCH_CUDA_ALLOC_CONF="$advised" python3 scripts/gpu/torch_oom.py 2>/dev/null | grep '^RESULT' || true
[ -z "${SAVE_TRACES:-}" ] || keep_records "$work/oom.trace" "$SAVE_TRACES/oom.trace"
rm -rf "$work"
