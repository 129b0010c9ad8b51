#!/usr/bin/env bash
# the worst cases forged traces once made of time that grew faster than the trace: each command beside the same command on a plain trace.
# A forged trace of the expandable-segments model's worst case (a kept 3 GiB tensor alternating
# with a freed 2^47-byte one, N times: examples/forge_trace.rs), at N and 4N: `fit` and
# `simulate --torch expandable_segments:True` beside `simulate` under the defaults on the same
# trace. Time linear in the trace grows 4x from N to 4N; squared, 16x. Best of three, seconds,
# with the most memory of the best run.
# Usage: scripts/bench.sh hostile[:N]  (default 8000)
set -euo pipefail
n=${1:-8000}
cargo build --release --quiet --example forge_trace -p gpushim
cargo build --release --quiet -p gpushim
g=target/release/gpushim
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
best() { # COMMAND...: "seconds KB" of the best of three
  local b=999999 m=0 s
  for _ in 1 2 3; do
    /usr/bin/time -f "%e %M" -o "$dir/t" "$@" >/dev/null 2>&1 || true
    read -r s k < <(tail -1 "$dir/t")
    if awk -v a="$s" -v b="$b" 'BEGIN { exit !(a < b) }'; then b=$s; m=$k; fi
  done
  echo "$b $m"
}
printf "%-48s %8s %10s %8s %10s %7s\n" "command (expandable worst case)" "N s" "N KB" "4N s" "4N KB" "ratio"
for n4 in "$n"; do
  target/release/examples/forge_trace expandable "$n" "$dir/a.trace"
  target/release/examples/forge_trace expandable "$((4 * n))" "$dir/b.trace"
  for cmd in "fit --at 1" "simulate --torch expandable_segments:True" "simulate --torch ''"; do
    read -r sa ka < <(eval best "$g" $cmd "$dir/a.trace")
    read -r sb kb < <(eval best "$g" $cmd "$dir/b.trace")
    printf "%-48s %8.2f %10s %8.2f %10s %7.1f\n" "$cmd" "$sa" "$ka" "$sb" "$kb" \
      "$(awk -v a="$sa" -v b="$sb" 'BEGIN { print (a > 0 ? b / a : 0) }')"
  done
done
echo "(N = $n: $(stat -c %s "$dir/a.trace") bytes; 4N: $(stat -c %s "$dir/b.trace") bytes)"
