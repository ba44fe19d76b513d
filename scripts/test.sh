#!/usr/bin/env bash
# All of reco's tests, from a fresh machine: installs what is missing, configures, builds and runs
#   1. the main build: CPU backend, eval metrics, logits kernels, LibTorch adapter (Debian's
#      LibTorch), the ablation smoke test, packaging and header checks; when nvcc is present the
#      CUDA backend's tests and kernels are compiled for sm_90 (and run only where a GPU exists);
#   2. the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Environment: RECO_JOBS (parallel jobs, default nproc), RECO_SKIP_SANITIZERS=1 to skip step 2,
# RECO_BUILD_DIR (default build), RECO_ASAN_BUILD_DIR (default build-asan).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
jobs=${RECO_JOBS:-$(nproc)}
build=${RECO_BUILD_DIR:-build}
asan_build=${RECO_ASAN_BUILD_DIR:-build-asan}

scripts/install_deps.sh

cuda_flag=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_flag=ON
  export PATH="$PATH:/usr/local/cuda/bin"
fi

echo "== [1/2] main build (CUDA: $cuda_flag, LibTorch adapter: ON) =="
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DRECO_ENABLE_CUDA=$cuda_flag -DRECO_ENABLE_TORCH=ON \
  -DRECO_BUILD_TESTS=ON -DRECO_BUILD_BENCHMARKS=ON -DRECO_BUILD_EXAMPLES=ON
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900

if [ "${RECO_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== [2/2] CPU tests under ASan + UBSan =="
  # -O0 and one SIMD width (the unit's SSE2 packs, no AVX2/AVX-512 variants): the packed and scalar
  # token passes are both checked, and the heaviest test units compile in about 3 minutes instead
  # of over 10 (the dispatched variants are the same templates at other widths).
  cmake -S . -B "$asan_build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="-O0 -DRECO_NO_SIMD_DISPATCH" -DRECO_SANITIZE=ON \
    -DRECO_ENABLE_CUDA=OFF -DRECO_ENABLE_TORCH=OFF -DRECO_BUILD_BENCHMARKS=OFF -DRECO_BUILD_EXAMPLES=OFF
  cmake --build "$asan_build" -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan_build" --output-on-failure -j "$jobs" --timeout 1800 -L "cpu|eval|logits|reference"
fi

echo "== all tests passed in $(( $(date +%s) - start )) s =="
