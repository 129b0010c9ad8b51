#!/usr/bin/env bash
# the recorder: one record's cost, records per second from many threads, bytes per event.
# The recorder's benchmarks, printed as one table: one record from one thread
# (criterion, and a 50-million-record steady run), records per second from N producer threads
# (default: every core, at least 16), and bytes per event. Uses prebuilt binaries in .gpu/ when
# there (the GPU machine has no Rust toolchain), else builds them.
set -euo pipefail
threads=${GPUSHIM_BENCH_THREADS:-$(( $(nproc) > 16 ? $(nproc) : 16 ))}
if [ -x .gpu/recorder-bench ] && [ -x .gpu/recorder_steady ]; then
  bench=.gpu/recorder-bench steady=.gpu/recorder_steady
else
  cargo build --release --quiet --example recorder_steady
  bench=$(cargo bench --bench recorder --no-run --message-format=json 2>/dev/null \
    | python3 -c "import json,sys; print([j['executable'] for j in map(json.loads, sys.stdin) if j.get('executable') and 'recorder' in j['target']['name']][0])")
  steady=target/release/examples/recorder_steady
fi
out=$(mktemp)
GPUSHIM_BENCH_THREADS=$threads "$bench" --bench --noplot 2>&1 | tee "$out" >/dev/null
st=$("$steady" 50000000)
one=$(grep -A1 "^record, one thread" "$out" | grep -o "time: *\[[^]]*\]" | head -1)
stack=$(grep -A1 "^record with a stack" "$out" | grep -o "time: *\[[^]]*\]" | head -1)
many=$(grep -A2 "producer threads" "$out" | grep -o "thrpt: *\[[^]]*\]" | head -1)
echo "machine: $(nproc) cores, $(uname -r); $(date -u +%F)"
printf '%-58s %-40s %s\n' "benchmark" "measured" "target"
printf '%-58s %-40s %s\n' "one record, no stack, clock read included (criterion)" "${one#time: }" "<= 50 ns median"
printf '%-58s %-40s %s\n' "one record, steady 50M-record run" "$(echo "$st" | sed 's/.*one record (clock included): \([0-9.]* ns\).*/\1/')" "<= 50 ns"
printf '%-58s %-40s %s\n' "one record with a stack seen before (criterion)" "${stack#time: }" "<= 1 us median"
printf '%-58s %-40s %s\n' "clock read alone (CLOCK_MONOTONIC, vDSO)" "$(echo "$st" | sed 's/clock read: \([0-9.]* ns\).*/\1/')" "-"
printf '%-58s %-40s %s\n' "$threads producer threads, records/s in aggregate (criterion)" "${many#thrpt: }" ">= 50 M/s, none lost"
printf '%-58s %-40s %s\n' "trace bytes per event" "32 (fixed record size)" "<= 32"
rm -f "$out"
