#!/usr/bin/env bash
# All of reco's tests, from a fresh machine: installs what is missing, configures, builds and runs
#   0. a virtual environment with PyPI's torch (2.15.0 and its CUDA wheels) and TRL's runtime
#      (tests/python/requirements.txt; made once per set of pinned versions, in $RECO_VENV,
#      default ~/.cache/reco-python-venv);
#   1. the main build: CPU backend, eval metrics, logits kernels, LibTorch adapter (against the
#      LibTorch inside that torch wheel, torch.utils.cmake_prefix_path; its Python op tests run
#      with that torch), the ablation smoke test, packaging and header checks; when nvcc is
#      present the CUDA backend's tests and kernels are compiled (and run only where a GPU exists);
#   2. the Python package: `pip install --no-build-isolation .` into that environment (the CUDA
#      ops compiled as a check where nvcc exists), then all its tests, a real TRL run among them;
#   3. the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Every stage prints its wall time, and a table of them closes the run.
#
# Build speed (CI has 2 cores): Ninja, and ccache when installed (its cache lives in
# $CCACHE_DIR, default ~/.cache/reco-ccache, so a second run on the same machine recompiles only
# what changed). Without a GPU nothing runs the CUDA units' device code, so they are compiled as a
# check only: sm_90 PTX (compute_90, no PTX-to-SASS assembler), host code at -O0 and nvcc's
# fastest device code generation (RECO_CUDA_COMPILE_CHECK_ONLY). With a GPU, or RECO_CUDA_ARCHS
# set, the full optimised sm_90 build. The benchmarks are built, not run: -O0
# (RECO_BENCHMARKS_COMPILE_CHECK_ONLY); without a GPU only those that run on the CPU
# (RECO_BUILD_GPU_BENCHMARKS=OFF; tests/cuda/build_for_gpu.sh builds the others for a device). The C++ test units are compiled at -Og
# (RECO_TESTS_OPTIMIZATION; the strategy-tree program at -O3), the LibTorch adapter at -Og for this
# CPU (RECO_ADAPTER_OPTIMIZATION), and the Python package's build, with the same flags, reuses the
# main build's units through ccache.
#
# Environment: RECO_JOBS (parallel jobs, default nproc), RECO_SKIP_PYTHON_PACKAGE=1 to skip step 2,
# RECO_VENV (step 0's environment), RECO_FRESH_VENV=1 to make it anew,
# RECO_SKIP_SANITIZERS=1 to skip step 3,
# RECO_BUILD_DIR (default build), RECO_ASAN_BUILD_DIR (default build-asan), RECO_CUDA_ARCHS
# (CMAKE_CUDA_ARCHITECTURES), RECO_NO_CCACHE=1 to compile without the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
jobs=${RECO_JOBS:-$(nproc)}
build=${RECO_BUILD_DIR:-build}
asan_build=${RECO_ASAN_BUILD_DIR:-build-asan}

stage_names=()
stage_secs=()
stage_t0=$start
# end_stage NAME: records and prints the time since the previous stage ended.
end_stage() {
  local now
  now=$(date +%s)
  stage_names+=("$1")
  stage_secs+=($((now - stage_t0)))
  printf '== stage "%s": %d s (total %d s) ==\n' "$1" $((now - stage_t0)) $((now - start))
  stage_t0=$now
}
print_stages() {
  echo "== stage times =="
  for k in "${!stage_names[@]}"; do
    printf '  %-34s %5d s\n' "${stage_names[$k]}" "${stage_secs[$k]}"
  done
  printf '  %-34s %5d s\n' "total" $(($(date +%s) - start))
}
trap print_stages EXIT

scripts/install_deps.sh
end_stage "install packages"

