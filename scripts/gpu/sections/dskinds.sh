#!/usr/bin/env bash
# memory by kind on a rank of a DeepSpeed ZeRO-1, 2 and 3 job against the rank's own figures (parameters, gradients, optimizer state with its fp32 master weights, DeepSpeed's gradient buckets).
# scripts/gpu/ds_kinds.py (a 6-layer GPT-2, PyTorch's AdamW as DeepSpeed's client optimizer,
# 4 x 512 tokens a rank, bf16 and fp32, DeepSpeed's defaults otherwise) under `gpushim run`,
# nothing set, for each MODE (zero1, zero2, zero3; zero0: no ZeRO, DeepSpeed's FP16_Optimizer;
# zero1-acc32: its BF16_Optimizer) and precision (DS_DTYPES, bf16 fp32): on two GPUs or more
# `torchrun --nproc-per-node N`, else rank 0 of 2 alone through PyTorch's fake process group
# (every buffer made, no communication). DeepSpeed is imported from .gpu/dssite (made here by
# scripts/deepspeed-site.sh and carried: the machine reaches no registry). Each rank's truth
# (after its last step, the last step at 6, and at the moment of the most bytes allocated, in
# requested bytes) against `gpushim summary --json`'s tensors by kind (scripts/gpu/kinds_table.py);
# then the frameworks named and the kinds at the peak. One table.
#   bash scripts/gpu.sh dskinds[:MODE,...]
set -euo pipefail
modes=${*:-zero1 zero2 zero3}
dtypes=${DS_DTYPES:-bf16 fp32}
[ -d .gpu/dssite/deepspeed ] || { echo "dskinds: no .gpu/dssite (bash scripts/deepspeed-site.sh here, then carry .gpu)"; exit 0; }
export PYTHONPATH="$PWD/.gpu/dssite${PYTHONPATH:+:$PYTHONPATH}" DS_BUILD_OPS=0
n=$(nvidia-smi -L | wc -l)
work=$(mktemp -d)
reports=${OUT:-$work}/dskinds-reports.txt
: >"$reports"
[ "$n" -ge 2 ] || echo "dskinds: $n GPU: rank 0 of 2 alone through PyTorch's fake process group"
for m in $modes; do
  for dtype in $dtypes; do
    name="$m.$dtype"
    mkdir -p "$work/$name"
    if [ "$n" -ge 2 ]; then
      launch=(torchrun --standalone --nproc-per-node "$n")
    else
      launch=(env DIST_FAKE=1 RANK=0 WORLD_SIZE=2 python3)
    fi
    if ! DIST_PEAK=1 DS_DTYPE=$dtype DIST_TRUTH_DIR="$work" DIST_TRUTH_NAME="$name" "$GPUSHIM_BIN" run \
        --trace "$work/$name/r.%r.trace" -- "${launch[@]}" scripts/gpu/ds_kinds.py "$m" 4 \
        >"$work/$name.out" 2>"$work/$name.err"; then
      echo "$name: run failed"; tail -8 "$work/$name.err"
    fi
    for t in "$work/$name"/r.*.trace; do
      [ -f "$t" ] || continue
      r=${t##*/r.}; r=${r%.trace}
      "$GPUSHIM_BIN" summary --json "$t" >"$work/$name.$r.summary" 2>/dev/null || true
      { echo "===== $name rank $r"; "$GPUSHIM_BIN" summary "$t" 2>&1 | grep -E "from the frames|by kind|at their most" || true; } >>"$reports"
    done
  done
done
names=()
for m in $modes; do for dtype in $dtypes; do names+=("$m.$dtype"); done; done
python3 scripts/gpu/kinds_table.py "$work" "${names[@]}"
cat "$reports"
if [ -n "${OUT:-}" ]; then
  tar -C "$work" -czf "$OUT/dskinds-traces.tar.gz" .
fi
