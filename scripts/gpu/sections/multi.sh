#!/usr/bin/env bash
# several GPUs and processes: IPC, DDP under NCCL, limits, a shared GPU (two GPUs).
# Many GPUs, many processes, on the GPU machine kind nvidia-h200-x2. Sections:
#   ipc    two processes exchanging pooled memory through legacy CUDA IPC (tests/clients/ipc.c on
#          real CUDA: the peer under the shim, and without it), and torch.multiprocessing
#          sharing CUDA tensors, with and without the shim;
#   ddp    `gpushim run -- torchrun --nproc_per_node=2` DDP training (NCCL) in each policy, loss
#          curves against the run without the shim, one trace per rank (%r), NCCL's legacy IPC
#          path (NCCL_CUMEM_ENABLE=0) over pooled buffers, and the reports over the set;
#   limit  limit:6GiB per process: two ranks filling their GPUs at once, then two processes
#          filling one GPU at once; what cudaMemGetInfo showed each;
#   share  two training processes on one GPU: neither, both, or one of them under the shim.
#   ab     DDP step time without the shim, with pool:off and with pool:caching, alternated.
# Usage: bash scripts/gpu.sh multi[:ipc,ddp,ab,limit,share]      (no argument: all)
set -uo pipefail
lib="$GPUSHIM_LIB" cmd="$GPUSHIM_BIN"
work=${GPUSHIM_WORK:-/tmp/gpushim-multi}
sections=${*:-ipc ddp ab limit share}
want() { [[ " $sections " == *" $1 "* ]]; }
mkdir -p "$work"
result() { grep -h '^RESULT ' "$@" | sed 's/^RESULT //'; }

