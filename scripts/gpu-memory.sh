#!/usr/bin/env bash
# Where the device memory went, on the GPU machine: each workload of
# scripts/gpu/where_memory_went.py (context, nccl-context, gpt2, nccl) under `gpushim run`,
# nothing set, and
# `gpushim summary --json` of its trace. One table: NVML's figure for the process (as the trace
# kept it, and as the program read NVML itself just before exit), what the summary names as
# held by each owner, and the rest (made by no allocating call). The rest is then set against
# a reference's own rest, a process that loads the same libraries and does next to nothing
# (context for gpt2: a CUDA context and cuBLAS; nccl-context for nccl: NCCL's kernels too): the
# named parts plus that reference must come within 2% of NVML's figure, or the shim missed an
# allocation. "NVML (program)" is read by the program just before it ends; the trace's last
# sample may come later (nccl: NCCL frees its buffers at the interpreter's exit). Build and carry .gpu as
# for scripts/gpu-check.sh.
#   bash scripts/gpu-memory.sh [context nccl-context gpt2 nccl]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .gpu/gpushim ] && [ -f .gpu/libgpushim.so ] || { echo "carry .gpu (see scripts/gpu-check.sh)" >&2; exit 2; }
workloads=${*:-context nccl-context gpt2 nccl}
work=$(mktemp -d)
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); torch $(python3 -c 'import torch; print(torch.__version__)'); $(date -u +%F)"
for w in $workloads; do
  .gpu/gpushim run --trace "$work/$w.%p.trace" -- python3 scripts/gpu/where_memory_went.py "$w" \
    > "$work/$w.out" 2> "$work/$w.err" || { echo "$w failed:"; tail -20 "$work/$w.err"; exit 1; }
  grep '^RESULT ' "$work/$w.out" | sed 's/^RESULT //' > "$work/$w.json"
  .gpu/gpushim summary --json "$work"/$w.*.trace > "$work/$w.summary.json"
done
python3 - "$work" $workloads <<'PY'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
MiB = 2**20
rows = {}
for w in names:
    own = json.load(open(f"{work}/{w}.json"))
    s = json.load(open(f"{work}/{w}.summary.json"))
    dm = [d for d in s["device_memory"] if d["device"] == 0]
    if not dm:
        print(f"{w}: the trace holds no NVML figure"); continue
    rows[w] = (own, dm[0])
REFERENCE = {"gpt2": "context", "nccl": "nccl-context"}
def ref_rest(w):
    ref = rows.get(REFERENCE.get(w, w), (None, None))[1]
    return ref["at_exit"]["not_allocated_bytes"] if ref else None
print()
mib = lambda b: "-" if b is None else f"{b / MiB:,.0f}"
print("| workload | moment | NVML (trace) | NVML (program) | named parts | rest | parts + reference rest | vs NVML |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for w, (own, d) in rows.items():
    for moment in ("at_peak", "at_exit"):
        r = d[moment]
        prog = own["nvml_at_exit"] if moment == "at_exit" else None
        rest = ref_rest(w)
        total = None if rest is None or w not in REFERENCE else rest + r["held_bytes"]
        off = "-" if total is None else f"{100 * (total - r['nvml_bytes']) / r['nvml_bytes']:+.2f}%"
        print(f"| {w} | {moment.replace('_', ' ')} | {mib(r['nvml_bytes'])} | {mib(prog)} | "
              f"{mib(r['held_bytes'])} | {mib(r['not_allocated_bytes'])} | {mib(total)} | {off} |")
print()
for w, (own, d) in rows.items():
    for moment in ("at_peak", "at_exit"):
        parts = ", ".join(f"{p['owner']} {p['bytes'] / MiB:,.1f}" for p in d[moment]["parts"])
        print(f"{w} {moment.replace('_', ' ')} (MiB): {parts}")
    print(f"{w}: PyTorch says allocated {own['allocated'] / MiB:,.1f}, reserved {own['reserved'] / MiB:,.1f}, "
          f"max reserved {own['max_reserved'] / MiB:,.1f} MiB")
PY
echo
for w in $workloads; do echo "== gpushim summary ($w)"; .gpu/gpushim summary "$work"/$w.*.trace | sed -n '/memory as NVML/,/= NVML/p'; done
