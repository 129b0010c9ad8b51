#!/usr/bin/env bash
# memory by kind on a rank of a DeepSpeed ZeRO-1, 2 and 3 job against the rank's own figures (parameters, gradients, optimizer state with its fp32 master weights, DeepSpeed's gradient buckets).
# scripts/gpu/ds_kinds.py (a 6-layer GPT-2, PyTorch's AdamW as DeepSpeed's client optimizer,
# 4 x 512 tokens a rank, bf16 and fp32, DeepSpeed's defaults otherwise) under `gpushim run`,
# nothing set, for each MODE (zero1, zero2, zero3) and precision: on two GPUs or more
# `torchrun --nproc-per-node N`, else rank 0 of 2 alone through PyTorch's fake process group
# (every buffer made, no communication). DeepSpeed is imported from .gpu/dssite (made here by
# scripts/deepspeed-site.sh and carried: the machine reaches no registry). Each rank's truth
# (after its last step, in requested bytes) against `gpushim summary --json`'s tensors by kind
# at exit; then the frameworks named and the kinds at the peak. One table.
#   bash scripts/gpu.sh dskinds[:MODE,...]
set -euo pipefail
modes=${*:-zero1 zero2 zero3}
[ -d .gpu/dssite/deepspeed ] || { echo "dskinds: no .gpu/dssite (bash scripts/deepspeed-site.sh here, then carry .gpu)"; exit 0; }
export PYTHONPATH="$PWD/.gpu/dssite${PYTHONPATH:+:$PYTHONPATH}" DS_BUILD_OPS=0
n=$(nvidia-smi -L | wc -l)
work=$(mktemp -d)
reports=${OUT:-$work}/dskinds-reports.txt
: >"$reports"
[ "$n" -ge 2 ] || echo "dskinds: $n GPU: rank 0 of 2 alone through PyTorch's fake process group"
for m in $modes; do
  for dtype in bf16 fp32; do
    name="$m.$dtype"
    mkdir -p "$work/$name"
    if [ "$n" -ge 2 ]; then
      launch=(torchrun --standalone --nproc-per-node "$n")
    else
      launch=(env DIST_FAKE=1 RANK=0 WORLD_SIZE=2 python3)
    fi
    if ! DS_DTYPE=$dtype DIST_TRUTH_DIR="$work" DIST_TRUTH_NAME="$name" "$GPUSHIM_BIN" run \
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
python3 - "$work" $modes <<'PY'
import glob, json, os, sys
work, modes = sys.argv[1], sys.argv[2:]
MiB = 1 << 20
KEY = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state",
       "communication": "communication"}
print(f"{'run':11} {'rank':>4} {'kind':16} {'truth MiB':>10} {'gpushim MiB':>12} {'err':>8}   every kind gpushim gave at exit (MiB)")
for m in modes:
    for dtype in ("bf16", "fp32"):
        name = f"{m}.{dtype}"
        for path in sorted(glob.glob(f"{work}/{name}.[0-9]*.json")):
            t = json.load(open(path))
            r = t["rank"]
            try:
                s = json.load(open(f"{work}/{name}.{r}.summary"))
                f = s["framework"][0]
                kinds = {k["kind"]: k["bytes"] for k in f.get("kinds_at_exit", [])}
            except (OSError, ValueError, KeyError, IndexError) as e:
                print(f"{name:11} {r:>4} no summary ({e})")
                continue
            every = ", ".join(f"{k} {v / MiB:.1f}" for k, v in sorted(kinds.items()))
            for i, (k, label) in enumerate(KEY.items()):
                got = kinds.get(k, 0)
                # Where the truth is none, the error is said in bytes: DeepSpeed's own scalars
                # (a few bytes) are its buffers too.
                err = f"{(got - t[k]) / t[k] * 100:+7.2f}%" if t[k] else f"{got - t[k]:+7d}B"
                print(f"{name:11} {r:>4} {label:16} {t[k] / MiB:10.2f} {got / MiB:12.2f} {err:>8}   {every if i == 0 else ''}")
            print(f"{name:11} {r:>4} {'allocated':16} {t['allocated'] / MiB:10.2f} {sum(kinds.values()) / MiB:12.2f}")
PY
cat "$reports"
if [ -n "${OUT:-}" ]; then
  tar -C "$work" -czf "$OUT/dskinds-traces.tar.gz" $(cd "$work" && ls -d */ | sed 's:/$::')
fi
