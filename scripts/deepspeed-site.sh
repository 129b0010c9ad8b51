#!/usr/bin/env bash
# DeepSpeed for the GPU machine, which reaches no package registry: its source and the wheels
# it imports, downloaded here and unpacked into .gpu/dssite (carried with .gpu; the GPU
# machine puts it on PYTHONPATH). No DeepSpeed op is built: the checks use PyTorch's AdamW.
# Packages the GPU machine's PyTorch already has (packaging, typing_extensions, tqdm, numpy)
# are left out so that its own are used.
#   bash scripts/deepspeed-site.sh [VERSION]     (default 0.19.8; Python 3.12, x86_64)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-0.19.8}
site=.gpu/dssite
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip download -q --no-deps -d "$work" "deepspeed==$version"
pip download -q -d "$work" --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_12_x86_64 \
  hjson py-cpuinfo einops pydantic msgpack psutil ninja
rm -rf "$site" && mkdir -p "$site"
for w in "$work"/*.whl; do
  case "$(basename "$w")" in
    packaging-*|typing_extensions-*|tqdm-*|numpy-*) continue ;;
  esac
  python3 -m zipfile -e "$w" "$site"
done
tar -xzf "$work/deepspeed-$version.tar.gz" -C "$work"
cp -r "$work/deepspeed-$version/deepspeed" "$site/"
echo "DeepSpeed $version in $site ($(du -sh "$site" | cut -f1))"
