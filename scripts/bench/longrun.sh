#!/usr/bin/env bash
# a run of any length: 10^8 events on the simulator, bounded trace against a whole one.
# One program (tests/clients/long_run.c: 48 blocks of 256 KiB allocated and freed a step, 4 KiB
# kept every LEAK_EVERY steps, a 512 MiB spike at three quarters, a failed 1 TiB request at the
# end) run twice under the shim with native stacks, at once: trace_max 64 MiB (a ring and its
# checkpoints) and 16 GiB (room for every record). Prints the size of each trace, the time
# `gpushim leaks` takes on it, and whether leaks, peak, oom and summary answer the same (times
# aside). Usage: scripts/bench.sh longrun[:STEPS,LEAK_EVERY]  (default 1030000 steps, about
# 10^8 events, and 1000: about 8 minutes on two cores, 8 GB of disk in $TMPDIR).
set -euo pipefail
steps=${1:-1030000}
every=${2:-1000}
source scripts/sim-env.sh
bench_binaries
run() { # NAME TRACE_MAX
  /usr/bin/time -f "%e %M" -o "$dir/$1.time" env LD_LIBRARY_PATH="$sim" LD_PRELOAD="$shim" \
    GPUSHIM_CONF="stacks:native,trace_max:$2" GPUSHIM_TRACE="$dir/$1.trace" \
    "$sim/long_run" "$steps" "$every" >"$dir/$1.out" 2>&1
}
run bounded 64MiB &
run whole 16GiB &
wait
# What each report must answer the same from both traces: times aside (the runs differ), and
# of leaks the live set and what grows by how much per iteration (how many boundaries each
# trace samples differs: the bounded one keeps a thinned series).
strip_times() { python3 -c '
import json, sys
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if not k.endswith("time_ns") and k not in ("path", "pid", "health", "duration_ns", "events")}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
v = json.load(sys.stdin)
if sys.argv[1] == "leaks":
    it = v.get("iterations") or {}
    v = {"live_at_exit": v["live_at_exit"], "boundary": it.get("boundary"),
         "growing": [(g["call_site"], g["bytes_per_iteration"]) for g in it.get("growing", [])]}
print(json.dumps(strip(v), sort_keys=True))' "$1"; }
echo "machine: $(nproc) cores, $(date -u +%F); $steps steps, 4 KiB kept every $every"
printf "%-8s %12s %12s %10s %12s %12s\n" trace "file bytes" "on disk" "run s" "leaks s" "leaks RSS"
for t in bounded whole; do
  /usr/bin/time -f "%e %M" -o "$dir/$t.leaks.time" "$gpushim" leaks "$dir/$t.trace" >"$dir/$t.leaks"
  read -r rs _ < "$dir/$t.time"
  read -r ls lk < "$dir/$t.leaks.time"
  printf "%-8s %12s %12s %10s %12s %9s MiB\n" "$t" "$(stat -c %s "$dir/$t.trace")" \
    "$(du -h "$dir/$t.trace" | cut -f1)" "$rs" "$ls" "$((lk / 1024))"
done
events=$("$gpushim" summary --json "$dir/whole.trace" | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"])')
echo "events in the whole trace: $events"
same=0
for r in leaks peak oom summary; do
  a=$("$gpushim" "$r" --json "$dir/whole.trace" | strip_times "$r")
  b=$("$gpushim" "$r" --json "$dir/bounded.trace" | strip_times "$r")
  if [ "$a" = "$b" ]; then echo "$r: the same"; same=$((same + 1)); else echo "$r: DIFFERS"; diff <(echo "$a" | python3 -m json.tool) <(echo "$b" | python3 -m json.tool) | head -20; fi
done
"$gpushim" summary "$dir/bounded.trace" | tail -2
echo "$same of 4 reports the same"
