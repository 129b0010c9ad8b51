#!/usr/bin/env bash
# IPC attacks between two real processes (freed handles, forged tickets, 1100 opens), pool on and off.
# The GPU machine's checks of what an adversary found that need real CUDA: the IPC
# client's attacks (tests/clients/ipc.c) between two real processes, under the pool and
# without it: handles of freed blocks, altered tickets, a table opened to others, more than
# 1024 opens, and a peer without the shim. Prints one table.
set -euo pipefail
shim="$GPUSHIM_LIB"
work=$GPUSHIM_CLIENTS
export GPUSHIM_TRACE=off
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
