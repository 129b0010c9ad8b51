#!/usr/bin/env bash
# what recording stacks costs per allocation: off, Python frames, native, both.
# What recording stacks costs per allocation, on the simulator (no GPU): a Python program
# allocates and frees a 4 KiB block 200,000 times from a stack 30 frames deep, under the shim
# with stacks:off, python, native and on; modes alternate (A B C D, five rounds) and the median
# of each is printed beside stacks:off, measured in the same run.
# Usage: scripts/bench.sh stacks:[PYTHON...]   (default: python3)
set -euo pipefail
source scripts/sim-env.sh
pythons=("$@")
[ ${#pythons[@]} -eq 0 ] && pythons=(python3)
echo "machine: $(nproc) cores, $(date -u +%F); 200,000 rounds of cudaMalloc+cudaFree, 30-frame Python stack"
printf "%-10s %-8s %12s %12s\n" python stacks "ns/round" "vs off"
for py in "${pythons[@]}"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  declare -A all=()
  for round in 1 2 3 4 5; do
    for mode in off python native on; do
      t="$sim/t.$mode.$round.trace"
      ns=$(GPUSHIM_CONF="stacks:$mode" GPUSHIM_TRACE="$t" LD_PRELOAD="$PWD/target/release/libgpushim.so" \
        LD_LIBRARY_PATH="$sim" "$py" tests/clients/py_bench.py "$sim/libcudart.so.13" 200000 30 2>/dev/null)
      all[$mode]="${all[$mode]:-} $ns"
      rm -f "$t"
    done
  done
  median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  base=$(echo "${all[off]}" | median)
  for mode in off python native on; do
    m=$(echo "${all[$mode]}" | median)
    printf "%-10s %-8s %12s %+11dns\n" "$ver" "$mode" "$m" "$((m - base))"
  done
  unset all
done
