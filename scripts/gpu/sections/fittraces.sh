#!/usr/bin/env bash
# traces for studying fit's misses: any model of fit_truth.py at the batches given, near a 20 GiB limit or not.
# On the GPU machine: scripts/gpu/fit_truth.py traced under `gpushim run`, nothing set, 3 steps,
# for each MODEL:BATCH given (MODEL:BATCH:limited: with PyTorch's allocator held to 20 GiB, as
# set_per_process_memory_fraction holds it: what the allocator and cuDNN do when memory is short).
# Each run's TRUTH line is printed; the traces, compressed, are left in $OUT (fit-traces.tar.xz)
# for `gpushim fit` on a machine without a GPU.
#   bash scripts/gpu.sh fittraces[:MODEL:BATCH[:limited],...]
set -euo pipefail
runs=${*:-vit:8 vit:16 vit:32 vit:64 resnet50:16 resnet50:240:limited resnet50:241:limited}
work=$(mktemp -d)
limit=$((20 << 30))
for r in $runs; do
  IFS=: read -r model batch limited <<< "$r"
  name="$model-$batch${limited:+-limited}"
  "$GPUSHIM_BIN" run --trace "$work/$name.trace" -- python3 scripts/gpu/fit_truth.py run "$model" "$batch" 3 \
    ${limited:+$limit} 2>"$work/$name.err" | grep '^TRUTH' | sed "s/^/$name /" \
    || { echo "$name: failed"; tail -3 "$work/$name.err"; }
done
python3 -c "import torch; p = torch.cuda.get_device_properties(0); print('SMs', p.multi_processor_count, 'threads/SM', p.max_threads_per_multi_processor)"
if [ -n "${OUT:-}" ]; then tar -C "$work" -cJf "$OUT/fit-traces.tar.xz" . && ls -la "$OUT"; fi
