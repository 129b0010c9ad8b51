#!/usr/bin/env bash
# The GPU machine's checks of what an adversary found that need real CUDA: the IPC
# client's attacks (tests/clients/ipc.c) between two real processes, under the pool and
# without it: handles of freed blocks, altered tickets, a table opened to others, more than
# 1024 opens, and a peer without the shim. Prints one table. Build and carry .gpu as for
# scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.gpu
[ -f $bin/libgpushim.so ] || { echo "carry .gpu (see scripts/gpu-check.sh)" >&2; exit 2; }
shim="$PWD/$bin/libgpushim.so"
cudart=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))")
driver=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
work=/tmp/gpushim-adversary && rm -rf $work && mkdir -p $work
ln -sf "$driver" $work/libcuda.so
LIBRARY_PATH=$work scripts/build-sim.sh $work --real "$cudart" >/dev/null
export LD_LIBRARY_PATH="$cudart" GPUSHIM_TRACE=off
echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(date -u +%F)"
printf '%-16s %-14s %s\n' check mode result
row() { printf '%-16s %-14s %s\n' "$1" "$2" "$(echo "$3" | tr '\n' ' ')"; }
for conf in pool:caching pool:off; do
  row stale "$conf" "$(GPUSHIM_CONF=$conf LD_PRELOAD=$shim $work/ipc stale 2>/dev/null)"
  row many-1100 "$conf" "$(GPUSHIM_CONF=$conf LD_PRELOAD=$shim $work/ipc many 1100 2>/dev/null)"
  row sharing "$conf" "$(GPUSHIM_CONF=$conf LD_PRELOAD=$shim $work/ipc 2>/dev/null)"
  row plain-peer "$conf" "$(GPUSHIM_CONF=$conf LD_PRELOAD=$shim $work/ipc --plain-peer 2>/dev/null)"
done
row forge pool:caching "$(GPUSHIM_CONF=pool:caching LD_PRELOAD=$shim $work/ipc forge 2>/dev/null)"
row perms pool:caching "$(GPUSHIM_CONF=pool:caching LD_PRELOAD=$shim $work/ipc perms 2>/dev/null)"
row stale "no shim" "$($work/ipc stale 2>/dev/null)"
row reload pool:off "$(GPUSHIM_CONF=pool:off LD_PRELOAD=$shim $work/reload 2>/dev/null || echo crashed)"
row reload "no shim" "$($work/reload 2>/dev/null || echo crashed)"
