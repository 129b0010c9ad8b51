#!/usr/bin/env bash
# interposition on real CUDA: C clients, PyTorch in four allocator modes, JAX, CuPy.
# Interposition on real CUDA: the C clients (built against it by scripts/gpu.sh) with and
# without the shim, PyTorch in its four allocator modes, JAX and CuPy under the shim; one table
# (scripts/gpu/check.py).
set -euo pipefail
GPUSHIM_WORK=$GPUSHIM_CLIENTS python3 scripts/gpu/check.py
