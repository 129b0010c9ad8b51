#!/usr/bin/env bash
# where the device memory went: NVML's figure split by owner, within 2% of a reference.
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
# sample may come later (nccl: NCCL frees its buffers at the interpreter's exit). Run through scripts/gpu.sh.
# RANKS=N runs each workload under torchrun with N ranks, one GPU each (a machine with N GPUs),
# and adds what `gpushim summary` says of the ranks together (the one closest to its limit).
# pools: 2 MiB from CUDA's default pool and 2 MiB of graph memory, set against context;
# created: the same and pools the program creates (2 MiB kept from one), set against context;
# nodes: a graph built node by node whose memory node keeps 2 MiB, set against context.
#   bash scripts/gpu.sh memory[:context,nccl-context,gpt2,nccl,pools,created,nodes]
#   RANKS=2 bash scripts/gpu.sh memory:nccl-context,nccl
set -euo pipefail
workloads=${*:-context nccl-context gpt2 nccl pools created nodes}
work=$(mktemp -d)
ranks=${RANKS:-1}
for w in $workloads; do
  if [ "$ranks" = 1 ]; then
    cmd=(python3 scripts/gpu/where_memory_went.py "$w")
  else
    cmd=(torchrun --standalone --nproc_per_node "$ranks" scripts/gpu/where_memory_went.py "$w")
  fi
  "$GPUSHIM_BIN" run --trace "$work/$w.r%r.trace" -- "${cmd[@]}" > "$work/$w.out" 2> "$work/$w.err" \
    || { echo "$w failed:"; tail -20 "$work/$w.err"; exit 1; }
  grep '^RESULT ' "$work/$w.out" | sed 's/^RESULT //' > "$work/$w.json"
  for t in "$work"/$w.r*.trace; do
    r=${t##*.r}; r=${r%.trace}
    "$GPUSHIM_BIN" summary --json "$t" > "$work/$w.$r.summary.json"
  done
done
python3 - "$work" $workloads <<'PY'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
MiB = 2**20
rows = {}
for w in names:
    for line in open(f"{work}/{w}.json"):
        own = json.loads(line)
        rank = own["rank"]
        s = json.load(open(f"{work}/{w}.{rank}.summary.json"))
        dev = [d for d in s["device_memory"] if d["at_peak"]["nvml_bytes"] > 0]
        if not dev:
            print(f"{w} rank {rank}: the trace holds no NVML figure"); continue
        rows[(w, rank)] = (own, max(dev, key=lambda d: d["at_peak"]["nvml_bytes"]))
REFERENCE = {"gpt2": "context", "nccl": "nccl-context", "pools": "context", "created": "context",
             "nodes": "context"}
def ref_rest(w, rank):
    ref = rows.get((REFERENCE.get(w, w), rank), (None, None))[1]
    return ref["at_exit"]["not_allocated_bytes"] if ref else None
print()
mib = lambda b: "-" if b is None else f"{b / MiB:,.0f}"
print("| workload | rank | device | moment | NVML (trace) | NVML (program) | named parts | rest | parts + reference rest | vs NVML |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
for (w, rank), (own, d) in rows.items():
    for moment in ("at_peak", "at_exit"):
        r = d[moment]
        prog = own["nvml_at_exit"] if moment == "at_exit" else None
        rest = ref_rest(w, rank)
        total = None if rest is None or w not in REFERENCE else rest + r["held_bytes"]
        off = "-" if total is None else f"{100 * (total - r['nvml_bytes']) / r['nvml_bytes']:+.2f}%"
        print(f"| {w} | {rank} | {d['device']} | {moment.replace('_', ' ')} | {mib(r['nvml_bytes'])} | {mib(prog)} | "
              f"{mib(r['held_bytes'])} | {mib(r['not_allocated_bytes'])} | {mib(total)} | {off} |")
print()
for (w, rank), (own, d) in rows.items():
    for moment in ("at_peak", "at_exit"):
        parts = ", ".join(f"{p['owner']} {p['bytes'] / MiB:,.1f}" for p in d[moment]["parts"])
        print(f"{w} rank {rank} {moment.replace('_', ' ')} (MiB): {parts}")
    print(f"{w} rank {rank}: PyTorch says allocated {own['allocated'] / MiB:,.1f}, reserved {own['reserved'] / MiB:,.1f}, "
          f"max reserved {own['max_reserved'] / MiB:,.1f} MiB")
PY
echo
for w in $workloads; do
  echo "== gpushim summary ($w)"
  "$GPUSHIM_BIN" summary "$work"/$w.r*.trace | sed -n -e '/memory as NVML/,/= NVML/p' -e '/closest to its/,$p'
done
