#!/usr/bin/env bash
# Every report's output from two builds of the command, side by side: for a change that must
# change no answer (a refactor), run it with the build from before and the build from after.
#   scripts/same-output.sh OLD_GPUSHIM NEW_GPUSHIM
# Reads the real models' traces in tests/data/torch and traces of the stand-in programs made
# here on the simulator (with the release shim), runs each command on each trace with both
# builds, and prints one table: command, trace, same or differs. Exit status 1 when any differs.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
source scripts/sim-env.sh
kinds=tests/clients/kinds
torch_libs="$sim/torch/lib/libtorch_cpu.so $sim/torch/lib/libc10_cuda.so"
make_trace() { # name, then the program and its arguments
  local name=$1; shift
  LD_LIBRARY_PATH=$sim "$new" run --lib "$shim" --trace "$dir/$name.trace" -- "$@" >/dev/null 2>&1
}
make_trace train python3 $kinds/train.py $torch_libs 20
make_trace train-leak python3 $kinds/train.py $torch_libs 20 leak
make_trace leaks python3 $kinds/leaks.py $torch_libs
make_trace autocast python3 $kinds/autocast.py $torch_libs 6 amp
make_trace blocks python3 $kinds/blocks.py $torch_libs 6
traces=(tests/data/torch/*.trace "$dir"/*.trace)
mkdir -m 700 "$dir/old" "$dir/new"
commands=(
  "summary" "summary --json" "peak" "peak --json" "leaks" "leaks --json" "oom" "oom --json"
  "fit --at 4" "fit --at 4 --json" "fit --at 4 --batch 8:64" "fit --at 4 --with @T --with-at 8"
  "simulate --torch expandable_segments:True" "simulate --recommend" "diff @T" "events"
  "report -o @D/page.html" "plot -o @D/plot.svg" "flamegraph -o @D/flame.svg"
)
printf '%-44s %-28s %s\n' command trace result
status=0
for t in "${traces[@]}"; do
  for c in "${commands[@]}"; do
    args=${c//@T/$t}
    # A command that writes a file: its output is the file's bytes.
    # shellcheck disable=SC2086
    a=$("$old" ${args//@D/$dir/old} "$t" 2>&1; echo "exit $?"; cat "$dir"/old/* 2>/dev/null) || true
    # shellcheck disable=SC2086
    b=$("$new" ${args//@D/$dir/new} "$t" 2>&1; echo "exit $?"; cat "$dir"/new/* 2>/dev/null) || true
    a=${a//$dir\/old/@D} b=${b//$dir\/new/@D}
    rm -f "$dir"/old/* "$dir"/new/*
    result=same
    if [ "$a" != "$b" ]; then result=DIFFERS; status=1; fi
    printf '%-44s %-28s %s\n' "$c" "$(basename "$t")" "$result"
  done
done
exit $status
