#!/usr/bin/env bash
# decoding speed and memory of gpushim summary on 10 and 100 million events.
# Decoding speed and memory of `gpushim summary` on synthetic traces of 10 and 100 million
# events (examples/make_trace.rs: a sliding window of 4096 live blocks on 8 streams), in one
# table. Needs about 3.5 GB of free disk in $TMPDIR. Usage: scripts/bench.sh summary
set -euo pipefail
cargo build --release --quiet -p gpushim --example make_trace
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) cores, $(date -u +%F)"
printf "%-14s %10s %14s %12s\n" events seconds "events/s" "max RSS"
for n in 10000000 100000000; do
  target/release/examples/make_trace "$dir/t.trace" "$n" >/dev/null
  /usr/bin/time -f "%e %M" -o "$dir/time" target/release/gpushim summary "$dir/t.trace" >/dev/null
  read -r secs kib < "$dir/time"
  printf "%-14s %10s %14.1fM %9s MiB\n" "$n" "$secs" "$(echo "$n / $secs / 1000000" | bc -l)" "$((kib / 1024))"
  rm -f "$dir/t.trace"
done
