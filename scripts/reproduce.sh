#!/usr/bin/env bash
# The ReCo ablation study (docs/ablation.md): installs what it needs, builds the two study programs
# and runs them: first the strategy tree (exact Pass@k, the mechanism measured; results in
# <out>/tree/), then GRPO-family objectives x base policies x seeds on the built-in Countdown task
# (<out>/). Report, CSV files and plots go to results/ (or --out DIR).
#
#   scripts/reproduce.sh                  # both default studies (CPU, about 20 minutes on 2 cores)
#   scripts/reproduce.sh --full           # the powered studies (tree: 128 seeds; Countdown: every configuration, 8 base policies)
#   scripts/reproduce.sh --device cuda    # Countdown on the GPU: --full unless --default (CUDA LibTorch, see below)
#   scripts/reproduce.sh --tree-only | --countdown-only
#   scripts/reproduce.sh --tree-seeds N   # the tree study's seeds (default 40, --full 128)
#   scripts/reproduce.sh --out DIR ...    # any other option is passed to reco_ablation (--help)
#
# Environment: RECO_BUILD_DIR (default build-ablation), RECO_NO_INSTALL=1 to skip apt-get,
# OPENBLAS_CORETYPE (default Haswell on x86-64 CPUs with AVX2 and FMA: the same kernels on all),
# CMAKE_PREFIX_PATH for a LibTorch of your own. With --device cuda the LibTorch is looked up in
# the python3 torch package (a CUDA wheel) unless CMAKE_PREFIX_PATH is set, and nvcc must be found.
set -euo pipefail

start=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${RECO_BUILD_DIR:-$root/build-ablation}
device=cpu
args=()
out=results
run_tree=1
run_countdown=1
tree_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; args+=("$1" "$2"); shift 2 ;;
    --device=*) device=${1#--device=}; args+=("--device" "$device"); shift ;;
    --out) out=$2; args+=("$1" "$2"); shift 2 ;;
    --full) tree_args+=(--full); args+=("$1"); shift ;;
    --smoke) tree_args+=(--smoke); args+=("$1"); shift ;;
    --tree-seeds) tree_args+=(--seeds "$2"); shift 2 ;;
    --tree-only) run_countdown=0; shift ;;
    --countdown-only) run_tree=0; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

say() { printf '== %s\n' "$*"; }

# ---- 1. Packages (Debian/Ubuntu; idempotent: only what is missing) -----------------------------
need=()
command -v cmake > /dev/null || need+=(cmake)
command -v g++ > /dev/null || need+=(g++)
command -v make > /dev/null || need+=(make)
command -v python3 > /dev/null || need+=(python3)
# Plots: matplotlib in python3 on the PATH or in the system's /usr/bin/python3 (Debian's package).
python3 -c 'import matplotlib' > /dev/null 2>&1 || /usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1 ||
  need+=(python3-matplotlib)
if [ "$device" = cpu ] && [ -z "${CMAKE_PREFIX_PATH:-}" ]; then
  [ -f /usr/lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake ] || [ -n "$(ls /usr/lib/*/cmake/Torch/TorchConfig.cmake 2> /dev/null)" ] ||
    need+=(libtorch-dev)
  # Debian's LibTorch uses the system BLAS; the reference BLAS is ~10x slower than OpenBLAS.
  dpkg -s libopenblas0-pthread > /dev/null 2>&1 || need+=(libopenblas0-pthread)
  # Gloo's headers, for data-parallel runs (--ranks N).
  dpkg -s libgloo-dev > /dev/null 2>&1 || need+=(libgloo-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ -n "${RECO_NO_INSTALL:-}" ]; then
    say "missing: ${need[*]} (RECO_NO_INSTALL is set: not installing)"
  else
    say "installing: ${need[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null
  fi
fi

# ---- BLAS kernels: the same on every x86-64 CPU with AVX2 and FMA ------------------------------
# OpenBLAS picks its kernels by CPU at run time, and kernels of other vector widths round the
# model's products differently: on an AVX-512 Zen 4 guest its own kernels gave other training
# trajectories (and one secondary verdict flipped) than on a Zen 3, while with the Haswell
# kernels both print the same study (docs/ablation.md, Determinism). Set OPENBLAS_CORETYPE
# yourself to choose other kernels.
if [ "$device" = cpu ] && [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "$(uname -m)" = x86_64 ] &&
   grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=Haswell
  say "OPENBLAS_CORETYPE=Haswell (the same BLAS kernels on every AVX2 CPU; set it to override)"
fi

# ---- 2. Configure and build only the study program --------------------------------------------
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DRECO_ENABLE_TORCH=ON -DRECO_BUILD_TESTS=OFF
            -DRECO_BUILD_BENCHMARKS=OFF -DRECO_BUILD_EXAMPLES=ON -DRECO_INSTALL=OFF)
if [ "$device" = cuda ]; then
  if [ -z "${CMAKE_PREFIX_PATH:-}" ]; then
    prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2> /dev/null) ||
      { echo "--device cuda: no CUDA LibTorch found (install a CUDA PyTorch wheel or set CMAKE_PREFIX_PATH)" >&2; exit 1; }
    cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix")
  fi
  cmake_args+=(-DRECO_ENABLE_CUDA=ON)
else
  cmake_args+=(-DRECO_ENABLE_CUDA=OFF)
fi
say "configuring $build"
mkdir -p "$build"
cmake -S "$root" -B "$build" "${cmake_args[@]}" > "$build/reproduce-configure.log" 2>&1 ||
  { cat "$build/reproduce-configure.log"; exit 1; }
targets=()
[ $run_tree = 1 ] && targets+=(reco_tree_study)
[ $run_countdown = 1 ] && targets+=(reco_ablation)
say "building ${targets[*]}"
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" > "$build/reproduce-build.log" 2>&1 ||
  { tail -50 "$build/reproduce-build.log"; exit 1; }

# ---- 3. Run the study --------------------------------------------------------------------------
# Prefer OpenBLAS even where the system's libblas alternative points elsewhere.
for d in /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/aarch64-linux-gnu/openblas-pthread; do
  [ -f "$d/libblas.so.3" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
cd "$root"
status=0
if [ $run_tree = 1 ]; then
  say "the strategy-tree study -> $out/tree"
  t0=$(date +%s)
  "$build/examples/ablation/tree/reco_tree_study" --out "$out/tree" --workers "$(nproc)" "${tree_args[@]}" || status=$?
  say "strategy tree: $(( $(date +%s) - t0 )) s"
fi
if [ $run_countdown = 1 ] && [ $status = 0 ]; then
  say "the Countdown study -> $out"
  "$build/examples/ablation/reco_ablation" "${args[@]}" || status=$?
fi

end=$(date +%s)
secs=$((end - start))
printf '== scripts/reproduce.sh: wall time %dm%02ds (install + build + study)\n' $((secs / 60)) $((secs % 60))
exit $status
