#!/usr/bin/env bash
# the pool: alloc+free cost beside CUDA's, safe reuse under GPU work, a transformer in 7 modes.
# The pool on the GPU machine, one table:
#  1. alloc+free pair cost, single thread, recording on: the pool beside cudaMalloc+cudaFree and
#     cudaMallocAsync+cudaFreeAsync measured in the same run;
#  2. safe reuse: kernels still reading freed buffers while another stream overwrites the next
#     allocation, for sync and async frees, plus the unsafe control that must fail;
#  3. a PyTorch transformer with varying sequence lengths in 7 allocator modes: step time and
#     peak memory.
set -euo pipefail
lib="$GPUSHIM_LIB" cmd="$GPUSHIM_BIN"
work=${GPUSHIM_WORK:-/tmp/gpushim-pool}
rm -rf "$work" && mkdir -p "$work"
nvcc -O2 -cudart shared -o "$work/pool_bench" scripts/gpu/pool_bench.cu
nvcc -O2 -cudart shared -o "$work/reuse" scripts/gpu/reuse.cu
shim() { LD_PRELOAD="$lib" GPUSHIM_TRACE="$work/$1.trace" GPUSHIM_CONF="$2" "${@:3}"; }

echo
echo "== 1. alloc+free pair, 1 MiB, single thread, median of 20000 (µs; clock read included)"
base=$("$work/pool_bench")
off=$(shim bench-off pool:off "$work/pool_bench" 2>/dev/null)
pooled=$(shim bench-pool pool:caching "$work/pool_bench" 2>/dev/null)
get() { echo "$1" | awk -v k="$2" '$1==k{print $2}'; }
printf "%-44s %12s %12s\n" "" "sync pair" "async pair"
printf "%-44s %12s %12s\n" "CUDA (no shim)" "$(get "$base" sync_pair_us)" "$(get "$base" async_pair_us)"
printf "%-44s %12s %12s\n" "shim pool:off (pass-through, recording)" "$(get "$off" sync_pair_us)" "$(get "$off" async_pair_us)"
printf "%-44s %12s %12s\n" "shim pool:caching (recording)" "$(get "$pooled" sync_pair_us)" "$(get "$pooled" async_pair_us)"
echo "clock read: $(get "$base" clock_us) µs"

echo
echo "== 2. safe reuse: reader kernel on s1 still running when its buffer is freed; s2 overwrites the next allocation"
for m in sync async; do
  echo "no shim:           $("$work/reuse" $m 3000)"
  echo "shim pool:caching: $(shim reuse-$m pool:caching "$work/reuse" $m 3000 2>/dev/null)"
done
echo "control (program reuses without waiting): $("$work/reuse" unsafe 3000 || true)"

echo
echo "== 2b. the same under pool:expandable"
for m in sync async; do
  echo "shim pool:expandable: $(shim reuse-exp-$m pool:expandable "$work/reuse" $m 3000 2>/dev/null)"
done
expa=$(shim bench-exp pool:expandable "$work/pool_bench" 2>/dev/null)
echo "pair, pool:expandable: sync $(get "$expa" sync_pair_us) µs, async $(get "$expa" async_pair_us) µs"

echo
echo "== 3. PyTorch transformer, varying sequence length, 40 steps (median of 35)"
run_torch() {  # label, env..., -- , mode
  local label=$1; shift
  local out
  out=$("$@" 2>"$work/$label.err" | grep '^RESULT ' | sed 's/^RESULT //') || true
  [ -n "$out" ] || { echo "$label: failed"; tail -5 "$work/$label.err"; return; }
  echo "$label $out" >> "$work/results"
}
: > "$work/results"
run_torch torch-default python3 scripts/gpu/train_bench.py default
run_torch torch-expandable python3 scripts/gpu/train_bench.py expandable
run_torch torch-async python3 scripts/gpu/train_bench.py async
run_torch torch-nocache python3 scripts/gpu/train_bench.py nocache
run_torch shim-nocache env LD_PRELOAD="$lib" GPUSHIM_TRACE="$work/shim-nocache.trace" python3 scripts/gpu/train_bench.py nocache
run_torch shim-async env LD_PRELOAD="$lib" GPUSHIM_TRACE="$work/shim-async.trace" python3 scripts/gpu/train_bench.py async
run_torch shim-pluggable env LD_PRELOAD="$lib" GPUSHIM_LIB="$lib" GPUSHIM_TRACE="$work/shim-pluggable.trace" python3 scripts/gpu/train_bench.py pluggable
run_torch shim-nocache-expandable env LD_PRELOAD="$lib" GPUSHIM_CONF=pool:expandable GPUSHIM_TRACE="$work/shim-nocache-expandable.trace" python3 scripts/gpu/train_bench.py nocache
run_torch shim-pluggable-expandable env LD_PRELOAD="$lib" GPUSHIM_LIB="$lib" GPUSHIM_CONF=pool:expandable GPUSHIM_TRACE="$work/shim-pluggable-expandable.trace" python3 scripts/gpu/train_bench.py pluggable
python3 - "$work" "$cmd" <<'PY'
import csv, io, json, subprocess, sys
work, cmd = sys.argv[1], sys.argv[2]
rows = [l.split(" ", 1) for l in open(f"{work}/results")]
res = {k: json.loads(v) for k, v in rows}
MiB = 1 << 20
def shim_trace(label):
    """The shim's reserved peak and the device's real used peak (the real cudaMemGetInfo
    answers recorded in the trace, sampled by the script after each step)."""
    t = f"{work}/{label}.trace"
    out = subprocess.run([cmd, "simulate", t, "--json"], capture_output=True, text=True, check=True).stdout
    reserved = json.loads(out)[0]["peak_reserved_bytes"]
    ev = subprocess.run([cmd, "events", t], capture_output=True, text=True, check=True).stdout
    used = 0
    for r in csv.DictReader(io.StringIO(ev)):
        if r["kind"] == "mem_info" and r["status"] == "0":
            used = max(used, int(r["size"]) - int(r["ptr"], 0))
    return reserved, used
base = res.get("torch-default", {}).get("step_ms")
print(f"{'mode':<28} {'step ms':>8} {'x default':>9} {'allocator peak reserved':>24} {'device used peak MiB':>21} {'loss last':>10}")
for label, r in res.items():
    reserved, used, src = r.get("torch_peak_reserved"), r["mem_get_info_peak_used"], "torch"
    if label.startswith("shim-"):
        (reserved, used), src = shim_trace(label), "shim"
    rs = f"{reserved / MiB:.0f} MiB ({src})" if reserved else "n/a"
    ratio = f"{r['step_ms'] / base:.3f}" if base else "-"
    print(f"{label:<28} {r['step_ms']:>8.2f} {ratio:>9} {rs:>24} {used / MiB:>21.0f} {r['loss_last']:>10.5f}")
print("device used = total - free from cudaMemGetInfo after each step (real figures; under the shim, the ones it recorded before showing idle cache as free)")
PY
