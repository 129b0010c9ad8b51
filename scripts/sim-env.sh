# Sourced (not run) by the benchmarks on the simulator, from the repository root: builds the
# release shim and the CUDA simulator, the latter into a temporary folder named by $sim, which
# goes when the sourcing script exits.
cargo build --release --quiet -p gpushim-shim
sim=$(mktemp -d)
trap 'rm -rf "$sim"' EXIT
bash scripts/build-sim.sh "$sim" >/dev/null
