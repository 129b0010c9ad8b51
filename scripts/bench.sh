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
source scripts/sections.sh
[ $# -gt 0 ] || { list_sections "$here" scripts/bench.sh; exit 0; }
check_sections "$here" scripts/bench.sh "$@"
echo "host: $(nproc) cores, $(uname -m); $(date -u +%F)"
run_sections "$here" "$@"
