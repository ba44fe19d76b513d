#!/usr/bin/env bash
# Builds and runs every GPU benchmark of the per-token objective on a machine with an NVIDIA GPU,
# and writes the results with the machine's description for docs/benchmarks.md.
#
#   benchmarks/cuda/run_gpu_benchmarks.sh                 # everything
#   FILTER='objective/fused/reco' benchmarks/cuda/run_gpu_benchmarks.sh   # a subset
#
# Environment:
#   BUILD        build directory (default build-gpu-bench)
#   OUT          results directory (default results/gpu-bench-<UTC date-time>)
#   CUDA_ARCH    CMAKE_CUDA_ARCHITECTURES (default 90: H100 / H200)
#   FILTER       --benchmark_filter regex for the Google Benchmark binaries (default: all)
#   NO_TORCH=1   skip the LibTorch baseline (otherwise used when `import torch` works and its
#                LibTorch has CUDA)
#   NO_LIGER=1   skip the Liger-Kernel comparison (otherwise `pip install liger-kernel` is tried
#                when it is not importable)
#   JOBS         parallel build jobs (default: number of CPUs)
#
# Writes to $OUT: environment.txt (device, driver, CUDA, compiler, flags, commit),
# objective_cuda.json, objective_torch_cuda.json, liger.json, the raw console logs, and
# summary.md (tables made by summarize_gpu_benchmarks.py from those files only).
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu-bench}
OUT=${OUT:-$ROOT/results/gpu-bench-$(date -u +%Y%m%dT%H%M%SZ)}
CUDA_ARCH=${CUDA_ARCH:-90}
FILTER=${FILTER:-.}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null || { echo "run_gpu_benchmarks.sh: nvidia-smi not found (no GPU?)" >&2; exit 1; }
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH

# LibTorch with CUDA, from the Python torch when there is one.
TORCH_ARGS=()
PYTHON=${PYTHON:-python3}
if [[ -z "${NO_TORCH:-}" ]] && "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  TORCH_PREFIX=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  TORCH_ARGS=(-DRECO_BENCH_TORCH_CUDA=ON "-DCMAKE_PREFIX_PATH=$TORCH_PREFIX")
fi

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DRECO_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DRECO_BUILD_BENCHMARKS=ON -DRECO_BUILD_TESTS=OFF \
  -DRECO_BUILD_EXAMPLES=OFF "${TORCH_ARGS[@]}" | tee "$OUT/configure.log"
TARGETS=(reco_bench_objective_cuda reco_cuda_c)
# benchmarks/cuda/CMakeLists.txt says when it configured the LibTorch baseline out.
if [[ ${#TORCH_ARGS[@]} -gt 0 ]] && ! grep -q 'reco_bench_objective_torch_cuda needs' "$OUT/configure.log"; then
  TARGETS+=(reco_bench_objective_torch_cuda)
fi
cmake --build "$BUILD" --target "${TARGETS[@]}" -j "$JOBS" 2>&1 | tee "$OUT/build.log"

{
  echo "date (UTC):      $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit:          $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (uncommitted changes)')"
  echo "gpu:             $(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | head -1)"
  echo "driver:          $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  echo "cuda (nvcc):     $(nvcc --version | tail -1)"
  echo "host compiler:   $(${CXX:-c++} --version | head -1)"
  echo "cpu:             $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "build type:      $(grep '^CMAKE_BUILD_TYPE:' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "cuda arch:       $(grep '^CMAKE_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "cuda flags:      $(grep '^CMAKE_CUDA_FLAGS:' "$BUILD/CMakeCache.txt" | cut -d= -f2-) $(grep '^CMAKE_CUDA_FLAGS_RELEASE:' "$BUILD/CMakeCache.txt" | cut -d= -f2-) -O3 --expt-relaxed-constexpr"
  echo "cxx flags:       $(grep '^CMAKE_CXX_FLAGS:' "$BUILD/CMakeCache.txt" | cut -d= -f2-) $(grep '^CMAKE_CXX_FLAGS_RELEASE:' "$BUILD/CMakeCache.txt" | cut -d= -f2-) -O3"
  if [[ ${#TORCH_ARGS[@]} -gt 0 ]]; then
    echo "torch:           $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
  fi
} > "$OUT/environment.txt"
cat "$OUT/environment.txt"

BENCH_ARGS=(--benchmark_filter="$FILTER" --benchmark_out_format=json --benchmark_counters_tabular=true)
"$BUILD/benchmarks/cuda/reco_bench_objective_cuda" "${BENCH_ARGS[@]}" \
  --benchmark_out="$OUT/objective_cuda.json" 2>&1 | tee "$OUT/objective_cuda.log"
if [[ -x "$BUILD/benchmarks/cuda/reco_bench_objective_torch_cuda" ]]; then
  "$BUILD/benchmarks/cuda/reco_bench_objective_torch_cuda" "${BENCH_ARGS[@]}" \
    --benchmark_out="$OUT/objective_torch_cuda.json" 2>&1 | tee "$OUT/objective_torch_cuda.log"
else
  echo "LibTorch baseline not built (needs a CUDA LibTorch; see benchmarks/cuda/CMakeLists.txt)" | tee "$OUT/objective_torch_cuda.log"
fi

if [[ -z "${NO_LIGER:-}" ]] && "$PYTHON" -c 'import torch' 2>/dev/null; then
  if ! "$PYTHON" -c 'import liger_kernel' 2>/dev/null; then
    "$PYTHON" -m pip install --quiet liger-kernel 2>&1 | tee "$OUT/liger_install.log" || true
  fi
  "$PYTHON" "$ROOT/benchmarks/cuda/bench_liger.py" --lib "$BUILD/adapters/cuda/libreco_cuda.so" \
    --out "$OUT/liger.json" 2>&1 | tee "$OUT/liger.log" || echo "Liger comparison failed; see $OUT/liger.log"
fi

"$PYTHON" "$ROOT/benchmarks/cuda/summarize_gpu_benchmarks.py" "$OUT"
echo "results in $OUT"
