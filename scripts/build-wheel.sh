#!/usr/bin/env bash
# Builds the manylinux x86_64 wheel (the `gpushim` command with libgpushim.so inside it, and the
# Python module) into dist/, for machines without a Rust toolchain. maturin and zig (for linking
# against an old glibc, manylinux_2_28) come from PyPI into .venv-wheel.
#   bash scripts/build-wheel.sh            # dist/gpushim-VERSION-py3-none-manylinux_2_28_x86_64.whl
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-wheel
if [ ! -x $venv/bin/maturin ]; then
  python3 -m venv $venv
  $venv/bin/pip install -q --disable-pip-version-check "maturin>=1.5,<2" "ziglang<0.14"
fi
rm -rf dist
PATH="$PWD/$venv/bin:$PATH" $venv/bin/maturin build --release --zig \
  --compatibility manylinux_2_28 --out dist
ls -l dist/*.whl
