#!/usr/bin/env bash
# step time and NVML peak under the shim against PyTorch alone, modes alternated.
# PyTorch under the shim against PyTorch alone on real workloads with shapes that change every step, modes alternated
# (A B C D E, A B C D E, ...) so a drifting machine cancels out. Modes: PyTorch's default;
# history (PyTorch's own memory history with Python stacks, no shim);
# observe (`gpushim run` with nothing set: PyTorch's allocator untouched, every tensor and its
# Python frames recorded); notensors (the same with tensors:off: segments only);
# pertensor (`gpushim run --per-tensor`: caching off, pool:caching,medium:20MiB); pluggable (the pluggable
# allocator over pool:expandable); plugcaching (over pool:caching); PyTorch's expandable
# segments, for memory; ptexpandable (pertensor over pool:expandable); ptnoframes
# (pertensor with stacks:off: what Python frames cost); plugnoframes (pluggable,
# stacks:off); plugnotrace (pluggable, recording off); ptnotrace (pertensor,
# recording off); pttrimoff (pertensor, nothing given back); ptplain (pertensor with
# medium:off: plain pool:caching); ptctx, ptnoctx, plugctx (checkpoints of one context event
# on, off: GPUSHIM_CTX_EVENTS=1, 0). MODES (environment) picks a subset, in order; a mode named alt-MODE runs MODE
# with the build whose library ALT_LIB names, so two builds are compared in the same run.
# Prints one table per workload: median step time over the rounds, × PyTorch's default of the
# same run (ratio of medians; and the median and range of each round's ratio to that round's
# default run, which cancels drift between rounds), the host's share of it (host ms: until the step waits for the GPU), NVML peak,
# each round's figure (also on stderr as each run ends); "per round / host": each run's step
# divided by its own host speed (µs per kernel launch, timed in the process between cycles on
# work no allocator takes part in) before the round's ratio: identical processes differ here by
# 20-40%, and this narrowed that on ResNet-50 but not on GPT-2 or the transformer;
# then what the pool did in each traced mode (its
# `gpushim summary` lines of the last round: segments reserved and released, waits, and
# whether and where the process left the legacy stream). KEEP_TRACES=DIR keeps those traces.
# WORKLOAD `alloc` times one tensor's allocation and free instead (scripts/gpu/alloc_cost.py,
# host cost only, no kernels): STEPS is then the number of tensors.
#   bash scripts/gpu.sh perf:WORKLOAD[,ROUNDS,STEPS]    (transformer, gpt2, resnet50, alloc)
#   BUDGET_S=270 bash scripts/gpu.sh perf:...   (fewer rounds if time runs short; table printed)
# Run through scripts/gpu.sh.
set -euo pipefail
# Every run on the same eight cores, laid out alike (address-space randomization off, one hash
# seed): identical processes on the GPU machine otherwise differ by up to 2x in host speed.
# PIN=0 leaves processes where the system puts them.
if [ "${PIN:-1}" = 1 ] && [ -z "${PERF_PINNED:-}" ]; then
  first=$(( $(nproc) / 2 )); last=$(( first + 7 < $(nproc) ? first + 7 : $(nproc) - 1 ))
  PERF_PINNED=1 PYTHONHASHSEED=0 exec taskset -c "$first-$last" setarch "$(uname -m)" -R bash "$0" "$@"
