#!/usr/bin/env bash
# The main job: builds gpushim, runs the bundled training-loop example under the shim (on the
# real GPU when one is present, on the CUDA simulator otherwise), and prints `gpushim summary`.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
if command -v gpushim >/dev/null 2>&1 && [ -z "${GPUSHIM_DEMO_BUILD:-}" ]; then
  # Installed with pip: the command carries the shim (GPUSHIM_DEMO_BUILD=1 builds instead).
  bin=$(command -v gpushim)
  lib=$("$bin" lib)
  echo "== the installed gpushim: $bin"
else
  echo "== building gpushim (the first build takes a few minutes)"
  cargo build --release -p gpushim -p gpushim-shim 2>&1 | grep -E "^(error|warning|   Compiling gpushim)" || true
  [ -x target/release/gpushim ] && [ -f target/release/libgpushim.so ] || { echo "the build failed: run cargo build --release -p gpushim -p gpushim-shim to see why" >&2; exit 1; }
  bin=target/release/gpushim
  lib=target/release/libgpushim.so
fi
work=target/demo
rm -rf "$work" && mkdir -p "$work"
cudart=""
if nvidia-smi -L >/dev/null 2>&1; then
  cudart=$(python3 - <<'PY' 2>/dev/null || true
import glob, os, sys
for base in sys.path + ["/usr/local/cuda/lib64"]:
    for p in glob.glob(os.path.join(base, "nvidia", "cu13", "lib", "libcudart.so.13")) + glob.glob(os.path.join(base, "libcudart.so.13")):
        print(os.path.dirname(p)); sys.exit(0)
PY
)
fi
if [ -n "$cudart" ]; then
  echo "== real GPU: $(nvidia-smi -L | head -1); libcudart from $cudart"
  scripts/build-sim.sh "$work" --real "$cudart" >/dev/null
  export LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "== no GPU: running on the CUDA simulator (tests/sim)"
  scripts/build-sim.sh "$work" >/dev/null
  export LD_LIBRARY_PATH="$PWD/$work${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# A plain CUDA program has no cache of its own: the pool serves it.
"$bin" run --conf pool:caching,stacks:on --lib "$lib" --trace "$work/train_loop.%p.trace" -- "$work/train_loop" "$steps"
echo
"$bin" summary "$work"/train_loop.*.trace
echo
"$bin" leaks "$work"/train_loop.*.trace
# A PyTorch-style training loop with two leaks, on the stand-ins for PyTorch's caching allocator
# and modules (tests/standin, tests/clients/kinds/torch: PyTorch's interface, the simulator's memory): the default run, nothing set.
if [ -z "$cudart" ] && [ -f "$work/torch/lib/libc10_cuda.so" ]; then
  echo
  echo "== a PyTorch-style loop with two leaks (tests/clients/kinds/leaks.py), default run"
  "$bin" run --lib "$lib" --trace "$work/leaks.%p.trace" -- \
    python3 tests/clients/kinds/leaks.py "$work/torch/lib/libtorch_cpu.so" "$work/torch/lib/libc10_cuda.so"
  "$bin" leaks "$work"/leaks.*.trace
fi