# [0] The Python environment: pinned versions (tests/python/requirements.txt), from PyPI. The peers
# whose loss code the tests call (verl, Liger Kernel, OpenRLHF) without their runtimes (ray, vLLM,
# deepspeed, Triton kernels; the tests stand in for what their loss modules import) plus the two
# small packages verl's loss module needs.
# Installing it (5.9 GB, most of it torch's CUDA libraries) takes 1.5 to 6 minutes on CI's 2 cores,
# so it is made once per set of pinned versions and reused, like the compiler cache: a stamp
# holds the hash of what was installed; another hash, or RECO_FRESH_VENV=1, makes it anew. The
# package itself is installed anew on every run (step 2).
peers=("verl==0.9.1" "liger-kernel==0.8.5" "openrlhf==0.11.2")
extras=(omegaconf orjson)
venv=${RECO_VENV:-$HOME/.cache/reco-python-venv}
wanted_stamp=$( (cat tests/python/requirements.txt; echo "${peers[*]} ${extras[*]}"; /usr/bin/python3 --version) | sha256sum | cut -d' ' -f1)
echo "== [0/3] Python environment: $venv (tests/python/requirements.txt) =="
if [ "${RECO_FRESH_VENV:-0}" = "1" ] || [ "$(cat "$venv/.reco-stamp" 2>/dev/null)" != "$wanted_stamp" ]; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r tests/python/requirements.txt
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "${peers[@]}"
  "$venv/bin/pip" install -q --disable-pip-version-check "${extras[@]}"
  echo "$wanted_stamp" > "$venv/.reco-stamp"
else
  echo "reused (same pinned versions; RECO_FRESH_VENV=1 to make it anew)"
fi
"$venv/bin/pip" uninstall -q -y reco 2>/dev/null || true
torch_prefix=$("$venv/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
echo "torch $("$venv/bin/python" -c "import torch; print(torch.__version__)") at $torch_prefix"
end_stage "python environment"

generator=()
keep_going=()  # a failed unit does not hide the others' errors
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); keep_going=(-- -k 0); else keep_going=(-- -k); fi
launchers=()
if [ "${RECO_NO_CCACHE:-0}" != "1" ] && command -v ccache >/dev/null 2>&1; then
  export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/reco-ccache}
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-8G}
  launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  ccache -z >/dev/null 2>&1 || true
fi

cuda_flag=OFF
cuda_arch=()
cuda_check_only=OFF
gpu_benchmarks=ON
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda_flag=ON
  export PATH="$PATH:/usr/local/cuda/bin"
  archs=${RECO_CUDA_ARCHS:-}
  if [ -z "$archs" ]; then
    if nvidia-smi -L >/dev/null 2>&1; then archs=90; else archs=90-virtual; cuda_check_only=ON; gpu_benchmarks=OFF; fi
  fi
  cuda_arch=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
fi

# On a CPU without AVX-512 the dispatched AVX-512 variant of the token pass could never run: the
# builds leave it out (RECO_NO_SIMD_AVX512 in CXXFLAGS, which CMake reads when it first configures
# a build directory, so every unit alike), a fifth less compile time.
if [ "$(uname -m)" = x86_64 ] && ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  export CXXFLAGS="${CXXFLAGS:-} -DRECO_NO_SIMD_AVX512"
fi

# The LibTorch adapter (and the wheel's, which reuses its units) at -Og for this CPU: one SIMD width,
# the one that runs here, instead of every dispatched variant (the core tests run each variant).
adapter_flags="-Og;-march=native"

echo "== [1/3] main build (CUDA: $cuda_flag ${cuda_arch[*]} check-only: $cuda_check_only, LibTorch adapter: ON (the wheel's), generator: ${generator[*]:-default}) =="
# The LibTorch of the environment's torch wheel; RECO_TORCH_CUDA_CUSTOM_TEST=OFF: nvcc 13.0.88's
# cicc crashes on that one test unit against LibTorch 2.x's headers (docs/cuda.md).
cmake -S . -B "$build" "${generator[@]}" "${launchers[@]}" "${cuda_arch[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DRECO_TORCH_PYTHON="$venv/bin/python" -DRECO_TORCH_CUDA_CUSTOM_TEST=OFF \
  -DRECO_ENABLE_CUDA=$cuda_flag -DRECO_CUDA_COMPILE_CHECK_ONLY=$cuda_check_only -DRECO_ENABLE_TORCH=ON \
  -DRECO_BUILD_TESTS=ON -DRECO_TESTS_OPTIMIZATION=-Og -DRECO_ADAPTER_OPTIMIZATION="$adapter_flags" -DRECO_BUILD_BENCHMARKS=ON \
  -DRECO_BENCHMARKS_COMPILE_CHECK_ONLY=ON -DRECO_BUILD_GPU_BENCHMARKS=$gpu_benchmarks -DRECO_BUILD_EXAMPLES=ON
end_stage "main: configure"
cmake --build "$build" -j "$jobs" "${keep_going[@]}"
end_stage "main: build"
ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
end_stage "main: tests"

