#!/usr/bin/env bash
# the pool's host cost per free-and-allocate round on the simulator, recording off and on.
# What the pool costs the host per free-and-allocate round, on the simulator (no GPU): 200,000
# rounds over 64 live blocks of a training-like size mix (tests/clients/pool_rounds.c), through
# the hooks as a program calls them, recording off and on. Modes alternate (five rounds) and
# medians are printed. GPUSHIM_BENCH_BASE=OLD.so adds the same rows for another build of the
# shim, alternated in the same run, so a change is measured beside its baseline.
# Usage: scripts/bench.sh pool
set -euo pipefail
source scripts/sim-env.sh
builds=("this:$PWD/target/release/libgpushim.so")
if [ -n "${GPUSHIM_BENCH_BASE:-}" ]; then
  cp "$GPUSHIM_BENCH_BASE" "$sim/base.so"
  builds=("base:$sim/base.so" "${builds[@]}")
fi
rows=()
for b in "${builds[@]}"; do
  for api in sync async; do
    for conf in "pool:caching" "pool:expandable"; do
      for rec in off on; do rows+=("$b|$api|$conf|$rec"); done
    done
  done
done
declare -A all=()
for round in 1 2 3 4 5; do
  for row in "${rows[@]}"; do
    IFS='|' read -r b api conf rec <<<"$row"
    lib=${b#*:}
    trace=off
    [ "$rec" = on ] && trace="$sim/t.trace"
    ns=$(GPUSHIM_CONF="$conf,stacks:off" GPUSHIM_TRACE="$trace" LD_PRELOAD="$lib" \
      LD_LIBRARY_PATH="$sim" "$sim/pool_rounds" "$api" 200000 2>/dev/null)
    rm -f "$sim"/t.trace
    all[$row]="${all[$row]:-} $ns"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "machine: $(nproc) cores, $(date -u +%F); ns per round (one free + one allocation), median of 5"
printf "%-6s %-6s %-16s %-10s %10s\n" build api pool recording "ns/round"
for row in "${rows[@]}"; do
  IFS='|' read -r b api conf rec <<<"$row"
  printf "%-6s %-6s %-16s %-10s %10s\n" "${b%%:*}" "$api" "$conf" "$rec" "$(echo "${all[$row]}" | median)"
done
