#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, the shim, the real CUDA runtime wheel
# for the no-driver test, every test, then the Python package installed with pip and checked.
set -euo pipefail
cd "$(dirname "$0")/.."
# One clean build: incremental state would only take disk (CI machines have little).
export CARGO_INCREMENTAL=0
# A C++ compiler builds the stand-in for PyTorch's allocator library (tests/standin).
if ! command -v "${CXX:-c++}" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq g++ >/dev/null
  else
    echo "scripts/test.sh needs a C++ compiler (g++): install it, or set CXX" >&2
    exit 2
  fi
fi
say() { echo "== scripts/test.sh: $*" >&2; }
say "formatting (cargo fmt --check)"
cargo fmt --all -- --check
say "lints (cargo clippy; the first build of the dependencies takes a few minutes)"
cargo clippy --workspace --all-targets --quiet -- -D warnings
say "building the shim"
cargo build -p gpushim-shim --quiet
# Two wheels from PyPI, no GPU needed: the real libcudart.so.13 (tests/real_runtime.rs loads it
# with no driver) and the NVTX v3 headers (tests/nvtx.rs builds a client with them).
fetch() { # PACKAGE SPEC DEST: unpack the wheel of SPEC into .wheels/DEST
  [ -d ".wheels/$3" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download --no-deps --quiet --disable-pip-version-check -d "$tmp" "$2"
  python3 -m zipfile -e "$tmp"/"$1"-*.whl ".wheels/$3"
  rm -rf "$tmp"
}
say "fetching the CUDA runtime and NVTX wheels from PyPI (once, into .wheels)"
fetch nvidia_cuda_runtime "nvidia-cuda-runtime==13.0.*" cudart
fetch nvidia_nvtx "nvidia-nvtx==13.*" nvtx
export GPUSHIM_CUDART_DIR="$PWD/.wheels/cudart/nvidia/cu13/lib"
export GPUSHIM_NVTX_INCLUDE="$PWD/.wheels/nvtx/nvidia/cu13/include"
if [ -n "${CI:-}" ]; then export GPUSHIM_REQUIRE_WHEELS=1; fi
# A real browser for the page (tests/page.rs opens it in headless Chromium with the network
# off): Debian's chromium and Playwright for Python, which drives it. CI installs them and
# requires them; elsewhere the test says it skipped the browser part when they are missing.
if [ -n "${CI:-}" ]; then
  if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian's chromium for the page's browser test"
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  fi
  if ! python3 -c "import playwright.sync_api" 2>/dev/null; then
    say "installing Playwright for Python (drives the browser)"
    python3 -m pip install --quiet --disable-pip-version-check playwright
  fi
  export GPUSHIM_REQUIRE_BROWSER=1
fi
say "every test (cargo test --workspace)"
# Parts a test had to skip here (no browser, one user, ...) are listed at the end, not hidden in
# cargo's captured output.
skips=target/tmp/skipped.txt
mkdir -p target/tmp && rm -f "$skips"
cargo test --workspace
# The Python package as a user installs it: pip install . into a fresh environment (maturin
# builds the command with the shim inside), then the command and the module from there, on the
# simulator (tests/python/check_package.py prints its own closing line).
# Its own environment: the README's `.venv` is the user's, never removed here.
say "the Python package: pip install . into a fresh environment (builds the command, a few minutes)"
rm -rf .venv-check && python3 -m venv .venv-check
.venv-check/bin/pip install -q --disable-pip-version-check .
pkg=$(mktemp -d)
scripts/build-sim.sh "$pkg/sim" >/dev/null
.venv-check/bin/python tests/python/check_package.py "$pkg/sim" "$pkg"
rm -rf "$pkg"
if [ -s "$skips" ]; then
  say "skipped in this run (what was not tested here, and why):"
  sort -u "$skips" | sed 's/^/  /' >&2
else
  say "nothing was skipped"
fi