fi
workload=${1:?usage: section perf WORKLOAD [ROUNDS] [STEPS]}
rounds=${2:-3}
steps=${3:-30}
work=$(mktemp -d)
out="$work/results.jsonl"
script=scripts/gpu/workloads.py
if [ "$workload" = alloc ]; then script=scripts/gpu/alloc_cost.py; steps=${3:-200000}; fi
wl() { # MODE STEPS: the workload script's arguments
  if [ "$workload" = alloc ]; then echo "$1 $2"; else echo "$workload $1 $2"; fi
}
run_mode() { # MODE: one run of the workload, its RESULT line on stdout
  local mode=$1
  case $mode in
    alt-*) # the same mode with the build in $ALT_LIB, named alt-MODE in the table
      [ -n "${ALT_LIB:-}" ] || { echo "perf: mode $mode needs ALT_LIB" >&2; return; }
      GPUSHIM_LIB="$ALT_LIB" TRACE_TAG=alt- run_mode "${mode#alt-}" | sed "s/\"mode\": \"[a-z]*\"/\"mode\": \"$mode\"/"
      return ;;
  esac
  case $mode in
      default|expandable|history) python3 $script $(wl $mode "$steps") ;;
      observe) "$GPUSHIM_BIN" run --trace "$work/${TRACE_TAG:-}ob.%p.trace" -- \
                   python3 $script $(wl default "$steps") \
                   | sed 's/"mode": "default"/"mode": "observe"/' ;;
      notensors) "$GPUSHIM_BIN" run --conf tensors:off --trace "$work/${TRACE_TAG:-}nt.%p.trace" -- \
                   python3 $script $(wl default "$steps") \
                   | sed 's/"mode": "default"/"mode": "notensors"/' ;;
      pertensor) "$GPUSHIM_BIN" run --per-tensor --trace "$work/${TRACE_TAG:-}pt.%p.trace" -- \
                   python3 $script $(wl $mode "$steps") ;;
      ptplain) "$GPUSHIM_BIN" run --per-tensor --conf medium:off --trace "$work/${TRACE_TAG:-}pp.%p.trace" -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptplain"/' ;;
      ptexpandable) "$GPUSHIM_BIN" run --per-tensor --conf pool:expandable \
                   --trace "$work/${TRACE_TAG:-}px.%p.trace" -- python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptexpandable"/' ;;
      pttrimoff) "$GPUSHIM_BIN" run --per-tensor --conf trim:off --trace "$work/${TRACE_TAG:-}pk.%p.trace" -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "pttrimoff"/' ;;
      ptnotrace) GPUSHIM_TRACE=off "$GPUSHIM_BIN" run --per-tensor --conf stacks:off -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptnotrace"/' ;;
      ptnoframes) "$GPUSHIM_BIN" run --per-tensor --conf stacks:off --trace "$work/${TRACE_TAG:-}pn.%p.trace" -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptnoframes"/' ;;
      ptctx) GPUSHIM_CTX_EVENTS=1 "$GPUSHIM_BIN" run --per-tensor --trace "$work/${TRACE_TAG:-}pq.%p.trace" -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptctx"/' ;;
      ptnoctx) GPUSHIM_CTX_EVENTS=0 "$GPUSHIM_BIN" run --per-tensor --trace "$work/${TRACE_TAG:-}py.%p.trace" -- \
                   python3 $script $(wl pertensor "$steps") \
                   | sed 's/"mode": "pertensor"/"mode": "ptnoctx"/' ;;
      plugctx) GPUSHIM_CTX_EVENTS=1 "$GPUSHIM_BIN" run --conf pool:expandable --trace "$work/${TRACE_TAG:-}pz.%p.trace" -- \
                   python3 $script $(wl pluggable "$steps") \
                   | sed 's/"mode": "pluggable"/"mode": "plugctx"/' ;;
      pluggable) "$GPUSHIM_BIN" run --conf pool:expandable --trace "$work/${TRACE_TAG:-}pl.%p.trace" -- \
                   python3 $script $(wl $mode "$steps") ;;
      plugnotrace) GPUSHIM_TRACE=off "$GPUSHIM_BIN" run --conf pool:expandable,stacks:off -- \
                   python3 $script $(wl pluggable "$steps") \
                   | sed 's/"mode": "pluggable"/"mode": "plugnotrace"/' ;;
      plugnoframes) "$GPUSHIM_BIN" run --conf pool:expandable,stacks:off --trace "$work/${TRACE_TAG:-}pf.%p.trace" -- \
                   python3 $script $(wl pluggable "$steps") \
                   | sed 's/"mode": "pluggable"/"mode": "plugnoframes"/' ;;
      plugcaching) "$GPUSHIM_BIN" run --conf pool:caching --trace "$work/${TRACE_TAG:-}pc.%p.trace" -- \
                   python3 $script $(wl pluggable "$steps") \
                   | sed 's/"mode": "pluggable"/"mode": "plugcaching"/' ;;
  esac 2>/dev/null | { grep '^RESULT' || true; } | sed 's/^RESULT //'
}
modes=${MODES:-default pertensor ptnoframes pluggable plugcaching expandable}
# BUDGET_S (environment): start no round that would end past this many seconds (judged by
# the longest round so far), so a call with a time limit still prints its table.
began=$SECONDS longest=0
for r in $(seq "$rounds"); do
  if [ -n "${BUDGET_S:-}" ] && [ $((SECONDS - began + longest)) -gt "$BUDGET_S" ]; then
    echo "perf: stopped after $((r - 1)) rounds (BUDGET_S=$BUDGET_S)" >&2
    break
  fi
  round_began=$SECONDS
  for mode in $modes; do
    run_mode "$mode" | sed "s/^{/{\"round\": $r, /" | tee -a "$out" | sed "s/^/round $r: /" >&2
    # The last round's traces stay, for the pool's lines below.
    [ "$r" = "$rounds" ] || rm -f "$work"/*.trace
  done
  if [ $((SECONDS - round_began)) -gt "$longest" ]; then longest=$((SECONDS - round_began)); fi
done
python3 - "$out" "$workload" "$modes" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if sys.argv[2] == "alloc":
    by = {}
    for r in rows:
        by.setdefault(r["mode"], []).append(r["ns_per_tensor"])
    base = statistics.median(by["default"])
    print(f"one tensor's allocation and free (host only): {len(by['default'])} rounds")
    print(f"{'mode':12} {'ns/tensor':>10} {'vs default':>11}")
    for mode, v in by.items():
        m = statistics.median(v)
        print(f"{mode:12} {m:10.0f} {m - base:+10.0f}")
    sys.exit(0)
by = {}
for r in rows:
    by.setdefault(r["mode"], []).append(r)
base = statistics.median(r["step_ms"] for r in by["default"])
# Each round's ratio to the default run of the same round: a machine that drifts between
# rounds (10-20% on the GPU machine) moves both alike.
base_of = {r.get("round"): r["step_ms"] for r in by["default"]}
# Each process's host speed, measured in it between cycles on work no allocator takes part in
# (an in-place kernel launch on a tensor made before: workloads.py's launch_speed): identical
# processes here ran 20-40% apart. "per round / host" divides each run's step by its own
# launch time before taking the round's ratio.
norm_of = {r.get("round"): r["step_ms"] / r["launch_us"] for r in by["default"] if r.get("launch_us")}
print(f"{rows[0]['workload']}: {len(by['default'])} rounds")
print(f"{'mode':16} {'step ms':>9} {'x default':>10} {'per round':>10} {'range':>13} "
      f"{'per round / host':>16} {'range':>13} {'launch us':>9} {'host ms':>8} "
      f"{'NVML peak MiB':>14}  each round (ms)")
for mode, rs in by.items():
    ms = statistics.median(r["step_ms"] for r in rs)
    peak = max(r["nvml_peak"] for r in rs) / 2**20
    each = " ".join(f"{r['step_ms']:.1f}" for r in rs)
    host = statistics.median(r.get("host_ms", 0) for r in rs)
    ratios = [r["step_ms"] / base_of[r.get("round")] for r in rs if r.get("round") in base_of]
    per = statistics.median(ratios) if ratios else float("nan")
    span = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "-"
    normed = [r["step_ms"] / r["launch_us"] / norm_of[r.get("round")] for r in rs
              if r.get("launch_us") and r.get("round") in norm_of]
    nper = f"{statistics.median(normed):.3f}" if normed else "-"
    nspan = f"{min(normed):.3f}-{max(normed):.3f}" if normed else "-"
    launch = statistics.median(r.get("launch_us", 0) for r in rs)
    print(f"{mode:16} {ms:9.2f} {ms / base:10.3f} {per:10.3f} {span:>13} {nper:>16} {nspan:>13} "
          f"{launch:9.3f} {host:8.2f} {peak:14.0f}  {each}")
for mode in sys.argv[3].split():
    if mode not in by:
        print(f"{mode:16} {'(no result)':>9}")
PY
for t in "$work"/*.trace; do
  [ -e "$t" ] || continue
  echo "$(basename "$t" | cut -d. -f1): $("$GPUSHIM_BIN" summary "$t" 2>/dev/null | grep -E '^pool' | tr '\n' ' ')"
done
# KEEP_TRACES=DIR keeps the last round's traces there, compressed, to read at leisure.
if [ -n "${KEEP_TRACES:-}" ]; then
  mkdir -p "$KEEP_TRACES" && for t in "$work"/*.trace; do [ -e "$t" ] && xz -T4 -c "$t" > "$KEEP_TRACES/$(basename "$t").xz"; done
fi
rm -rf "$work"
