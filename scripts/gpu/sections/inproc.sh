#!/usr/bin/env bash
# per-tensor steps against PyTorch's own cache, within one process, seconds apart.
# The GPU machine, measured within one process: per-tensor steps against PyTorch's
# own cache, seconds apart. Each run is one process under the shim's per-tensor pool
# (`pool:caching,medium:20MiB,trim:1s`, what `gpushim run --per-tensor` sets, trim named since
# PYTORCH_NO_CUDA_MEMORY_CACHING is not set) that switches PyTorch's cache off and on with
# torch.cuda.memory.caching_allocator_enable, a cycle of 6 shapes at a time, in the order off,
# on, on, off, off, on, ... (scripts/gpu/workloads.py, MODE toggle). Neighbouring cycles give
# one ratio each: per-tensor step time over cached step time, on the same shapes, which cancels
# the drift between processes that made scripts/gpu.sh perf's rounds spread by 15-40%. "ratio"
# is the median of those; "by shape" sums each shape's median step in each mode, which a step
# that stalls (a cycle's sum carries it whole) does not move.
# With the cache on, the shim sees only PyTorch's segments (none after the first cycle), so the
# "on" cycles are PyTorch's default allocator plus the shim's idle hooks; section perf's
# cross-process figure is the one against PyTorch without the shim.
# ALT_LIB names a second build: runs then alternate between the two builds (A B A B), and each
# build's ratios are shown on their own line.
#   bash scripts/gpu.sh inproc[:WORKLOADS,ROUNDS,STEPS]
#     WORKLOADS  space-separated, default "transformer gpt2 resnet50"
#     ROUNDS     processes per workload and build (default 2)
#     STEPS      timed steps per process, half per-tensor, half cached (default 72: 6 pairs)
#   BUDGET_S=500 ...   start no process that would end past this many seconds
#   WORKLOAD_SCALE=4 ...   batches 4 times larger: bound by the GPU, so what remains of the
#                          ratio is the pool's cost on the GPU's side (placement, fences)
#   TOGGLE_NULL=1 ...   PyTorch's cache stays on in both halves: the ratios then show how
#                       far from 1.000 the method lands on its own ("toggled" reads yes when
#                       both halves were cached)
#   INPROC=swap ...     the pluggable allocator (the shim's gpushim_alloc over
#                       `pool:expandable`, as section perf's mode pluggable) against PyTorch's
#                       caching allocator instead: both live in the process and the one
#                       PyTorch uses is swapped between cycles (scripts/gpu/modes.py,
#                       swap_allocators); ratio = pluggable step / cached step
#   EXTRA_CONF=stacks:off ...   added to the shim's configuration of either kind
#   KEEP_GC=1 ...       Python's cycle collector as it is (by default it is frozen after the
#                       warm-up and run between cycles, outside the timed steps; the pairs'
#                       ranges did not narrow with that: their outliers come
#                       from elsewhere)
# Run through scripts/gpu.sh.
set -euo pipefail
workloads=${1:-transformer gpt2 resnet50}
rounds=${2:-2}
steps=${3:-72}
kind=${INPROC:-toggle}
case $kind in
  toggle) conf="pool:caching,medium:20MiB,trim:1s" ;;
  swap) conf="pool:expandable" ;;
  *) echo "inproc: INPROC=$kind: toggle (per-tensor, the default) or swap (pluggable)" >&2; exit 2 ;;
esac
conf="$conf${EXTRA_CONF:+,$EXTRA_CONF}"
work=$(mktemp -d)
out="$work/results.jsonl"
echo "$kind, shim configuration $conf"
builds="a"
[ -n "${ALT_LIB:-}" ] && builds="a b"
began=$SECONDS longest=0
for w in $workloads; do
  for r in $(seq "$rounds"); do
    for b in $builds; do
      if [ -n "${BUDGET_S:-}" ] && [ $((SECONDS - began + longest)) -gt "$BUDGET_S" ]; then
        echo "inproc: skipped $w round $r build $b (BUDGET_S=$BUDGET_S)" >&2
        continue
      fi
      lib="$GPUSHIM_LIB"
      [ "$b" = b ] && lib="$ALT_LIB"
      t0=$SECONDS
      GPUSHIM_LIB="$lib" "$GPUSHIM_BIN" run --lib "$lib" --conf "$conf" \
        --trace "$work/$w.$b.%p.trace" -- python3 scripts/gpu/workloads.py "$w" "$kind" "$steps" \
        2>/dev/null | { grep '^RESULT' || true; } | sed "s/^RESULT {/{\"build\": \"$b\", \"round\": $r, /" \
        | tee -a "$out" | sed "s/^/$w round $r build $b: /" >&2
      [ $((SECONDS - t0)) -gt "$longest" ] && longest=$((SECONDS - t0))
      # Keep the last trace of each workload and build for the pool's lines below.
      ls -t "$work"/"$w.$b".*.trace 2>/dev/null | tail -n +2 | xargs -r rm -f
    done
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not rows:
    sys.exit("inproc: no results (see the runs' output with 2>/dev/null removed)")
print(f"{'workload':12} {'build':5} {'runs':>4} {'pairs':>5} {'shim ms':>13} {'cached ms':>9} "
      f"{'ratio':>6} {'pair range':>12} {'by shape':>8} {'host ms off/on':>15} {'NVML MiB':>9} toggled")
seen = []
for r in rows:
    key = (r["workload"], r["build"])
    if key not in seen:
        seen.append(key)
for w, b in seen:
    rs = [r for r in rows if (r["workload"], r["build"]) == (w, b)]
    # Each run's median pair ratio, then the median over runs; range over every run's pairs.
    ratio = statistics.median(r["ratio"] for r in rs)
    lo, hi = min(r["ratio_min"] for r in rs), max(r["ratio_max"] for r in rs)
    off = statistics.median(r["off_ms"] for r in rs)
    on = statistics.median(r["on_ms"] for r in rs)
    hoff = statistics.median(r["off_host_ms"] for r in rs)
    hon = statistics.median(r["on_host_ms"] for r in rs)
    peak = max(r["nvml_peak"] for r in rs) / 2**20
    ok = all(r["toggle_ok"] for r in rs)
    shapes = statistics.median(r["ratio_shapes"] for r in rs)
    print(f"{w:12} {b:5} {len(rs):4} {sum(r['pairs'] for r in rs):5} {off:13.2f} {on:9.2f} "
          f"{ratio:6.3f} {lo:5.3f}-{hi:5.3f} {shapes:8.3f} {hoff:7.2f}/{hon:7.2f} {peak:9.0f} "
          f"{'yes' if ok else 'NO'}")
    print(f"{'':12} {'':5} each run's ratio: " + " ".join(f"{r['ratio']:.3f}" for r in rs)
          + "; by shape: " + " ".join(f"{r['ratio_shapes']:.3f}" for r in rs))
PY
for t in "$work"/*.trace; do
  [ -e "$t" ] || continue
  echo "$(basename "$t" | cut -d. -f1,2): $("$GPUSHIM_BIN" summary "$t" 2>/dev/null | grep -E '^pool' | tr '\n' ' ')"
done
rm -rf "$work"