if [ "${RECO_SKIP_PYTHON_PACKAGE:-0}" != "1" ]; then
  echo "== [2/3] Python package: pip install into the environment of step 0, then all its tests =="
  # The wheel builds the op library against the environment's torch (no build isolation: the build
  # must see it); the CUDA ops whenever nvcc is found (that torch has CUDA), compiled as a check
  # as in the main build. Its CMake build runs in a directory beside the main build (the same
  # depth, so that ccache, whose base directory is the checkout, sees the same relative paths)
  # with the main build's compiler and flags: its units are then cache hits of the main build's.
  wheel_build="${build%/}-wheel"
  rm -rf "$wheel_build"
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")
  wheel_args="${launchers[*]} -DCMAKE_CXX_COMPILER=$cxx -DRECO_ADAPTER_OPTIMIZATION=$adapter_flags"
  expect_cuda=0
  if [ "$cuda_flag" = ON ]; then
    wheel_args="$wheel_args ${cuda_arch[*]} -DRECO_CUDA_COMPILE_CHECK_ONLY=$cuda_check_only"
    expect_cuda=1
  fi
  CMAKE_ARGS="$wheel_args" "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
    --no-deps --force-reinstall --config-settings=build-dir="$wheel_build" .
  root=$PWD
  ops=$(cd "$build" && "$venv/bin/python" -c "import reco; print(reco.library_path())")
  (cd "$build" && "$venv/bin/python" -c "import reco; print('reco.build_info():', reco.build_info())" &&
     RECO_EXPECT_CUDA_OPS=$expect_cuda "$venv/bin/python" "$root/tests/python/test_package.py" &&
     "$venv/bin/python" "$root/tests/python/test_batch_metrics.py" &&
     RECO_REQUIRE_VERL=1 "$venv/bin/python" "$root/tests/python/test_verl.py" &&
     RECO_REQUIRE_TRL=1 "$venv/bin/python" "$root/tests/python/test_trl.py" &&
     RECO_REQUIRE_LIGER=1 "$venv/bin/python" "$root/tests/python/test_liger.py" &&
     RECO_REQUIRE_OPENRLHF=1 "$venv/bin/python" "$root/tests/python/test_openrlhf.py" &&
     "$venv/bin/python" "$root/tests/python/test_nn.py" &&
     "$venv/bin/python" "$root/tests/python/test_readme.py" &&
     RECO_REQUIRE_TRL_TRAIN=1 "$venv/bin/python" "$root/tests/python/test_trl_train.py" &&
     "$venv/bin/python" "$root/tests/torch/test_ops.py" "$ops" &&
     "$venv/bin/python" "$root/tests/torch/test_compose_ops.py" "$ops")
  end_stage "python package: build + tests"
fi

if [ "${RECO_SKIP_SANITIZERS:-0}" != "1" ]; then
  echo "== [3/3] CPU tests under ASan + UBSan =="
  # -O0 and one SIMD width (the unit's SSE2 packs, no AVX2/AVX-512 variants): the packed and scalar
  # token passes are both checked (the dispatched variants are the same templates at other widths).
  # RECO_NO_FORCE_INLINE: without the forced inlining of the per-token math, which at -O0 copies
  # it into every pass, test_components.cpp compiles in 45 CPU-seconds instead of 200.
  cmake -S . -B "$asan_build" "${generator[@]}" "${launchers[@]}" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS="-O0 -DRECO_NO_SIMD_DISPATCH -DRECO_NO_FORCE_INLINE" -DRECO_SANITIZE=ON \
    -DRECO_ENABLE_CUDA=OFF -DRECO_ENABLE_TORCH=OFF -DRECO_BUILD_BENCHMARKS=OFF -DRECO_BUILD_EXAMPLES=OFF
  cmake --build "$asan_build" -j "$jobs" "${keep_going[@]}"
  end_stage "sanitizers: configure + build"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$asan_build" --output-on-failure -j "$jobs" --timeout 1800 -L "cpu|eval|logits"
  end_stage "sanitizers: tests"
fi

if [ ${#launchers[@]} -gt 0 ]; then ccache -s 2>/dev/null | grep -Ei 'hits|misses' | head -4 || true; fi
echo "== all tests passed in $(( $(date +%s) - start )) s =="
