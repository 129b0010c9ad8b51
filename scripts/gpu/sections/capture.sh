#!/usr/bin/env bash
# the pool never breaks a program: capture rules, OOM, graphs and resets, each the same as without the shim.
# The GPU machine's checks that the pool never breaks a program: the capture client
# (tests/clients/capture.c) on real CUDA without the shim and under it in every pool mode, each
# scenario's lines compared with the run without the shim (table: every capture rule; oom;
# graph; graphmem, stream-ordered memory captured on a created stream through the CUDA 10.0
# entry point and on the per-thread default stream; nocontext, a thread with no context
# allocating during another's capture; reset, cudaDeviceReset with blocks cached; release, the
# pool's frees while another thread begins captures; race, cudaMalloc and cudaFree on one thread
# while another begins and ends thread-local captures, also at a pool limit); what cuCtxRecordEvent covers and costs
# (scripts/gpu/ctx_event_probe.cu, the pool's checkpoint); then the NVML check that memory given
# back reaches another process (scripts/gpu/giveback.py). Prints tables. PyTorch's own tests are run separately
# (docs/gpu-checks.md).
# `capture:race`: only the race, in every mode, without the probes after the table (the race
# itself takes minutes on an H100: 20,000 captures beside a thread whose cudaFree waits for the
# device; one run of the whole section took 469 s there).
set -euo pipefail
work=$(mktemp -d)
only=${1:-}
scenarios=("" oom graph graphmem nocontext reset release race)
[ "$only" = race ] && scenarios=(race)
for what in "${scenarios[@]}"; do $GPUSHIM_CLIENTS/capture $what > $work/plain${what:+-$what}.txt; done
printf '%-30s' mode; for what in "${scenarios[@]}"; do printf '%-10s' "${what:-table}"; done; echo
# The last two rows: the pool at a 64 MiB limit, race only (the other scenarios ask for more
# than 64 MiB, which a limit refuses by design), so the race (one thread allocating and
# freeing with cudaFree while another begins and ends captures) runs out of room during
# captures and the pool must give its empty segments back in relaxed capture mode, as CUDA
# would serve.
for conf in pool:off pool:caching pool:expandable pool:caching,limit:64MiB pool:expandable,limit:64MiB; do
  row=("$conf")
  for what in "${scenarios[@]}"; do
    if [[ $conf == *limit* && $what != race ]]; then row+=(-); continue; fi
    GPUSHIM_TRACE=off GPUSHIM_CONF=$conf LD_PRELOAD=$GPUSHIM_LIB $GPUSHIM_CLIENTS/capture $what > $work/shim.txt
    if cmp -s $work/shim.txt $work/plain${what:+-$what}.txt; then row+=(same); else row+=(DIFFERENT); diff $work/plain${what:+-$what}.txt $work/shim.txt | sed "s/^/$conf $what: /" | head -8 >&2 || true; fi
  done
  printf '%-30s' "${row[0]}"; printf '%-10s' "${row[@]:1}"; echo
done
if [ "$only" = race ]; then cat $work/plain-race.txt; exit 0; fi
echo "without the shim: $(grep -c . $work/plain.txt) lines"
for what in "${scenarios[@]:1}"; do cat $work/plain-$what.txt; done
# The simulator's answers (tests/capture.rs checks them against the same rules), carried in
# .gpu/capture-sim.txt by whoever built .gpu: real CUDA must print the same lines.
if [ -f .gpu/capture-sim.txt ]; then
  if cmp -s .gpu/capture-sim.txt $work/plain.txt; then echo "simulator vs real CUDA: same $(grep -c . $work/plain.txt) lines"
  else echo "simulator vs real CUDA: DIFFERENT"; diff .gpu/capture-sim.txt $work/plain.txt || true; fi
fi
# The checkpoint's one event for the whole context (cuCtxRecordEvent): what it covers, costs
# and does during a capture (docs/cuda-facts.md).
nvcc -o $work/ctx_event_probe scripts/gpu/ctx_event_probe.cu -lcuda && $work/ctx_event_probe
mkdir -p "${OUT:-/tmp}/capture" && cp $work/*.txt "${OUT:-/tmp}/capture/"
python3 scripts/gpu/giveback.py run
