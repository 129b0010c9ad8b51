#!/usr/bin/env bash
# Where the default run's time goes on one tensor event, part by part, beside PyTorch alone.
# A loop of torch.empty + del, DEPTH Python frames deep (scripts/gpu/event_cost.py), in one
# process per mode, the modes alternated (A B C ..., A B C ...) for ROUNDS rounds, every process
# pinned to the same four cores (the program and the shim's helper threads) so that identical
# processes run alike. Modes:
#   torch      no shim
#   history    no shim, PyTorch's own memory history with Python stacks
#   loaded     the shim with tensors:off (what a tensor costs while nothing watches it)
#   tracker    the shim's tracker attached, nothing recorded (GPUSHIM_TRACE=off): PyTorch
#              building its trace entry and calling the tracker
#   record     tensors recorded, no Python frames (stacks:off)
#   default    `gpushim run` with nothing set: tensors and their Python frames
#   before     the default run with the shim library ALT_LIB names (an earlier build)
# MODES (environment) picks a subset, in order. Prints ns per event (median over rounds of each process's median block) and the difference
# of each mode from the one before it, i.e. the cost of each part; then one run of the default
# under GPUSHIM_COSTS=1, the shim's own count of its parts (timing them adds to them).
#   bash scripts/gpu.sh eventcost[:ROUNDS,DEPTH,PAIRS]
set -euo pipefail
rounds=${1:-7}
depth=${2:-20}
pairs=${3:-50000}
work=$(mktemp -d)
out="$work/results.jsonl"
cpu=$(( $(nproc) / 2 ))
pin() { PYTHONHASHSEED=0 taskset -c "$cpu-$((cpu + 3))" setarch "$(uname -m)" -R "$@"; }
prog="scripts/gpu/event_cost.py $depth $pairs"
run_mode() {
  case $1 in
    torch) pin python3 $prog ;;
    history) HISTORY=1 pin python3 $prog ;;
    loaded) pin "$GPUSHIM_BIN" run --conf tensors:off --trace "$work/l.%p.trace" -- python3 $prog ;;
    tracker) GPUSHIM_TRACE=off pin "$GPUSHIM_BIN" run -- python3 $prog ;;
    record) pin "$GPUSHIM_BIN" run --conf stacks:off --trace "$work/r.%p.trace" -- python3 $prog ;;
    default) pin "$GPUSHIM_BIN" run --trace "$work/d.%p.trace" -- python3 $prog ;;
    before) GPUSHIM_LIB="${ALT_LIB:?mode before needs ALT_LIB}" pin "$GPUSHIM_BIN" run --trace "$work/b.%p.trace" -- python3 $prog ;;
  esac 2>"$work/err" | { grep '^RESULT' || { tail -3 "$work/err" >&2; true; }; } | sed "s/^RESULT {/{\"mode\": \"$1\", /"
  rm -f "$work"/*.trace
}
modes=${MODES:-torch history loaded tracker record default}
for r in $(seq "$rounds"); do
  for m in $modes; do run_mode "$m" | tee -a "$out" | sed "s/^/round $r: /" >&2; done
done
python3 - "$out" "$modes" "$depth" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by, speed = {}, {}
for r in rows:
    by.setdefault(r["mode"], []).append(r["ns_per_event"])
    speed.setdefault(r["mode"], []).append(r["empty_ns"])
# Each process's figure scaled by how fast it ran the empty tensors against PyTorch's own
# processes (the median of theirs): a process that runs everything 1.5x slower counts 1/1.5.
ref = statistics.median(speed["torch"]) if "torch" in speed else 1.0
scaled = {m: [v * ref / s for v, s in zip(by[m], speed[m])] for m in by}
what = {
    "torch": "PyTorch alone",
    "history": "PyTorch's memory history, Python stacks",
    "loaded": "shim loaded, tensors off",
    "tracker": "tracker attached, nothing recorded",
    "record": "tensor records, no Python frames",
    "default": "the default run (records + Python frames)",
    "before": "the default run of the build ALT_LIB names",
}
part = {"loaded": "the shim's hooks", "tracker": "PyTorch's trace entry + the call",
        "record": "the record", "default": "the Python frames"}
base = statistics.median(by["torch"]) if "torch" in by else float("nan")
cbase = statistics.median(scaled["torch"]) if "torch" in scaled else float("nan")
print(f"one tensor event, {sys.argv[3]} Python frames deep: {max(map(len, by.values()))} rounds, each a process pinned to four cores")
print(f"{'mode':9} {'ns/event':>9} {'range':>13} {'vs torch':>9} {'this part':>10} "
      f"{'scaled':>7} {'vs torch':>9} {'this part':>10} {'empty ns':>8}  what")
prev = cprev = None
for m in sys.argv[2].split():
    v = by.get(m)
    if not v:
        print(f"{m:9} (no result)")
        continue
    med = statistics.median(v)
    cmed = statistics.median(scaled[m])
    alone = m in ("history", "before")
    step = "" if prev is None or alone else f"{med - prev:+10.0f}"
    cstep = "" if cprev is None or alone else f"{cmed - cprev:+10.0f}"
    print(f"{m:9} {med:9.0f} {min(v):6.0f}-{max(v):<6.0f} {med - base:+9.0f} {step:>10} "
          f"{cmed:7.0f} {cmed - cbase:+9.0f} {cstep:>10} {statistics.median(speed[m]):8.0f}  {what[m]}"
          + (f" ({part[m]})" if m in part else ""))
    if not alone:
        prev, cprev = med, cmed
PY
echo
echo "the default run's own count of its parts (GPUSHIM_COSTS=1; timing adds to each):"
GPUSHIM_COSTS=1 pin "$GPUSHIM_BIN" run --trace "$work/c.%p.trace" -- python3 $prog 2>&1 >/dev/null \
  | grep -E "costs of|tensor event|trace record|stacks|python|interned" || true
rm -rf "$work"
