#!/usr/bin/env bash
# the hooks' cost per allocation-and-free pair of a recorded run, warm and evicted.
# What the hooks cost per allocation-and-free pair when the program's own work evicts the shim
# between calls, on the simulator (no GPU): a recorded run's cudaMalloc/cudaFree calls, in their
# order and sizes, replayed through the shim by tests/clients/replay_calls.c, once with nothing
# between the calls (warm) and once with THRASH_KB of other memory touched before each call
# (cold). On the GPU, the hooks cost about five times more inside PyTorch than replayed warm
# (docs/gpu-checks.md); the cold replay comes close to what PyTorch sees.
# Recording is on, stacks off, a non-blocking stream exists (blocks freed with cudaFree are
# fenced, as in PyTorch). Three rounds, builds alternated, medians printed.
# GPUSHIM_BENCH_BASE=OLD.so adds the same rows for another build of the shim, in the same run.
# GPUSHIM_BENCH_CONF sets the pool (default: `--per-tensor`'s, pool:caching,medium:20MiB).
# Usage: scripts/bench.sh replay:[TRACE,THRASH_KB]
#   TRACE: a trace of a per-tensor run (KEEP_TRACES=DIR bash scripts/gpu.sh perf keeps them on
#   the GPU machine); without one, a trace of tests/clients/pool_rounds on the simulator.
set -euo pipefail
trace=${1:-}
thrash=${2:-8192}
conf=${GPUSHIM_BENCH_CONF:-pool:caching,medium:20MiB}
cargo build --release --quiet
source scripts/sim-env.sh
export LD_LIBRARY_PATH="$sim"
lib=$PWD/target/release/libgpushim.so
if [ -z "$trace" ]; then
  trace=$sim/rounds.trace
  GPUSHIM_CONF="$conf" GPUSHIM_TRACE="$trace" LD_PRELOAD="$lib" "$sim/pool_rounds" sync 20000 \
    >/dev/null 2>&1
fi
# One line per call: "a SLOT SIZE" or "f SLOT", slots reused as blocks are freed.
target/release/gpushim events "$trace" | python3 -c '
import sys
slots, spare, n = {}, [], 0
for line in sys.stdin:
    f = line.rstrip("\n").split(",")
    if len(f) < 8 or f[3] not in ("cudaMalloc", "cudaFree") or f[5] != "0":
        continue
    if f[2] == "alloc":
        i = spare.pop() if spare else n
        n += i == n
        slots[f[6]] = i
        print("a", i, f[7])
    elif f[2] == "free" and f[6] in slots:
        i = slots.pop(f[6])
        spare.append(i)
        print("f", i)
' > "$sim/ops"
calls=$(wc -l < "$sim/ops")
[ "$calls" -gt 0 ] || { echo "bench-replay: no cudaMalloc/cudaFree in $trace" >&2; exit 1; }
builds=("this:$lib")
if [ -n "${GPUSHIM_BENCH_BASE:-}" ]; then
  cp "$GPUSHIM_BENCH_BASE" "$sim/base.so"
  builds=("base:$sim/base.so" "${builds[@]}")
fi
declare -A all=()
for round in 1 2 3; do
  for b in "${builds[@]}"; do
    for kb in 0 "$thrash"; do
      ns=$(GPUSHIM_CONF="$conf,stacks:off" GPUSHIM_TRACE="$sim/t.trace" LD_PRELOAD="${b#*:}" \
        "$sim/replay_calls" "$sim/ops" "$kb" 1 2>/dev/null)
      rm -f "$sim/t.trace"
      all["${b%%:*}|$kb"]="${all["${b%%:*}|$kb"]:-} $ns"
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "machine: $(nproc) cores, $(date -u +%F); $(basename "$trace"): $calls calls under $conf"
printf "%-6s %16s %22s\n" build "warm ns/pair" "${thrash} KiB between ns/pair"
for b in "${builds[@]}"; do
  n=${b%%:*}
  printf "%-6s %16s %22s\n" "$n" "$(echo "${all["$n|0"]}" | median)" "$(echo "${all["$n|$thrash"]}" | median)"
done
