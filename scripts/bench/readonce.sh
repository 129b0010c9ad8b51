#!/usr/bin/env bash
# each report's time and memory on a trace at the default cap, beside reading the file once.
# One program (tests/clients/long_run.c on the simulator: 48 blocks of 256 KiB allocated and
# freed a step from one line, 4 KiB kept every 1000 steps, a 512 MiB spike at three quarters, a failed
# 1 TiB request at the end) fills a trace of trace_max CAP (default 2GiB) without lapping its
# ring; then, in the same run, the time to read the file once (`cat > /dev/null`, the file in
# the page cache), the reader's alone, and each report's time (each the best of three runs), peak
# memory (max RSS), and how many times it opened the
# trace and read it through (as the command counts them, GPUSHIM_READS=1). Then the same trace
# saved as a host's analysis (`analyze`) and the job's summary from the saved file. The goal
# (docs/limits.md says how far it is): every report within 3x the read, memory growing with the
# live set and the stacks, never with the file.
# The page and `analyze` read by up to five groups of trackers, each on a thread of its own,
# where the machine has three cores or more (one core for the decoder, one a group), two on
# two cores: each is
# also timed with two groups (GPUSHIM_READ_SPLIT=2) and with one (GPUSHIM_READ_SPLIT=0), in
# the same run.
# Usage: scripts/bench.sh readonce[:CAP,STEPS,PROGRAM]  (default 2GiB and 200000 steps, about 1.5 GB of records in a
# 2 GiB file: a few minutes to make, then the reports; 2 GB of disk in $TMPDIR).
# PROGRAM `model` writes the trace with the kinds program on the PyTorch stand-in instead
# (tests/clients/kinds/train.py: the framework's tensors, forward, backward and optimizer
# phases, Python frames on every tensor, a cuBLAS workspace kept to the end: a model's records,
# which cost the reports more each than the loop's); STEPS then defaults to 1000000 (1.88 GB).
# GPUSHIM_BEFORE=PATH: each report also alternated with another build (see the end).
# Without cargo (a machine with more cores): GPUSHIM_PREBUILT=DIR holding gpushim,
# libgpushim.so and read_only, built elsewhere (target/release/, target/release/examples/).
set -euo pipefail
cap=${1:-2GiB}
program=${3:-loop}
case $program in
  loop) steps=${2:-200000} ;;
  model) steps=${2:-1000000} ;;
  *) echo "readonce: PROGRAM is loop or model, not '$program'" >&2; exit 2 ;;
esac
source scripts/sim-env.sh
bench_binaries
t=$dir/long.trace
if [ "$program" = model ]; then
  /usr/bin/time -f "%e" -o "$dir/run.time" env LD_LIBRARY_PATH="$sim" LD_PRELOAD="$shim" \
    GPUSHIM_CONF="trace_max:$cap" GPUSHIM_TRACE="$t" PYTHONDONTWRITEBYTECODE=1 \
    python3 tests/clients/kinds/train.py "$sim/torch/lib/libtorch_cpu.so" \
    "$sim/torch/lib/libc10_cuda.so" "$steps" >"$dir/run.out" 2>&1
else
  /usr/bin/time -f "%e" -o "$dir/run.time" env LD_LIBRARY_PATH="$sim" LD_PRELOAD="$shim" \
    GPUSHIM_CONF="trace_max:$cap" GPUSHIM_TRACE="$t" "$sim/long_run" "$steps" 1000 >"$dir/run.out" 2>&1
fi
summarized=$("$gpushim" summary --json "$t" | python3 -c 'import json,sys; print(json.load(sys.stdin)["health"]["summarized"])')
records=$("$gpushim" summary --json "$t" | python3 -c 'import json,sys; print(json.load(sys.stdin)["health"]["committed"])')
echo "machine: $(nproc) cores, $(date -u +%F); the $program program, trace_max $cap, $steps steps in $(cat "$dir/run.time") s"
echo "trace: $(stat -c %s "$t") bytes, $records records, $summarized summarized (0: the ring never lapped)"
cat "$t" >/dev/null # into the page cache
read_s=999999
for _ in 1 2 3; do
  /usr/bin/time -f "%e %M" -o "$dir/cat.time" cat "$t" >/dev/null
  read -r c _ < "$dir/cat.time"
  read_s=$(awk -v a="$c" -v b="$read_s" 'BEGIN { print (a < b ? a : b) }')
