#!/usr/bin/env bash
# Builds every binary that needs a GPU to run (CUDA tests, benchmarks, examples, the LibTorch
# CUDA path and its op library) on a machine without one, for tests/cuda/run_on_gpu.sh on a
# machine with one. nvcc compiles machine code for the GPU's architecture, so nothing is
# compiled at start-up there.
#
#   tests/cuda/build_for_gpu.sh TORCH_PREFIX BIN [BUILD]
#
#   TORCH_PREFIX  a CUDA LibTorch of the same version as the GPU machine's torch: the `torch`
#                 folder of its wheel, unpacked (`unzip torch-*.whl 'torch/include/*'
#                 'torch/share/*' 'torch/lib/*'`); its CUDA version must match nvcc's here.
#   BIN           where the binaries are copied (with BUILD_INFO: commit, flags)
#   BUILD         the build folder (default build-gpu)
# Environment: CUDA_ARCH (default 90: H100 / H200), JOBS (default: all CPUs).
#
# The LibTorch libraries are not copied: run_on_gpu.sh loads the GPU machine's own. Linking
# here allows undefined symbols inside those libraries (their CUDA dependencies live in other
# wheels), which the machine that runs them resolves.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TORCH_PREFIX=$(cd "$1" && pwd)
BIN=$2
BUILD=${3:-$ROOT/build-gpu}
ARCH=${CUDA_ARCH:-90}
JOBS=${JOBS:-$(nproc)}
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}" \
  -DRECO_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DTORCH_CUDA_ARCH_LIST="${ARCH:0:1}.${ARCH:1}" \
  -DRECO_ENABLE_TORCH=ON -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DRECO_BENCH_TORCH_CUDA=ON \
  -DRECO_TORCH_CUDA_CUSTOM_TEST="${CUSTOM_TEST:-ON}" -DRECO_BUILD_TESTS=ON -DRECO_BUILD_BENCHMARKS=ON -DRECO_BUILD_EXAMPLES=ON \
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--allow-shlib-undefined
TARGETS=(reco_cuda_tests reco_cuda_fast_tests reco_logits_cuda_tests reco_cuda_c reco_example_cuda_train_step
         reco_bench_objective_cuda bench_logits_cuda reco_torch_cuda_tests reco_torch_tests reco_torch_ops
         reco_bench_objective_torch_cuda reco_ablation reco_bench_torch_step_plan_cuda)
# With Gloo's headers (libgloo-dev) also the multi-process CPU step-plan test and benchmark.
if grep -q '^RECO_GLOO_INCLUDE_DIR:PATH=/' "$BUILD/CMakeCache.txt"; then
  TARGETS+=(reco_torch_dist_tests reco_bench_torch_step_plan)
fi
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" -- -k 0  # every failure, not the first
mkdir -p "$BIN"
for f in tests/cuda/reco_cuda_tests tests/cuda_fast/reco_cuda_fast_tests tests/logits/reco_logits_cuda_tests \
         adapters/cuda/libreco_cuda.so examples/cuda/reco_example_cuda_train_step \
         benchmarks/cuda/reco_bench_objective_cuda benchmarks/logits/bench_logits_cuda \
         tests/torch/reco_torch_cuda_tests tests/torch/reco_torch_tests adapters/torch/libreco_torch_ops.so \
         benchmarks/cuda/reco_bench_objective_torch_cuda tests/ablation/program/reco_ablation \
         benchmarks/torch/reco_bench_torch_step_plan_cuda benchmarks/torch/reco_bench_torch_step_plan \
         tests/torch/reco_torch_dist_tests; do
  [[ -f $BUILD/$f ]] && cp "$BUILD/$f" "$BIN/"
done
strip --strip-unneeded "$BIN"/* 2>/dev/null || true
{
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo +changes)," \
       "nvcc $(nvcc --version | tail -1 | sed 's/.*release //'), $(${CXX:-c++} --version | head -1)," \
       "sm_$ARCH, Release, LibTorch $(cat "$TORCH_PREFIX/version.py" 2>/dev/null | sed -n "s/^__version__ = '\(.*\)'/\1/p")"
} > "$BIN/BUILD_INFO"
du -sh "$BIN"
