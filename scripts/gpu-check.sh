#!/usr/bin/env bash
# The GPU machine's checks of interposition: builds the C clients against the real CUDA,
# runs them with and without the shim, runs PyTorch in its four allocator modes, JAX and CuPy
# under the shim, and prints one table. The machine has no Rust toolchain: build first with
#   cargo build --release -p gpushim -p gpushim-shim && mkdir -p .gpu && cp target/release/{gpushim,libgpushim.so} .gpu/ && strip --strip-debug .gpu/*
# and carry .gpu; with cargo present the script builds them itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .gpu/gpushim ] && [ -f .gpu/libgpushim.so ]; then
  bin=.gpu
elif command -v cargo >/dev/null; then
  cargo build --release --quiet -p gpushim -p gpushim-shim
  bin=target/release
else
  echo "no prebuilt .gpu/ and no cargo: see the top of this script" >&2; exit 2
fi
export GPUSHIM_BIN="$PWD/$bin/gpushim" GPUSHIM_LIB="$PWD/$bin/libgpushim.so"
cudart=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))" 2>/dev/null || true)
[ -f "$cudart/libcudart.so.13" ] || cudart=/usr/local/cuda/lib64
driver=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
[ -n "$driver" ] || driver=$(python3 -c "import ctypes.util; print(ctypes.util.find_library('cuda') or '')")
export GPUSHIM_WORK=${GPUSHIM_WORK:-/tmp/gpushim-gpu-check}
rm -rf "$GPUSHIM_WORK" && mkdir -p "$GPUSHIM_WORK"
ln -sf "$driver" "$GPUSHIM_WORK/libcuda.so"
LIBRARY_PATH="$GPUSHIM_WORK" scripts/build-sim.sh "$GPUSHIM_WORK" --real "$cudart" >/dev/null
export LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); libcudart: $cudart; driver: $driver; $(date -u +%F)"
python3 scripts/gpu/check.py
