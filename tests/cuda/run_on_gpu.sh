#!/usr/bin/env bash
# Runs the prebuilt CUDA test, sanitizer, benchmark and example binaries on a machine with an
# NVIDIA GPU, and writes every log and a summary table under OUT. The binaries are built
# elsewhere (tests/cuda/build_for_gpu.sh) and copied into BIN.
#
#   tests/cuda/run_on_gpu.sh BIN OUT [stage ...]
#
# Stages (default: env tests):
#   env       device, driver, CUDA, torch versions
#   tests     every CUDA gtest binary, the LibTorch CUDA tests, the ops' CUDA test from Python
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck and initcheck on the CUDA tests
#   bench     the objective and logits benchmarks, the LibTorch CUDA eager baseline, Liger
#   ncu       Nsight Compute on the fused token kernel and on the logits kernels
#   plan      the step plan against its call: CUDA tensors over NCCL, 2 Gloo ranks on the CPU cores
#   examples  examples/cuda/train_step and the ablation smoke run on --device cuda
#   study     the ablation study on --device cuda (STUDY_ARGS, STUDY_LIMIT)
#
# LibTorch comes from the machine's Python torch (its lib folder is put on LD_LIBRARY_PATH).
set -uo pipefail
BIN=$(cd "$1" && pwd)
OUT=$2
shift 2
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(env tests)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
PY=${PYTHON:-python3}
TORCH_LIB=$("$PY" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$TORCH_LIB:$BIN:${LD_LIBRARY_PATH:-}
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# step NAME TIMEOUT CMD...: runs CMD with a time limit, logs to OUT/NAME.log, one summary line.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  local extra=""
  if grep -q '^\[  PASSED  \]' "$OUT/$name.log"; then
    extra="$(grep -m1 '^\[  PASSED  \]' "$OUT/$name.log" | sed 's/\[  PASSED  \] //')"
  fi
  if grep -q '^\[  FAILED  \]' "$OUT/$name.log"; then
    extra="$extra; failed: $(grep '^\[  FAILED  \]' "$OUT/$name.log" | grep -v 'listed below' | sed 's/\[  FAILED  \] //' | tr '\n' ' ')"
  fi
  if grep -q 'ERROR SUMMARY' "$OUT/$name.log"; then
    extra="$extra; $(grep -m1 'ERROR SUMMARY' "$OUT/$name.log" | sed 's/^=* *//')"
  fi
  printf '%-34s rc=%-3s %5ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$extra" | tee -a "$SUMMARY"
}

have() { [[ -x "$BIN/$1" ]]; }

