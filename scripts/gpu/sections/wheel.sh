#!/usr/bin/env bash
# the prebuilt wheel installed with no Rust toolchain, then the main job from it.
# On the GPU machine: the prebuilt wheel (dist/, from scripts/build-wheel.sh, carried)
# installed into the machine's Python with no Rust toolchain there, then the main job from it:
# `gpushim run -- python scripts/gpu/train_bench.py`, `gpushim summary`, and the Python module
# (torch_allocator before and after the first allocation, records). Prints what it saw.
set -euo pipefail
whl=$(ls dist/gpushim-*.whl | head -1)
site=/tmp/gpushim-site
rm -rf $site
python3 -m pip install -q --no-index --no-deps --target $site "$whl"
export PYTHONPATH=$site PATH=$site/bin:$PATH
work=$(mktemp -d)
echo "wheel: $(basename "$whl")"
gpushim --version
echo "== gpushim run -- python3 scripts/gpu/train_bench.py default 20"
gpushim run --trace "$work/bench.%p.trace" -- python3 scripts/gpu/train_bench.py default 20 | grep RESULT
gpushim summary "$work"/bench.*.trace | head -12
echo "== python -m gpushim run with gpushim.torch_allocator()"
cat > "$work/plug.py" <<'PY'
import gpushim, torch
gpushim.torch_allocator()
x = torch.randn(4096, 4096, device="cuda")
y = (x @ x).sum().item()
print("pluggable: ok, result finite:", y == y)
PY
python3 -m gpushim run --trace "$work/plug.%p.trace" -- python3 "$work/plug.py"
python3 - "$work" <<'PY'
import glob, sys, gpushim
t = glob.glob(sys.argv[1] + "/plug.*.trace")[0]
recs = list(gpushim.records(t))
plug = [r for r in recs if r["api"] == "torch_pluggable" and r["kind"] == "alloc_async"]
print("records:", len(recs), "pluggable allocations:", len(plug))
PY
echo "== torch_allocator after the first allocation"
python3 - <<'PY'
import torch, gpushim
torch.ones(1, device="cuda")
try:
    gpushim.torch_allocator()
    print("refused: NO")
except RuntimeError as e:
    print("refused:", str(e)[:80])
PY
