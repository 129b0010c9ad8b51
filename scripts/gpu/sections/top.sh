#!/usr/bin/env bash
# `top` watching real models as they train: each refresh reads on from the last one.
# Each workload of scripts/gpu/workloads.py (GPT-2, ResNet-50; shapes changing every step) runs
# STEPS steps under `gpushim run` while `gpushim top --interval 250ms` watches its trace, once
# reading on at each refresh (the default) and once reading the whole trace again at each
# (GPUSHIM_TOP_WHOLE=1, as `top` did before), alternated, each beside a run of its own. A row:
# the refreshes shown, the passes over the trace `top` read (as it counts them,
# GPUSHIM_READS=1), the CPU seconds `top` took in all, and whether its last refresh (the
# program exited) shows what a whole read of the finished trace shows (`top --count 1`,
# GPUSHIM_TOP_WHOLE=1): the records read on refresh by refresh, while PyTorch's threads wrote
# them, are those of the finished trace.
# Usage: bash scripts/gpu.sh top[:STEPS]  (default 300)
set -euo pipefail
steps=${1:-300}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf "%-10s %-10s %10s %8s %10s %22s\n" workload top refreshes passes "CPU s" "last = a whole read"
for w in ${TOP_MODELS:-gpt2 resnet50}; do
  for mode in on whole on whole; do
    t=$work/$w.$mode.trace
    rm -f "$t"
    "$GPUSHIM_BIN" run --trace "$t" -- python3 scripts/gpu/workloads.py "$w" default "$steps" \
      >"$work/run.out" 2>&1 &
    runner=$!
    for _ in $(seq 600); do [ -s "$t" ] && break; sleep 0.1; done
    env=(GPUSHIM_READS=1)
    [ "$mode" = whole ] && env+=(GPUSHIM_TOP_WHOLE=1)
    env "${env[@]}" /usr/bin/time -f "%U %S" -o "$work/time" \
      "$GPUSHIM_BIN" top --interval 250ms "$t" >"$work/top.out" 2>"$work/top.err" || true
    wait "$runner" || { echo "$w: the run failed"; tail -5 "$work/run.out"; continue; }
    refreshes=$(grep -c " (pid [0-9]*): " "$work/top.out" || true)
    passes=$(sed -n 's/^gpushim: opened .* read \([0-9]*\) pass(es).*$/\1/p' "$work/top.err")
    cpu=$(awk '{ print $1 + $2 }' "$work/time")
    # The last refresh: the lines after the last blank line.
    awk 'BEGIN { RS = ""; ORS = "\n" } { last = $0 } END { print last }' "$work/top.out" >"$work/last"
    GPUSHIM_TOP_WHOLE=1 "$GPUSHIM_BIN" top --count 1 "$t" >"$work/whole"
    same=no
    cmp -s "$work/last" "$work/whole" && same=yes
    printf "%-10s %-10s %10s %8s %10.2f %22s\n" "$w" "$mode" "$refreshes" "${passes:--}" "$cpu" "$same"
    [ "$same" = yes ] || diff "$work/last" "$work/whole" | head -10
  done
done
echo "(top: on, each refresh reading on from the last; whole, the whole trace at each refresh)"
