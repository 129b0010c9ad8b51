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
what() { sed -n '2s/^# //p' "$here/$1.sh"; }
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/gpu.sh SECTION[:ARG,...] ..."
  for f in "$here"/*.sh; do n=$(basename "$f" .sh); printf '  %-10s %s\n' "$n" "$(what "$n")"; done
  exit 0
fi
for s in "$@"; do
  [ -f "$here/${s%%:*}.sh" ] || { echo "no section '${s%%:*}': run bash scripts/gpu.sh for the list" >&2; exit 2; }
done
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
rows=()
for s in "$@"; do
  name=${s%%:*}; args=()
  [ "$s" != "$name" ] && IFS=, read -r -a args <<< "${s#*:}"
  echo; echo "=== $name: $(what "$name")"
  start=$SECONDS
  if bash "$here/$name.sh" "${args[@]}"; then result=ok; else result="failed ($?)"; fi
  rows+=("| $name | $(what "$name") | $result | $((SECONDS - start)) |")
done
echo
echo "| section | what it measures | result | seconds |"
echo "|---|---|---|---:|"
printf '%s\n' "${rows[@]}"
