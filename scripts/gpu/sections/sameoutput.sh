#!/usr/bin/env bash
# every report's output from this build and another (GPUSHIM_BEFORE=PATH to its gpushim) on traces made here on the GPU, side by side: for a change that must change no answer.
# The traces: GPT-2 and ResNet-50 (scripts/gpu/torch_replay.py, 10 steps, real sizes), and rank 0
# of a GPT-2 job under FSDP2 and DDP at 2 ranks (scripts/gpu/dist_kinds.py through PyTorch's
# fake process group, WORLD_SIZE kept in the trace). On each, both builds run summary, peak,
# leaks, oom, fit (at the run's batch, x2..x8, and for the jobs at 4 ranks), simulate
# --recommend, report (the page's bytes) and diff, their JSON where they have it. One table:
# command, trace, same or differs.
#   GPUSHIM_BEFORE=.gpu/before/gpushim bash scripts/gpu.sh sameoutput
set -euo pipefail
before=${GPUSHIM_BEFORE:?set GPUSHIM_BEFORE to the other build of gpushim}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$GPUSHIM_BIN" run --trace "$work/gpt2.trace" -- python3 scripts/gpu/torch_replay.py gpt2 10 >/dev/null 2>&1
"$GPUSHIM_BIN" run --trace "$work/resnet50.trace" -- python3 scripts/gpu/torch_replay.py resnet50 10 >/dev/null 2>&1
for m in fsdp2 ddp; do
  DIST_MODEL=gpt2 DIST_FAKE=1 RANK=0 WORLD_SIZE=2 DIST_TRUTH_DIR="$work" DIST_TRUTH_NAME="$m" \
    "$GPUSHIM_BIN" run --trace "$work/$m.trace" -- python3 scripts/gpu/dist_kinds.py "$m" 4 4 >/dev/null 2>&1
done
mkdir -m 700 "$work/a" "$work/b"
printf '%-44s %-18s %s\n' command trace result
differ=0
for t in "$work"/*.trace; do
  name=$(basename "$t")
  fits=("fit --at 4 --json" "fit --at 4")
  case $name in fsdp2.trace | ddp.trace) fits+=("fit --at 4 --world-size 4 --json") ;; esac
  for c in "summary --json" "summary" "peak --json" "leaks --json" "leaks" "oom --json" \
      "${fits[@]}" "simulate --torch expandable_segments:True --json" "simulate --recommend" \
      "report -o @D/page.html" "diff @T"; do
    args=${c//@T/$t}
    # shellcheck disable=SC2086
    a=$("$before" ${args//@D/$work/a} "$t" 2>&1; echo "exit $?"; cat "$work"/a/* 2>/dev/null) || true
    # shellcheck disable=SC2086
    b=$("$GPUSHIM_BIN" ${args//@D/$work/b} "$t" 2>&1; echo "exit $?"; cat "$work"/b/* 2>/dev/null) || true
    a=${a//$work\/a/@D} b=${b//$work\/b/@D}
    rm -f "$work"/a/* "$work"/b/*
    result=same
    [ "$a" = "$b" ] || { result=DIFFERS; differ=$((differ + 1)); }
    printf '%-44s %-18s %s\n' "$c" "$name" "$result"
  done
done
echo "sameoutput: $differ differ"
