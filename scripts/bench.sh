#!/usr/bin/env bash
# The benchmarks, one entry: each named section (scripts/bench/NAME.sh) prints its figures
# beside the baseline it measured in the same run; then one table of what ran. Most run on the
# simulator (no GPU); `recorder` also runs on the GPU machine from prebuilt binaries in .gpu/.
#   bash scripts/bench.sh                     the sections and what each measures
#   bash scripts/bench.sh pool stacks         run these sections
#   bash scripts/bench.sh stacks:python3.12   a section with its arguments (comma-separated)
set -euo pipefail
cd "$(dirname "$0")/.."
here=scripts/bench
what() { sed -n '2s/^# //p' "$here/$1.sh"; }
if [ $# -eq 0 ]; then
  echo "usage: bash scripts/bench.sh SECTION[:ARG,...] ..."
  for f in "$here"/*.sh; do n=$(basename "$f" .sh); printf '  %-9s %s\n' "$n" "$(what "$n")"; done
  exit 0
fi
for s in "$@"; do
  [ -f "$here/${s%%:*}.sh" ] || { echo "no section '${s%%:*}': run bash scripts/bench.sh for the list" >&2; exit 2; }
done
echo "host: $(nproc) cores, $(uname -m); $(date -u +%F)"
rows=()
for s in "$@"; do
  name=${s%%:*}; args=()
  [ "$s" != "$name" ] && IFS=, read -r -a args <<< "${s#*:}"
  echo; echo "=== $name: $(what "$name")"
  start=$SECONDS
  if bash "$here/$name.sh" "${args[@]}"; then result=ok; else result="failed ($?)"; fi
  rows+=("| $name | $(what "$name") | $result | $((SECONDS - start)) |")
done
echo
echo "| section | what it measures | result | seconds |"
echo "|---|---|---|---:|"
printf '%s\n' "${rows[@]}"
