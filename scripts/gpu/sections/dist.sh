#!/usr/bin/env bash
# memory by kind on every rank of a DDP or FSDP job against each rank's own figures (parameters, gradients, optimizer state).
# On a machine of two GPUs or more: scripts/gpu/dist_kinds.py (a 6-layer GPT-2, AdamW, 4 x 512
# tokens a rank) under `gpushim run --trace DIR/MODE.%r.trace -- torchrun --nproc-per-node N`,
# nothing set, for each MODE (ddp, ddp-view, fsdp2, fsdp2-keep, fsdp1, fsdp1-orig). Each rank's
# truth (after its last optimizer step, in requested bytes) against `gpushim summary --json`'s
# tensors by kind at exit, with every kind gpushim gave; then the job's own summary of the ranks
# side by side. Traces and reports are kept in $OUT (dist-traces.tar.gz, dist-reports.txt)
# where it is set. One table.
#   bash scripts/gpu.sh dist[:MODE,...]
set -euo pipefail
modes=${*:-ddp ddp-view fsdp2 fsdp2-keep fsdp1 fsdp1-orig}
n=$(nvidia-smi -L | wc -l)
[ "$n" -ge 2 ] || { echo "dist: needs two GPUs or more (this machine has $n)"; exit 0; }
work=$(mktemp -d)
reports=${OUT:-$work}/dist-reports.txt
: >"$reports"
for m in $modes; do
  mkdir -p "$work/$m"
  if DIST_TRUTH_DIR="$work" "$GPUSHIM_BIN" run --trace "$work/$m/r.%r.trace" -- \
      torchrun --standalone --nproc-per-node "$n" scripts/gpu/dist_kinds.py "$m" 4 \
      >"$work/$m.out" 2>"$work/$m.err"; then :; else
    echo "$m: run failed"; tail -8 "$work/$m.err"
  fi
  : >"$work/$m.truth"
  for f in "$work/$m".[0-9]*.json; do
    [ -f "$f" ] && { cat "$f"; echo; } >>"$work/$m.truth"
  done
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
python3 - "$work" $modes <<'PY'
import glob, json, sys
work, modes = sys.argv[1], sys.argv[2:]
MiB = 1 << 20
KEY = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state"}
print(f"{'mode':11} {'rank':>4} {'kind':16} {'truth MiB':>10} {'gpushim MiB':>12} {'err':>8}   every kind gpushim gave at exit (MiB)")
for m in modes:
    truths = {}
    for line in open(f"{work}/{m}.truth"):
        if not line.strip():
            continue
        t = json.loads(line)
        truths[t["rank"]] = t
    for r in sorted(truths):
        t = truths[r]
        try:
            s = json.load(open(f"{work}/{m}.{r}.summary"))
            f = s["framework"][0]
            kinds = {k["kind"]: k["bytes"] for k in f.get("kinds_at_exit", [])}
        except (OSError, ValueError, KeyError, IndexError) as e:
            print(f"{m:11} {r:>4} no summary ({e})")
            continue
        every = ", ".join(f"{k} {v / MiB:.1f}" for k, v in sorted(kinds.items()))
        for i, (k, name) in enumerate(KEY.items()):
            got = kinds.get(k, kinds.get(name, 0))
            err = (got - t[k]) / t[k] * 100 if t[k] else 0.0
            tail = every if i == 0 else ""
            print(f"{m:11} {r:>4} {name:16} {t[k] / MiB:10.2f} {got / MiB:12.2f} {err:+7.2f}%   {tail}")
        print(f"{m:11} {r:>4} {'allocated':16} {t['allocated'] / MiB:10.2f} {sum(kinds.values()) / MiB:12.2f}")
PY
if [ -n "${OUT:-}" ]; then
  tar -C "$work" -czf "$OUT/dist-traces.tar.gz" $(cd "$work" && ls -d */ | sed 's:/$::')
fi
