#!/usr/bin/env bash
# The one entry for the GPU machine: one shared set-up (the shim and the command, CUDA's runtime
# and driver, the C clients built against them), then each section named, then one table of
# what ran. Each section (scripts/gpu/sections/NAME.sh) prints its own figures; its header says
# what it measures. The machine has no Rust toolchain: build here and carry .gpu,
#   cargo build --release -p gpushim -p gpushim-shim
#   mkdir -p .gpu && cp target/release/{gpushim,libgpushim.so} .gpu/ && strip --strip-debug .gpu/*
# (with cargo present, this script builds them itself).
#   bash scripts/gpu.sh                      the sections and what each measures
#   bash scripts/gpu.sh check capture        run these sections
#   bash scripts/gpu.sh tensors:leaks,same   a section with its arguments (comma-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
here=scripts/gpu/sections
source scripts/sections.sh
[ $# -gt 0 ] || { list_sections "$here" scripts/gpu.sh; exit 0; }
check_sections "$here" scripts/gpu.sh "$@"
if ! { [ -x .gpu/gpushim ] && [ -f .gpu/libgpushim.so ]; }; then
  command -v cargo >/dev/null || { echo "no prebuilt .gpu/ and no cargo: see the top of this script" >&2; exit 2; }
  cargo build --release --quiet -p gpushim -p gpushim-shim
  mkdir -p .gpu && cp target/release/{gpushim,libgpushim.so} .gpu/
fi
export GPUSHIM_BIN="$PWD/.gpu/gpushim" GPUSHIM_LIB="$PWD/.gpu/libgpushim.so"
# CUDA's runtime (the PyTorch wheel's, else the toolkit's) and driver.
cudart=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))" 2>/dev/null || true)
[ -f "$cudart/libcudart.so.13" ] || cudart=/usr/local/cuda/lib64
driver=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
[ -n "$driver" ] || driver=$(python3 -c "import ctypes.util; print(ctypes.util.find_library('cuda') or '')")
export GPUSHIM_CUDART="$cudart" GPUSHIM_DRIVER="$driver"
# The C clients of tests/clients, built against real CUDA (GPUSHIM_CLIENTS/NAME).
export GPUSHIM_CLIENTS=${GPUSHIM_CLIENTS:-/tmp/gpushim-clients}
rm -rf "$GPUSHIM_CLIENTS" && mkdir -p "$GPUSHIM_CLIENTS"
ln -sf "$driver" "$GPUSHIM_CLIENTS/libcuda.so"
LIBRARY_PATH="$GPUSHIM_CLIENTS" scripts/build-sim.sh "$GPUSHIM_CLIENTS" --real "$cudart" >/dev/null
export LD_LIBRARY_PATH="$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
torch=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) (x$(nvidia-smi -L | wc -l)); torch $torch; libcudart $cudart; $(date -u +%F)"
run_sections "$here" "$@"
