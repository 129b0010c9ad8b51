#!/usr/bin/env bash
# memory by kind on every rank of a DDP or FSDP job against each rank's own figures (parameters, gradients, optimizer state), after the last step and at the peak.
# scripts/gpu/dist_kinds.py (a 6-layer GPT-2, AdamW, 4 x 512 tokens a rank, the last step 6)
# under `gpushim run --trace DIR/MODE.%r.trace`, nothing set, for each MODE (ddp, ddp-view,
# fsdp2, fsdp2-keep, fsdp1, fsdp1-orig, fsdp1-grad-op): on two GPUs or more `torchrun
# --nproc-per-node N` (NCCL), else rank 0 of 2 alone through PyTorch's fake process group
# (every buffer made, no communication), or with DIST_NCCL1=1 one rank of NCCL. Each rank's
# truth (after its last step, and at the moment of the most bytes allocated from PyTorch's own
# record of every allocation; requested bytes) against `gpushim summary --json`'s tensors by kind
# (scripts/gpu/kinds_table.py); then the job's own summary of the ranks side by side. Traces,
# truths and reports are kept in $OUT (dist-traces.tar.gz, dist-reports.txt) where it is set.
# One table.
#   bash scripts/gpu.sh dist[:MODE,...]
set -euo pipefail
modes=${*:-ddp ddp-view fsdp2 fsdp2-keep fsdp1 fsdp1-orig fsdp1-grad-op}
n=$(nvidia-smi -L | wc -l)
if [ -n "${DIST_NCCL1:-}" ]; then
  launch=(torchrun --standalone --nproc-per-node 1); n=1
elif [ "$n" -ge 2 ]; then
  launch=(torchrun --standalone --nproc-per-node "$n")
else
  launch=(env DIST_FAKE=1 RANK=0 WORLD_SIZE=2 python3); n=1
  echo "dist: one GPU: rank 0 of 2 alone through PyTorch's fake process group"
fi
work=$(mktemp -d)
reports=${OUT:-$work}/dist-reports.txt
: >"$reports"
for m in $modes; do
  mkdir -p "$work/$m"
  if DIST_PEAK=1 DIST_TRUTH_DIR="$work" "$GPUSHIM_BIN" run --trace "$work/$m/r.%r.trace" -- \
      "${launch[@]}" scripts/gpu/dist_kinds.py "$m" 4 >"$work/$m.out" 2>"$work/$m.err"; then :; else
    echo "$m: run failed"; tail -8 "$work/$m.err"
  fi
  for r in $(seq 0 $((n - 1))); do
    t="$work/$m/r.$r.trace"
    [ -f "$t" ] && "$GPUSHIM_BIN" summary --json "$t" >"$work/$m.$r.summary" 2>/dev/null || true
  done
  {
    echo "===== $m: summary of the job"
    "$GPUSHIM_BIN" summary "$work/$m"/r.[0-9]*.trace 2>&1 || true
    echo "===== $m: leaks of rank 0"
    "$GPUSHIM_BIN" leaks "$work/$m/r.0.trace" 2>&1 | head -60 || true
  } >>"$reports"
done
python3 scripts/gpu/kinds_table.py "$work" $modes
if [ -n "${OUT:-}" ]; then
  tar -C "$work" -czf "$OUT/dist-traces.tar.gz" .
fi
