#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, the shim, the real CUDA runtime wheel
# for the no-driver test, then every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo build -p gpushim-shim --quiet
# tests/real_runtime.rs loads the real libcudart.so.13 (PyPI: nvidia-cuda-runtime), no driver.
if [ ! -f .wheels/libcudart.so.13 ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$tmp" "nvidia-cuda-runtime==13.0.*"
  python3 -m zipfile -e "$tmp"/nvidia_cuda_runtime-*.whl "$tmp/x"
  mkdir -p .wheels
  cp "$tmp"/x/nvidia/cu13/lib/libcudart.so.13 .wheels/
  rm -rf "$tmp"
fi
export GPUSHIM_CUDART_DIR="$PWD/.wheels"
if [ -n "${CI:-}" ]; then export GPUSHIM_REQUIRE_CUDART=1; fi
cargo test --workspace