for stage in "${STAGES[@]}"; do
  case $stage in
  env)
    {
      echo "date (UTC):  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "gpu:         $(nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | head -1)"
      echo "driver:      $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
      echo "nvcc:        $(nvcc --version 2>/dev/null | tail -1)"
      echo "torch:       $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
      echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
      echo "binaries:    $(cat "$BIN/BUILD_INFO" 2>/dev/null)"
    } | tee "$OUT/environment.txt"
    ;;
  tests)
    for t in ${TESTS:-reco_cuda_tests reco_cuda_fast_tests reco_logits_cuda_tests reco_torch_cuda_tests reco_torch_tests}; do
      have $t && step "$t" 600 "$BIN/$t" --gtest_color=no
    done
    if have reco_cuda_c.so || [[ -f $BIN/libreco_cuda.so ]]; then
      step reco_cuda_c_api_ctypes 120 "$PY" "$ROOT/tests/cuda_fast/test_c_api_ctypes.py" "$BIN/libreco_cuda.so" "$ROOT/benchmarks/cuda"
    fi
    if [[ -f $BIN/libreco_torch_ops.so ]]; then
      step torch_cuda_ops_py 600 "$PY" "$ROOT/tests/torch/test_cuda_ops.py" "$BIN/libreco_torch_ops.so"
      step torch_ops_py 600 "$PY" "$ROOT/tests/torch/test_ops.py" "$BIN/libreco_torch_ops.so"
      step torch_given_ops_py 600 "$PY" "$ROOT/tests/torch/test_given_ops.py" "$BIN/libreco_torch_ops.so"
      # Split steps on CUDA tensors from torch.distributed: NCCL (one rank: one GPU), Gloo (2 ranks).
      step torch_plan_ops_nccl 300 "$PY" "$ROOT/tests/torch/test_plan_ops.py" "$BIN/libreco_torch_ops.so" \
        --device cuda --backend nccl --world 1
      step torch_plan_ops_cuda_gloo 300 "$PY" "$ROOT/tests/torch/test_plan_ops.py" "$BIN/libreco_torch_ops.so" \
        --device cuda --backend gloo --world 2
    fi
    ;;
  sanitize)
    # The four tools run side by side (one process each; the GPU and 16 cores have room). The
    # filters leave out the cases that are long under a sanitizer (2^31-byte offsets); every
    # kernel and path still runs.
    CS="compute-sanitizer --error-exitcode 1 --print-limit 20"
    F=(--gtest_color=no --gtest_filter="${FAST_FILTER:--*TokenOffsetsPast2To31Bytes*}")
    L=(--gtest_color=no --gtest_filter="${LOGITS_FILTER:-*}")
    have reco_cuda_fast_tests && step memcheck_fast "${SAN_LIMIT:-300}" $CS --tool memcheck --leak-check full "$BIN/reco_cuda_fast_tests" "${F[@]}" &
    have reco_cuda_fast_tests && step racecheck_fast "${SAN_LIMIT:-300}" $CS --tool racecheck "$BIN/reco_cuda_fast_tests" "${F[@]}" &
    have reco_cuda_fast_tests && step synccheck_fast "${SAN_LIMIT:-300}" $CS --tool synccheck "$BIN/reco_cuda_fast_tests" "${F[@]}" &
    have reco_cuda_fast_tests && step initcheck_fast "${SAN_LIMIT:-300}" $CS --tool initcheck "$BIN/reco_cuda_fast_tests" "${F[@]}" &
    have reco_cuda_tests && step memcheck_parity "${SAN_LIMIT:-300}" $CS --tool memcheck "$BIN/reco_cuda_tests" --gtest_color=no &
    have reco_logits_cuda_tests && step memcheck_logits "${SAN_LIMIT:-300}" $CS --tool memcheck "$BIN/reco_logits_cuda_tests" "${L[@]}" &
    have reco_logits_cuda_tests && step racecheck_logits "${SAN_LIMIT:-300}" $CS --tool racecheck "$BIN/reco_logits_cuda_tests" "${L[@]}" &
    have reco_torch_cuda_tests && step memcheck_torch "${SAN_LIMIT:-300}" $CS --tool memcheck "$BIN/reco_torch_cuda_tests" --gtest_color=no &
    wait
    ;;
  bench)
    BA=(--benchmark_out_format=json --benchmark_counters_tabular=true)
    have reco_bench_objective_cuda && step bench_objective_cuda "${BENCH_LIMIT:-240}" "$BIN/reco_bench_objective_cuda" "${BA[@]}" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$OUT/objective_cuda.json"
    have reco_bench_objective_torch_cuda && step bench_objective_torch_cuda 150 "$BIN/reco_bench_objective_torch_cuda" "${BA[@]}" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$OUT/objective_torch_cuda.json"
    have bench_logits_cuda && step bench_logits_cuda 120 "$BIN/bench_logits_cuda" "${BA[@]}" --benchmark_filter="${LOGITS_BENCH_FILTER:-/N:8192/}" --benchmark_out="$OUT/logits_cuda.json"
    if ls "$ROOT"/.whl/liger_kernel-*.whl >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$ROOT"/.whl/liger_kernel-*.whl >/dev/null 2>&1
      PYTHONPATH=/tmp/site step bench_liger 150 "$PY" "$ROOT/benchmarks/cuda/bench_liger.py" --lib "$BIN/libreco_cuda.so" --out "$OUT/liger.json"
    fi
    ;;
  ncu)
    # Nsight Compute, full set: the fused kernels of one call (response + token) for grpo and reco
    # at N = 16M and 8K tokens, and the logits forward + backward at 8192 x 151,936 bf16.
    NCU=(ncu --clock-control none --set full)
    if have reco_bench_objective_cuda; then
      for c in grpo/kl/N:16777216 reco/kl/N:16777216 grpo/kl/N:8192; do
        tag=$(echo "$c" | tr '/:' '__')
        step "ncu_$tag" 120 "${NCU[@]}" -k "regex:response_kernel|token_kernel|finalize_kernel" -c 3 \
          -o "$OUT/ncu_$tag" "$BIN/reco_bench_objective_cuda" --benchmark_filter="objective/fused/$c/"
      done
    fi
    have bench_logits_cuda && step ncu_logits 120 "${NCU[@]}" -k "regex:forward_kernel|backward_kernel" -c 2 \
      -o "$OUT/ncu_logits" "$BIN/bench_logits_cuda" --benchmark_filter="${NCU_LOGITS_BENCH:-logits_forward_backward/bf16/V:151936/N:8192/}"
    for rep in "$OUT"/ncu_*.ncu-rep; do
      [[ -f $rep ]] && ncu -i "$rep" --page details > "${rep%.ncu-rep}.txt" 2>&1 && rm -f "$rep"
    done
    ;;
  plan)
    # Split steps: the plan against the call it serves. On CUDA tensors over NCCL (one rank), and the
    # CPU benchmark's 2 Gloo ranks on this machine's cores (a core per busy thread), with the
    # multi-process CPU test matrix against this machine's LibTorch.
    PA=(--benchmark_out_format=json --benchmark_counters_tabular=true)
    have reco_bench_torch_step_plan_cuda && step bench_step_plan_nccl "${PLAN_LIMIT:-240}" \
      "$BIN/reco_bench_torch_step_plan_cuda" "${PA[@]}" --benchmark_filter="${PLAN_FILTER:-.}" \
      --benchmark_out="$OUT/step_plan_nccl.json"
    have reco_bench_torch_step_plan && step bench_step_plan_gloo "${PLAN_LIMIT:-240}" \
      "$BIN/reco_bench_torch_step_plan" "${PA[@]}" --benchmark_filter="${GLOO_PLAN_FILTER:-rule_80_20|allreduce}" \
      --benchmark_repetitions="${PLAN_REPS:-3}" --benchmark_out="$OUT/step_plan_gloo.json"
    have reco_torch_dist_tests && step reco_torch_dist_tests 300 "$BIN/reco_torch_dist_tests" --gtest_color=no
    ;;
  study)
    # The ablation study on the GPU (examples/ablation; STUDY_ARGS e.g. --full), within STUDY_LIMIT s.
    have reco_ablation && step study_cuda "${STUDY_LIMIT:-400}" "$BIN/reco_ablation" --device cuda --out "$OUT/study" ${STUDY_ARGS:-}
    ;;
  examples)
    have reco_example_cuda_train_step && step example_train_step 120 "$BIN/reco_example_cuda_train_step"
    if have reco_ablation; then
      step ablation_smoke_cuda 420 "$BIN/reco_ablation" --smoke --device cuda --out "$OUT/ablation_smoke"
    fi
    ;;
  *) echo "unknown stage $stage" >&2 ;;
  esac
done
echo "---- summary"
cat "$SUMMARY"
