#!/usr/bin/env bash
# Builds the GPU-less CUDA simulator (libcuda.so.1, libcudart.so.13) and the C test clients.
#   scripts/build-sim.sh OUTDIR            # simulator + clients linked against it
#   scripts/build-sim.sh OUTDIR --real DIR # clients only, linked against the real CUDA in DIR
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-sim.sh OUTDIR [--real CUDA_LIB_DIR]}
mkdir -p "$out"
out=$(cd "$out" && pwd)
CC=${CC:-cc}
inc="-I$here/tests/sim"
if [ "${2:-}" = "--real" ]; then
  libdir=${3:?--real needs the directory holding libcudart.so.13}
  link=(-L "$libdir" -l:libcudart.so.13 -lcuda -ldl -Wl,-rpath,"$libdir")
else
  $CC -shared -fPIC -O1 -Wall -Werror -o "$out/libcuda.so.1" -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic \
    "$here/tests/sim/cuda_sim.c" -lpthread
  $CC -shared -fPIC -O1 -Wall -Werror -o "$out/libcudart.so.13" -Wl,-soname,libcudart.so.13 -Wl,-Bsymbolic \
    -Wl,--version-script="$here/tests/sim/cudart.map" "$here/tests/sim/cudart_sim.c" -ldl -lpthread
  $CC -shared -fPIC -O1 -Wall -Werror -o "$out/libnvidia-ml.so.1" -Wl,-soname,libnvidia-ml.so.1 \
    "$here/tests/sim/nvml_sim.c" -ldl
  ln -sf libcuda.so.1 "$out/libcuda.so"
  ln -sf libcudart.so.13 "$out/libcudart.so"
  link=(-L "$out" -lcudart -lcuda -ldl)
fi
for client in coverage conformance entry_points runtime_route bench_calls storm forker nvtx_loader ipc capture exit_free thread_churn; do
  $CC -O1 -Wall $inc -o "$out/$client" "$here/tests/clients/$client.c" "${link[@]}" -lpthread -ldl
done
$CC -O1 -g -Wall $inc -o "$out/stackcache" "$here/tests/clients/stackcache.c" "${link[@]}"
$CC -O1 -g -Wall $inc -o "$out/train_loop" "$here/examples/train_loop.c" "${link[@]}" -lpthread
$CC -O1 -Wall -o "$out/reload" "$here/tests/clients/reload.c" -ldl
if [ "${2:-}" != "--real" ]; then
  $CC -shared -fPIC -O1 $inc -o "$out/liblocal.so" "$here/tests/clients/local_lib.c" -L "$out" -lcudart
  $CC -O1 -o "$out/load_local" "$here/tests/clients/load_local.c" -ldl
  # Uses the simulator's GPU-work model (simLaunch, simInUse).
  $CC -O1 -Wall $inc -o "$out/pool" "$here/tests/clients/pool.c" "${link[@]}" -lpthread
  $CC -O1 -Wall $inc -o "$out/perstep" "$here/tests/clients/perstep.c" "${link[@]}" -ldl
  $CC -O2 -Wall $inc -o "$out/pool_rounds" "$here/tests/clients/pool_rounds.c" "${link[@]}"
  $CC -O2 -Wall -o "$out/replay_calls" "$here/tests/clients/replay_calls.c" "${link[@]}"
  $CC -O1 -Wall $inc -o "$out/leaky" "$here/tests/clients/leaky.c" "${link[@]}" -ldl
  $CC -O1 -g -Wall $inc -o "$out/long_run" "$here/tests/clients/long_run.c" "${link[@]}"
  # A library named like NCCL's that keeps memory of its own, and a program that calls it.
  mkdir -p "$out/owners"
  $CC -shared -fPIC -O1 -Wall $inc -o "$out/owners/libnccl.so.2" -Wl,-soname,libnccl.so.2 \
    "$here/tests/clients/owner_lib.c" -L "$out" -lcudart -lcuda
  $CC -O1 -Wall $inc -o "$out/owners/owners" "$here/tests/clients/owners.c" \
    "$out/owners/libnccl.so.2" -Wl,-rpath,"$out/owners" "${link[@]}"
  # The stand-in for PyTorch's libc10_cuda.so (C++, libstdc++), laid out as a torch package.
  mkdir -p "$out/torch/lib"
  ${CXX:-c++} -std=c++17 -shared -fPIC -O1 -Wall -fvisibility=hidden -o "$out/torch/lib/libc10_cuda.so" \
    -Wl,-soname,libc10_cuda.so "$here/tests/standin/c10_cuda.cpp" -L "$out" -lcudart
  echo "__version__ = '2.11.0+standin'" > "$out/torch/version.py"
  # ... and for libtorch_cpu.so's get_current_node (the backward function a thread runs).
  ${CXX:-c++} -std=c++17 -shared -fPIC -O1 -Wall -fvisibility=hidden -o "$out/torch/lib/libtorch_cpu.so" \
    -Wl,-soname,libtorch_cpu.so "$here/tests/standin/torch_cpu.cpp" -L "$out/torch/lib" -l:libc10_cuda.so \
    -Wl,-rpath,'$ORIGIN' -pthread
fi
if [ "${2:-}" != "--real" ]; then
  echo "the CUDA simulator is in $out (libcudart.so.13, libcuda.so.1, libnvidia-ml.so.1)"
  echo "a program of your own: cc -g -I $here/tests/sim prog.c -o prog -L $out -lcudart -Wl,-rpath,$out"
  echo "then: LD_LIBRARY_PATH=$out gpushim run -- ./prog   (the runtime finds the driver there; a program without Python gets native stacks)"
fi
