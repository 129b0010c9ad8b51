#!/usr/bin/env bash
# the OOM post-mortem's settings against real runs: each predicted to serve or not, checked by running it.
# On the GPU machine: scripts/gpu/torch_pin_oom.py (fragmentation: every freed segment pinned by a
# small tensor) under `gpushim run` with nothing set, once held by a memory fraction (3 GiB),
# once by a device filled but for 3 GiB, and under the fraction beside a torch.cuda.MemPool and
# beside a CUDA graph's pool that each keep 1 GiB the default pools cannot use; then `gpushim oom` (the limit it found) and
# `gpushim simulate --torch S` for each setting S, the prediction being whether the replay
# serves every request; then the program run for real under each S up to the step the traced
# run failed at. One table: per mode and setting, predicted and real. The run's own setting
# must fail where the run failed.
#   bash scripts/gpu.sh oomfix                  every mode
#   bash scripts/gpu.sh oomfix:mempool,graph    these modes
set -euo pipefail
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(fraction device mempool graph)
work=$(mktemp -d)
settings=("" "expandable_segments:True" "max_split_size_mb:256" "garbage_collection_threshold:0.6,max_split_size_mb:64")
for mode in "${modes[@]}"; do
  "$GPUSHIM_BIN" run --trace "$work/$mode.trace" -- python3 scripts/gpu/torch_pin_oom.py "$mode" \
    > "$work/$mode.out" 2>"$work/$mode.err" || { echo "$mode: traced run failed"; tail -3 "$work/$mode.err"; continue; }
  step=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().split('RESULT ',1)[1])['failed_step'])" "$work/$mode.out")
  echo "== $mode: the traced run failed at step $step; $("$GPUSHIM_BIN" events "$work/$mode.trace" | grep -c ",tensor_pool," || true) tensor_pool records; gpushim oom says:"
  "$GPUSHIM_BIN" oom "$work/$mode.trace" | grep -E "failed allocation|replayed up to|private pools|fails there too|does not fail there|serve it|none of them" | cut -c1-220
  args=()
  for s in "${settings[@]}"; do args+=(--torch "$s"); done
  "$GPUSHIM_BIN" simulate "$work/$mode.trace" "${args[@]}" --json > "$work/$mode.sim.json"
  for s in "${settings[@]}"; do
    PYTORCH_CUDA_ALLOC_CONF=$s python3 scripts/gpu/torch_pin_oom.py "$mode" $((step + 1)) 2>/dev/null \
      | grep '^RESULT' | sed "s/^RESULT /{\"setting\": \"$s\", \"r\": /; s/\$/}/" >> "$work/$mode.truth"
  done
done
python3 - "$work" "${modes[@]}" <<'PY'
import json, os, sys
work = sys.argv[1]
print(f"{'mode':9} {'setting':55} {'predicted':>10} {'real':>10}")
bad = 0
for mode in sys.argv[2:]:
    sim = os.path.join(work, mode + ".sim.json")
    if not os.path.exists(sim):
        print(f"{mode:9} (no trace)"); bad += 1; continue
    outcomes = json.load(open(sim))[0]["outcomes"]
    truth = [json.loads(l) for l in open(os.path.join(work, mode + ".truth"))]
    for k, t in enumerate(truth):
        s = t["setting"]
        # outcomes[0] is the run's own setting; the asked ones follow, in order.
        o = outcomes[k + 1] if k + 1 < len(outcomes) else None
        pred = "?" if o is None else ("serves" if o["failures"] == 0 else "fails")
        real = "fails" if t["r"]["failed_step"] is not None else "serves"
        ok = pred == real
        bad += not ok
        print(f"{mode:9} {s or '(defaults)':55} {pred:>10} {real:>10}{'' if ok else '  OFF'}")
print("every prediction right" if not bad else f"{bad} off")
sys.exit(1 if bad else 0)
PY
