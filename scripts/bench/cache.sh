#!/usr/bin/env bash
# instructions and cache misses of one pooled allocation and free, the shim evicted between (valgrind).
# What one pooled allocation and one free cost the program's thread when the program's own work
# has evicted the shim from the caches in between (as PyTorch's does on the GPU machine), counted
# rather than timed: instructions, L1 misses (instruction and data) and last-level misses of the
# hooks `serve::alloc` and `serve::free`, inclusive of everything they call (the pool, the trace,
# the Python frames of a 30-frame stack), under valgrind's cache simulator, on the simulator (no
# GPU). tests/clients/py_bench.py writes 2 MiB between calls (the simulated last level is 2 MiB),
# so every line the hooks touch is cold. The program's thread only (`--separate-threads`): the
# trace's grower and the pool's helper run on threads of their own and vary with scheduling.
# Counts repeat to within a few percent from run to run, where timings on this machine spread by
# 30%: a change that removes a cache line from every call shows here.
# Usage: scripts/bench.sh cache:[LIB...]   (default: this tree's release build)
#   each LIB is named by its path; several are measured one after another.
#   N=500 (calls timed after as many warm-up calls), CONF=pool:caching,medium:20MiB,
#   PYTHON=python3.12 (default python3)
# Needs valgrind (callgrind_annotate) and python3. About 3 minutes per library.
set -euo pipefail
command -v valgrind >/dev/null || { echo "bench-cache: needs valgrind (apt install valgrind)" >&2; exit 2; }
libs=("$@")
if [ ${#libs[@]} -eq 0 ]; then
  cargo build --release --quiet -p gpushim-shim
  libs=("$PWD/target/release/libgpushim.so")
fi
n=${N:-500}
conf=${CONF:-pool:caching,medium:20MiB}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash scripts/build-sim.sh "$work/sim" >/dev/null
# The interpreter itself, not a launcher script (pyenv's would run under valgrind too);
# PYTHON=... names another (the frame walk differs by minor version).
py=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')
echo "machine: $(nproc) cores, $(date -u +%F); $("$py" -V); $n calls each after $n warm-up, 30-frame Python stack, $conf"
printf "%-40s %-6s %8s %8s %8s %8s\n" library hook Ir "I1 miss" "D1 miss" "LL miss"
for lib in "${libs[@]}"; do
  out="$work/cg.out"
  GPUSHIM_TRACE="$work/t.%p.trace" GPUSHIM_CONF="$conf" LD_LIBRARY_PATH="$work/sim" LD_PRELOAD="$lib" \
    valgrind --tool=callgrind --separate-threads=yes --cache-sim=yes --LL=2097152,16,64 \
    --callgrind-out-file="$out" "$py" tests/clients/py_bench.py "$work/sim/libcudart.so.13" "$n" 30 2048 \
    >/dev/null 2>"$work/valgrind.log" || { tail -5 "$work/valgrind.log" >&2; exit 1; }
  rm -f "$work"/t.*.trace
  # Thread 1 is the program's; warm-up and timed calls both count (2 N calls of each hook).
  callgrind_annotate --inclusive=yes --threshold=100 "$out-01" 2>/dev/null \
    | grep -E '^ *[0-9,]+ .*gpushim::hooks::serve::(alloc|free) \[' \
    | python3 -c '
import re, sys
lib, calls = sys.argv[1], 2 * int(sys.argv[2])
for line in sys.stdin:
    v = [int(x.replace(",", "")) for x in re.findall(r"([0-9][0-9,]*) \(", line)]
    ir, _, _, i1, d1r, d1w, ill, dlr, dlw = v[:9]
    hook = "alloc" if "serve::alloc" in line else "free"
    print(f"{lib[-40:]:40} {hook:6} {ir / calls:8.0f} {i1 / calls:8.1f} {(d1r + d1w) / calls:8.1f} "
          f"{(ill + dlr + dlw) / calls:8.1f}")
' "$lib" "$n"
  rm -f "$out"*
done
