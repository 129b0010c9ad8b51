#!/usr/bin/env bash
# what one tensor event costs the tracker on the stand-in: time per mode, instructions by part.
# What one tensor event (an allocation or a free of PyTorch's caching allocator) costs under the
# shim, on the stand-in for PyTorch's allocator (tests/standin/c10_cuda.cpp; no GPU): a loop of
# allocation + free 20 Python frames deep (tests/clients/py_tensor_bench.py), each block timed
# beside a block of the same calls that allocate nothing. Modes alternate (A B C, five rounds):
# tensors off (the baseline), tensors without Python frames, the default run; the median of each
# is printed beside the baseline. Then, where valgrind is installed, the instructions per
# allocation+free of the tracker's parts (callgrind, steady state: a run of 6,000 pairs less a
# run of 2,000), which repeat exactly where timings on a shared machine spread by 30%.
# Usage: scripts/bench.sh tensors[:PYTHON]   (default: python3)
set -euo pipefail
source scripts/sim-env.sh
py=$("${1:-python3}" -c 'import sys; print(sys.executable)')
lib="$sim/torch/lib/libc10_cuda.so"
run() { # CONF PAIRS BLOCKS [PREFIX...]: the shim under CONF, the bench's output
  local conf=$1 pairs=$2 blocks=$3
  shift 3
  GPUSHIM_CONF="$conf" GPUSHIM_TRACE="$sim/t.%p.trace" LD_PRELOAD="$PWD/target/release/libgpushim.so" \
    LD_LIBRARY_PATH="$sim" "$@" "$py" tests/clients/py_tensor_bench.py "$lib" 20 "$pairs" "$blocks" 2>/dev/null
  rm -f "$sim"/t.*.trace
}
echo "machine: $(nproc) cores, $(date -u +%F); $("$py" --version); stand-in allocator, 20 Python frames"
declare -A all=()
modes=("tensors:off" "stacks:off" "default")
conf_of() { [ "$1" = default ] || echo "$1"; }
for round in 1 2 3 4 5; do
  for mode in "${modes[@]}"; do
    all[$mode]="${all[$mode]:-} $(run "$(conf_of "$mode")" 50000 9)"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
base=$(echo "${all[tensors:off]}" | median)
printf "%-28s %12s %12s\n" mode "ns/event" "vs off"
for mode in "${modes[@]}"; do
  m=$(echo "${all[$mode]}" | median)
  printf "%-28s %12s %+11.1fns\n" "$mode" "$m" "$(python3 -c "print($m - $base)")"
done
command -v valgrind >/dev/null || { echo "(valgrind not installed: no instruction counts)"; exit 0; }
for n in 2000 6000; do
  run "" "$n" 1 valgrind --tool=callgrind --callgrind-out-file="$sim/cg.$n" \
    --toggle-collect='*hooks*torch*invoke*' >/dev/null
done
for n in 2000 6000; do callgrind_annotate --inclusive=yes "$sim/cg.$n" >"$sim/cg.$n.txt" 2>/dev/null; done
printf "%-28s %12s\n" "part (default run)" "instr/pair"
for part in hooks::torch::invoke trace::record stacks::maybe_record python::walk Recorder::append __tls_get_addr; do
  count() { awk -v p="$part" 'index($0, p) && /\[/ {gsub(",", "", $1); print $1; exit}' "$1"; }
  a=$(count "$sim/cg.2000.txt") b=$(count "$sim/cg.6000.txt")
  [ -n "$a" ] && [ -n "$b" ] && printf "%-28s %12d\n" "$part" $(( (b - a) / 4800 ))
done
