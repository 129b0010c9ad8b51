#!/usr/bin/env bash
# whether the host's cores add up: one report alone against copies of it run at once, and the page's trackers in one to five groups.
# Splitting a report's work across cores pays only where a second busy core does not slow the
# first. This measures it on the machine at hand, in one run: a trace of the loop of
# tests/clients/long_run.c (STEPS steps on the simulator, default 50000: some 470 MB), then
#   - a pure CPU loop (awk, no memory to speak of) alone and as N copies at once;
#   - `gpushim summary` alone and as N copies at once (each its own process, decoder and
#     trackers: nothing shared but the machine);
#   - the page with its trackers in 1, 2, 3 and 5 groups (GPUSHIM_READ_SPLIT=0, 2, 3, 5:
#     threads of one process), with the CPU time of its busiest thread of trackers.
# Each figure is the best of three. "slowdown": the time of N copies at once over one alone
# (1.00: the cores add up; 2.00: N copies take twice as long as one, as if they shared a core).
# Usage: scripts/bench.sh scaling[:STEPS,COPIES]  (COPIES, default 4: the most copies run at once)
# Without cargo: GPUSHIM_PREBUILT=DIR holding gpushim, libgpushim.so and read_only built elsewhere.
set -euo pipefail
steps=${1:-50000}
most=${2:-4}
source scripts/sim-env.sh
bench_binaries
t=$dir/loop.trace
env LD_LIBRARY_PATH="$sim" LD_PRELOAD="$shim" GPUSHIM_CONF="trace_max:2GiB" \
  GPUSHIM_TRACE="$t" "$sim/long_run" "$steps" 1000 >"$dir/run.out" 2>&1
cat "$t" >/dev/null
echo "machine: $(nproc) cores ($(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1); $(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p') thread(s) a core); $(date -u +%F)"
echo "trace: $(stat -c %s "$t") bytes ($steps steps of the loop)"
best() { # COMMAND...: the best of three wall times, seconds
  local b=999999 s
  for _ in 1 2 3; do
    /usr/bin/time -f "%e" -o "$dir/best.time" bash -c "$1" >/dev/null 2>&1
    s=$(tail -1 "$dir/best.time")
    b=$(awk -v a="$s" -v b="$b" 'BEGIN { print (a < b ? a : b) }')
  done
  echo "$b"
}
copies() { # N COMMAND: N copies of COMMAND at once, waited for together
  local n=$1 c=$2 all="" i
  for i in $(seq "$n"); do all+="( $c ) & "; done
  echo "$all wait"
}
spin="awk 'BEGIN { for (i = 0; i < 4e7; i++) s += i * i }'"
summary="'$gpushim' summary --no-symbols '$t'"
printf "%-22s %8s" "work" "alone"
for n in $(seq 2 "$most"); do printf " %8s %9s" "x$n s" "slowdown"; done
echo
row() { # NAME COMMAND
  local one s
  one=$(best "$2")
  printf "%-22s %8.2f" "$1" "$one"
  for n in $(seq 2 "$most"); do
    s=$(best "$(copies "$n" "$2")")
    printf " %8.2f %9.2f" "$s" "$(awk -v a="$s" -v b="$one" 'BEGIN { print a / b }')"
  done
  echo
}
row "CPU loop (awk)" "$spin"
row "gpushim summary" "$summary"
echo
printf "%-22s %8s %12s %14s\n" "the page" "seconds" "groups" "busiest CPU s"
for split in 0 2 3 5; do
  s=999999 busy=-
  for _ in 1 2 3; do
    GPUSHIM_READS=1 GPUSHIM_READ_SPLIT=$split /usr/bin/time -f "%e" -o "$dir/page.time" \
      "$gpushim" report --no-symbols "$t" -o "$dir/page.html" >/dev/null 2>"$dir/page.err"
    s1=$(tail -1 "$dir/page.time")
    if awk -v a="$s1" -v b="$s" 'BEGIN { exit !(a < b) }'; then
      s=$s1
      busy=$(sed -n 's/^gpushim: first pass .*busiest thread \([0-9.]*\) s.*$/\1/p' "$dir/page.err")
    fi
  done
  groups=$((split > 0 ? split : 1))
  printf "%-22s %8.2f %12s %14s\n" "GPUSHIM_READ_SPLIT=$split" "$s" "$groups" "${busy:--}"
done
echo "(busiest CPU s: the CPU time of the page's busiest thread of trackers, in its best run)"
