#!/usr/bin/env bash
# every tensor of PyTorch's own allocator: leaks named, PyTorch's answers unchanged.
# Every tensor of PyTorch's own caching allocator in the default run, on the GPU machine:
#   leaks    a training loop with the two classic leaks (scripts/gpu/torch_two_leaks.py), run
#            plainly under LD_PRELOAD and under `gpushim run`, nothing set: what `gpushim leaks`
#            names as growing, and the summary's PyTorch line; then a run that drops what it
#            kept at the end, where `leaks` must join the activation to the metric keeping it;
#            and scripts/gpu/torch_kept_graph.py, losses kept with their whole graphs, cleared
#            at the end: every activation's line joined to the loss's
#   same     what PyTorch itself answers (statistics, snapshot, graphs, torch.compile in both
#            modes; scripts/gpu/pluggable_probe.py) without the shim and under `gpushim run`:
#            every answer must be the same
#   layout   PyTorch's expandable segments and its cudaMallocAsync backend: whether tensors are
#            recorded (the first must, the second must say it cannot)
# Step time and device memory against PyTorch alone are scripts/gpu.sh perf's modes default and
# observe. Run through scripts/gpu.sh.
#   bash scripts/gpu.sh tensors[:leaks,same,layout]
set -euo pipefail
sections=${*:-leaks same layout}
work=$(mktemp -d)
growing() { # TRACE: what `gpushim leaks --program-frames` prints of the growth, as it prints it,
  # and the summary's PyTorch line
  "$GPUSHIM_BIN" leaks --program-frames "$1" | grep -E "^iterations|^  grows" | sed 's/^/  /'
  "$GPUSHIM_BIN" summary "$1" | grep -E "^PyTorch|^tensors|^Python frames" | sed 's/^/  /'
}
for s in $sections; do case $s in
leaks)
  echo "== leaks: two leaks of 4 MiB per step (LEAK A, LEAK B in scripts/gpu/torch_two_leaks.py)"
  LD_PRELOAD=$GPUSHIM_LIB GPUSHIM_TRACE="$work/pre.%p.trace" python3 scripts/gpu/torch_two_leaks.py 30
  echo "LD_PRELOAD=libgpushim.so python3 ...:"; growing "$work"/pre.*.trace
  "$GPUSHIM_BIN" run --trace "$work/run.%p.trace" -- python3 scripts/gpu/torch_two_leaks.py 30 >/dev/null 2>&1
  echo "gpushim run -- python3 ...:"; growing "$work"/run.*.trace
  grep -n "LEAK" scripts/gpu/torch_two_leaks.py | sed 's/^/  the leaks are at line /'
  "$GPUSHIM_BIN" run --trace "$work/rel.%p.trace" -- python3 scripts/gpu/torch_two_leaks.py 30 release >/dev/null 2>&1
  echo "gpushim run -- python3 ... 30 release (what was kept dropped at the end):"
  "$GPUSHIM_BIN" leaks --program-frames "$work"/rel.*.trace | grep -E "^  grows|^    kept alive" | sed 's/^/  /'
  "$GPUSHIM_BIN" leaks "$work"/pre.*.trace | grep -c "kept alive" | sed 's/^/  kept-alive joins without the release (must be 0): /' || true
  "$GPUSHIM_BIN" run --trace "$work/graph.%p.trace" -- python3 scripts/gpu/torch_kept_graph.py 30 >/dev/null 2>&1
  echo "gpushim run -- python3 scripts/gpu/torch_kept_graph.py 30 (losses kept with their graphs, then cleared):"
  "$GPUSHIM_BIN" leaks --program-frames "$work"/graph.*.trace | grep -E "^  grows|^    kept alive|^    and with" | sed 's/^/  /'
  grep -n "ACT\|LOSS\|KEPT" scripts/gpu/torch_kept_graph.py | sed 's/^/  line /' ;;
same)
  echo "== same: PyTorch's own answers without the shim and under gpushim run"
  python3 scripts/gpu/pluggable_probe.py 2>/dev/null | grep '^PROBE' | sed 's/^PROBE //' > "$work/alone.json"
  "$GPUSHIM_BIN" run --trace "$work/probe.%p.trace" -- python3 scripts/gpu/pluggable_probe.py 2>/dev/null \
    | grep '^PROBE' | sed 's/^PROBE //' > "$work/shim.json"
  python3 - "$work/alone.json" "$work/shim.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = [k for k in a if a[k] == b.get(k)]
print(f"  {len(same)} of {len(a)} answers the same")
for k in a:
    if a[k] != b.get(k):
        print(f"  DIFFERENT {k}: alone {a[k]!r}, under the shim {b.get(k)!r}")
for k in ("backend", "CUDA graph capture + replay", "torch.compile (default)", "torch.compile reduce-overhead (CUDA graphs)", "memory_snapshot segments"):
    if k in a:
        print(f"  {k}: {a[k]!r}")
PY
  echo "  trace of the probe:"; "$GPUSHIM_BIN" summary "$work"/probe.*.trace | grep -E "^PyTorch|^tensors" | sed 's/^/  /' ;;
layout)
  echo "== layout: other allocator settings of PyTorch"
  for conf in expandable_segments:True backend:cudaMallocAsync; do
    rm -f "$work"/lay.*.trace
    PYTORCH_CUDA_ALLOC_CONF=$conf "$GPUSHIM_BIN" run --trace "$work/lay.%p.trace" -- \
      python3 scripts/gpu/torch_two_leaks.py 12 > "$work/lay.out" 2>&1 || true
    echo "PYTORCH_CUDA_ALLOC_CONF=$conf: $(grep -o 'tensors are not recorded.*' "$work/lay.out" | head -1)"
    growing "$work"/lay.*.trace
  done ;;
*) echo "tensors: unknown section $s (leaks, same, layout)" >&2; exit 2 ;;
esac; done
rm -rf "$work"