done
printf "%-10s %10s %10s %10s %13s %8s %8s %8s\n" report seconds "x read" "max RSS" "opens/passes" "records" "decode" "busiest"
printf "%-10s %10.2f %10s %10s %13s %8s %8s %8s\n" "cat" "$read_s" "1.0" "-" "1/1" "1.00x" "-" "-"
one() { # NAME [PROGRAM] ARGS...: its time, memory and reads (opened, passes begun, the records decoded
  # as a multiple of the trace's: a pass that reads only the first part counts for that part); PROGRAM, a path, in place of gpushim
  local name=$1; shift
  local bin=$gpushim
  if [ "${1#/}" != "$1" ]; then bin=$1; shift; fi
  # The best of three runs (a shared machine's noise is all upward), its memory the most any took.
  local s=999999 kib=0 s1 kib1
  for _ in 1 2 3; do
    GPUSHIM_READS=1 /usr/bin/time -f "%e %M" -o "$dir/$name.time" "$bin" "$@" >/dev/null 2>"$dir/$name.err" || true
    read -r s1 kib1 < "$dir/$name.time"
    s=$(awk -v a="$s1" -v b="$s" 'BEGIN { print (a < b ? a : b) }')
    kib=$((kib1 > kib ? kib1 : kib))
  done
  reads=$(sed -n 's/^gpushim: opened \([0-9]*\) trace file(s), read \([0-9]*\) pass(es): .*$/\1\/\2/p' "$dir/$name.err")
  times=$(sed -n 's/^gpushim: opened .*: \([0-9.]*\) times their records$/\1x/p' "$dir/$name.err")
  # The last run's CPU seconds: its decoding threads (every pass), and the first pass's busiest
  # thread of trackers (near the report's time: the trackers are what it waited for).
  decode=$(sed -n 's/^gpushim: first pass .*decoding \([0-9.]*\) s.*$/\1/p' "$dir/$name.err")
  busiest=$(sed -n 's/^gpushim: first pass .*busiest thread \([0-9.]*\) s.*$/\1/p' "$dir/$name.err")
  printf "%-10s %10.2f %10.1f %7s MiB %13s %8s %8s %8s\n" "$name" "$s" "$(awk -v a="$s" -v b="$read_s" 'BEGIN { print a / b }')" "$((kib / 1024))" "${reads:--}" "${times:--}" "${decode:--}" "${busiest:--}"
}
# The reader alone (examples/read_only.rs): decoded, ordered, handed on, nothing more.
one reader "$reader" "$t"
for r in summary peak leaks oom; do one "$r" "$r" "$t"; done
one report report "$t" -o "$dir/page.html"
one "report-2" /usr/bin/env GPUSHIM_READ_SPLIT=2 "$gpushim" report "$t" -o "$dir/page2.html"
one "report-1" /usr/bin/env GPUSHIM_READ_SPLIT=0 "$gpushim" report "$t" -o "$dir/page1.html"
one analyze analyze "$t" -o "$dir/host.analysis"
one "analyze-2" /usr/bin/env GPUSHIM_READ_SPLIT=2 "$gpushim" analyze "$t" -o "$dir/host2.analysis"
one "analyze-1" /usr/bin/env GPUSHIM_READ_SPLIT=0 "$gpushim" analyze "$t" -o "$dir/host1.analysis"
for n in 1 2; do
  cmp -s "$dir/page.html" "$dir/page$n.html" && cmp -s "$dir/host.analysis" "$dir/host$n.analysis" \
    || echo "the page or the analysis read by $n group(s) of trackers differs from the default's"
done
one "summary*" summary "$dir/host.analysis"
# The pictures and the export that holds the run's history, and a refresh of `top`: bounded
# memory however long the trace.
one top top "$t" --count 1
one plot plot "$t" -o "$dir/kinds.svg"
one plot-total plot --by total "$t" -o "$dir/total.svg"
one memory-viz export --format memory-viz "$t" -o "$dir/snapshot.pickle"
rm -f "$dir/snapshot.pickle"
one events events "$t"
# What fits (the model program's trace: PyTorch's requests, held for the replays of its
# allocator): its memory grows with the requests the trace holds (docs/limits.md).
if [ "$program" = model ]; then one fit fit "$t" --at 8; fi
echo "(report-N, analyze-N: their trackers in N groups, GPUSHIM_READ_SPLIT=0 or 2; by default one a report, up to five, where $(nproc) cores allow: one for the decoder, one a group; two on two cores)"
echo "(summary*: the job's summary from the saved analysis, $(stat -c %s "$dir/host.analysis") bytes)"
echo "(top: one refresh; plot: by kind; plot-total: --by total; memory-viz: its newest 100,000 events a device; events: every record as CSV, to /dev/null; fit: at 2x, 4x and 8x the batch and the largest that fits, the model program's trace only)"
echo "(decode, busiest: CPU seconds of the decoding threads, every pass, and of the first pass's busiest thread of trackers, the last run's)"
# GPUSHIM_BEFORE=PATH: another build of the command (or a script running one) read the same
# trace, each report alternated with this build's, A B A B, five times each; the medians.
if [ -n "${GPUSHIM_BEFORE:-}" ]; then
  echo
  echo "this build beside $GPUSHIM_BEFORE on the same trace, alternated five times (median seconds):"
  printf "%-10s %10s %10s\n" report this before
  median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  for r in summary peak leaks oom report; do
    : > "$dir/ab.this"; : > "$dir/ab.before"
    for _ in 1 2 3 4 5; do
      for side in this before; do
        bin=$gpushim; [ "$side" = before ] && bin=$GPUSHIM_BEFORE
        if [ "$r" = report ]; then args=(report "$t" -o "$dir/ab.html"); else args=("$r" "$t"); fi
        /usr/bin/time -f "%e" -o "$dir/ab.time" "$bin" "${args[@]}" >/dev/null 2>&1 || true
        tail -1 "$dir/ab.time" >> "$dir/ab.$side"
      done
    done
    printf "%-10s %10s %10s\n" "$r" "$(median < "$dir/ab.this")" "$(median < "$dir/ab.before")"
  done
fi
