#!/usr/bin/env bash
# What the shim needs to know of each PyTorch version to read its allocator trace, found from
# that version's own headers: the vtable slot of CUDAAllocator::attachAllocatorTraceTracker
# (from a pointer to that member, Itanium C++ ABI) and the offsets of TraceEntry's fields. The
# table goes into SLOTS in shim/src/hooks/torch.rs. Needs g++, pip and network access to PyPI;
# downloads each torch wheel (about 800 MB) once and keeps only its headers.
#   scripts/torch-layout.sh [VERSION ...]     (default: 2.4.1 to 2.11.0)
set -euo pipefail
work=${TORCH_LAYOUT_WORK:-/tmp/gpushim-torch-layout}
mkdir -p "$work"
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(2.4.1 2.5.1 2.6.0 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0)
unpack() { # PACKAGE-SPEC DEST
  [ -d "$2" ] && return 0
  local tmp; tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "$1"
  python3 -m zipfile -e "$tmp"/*.whl "$2"
  rm -rf "$tmp"
}
unpack "nvidia-cuda-runtime==13.0.*" "$work/cudart"
unpack "nvidia-cuda-crt==13.0.*" "$work/crt"
cat > "$work/slot.cpp" <<'CPP'
#include <c10/cuda/CUDACachingAllocator.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
using namespace c10::cuda::CUDACachingAllocator;
int main() {
  auto pmf = &CUDAAllocator::attachAllocatorTraceTracker;
  uintptr_t raw[2];
  memcpy(raw, &pmf, sizeof raw);
  printf("slot=%lu action=%zu device=%zu addr=%zu stream=%zu size=%zu\n",
         (unsigned long)((raw[0] - 1) / sizeof(void *)), offsetof(TraceEntry, action_),
         offsetof(TraceEntry, device_), offsetof(TraceEntry, addr_), offsetof(TraceEntry, stream_),
         offsetof(TraceEntry, size_));
}
CPP
for v in "${versions[@]}"; do
  d="$work/torch-$v"
  if [ ! -d "$d/torch/include" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" "torch==$v"
    python3 - "$tmp"/torch-*.whl "$d" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("torch/include/c10/") or n.startswith("torch/include/torch/headeronly/"):
        z.extract(n, sys.argv[2])
PY
    rm -rf "$tmp"
  fi
  g++ -std=c++17 -w -Wno-invalid-offsetof -I"$d/torch/include" -I"$work/cudart/nvidia/cu13/include" \
    -I"$work/crt/nvidia/cu13/include" "$work/slot.cpp" -o "$work/slot-$v"
  printf '%-8s %s\n' "$v" "$("$work/slot-$v")"
done
