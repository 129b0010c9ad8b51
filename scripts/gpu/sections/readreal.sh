#!/usr/bin/env bash
# each report's time on real models' long traces, beside reading the file once.
# The readonce bench's trace is a C loop's (four records an allocation, one call site); a real
# model's trace has the framework's tensors, segments, Python stacks and many lines. Each
# workload of scripts/gpu/workloads.py (GPT-2, ResNet-50, a transformer; shapes changing every
# step) runs STEPS steps under the default run with trace_max 16 GiB (every record kept);
# then, the file in the page cache, the time to read it (`cat`), and each report's time (the
# best of three), with frames named from the binaries (the default) and without
# (`--no-symbols`: what naming them costs), and the page's. A row: seconds, and in brackets
# the multiple of the read. GPUSHIM_BEFORE=PATH: another build of the command timed on the
# same traces, alternated with this one (a row "before" under each workload's).
# GPUSHIM_KEEP=DIR: each workload's trace also kept there, compressed (NAME.trace.xz), to be
# read again on a machine without a GPU. READREAL_MODELS="gpt2": these workloads only.
# Usage: bash scripts/gpu.sh readreal[:STEPS]  (default 400)
set -euo pipefail
steps=${1:-400}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
best() { # COMMAND...: the best of three runs' seconds
  local b=999999 s
  for _ in 1 2 3; do
    /usr/bin/time -f "%e" -o "$work/time" "$@" >/dev/null 2>&1 || true
    s=$(tail -1 "$work/time")
    b=$(awk -v a="$s" -v b="$b" 'BEGIN { print (a < b ? a : b) }')
  done
  echo "$b"
}
row() { # NAME BIN: a row of the reports' times by BIN on the workload's trace $t
  local name=$1 bin=$2 s r
  printf "%-12s %9s %8.0f %6.2f" "$name" "$records" "$(awk -v s="$(stat -c %s "$t")" 'BEGIN { print s / 1e6 }')" "$c"
  for r in summary peak leaks oom page; do
    if [ "$r" = page ]; then
      s=$(best "$bin" report "$t" -o "$work/$w.html")
    else
      s=$(best "$bin" "$r" "$t")
    fi
    printf " %6.2f (%4.0fx)" "$s" "$(awk -v a="$s" -v b="$base" 'BEGIN { print a / b }')"
  done
  s=$(best "$bin" leaks --no-symbols "$t")
  printf " %6.2f (%4.0fx)\n" "$s" "$(awk -v a="$s" -v b="$base" 'BEGIN { print a / b }')"
}
printf "%-12s %9s %8s %6s" workload records MB cat
for r in summary peak leaks oom page; do printf " %13s" "$r"; done
printf " %13s\n" "leaks -n"
for w in ${READREAL_MODELS:-gpt2 resnet50 transformer}; do
  t=$work/$w.trace
  "$GPUSHIM_BIN" run --conf "trace_max:16GiB" --trace "$t" -- \
    python3 scripts/gpu/workloads.py "$w" default "$steps" >"$work/$w.out" 2>&1 \
    || { echo "$w: the run failed"; tail -5 "$work/$w.out"; continue; }
  records=$("$GPUSHIM_BIN" summary --json "$t" | python3 -c 'import json,sys; print(json.load(sys.stdin)["health"]["committed"])')
  if [ -n "${GPUSHIM_KEEP:-}" ]; then
    mkdir -p "$GPUSHIM_KEEP" && xz -T4 -6 -c "$t" >"$GPUSHIM_KEEP/$w.trace.xz"
  fi
  cat "$t" >/dev/null
  c=$(best cat "$t")
  # The read of a small file is a few milliseconds: the multiples are of at least 10 ms.
  base=$(awk -v c="$c" 'BEGIN { print (c > 0.01 ? c : 0.01) }')
  row "$w" "$GPUSHIM_BIN"
  if [ -n "${GPUSHIM_BEFORE:-}" ]; then
    row "  before" "$GPUSHIM_BEFORE"
    row "  again" "$GPUSHIM_BIN"
  fi
done
