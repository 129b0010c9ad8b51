set -e
lib=$PWD/.gpu/libgpushim.so
mkdir -p $OUT
cudart=$(python3 -c "import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], 'lib'))")
export LD_LIBRARY_PATH=$cudart
LD_PRELOAD=$lib GPUSHIM_CONF=pool:off GPUSHIM_TRACE=$OUT/async-off.trace python3 scripts/gpu/train_bench.py async 25 | cut -c1-200
LD_PRELOAD=$lib GPUSHIM_LIB=$lib GPUSHIM_TRACE=$OUT/pluggable.trace python3 scripts/gpu/train_bench.py pluggable 25 | cut -c1-200
.gpu/gpushim simulate $OUT/async-off.trace --conf pool:caching --conf pool:caching,round:pow2_4 --conf pool:caching,max_split:64MiB
.gpu/gpushim simulate $OUT/pluggable.trace
ls -la $OUT
