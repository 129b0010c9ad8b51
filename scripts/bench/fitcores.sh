#!/usr/bin/env bash
# fit's time with its replays side by side on the cores there are, beside a build before.
# `fit` replays PyTorch's allocator some twenty times a setting (the rows, then a doubling and
# a bisection for the largest batch): the two settings on two threads, and where there are more
# cores each setting's rows and the search's next steps at once (the one-at-a-time search's
# batches among them, its answer kept). A trace (default: tests/data/torch/gpt2.trace; an
# `.xz` file is unpacked first) is fitted at batch AT (default 8) plainly and with
# `--checkpoint auto`, by this build and, with GPUSHIM_BEFORE=PATH, by another build of the
# command, alternated A B A B three times: the median seconds of each, and whether the two
# builds printed the same fit.
# Usage: scripts/bench.sh fitcores[:TRACE,AT]
# Without cargo: GPUSHIM_PREBUILT=DIR holding gpushim built elsewhere.
set -euo pipefail
trace=${1:-tests/data/torch/gpt2.trace}
at=${2:-8}
if [ -n "${GPUSHIM_PREBUILT:-}" ]; then
  gpushim=$(cd "$GPUSHIM_PREBUILT" && pwd)/gpushim
else
  cargo build --release --quiet -p gpushim
  gpushim=$PWD/target/release/gpushim
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
case "$trace" in
  *.xz) xz -dc "$trace" >"$dir/fit.trace" && trace=$dir/fit.trace ;;
esac
before=${GPUSHIM_BEFORE:-}
echo "machine: $(nproc) cores; trace: $(stat -c %s "$trace") bytes; at batch $at; $(date -u +%F)"
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
printf "%-22s %12s %12s %8s\n" fit "this build" "before" same
for what in plain "--checkpoint auto"; do
  args=(fit --at "$at" "$trace")
  [ "$what" = plain ] || args+=($what)
  : >"$dir/a" && : >"$dir/b"
  for _ in 1 2 3; do
    /usr/bin/time -f "%e" -o "$dir/t" "$gpushim" "${args[@]}" >"$dir/a.out" 2>/dev/null || true
    tail -1 "$dir/t" >>"$dir/a"
    if [ -n "$before" ]; then
      /usr/bin/time -f "%e" -o "$dir/t" "$before" "${args[@]}" >"$dir/b.out" 2>/dev/null || true
      tail -1 "$dir/t" >>"$dir/b"
    fi
  done
  b=-; same=-
  if [ -n "$before" ]; then
    b=$(median <"$dir/b")
    same=$(cmp -s "$dir/a.out" "$dir/b.out" && echo yes || echo NO)
  fi
  printf "%-22s %12s %12s %8s\n" "$what" "$(median <"$dir/a")" "$b" "$same"
done