if want ipc; then
  echo
  echo "== ipc: three 4 MiB blocks carved from one freed 32 MiB allocation, exported, checked and written by a peer process"
  rm -rf "$work/ipc" && mkdir -p "$work/ipc"
  line() { tr '\n' ' ' | sed 's/ *$//'; }
  echo "no shim:                          $("$GPUSHIM_CLIENTS/ipc" 2>&1 | line)"
  for conf in pool:off pool:caching; do
    echo "shim $conf, peer under the shim:   $(LD_PRELOAD="$lib" GPUSHIM_CONF=$conf GPUSHIM_TRACE="$work/ipc/c-${conf#pool:}-%p.trace" "$GPUSHIM_CLIENTS/ipc" 2>&1 | line)"
    echo "shim $conf, peer without the shim: $(LD_PRELOAD="$lib" GPUSHIM_CONF=$conf GPUSHIM_TRACE=off "$GPUSHIM_CLIENTS/ipc" --plain-peer 2>&1 | line)"
  done
  echo
  echo "== ipc: torch.multiprocessing shares 5 CUDA tensors (PyTorch's caching allocator on top of the pool)"
  echo "no shim:           $(python3 scripts/gpu/torch_ipc.py 2>"$work/ipc/torch-base.err" | result - || tail -3 "$work/ipc/torch-base.err")"
  out=$("$cmd" run --conf pool:caching --trace "$work/ipc/torch-%p.trace" -- python3 scripts/gpu/torch_ipc.py 2>"$work/ipc/torch-shim.err")
  echo "shim pool:caching: $(echo "$out" | result - || tail -3 "$work/ipc/torch-shim.err")"
  for t in "$work"/ipc/torch-*.trace; do
    ev=$("$cmd" events "$t" 2>/dev/null)
    echo "  $(basename "$t"): ipc_export $(grep -c ipc_export <<<"$ev"), ipc_open $(grep -c ipc_open <<<"$ev"), ipc_close $(grep -c ipc_close <<<"$ev")"
  done
fi

if want ddp; then
  echo
  echo "== ddp: torchrun --standalone --nproc_per_node=2 scripts/gpu/ddp_train.py MODE 30 (NCCL)"
  rm -rf "$work/ddp" && mkdir -p "$work/ddp"
  ddp() {  # label conf mode leak_mib [env...]
    local label=$1 conf=$2 mode=$3 leak=$4; shift 4
    local launch=(torchrun --standalone --nproc_per_node=2 scripts/gpu/ddp_train.py "$mode" 30 "$leak")
    if [ "$conf" = none ]; then
      env "$@" "${launch[@]}" >"$work/ddp/$label.out" 2>"$work/ddp/$label.err"
    else
      env "$@" "$cmd" run --conf "$conf" --trace "$work/ddp/$label-%r.trace" -- "${launch[@]}" \
        >"$work/ddp/$label.out" 2>"$work/ddp/$label.err"
    fi
    echo "$label $? $conf $mode $leak $*" >>"$work/ddp/runs"
  }
  ddp baseline none default 0
  ddp baseline-again none default 0
  ddp off pool:off default 0
  ddp caching pool:caching default 0
  ddp expandable pool:expandable default 0
  ddp nocache-caching pool:caching nocache 0
  ddp nccl-legacy-ipc pool:caching nocache 0 NCCL_CUMEM_ENABLE=0
  ddp leak pool:caching,stacks:on nocache 4
  python3 scripts/gpu/multi_report.py ddp "$work/ddp"
  echo
  echo "-- gpushim run's own lines (caching):"
  grep '^gpushim:' "$work/ddp/caching.err" | head -8
  echo
  echo "-- gpushim summary over the two ranks of 'caching' (combined part):"
  "$cmd" summary "$work"/ddp/caching-*.trace | awk '/^all|combined|together/{p=1} p' | head -20
  echo
  echo "-- NCCL's buffers in rank 0's trace (VMM calls and cudaMalloc-family calls by API):"
  for label in caching nccl-legacy-ipc; do
    echo "  $label:"
    "$cmd" summary --json "$work/ddp/$label-0.trace" | python3 scripts/gpu/multi_report.py apis
    ev=$("$cmd" events "$work/ddp/$label-0.trace" 2>/dev/null)
    echo "    ipc_export $(grep -c ipc_export <<<"$ev"), ipc_open $(grep -c ipc_open <<<"$ev")"
  done
  echo
  echo "-- gpushim peak --top 3 over the two ranks of 'nocache-caching' (combined part):"
  "$cmd" peak --top 3 "$work"/ddp/nocache-caching-*.trace | awk '/^all .* traces together/{p=1} p'
  echo
  echo "-- gpushim leaks over the two ranks of 'leak' (4 MiB kept per step per rank):"
  "$cmd" leaks "$work"/ddp/leak-*.trace | awk '/^iterations|grows|^all .* traces together/' | head -12
  echo
  echo "-- one timeline of the two ranks of 'leak': gpushim plot ... -o ddp-leak.png; export --format perfetto"
  "$cmd" plot "$work"/ddp/leak-*.trace -o "$work/ddp/ddp-leak.png"
  "$cmd" export --format perfetto "$work"/ddp/leak-*.trace -o "$work/ddp/ddp-leak.json"
fi

if want ab; then
  echo
  # AB_TRACE=1: the shim records (one trace per rank); otherwise GPUSHIM_TRACE=off.
  trace=off; [ "${AB_TRACE:-0}" = 1 ] && trace="$work/ab/%r-%p.trace"
  echo "== ab: DDP step time, the three set-ups alternated over 3 rounds (torchrun ... ddp_train.py default 40; GPUSHIM_TRACE=$trace)"
  rm -rf "$work/ab" && mkdir -p "$work/ab"
  for round in 1 2 3; do
    for conf in none pool:off pool:caching; do
      launch=(torchrun --standalone --nproc_per_node=2 scripts/gpu/ddp_train.py default 40 0)
      if [ "$conf" = none ]; then "${launch[@]}"; else LD_PRELOAD="$lib" GPUSHIM_CONF=$conf GPUSHIM_TRACE="$trace" "${launch[@]}"; fi \
        >"$work/ab/${conf#pool:}-$round.out" 2>/dev/null
    done
  done
  python3 scripts/gpu/multi_report.py ab "$work/ab"
fi

if want limit; then
  echo
  echo "== limit: GPUSHIM_CONF=pool:caching,limit:6GiB; each process fills its GPU with 256 MiB tensors until out of memory"
  rm -rf "$work/limit" && mkdir -p "$work/limit"
  "$cmd" run --conf pool:caching,limit:6GiB --trace "$work/limit/ranks-%r.trace" -- \
    torchrun --standalone --nproc_per_node=2 scripts/gpu/limit_rank.py >"$work/limit/ranks.out" 2>"$work/limit/ranks.err"
  echo "two ranks, one GPU each (exit $?):"
  result "$work/limit/ranks.out" | sed 's/^/  /'
  for i in 0 1; do
    CUDA_VISIBLE_DEVICES=0 RANK=$i LD_PRELOAD="$lib" GPUSHIM_CONF=pool:caching,limit:6GiB \
      GPUSHIM_TRACE="$work/limit/shared-$i.trace" python3 scripts/gpu/limit_rank.py >"$work/limit/shared-$i.out" 2>&1 &
  done
  wait
  echo "two processes on GPU 0 at once:"
  result "$work"/limit/shared-*.out | sed 's/^/  /'
  echo "gpushim oom over the two shared-GPU traces:"
  "$cmd" oom "$work"/limit/shared-*.trace | grep -E 'failed|limit' | head -6 | sed 's/^/  /'
fi

if want share; then
  echo
  echo "== share: two scripts/gpu/train_bench.py default 40 on GPU 0 at once (median ms/step of steps 5-39, last loss)"
  rm -rf "$work/share" && mkdir -p "$work/share"
  pair() {  # label shimA shimB
    local label=$1
    for i in 0 1; do
      local s=$2; [ $i = 1 ] && s=$3
      if [ "$s" = shim ]; then
        CUDA_VISIBLE_DEVICES=0 LD_PRELOAD="$lib" GPUSHIM_CONF=pool:caching GPUSHIM_TRACE="$work/share/$label-$i.trace" \
          python3 scripts/gpu/train_bench.py default 40 >"$work/share/$label-$i.out" 2>&1 &
      else
        CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/train_bench.py default 40 >"$work/share/$label-$i.out" 2>&1 &
      fi
    done
    wait
    for i in 0 1; do
      local s=$2; [ $i = 1 ] && s=$3
      printf "  %-22s process %d (%-7s) %s\n" "$label" $i "$s" "$(python3 scripts/gpu/multi_report.py step "$work/share/$label-$i.out")"
    done
  }
  CUDA_VISIBLE_DEVICES=0 python3 scripts/gpu/train_bench.py default 40 >"$work/share/alone.out" 2>&1
  echo "  alone, no shim: $(python3 scripts/gpu/multi_report.py step "$work/share/alone.out")"
  pair neither none none
  pair both shim shim
  pair one shim none
  echo "  traces of 'both':"
  "$cmd" summary "$work"/share/both-*.trace | grep -E '^combined|records lost|^  sum'
fi
