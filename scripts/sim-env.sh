# Sourced (not run) by the benchmarks on the simulator, from the repository root: the release
# shim built ($shim), the CUDA simulator built into a temporary folder named by $sim, and a
# folder for a run's files named by $dir, both gone when the sourcing script exits.
# `bench_binaries` then has the command ($gpushim) and examples/read_only ($reader) built.
# With GPUSHIM_PREBUILT=DIR (a machine without cargo: binaries built elsewhere, from
# target/release/ and target/release/examples/) all three are taken from DIR instead.
if [ -n "${GPUSHIM_PREBUILT:-}" ]; then
  prebuilt=$(cd "$GPUSHIM_PREBUILT" && pwd)
  shim=$prebuilt/libgpushim.so
else
  prebuilt=
  cargo build --release --quiet -p gpushim-shim
  shim=$PWD/target/release/libgpushim.so
fi
sim=$(mktemp -d)
dir=$(mktemp -d)
trap 'rm -rf "$sim" "$dir"' EXIT
bash scripts/build-sim.sh "$sim" >/dev/null
bench_binaries() {
  if [ -n "$prebuilt" ]; then
    gpushim=$prebuilt/gpushim reader=$prebuilt/read_only
  else
    cargo build --release --quiet -p gpushim
    cargo build --release --quiet --example read_only
    gpushim=$PWD/target/release/gpushim reader=$PWD/target/release/examples/read_only
  fi
}
