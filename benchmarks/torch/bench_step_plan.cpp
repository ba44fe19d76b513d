// The cost of a split step's plan against the objective call it serves, on 2 Gloo ranks (CPU).
//
// The binary forks itself into 2 ranks (c10d FileStore + ProcessGroupGloo on 127.0.0.1) before
// LibTorch does any work. Both ranks register the same benchmarks with fixed iteration counts and
// run them in the same order, so every build_step_plan on rank 0 meets its twin on rank 1; rank 1
// reports nothing. A barrier outside the timed loop lines the ranks up before each run.
//
// A step of N token slots (N = 1M, 4M, 16M) is [N / 1024, 1024] float32 with ragged masks and
// groups of 8; each rank holds half of it as one micro-batch. Per preset and N, on rank 0:
//   plan          build_step_plan over the process group (collectives + selection rounds);
//   plan_given_layout  the same with step_options::layout given (no all-gather of the ranks' shapes);
//   plan_local    the same with no process group (this rank's half as the whole step): the
//                 plan's own passes over the data without the collectives;
//   plan_host_passes (CUDA) / plan_tensor_ops (CPU)  `plan` with the other kind of token passes
//                 (step_options::passes): host passes over copies of the device tensors, or the
//                 device's tensor operations run on CPU tensors;
//   call_planned  policy_loss with the plan + backward on this rank's micro-batch;
//   call          policy_loss without a plan + backward on the same micro-batch;
//   plan_over_call  the plan and the planned call alternating in one loop, each one's CPU time
//                 summed and their ratio (a counter; robust to the machine's speed drifting);
//                 plan_given_layout_over_call the same with the layout given;
// and per N, copy_inputs: a copy of the call's per-token inputs (logp, old_logp, ref_logp,
// entropy, mask), the memory traffic of one pass over them; and allreduce: one collective alone.
// Each rank uses RECO_BENCH_THREADS threads (default 1: two ranks on a 2-core machine).
// --benchmark_enable_random_interleaving is refused: it shuffles each rank differently.
//
// Built with RECO_BENCH_STEP_PLAN_NCCL (reco_bench_torch_step_plan_cuda, a CUDA LibTorch): the
// same rows on CUDA tensors with one process over ProcessGroupNCCL (NCCL takes one rank per GPU),
// the whole step on the one rank, every timed iteration ended by a device synchronisation.
#include <benchmark/benchmark.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/version.h>
#ifdef RECO_BENCH_STEP_PLAN_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"
#ifndef RECO_BENCH_STEP_PLAN_NCCL
#include "reco/torch/gloo_group.hpp"
#endif

namespace {

#ifdef RECO_BENCH_STEP_PLAN_NCCL
constexpr int world = 1;
const at::Device device(at::kCUDA, 0);
// Ends a timed iteration: the device's work is part of it.
void sync() { c10::cuda::device_synchronize(); }
#else
constexpr int world = 2;
const at::Device device(at::kCPU);
void sync() {}
#endif
constexpr int64_t width = 1024;     // padded response length; valid lengths in [256, 1024]
constexpr int64_t group_size = 8;

int rank = 0;
c10::intrusive_ptr<c10d::ProcessGroup> group;

// This rank's half of a step of N token slots (seeded by rank: the halves differ).
struct rank_batch {
  at::Tensor logp, old_logp, ref_logp, entropy, mask, rewards, group_offsets;
};

const rank_batch& rank_data(int64_t N) {
  static std::map<int64_t, std::unique_ptr<rank_batch>> cache;
  auto& slot = cache[N];
  if (slot) return *slot;
  at::manual_seed(1234 + static_cast<uint64_t>(rank));
  auto b = std::make_unique<rank_batch>();
  const int64_t R = N / width / world;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  b->logp = -at::rand({R, width}, f32) * 3 - 1e-4;
  b->old_logp = at::clamp_max(b->logp + 0.2 * at::randn({R, width}, f32), -1e-6);
  b->ref_logp = at::clamp_max(b->logp + 0.1 * at::randn({R, width}, f32), 0.0);
  b->entropy = at::rand({R, width}, f32) * 3;
  const at::Tensor lengths = at::randint(width / 4, width + 1, {R, 1}, at::kLong);
  b->mask = at::arange(width, at::kLong).unsqueeze(0) < lengths;
  b->rewards = (at::rand({R}, f32) < 0.5).to(at::kFloat);
  b->group_offsets = at::arange(0, R + 1, group_size, at::kLong);
  for (at::Tensor* t : {&b->logp, &b->old_logp, &b->ref_logp, &b->entropy, &b->mask, &b->rewards, &b->group_offsets})
    *t = t->to(device);
  slot = std::move(b);
  return *slot;
}

reco::torch::policy_inputs inputs_of(const rank_batch& b, const at::Tensor& logp) {
  reco::torch::policy_inputs in;
  in.logp = logp;
  in.old_logp = b.old_logp;
  in.ref_logp = b.ref_logp;
  in.entropy = b.entropy;
  in.mask = b.mask;
  in.rewards = b.rewards;
  in.group_offsets = b.group_offsets;
  return in;
}

// Both ranks enter the timed loop together (outside the timing).
void line_up() { group->barrier()->wait(); }

void counters(benchmark::State& state, int64_t N) {
  state.counters["step_tokens"] = static_cast<double>(N);
  state.counters["rank_tokens"] = static_cast<double>(N / world);
  // Per token of the step: a flat value across N means linear cost.
  state.counters["time_per_step_token"] = benchmark::Counter(
      static_cast<double>(N), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// How the plan is built: over the group; over the group with the layout given (no all-gather of
// the ranks' shapes); without a group (this rank's half as the whole step); over the group with
// the other kind of token passes (CUDA tensors: the host passes over copies, as before the device
// passes; CPU tensors: tensor operations, what CUDA tensors run, here on the CPU).
enum plan_mode { collective, collective_given_layout, local, collective_other_passes };

void BM_plan(benchmark::State& state, const std::string& preset, plan_mode mode) {
  const int64_t N = state.range(0);
  const rank_batch& b = rank_data(N);
  const std::vector<reco::torch::policy_inputs> mbs{inputs_of(b, b.logp)};
  const c10::intrusive_ptr<c10d::ProcessGroup> g = mode != local ? group : c10::intrusive_ptr<c10d::ProcessGroup>();
  reco::torch::step_options opt;
  if (mode == collective_given_layout) {
    const int64_t R = b.rewards.numel();  // every rank holds R responses in groups of group_size
    opt.layout = reco::torch::step_layout{R * world, R * rank, R * rank / group_size};
  }
  if (mode == collective_other_passes)
    opt.passes = device.is_cpu() ? reco::torch::plan_passes::tensor_ops : reco::torch::plan_passes::host;
  int collectives = 0;
  line_up();
  for (auto _ : state) {
    ++opt.step;  // the same sequence on both ranks
    const reco::torch::planned_step plan = reco::torch::build_step_plan(g, preset, mbs, {}, opt);
    collectives = plan.collectives;
    benchmark::DoNotOptimize(plan.parts.data());
    sync();
  }
  counters(state, N);
  state.counters["collectives"] = collectives;
}

void BM_call(benchmark::State& state, const std::string& preset, bool planned) {
  const int64_t N = state.range(0);
  const rank_batch& b = rank_data(N);
  const at::Tensor logp = b.logp.clone().requires_grad_(true);
  const reco::torch::policy_inputs in = inputs_of(b, logp);
  // The plan of step 1 (both ranks build it: it is collective).
  reco::torch::step_options opt;
  opt.step = 1;
  const std::vector<reco::torch::policy_inputs> mbs{in};
  const reco::torch::planned_step plan = reco::torch::build_step_plan(group, preset, mbs, {}, opt);
  line_up();
  for (auto _ : state) {
    logp.mutable_grad() = at::Tensor();
    reco::torch::policy_output out =
        planned ? reco::torch::policy_loss(preset, in, {}, plan, 0) : reco::torch::policy_loss(preset, in);
    out.loss.backward();
    benchmark::DoNotOptimize(logp.grad().data_ptr());
    sync();
  }
  counters(state, N);
}

void BM_copy_inputs(benchmark::State& state) {
  const int64_t N = state.range(0);
  const rank_batch& b = rank_data(N);
  const std::vector<at::Tensor> src{b.logp, b.old_logp, b.ref_logp, b.entropy, b.mask};
  std::vector<at::Tensor> dst;
  int64_t bytes = 0;
  for (const auto& t : src) {
    dst.push_back(at::empty_like(t));
    dst.back().fill_(0);  // fault the pages in before timing
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  line_up();
  for (auto _ : state) {
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    benchmark::DoNotOptimize(dst.back().data_ptr());
    sync();
  }
  counters(state, N);
  state.SetBytesProcessed(bytes * state.iterations());
}

// The plan and the call it serves, alternating in one loop: the CPU time of this rank's thread in
// each, summed over the iterations, and their ratio. A machine whose speed drifts between the
// `plan` and `call_planned` rows (a shared guest) moves both halves of this ratio alike.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void BM_plan_over_call(benchmark::State& state, const std::string& preset, bool given_layout) {
  const int64_t N = state.range(0);
  const rank_batch& b = rank_data(N);
  const at::Tensor logp = b.logp.clone().requires_grad_(true);
  const reco::torch::policy_inputs in = inputs_of(b, logp);
  const std::vector<reco::torch::policy_inputs> mbs{in};
  reco::torch::step_options opt;
  if (given_layout) {
    const int64_t R = b.rewards.numel();
    opt.layout = reco::torch::step_layout{R * world, R * rank, R * rank / group_size};
  }
  double plan_cpu = 0, call_cpu = 0, plan_wall = 0, call_wall = 0;
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  line_up();
  for (auto _ : state) {
    const auto wall0 = clock::now();
    const double t0 = thread_cpu_seconds();
    ++opt.step;
    const reco::torch::planned_step plan = reco::torch::build_step_plan(group, preset, mbs, {}, opt);
    sync();
    const double t1 = thread_cpu_seconds();
    const auto wall1 = clock::now();
    logp.mutable_grad() = at::Tensor();
    reco::torch::policy_output out = reco::torch::policy_loss(preset, in, {}, plan, 0);
    out.loss.backward();
    benchmark::DoNotOptimize(logp.grad().data_ptr());
    sync();
    const double t2 = thread_cpu_seconds();
    const auto wall2 = clock::now();
    plan_cpu += t1 - t0;
    call_cpu += t2 - t1;
    plan_wall += seconds(wall0, wall1);
    call_wall += seconds(wall1, wall2);
    state.SetIterationTime(seconds(wall0, wall2));
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["plan_cpu_ms"] = 1e3 * plan_cpu / n;
  state.counters["call_cpu_ms"] = 1e3 * call_cpu / n;
  state.counters["plan_over_call_pct"] = 100.0 * plan_cpu / call_cpu;
  // Wall time (on a GPU the call's time is the device's, which CPU time does not see).
  state.counters["plan_over_call_wall_pct"] = 100.0 * plan_wall / call_wall;
}

// One all-reduce of n doubles over the group, alone: what a collective costs by itself on this
// machine (the sizes of the plan's payloads: a few counts, per-response fields, a histogram).
void BM_allreduce(benchmark::State& state) {
  const int64_t n = state.range(0);
  at::Tensor t = at::zeros({n}, at::TensorOptions().dtype(at::kDouble).device(device));
  line_up();
  for (auto _ : state) {
    std::vector<at::Tensor> ts{t};
    group->allreduce(ts)->wait();
    benchmark::DoNotOptimize(t.data_ptr());
    sync();
  }
  state.counters["doubles"] = static_cast<double>(n);
}

// Fixed iteration counts (the ranks must agree), about 0.3-1 s per run.
int64_t iterations_for(int64_t N) { return N <= (int64_t(1) << 20) ? 40 : N <= (int64_t(4) << 20) ? 12 : 4; }

void register_all() {
  const std::vector<int64_t> sizes{int64_t(1) << 20, int64_t(4) << 20, int64_t(16) << 20};
  for (int64_t N : sizes)
    benchmark::RegisterBenchmark("step_plan/copy_inputs", BM_copy_inputs)
        ->Arg(N)->Iterations(iterations_for(N))->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int64_t n : {int64_t(64), int64_t(8) << 10, int64_t(66) << 10})
    benchmark::RegisterBenchmark("step_plan/allreduce", BM_allreduce)
        ->Arg(n)->Iterations(200)->Unit(benchmark::kMillisecond)->UseRealTime();
  std::vector<std::string> presets{"rule_80_20", "grpo", "reco"};
  if (device.is_cpu()) presets.insert(presets.end(), {"kl_cov", "clip_cov"});  // covariance: CPU tensors only
  for (const std::string& preset : presets) {
    const bool covariance = preset == "kl_cov" || preset == "clip_cov";
    for (int64_t N : sizes) {
      auto add = [&](const char* what, auto fn, auto flag) {
        benchmark::RegisterBenchmark(("step_plan/" + preset + "/" + what).c_str(), fn, preset, flag)
            ->Arg(N)->Iterations(iterations_for(N))->Unit(benchmark::kMillisecond)->UseRealTime();
      };
      add("plan", BM_plan, collective);
      add("plan_given_layout", BM_plan, collective_given_layout);
      add("plan_local", BM_plan, local);
      if (!covariance)  // a covariance plan reads logp on the host: it has no tensor passes
        add(device.is_cpu() ? "plan_tensor_ops" : "plan_host_passes", BM_plan, collective_other_passes);
      add("call_planned", BM_call, true);
      add("call", BM_call, false);
      for (const bool given : {false, true})
        benchmark::RegisterBenchmark(
            ("step_plan/" + preset + (given ? "/plan_given_layout_over_call" : "/plan_over_call")).c_str(),
            BM_plan_over_call, preset, given)
            ->Arg(N)->Iterations(iterations_for(N))->Unit(benchmark::kMillisecond)->UseManualTime();
    }
  }
}

// Rank 1's results are dropped.
class null_reporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

int run_rank(int argc, char** argv, const std::string& store) {
  const char* env = std::getenv("RECO_BENCH_THREADS");
  at::set_num_threads(env ? std::max(1, std::atoi(env)) : 1);
  {
    auto s = c10::make_intrusive<c10d::FileStore>(store, world);
#ifdef RECO_BENCH_STEP_PLAN_NCCL
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, world, c10d::ProcessGroupNCCL::Options::create());
    group = c10::make_intrusive<c10d::ProcessGroup>(s, rank, world);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
#else
    group = reco::torch::loopback_gloo_group(s, rank, world, std::chrono::seconds(120));
#endif
  }
  register_all();
  if (rank == 0) {
#ifdef RECO_BENCH_STEP_PLAN_NCCL
    benchmark::AddCustomContext("ranks", "1 process, ProcessGroupNCCL, CUDA tensors");
#else
    benchmark::AddCustomContext("ranks", "2 processes, ProcessGroupGloo on 127.0.0.1");
#endif
    benchmark::AddCustomContext("threads per rank (LibTorch and OpenMP)", std::to_string(at::get_num_threads()));
    benchmark::AddCustomContext("libtorch", TORCH_VERSION);
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
  } else {
    // The same flags without the output file (rank 0 writes it).
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i)
      if (std::strncmp(argv[i], "--benchmark_out", 15) != 0) args.push_back(argv[i]);
    int n = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&n, args.data());
    null_reporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  group->barrier()->wait();
  group.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "random_interleaving") != nullptr) {
      std::fprintf(stderr, "reco_bench_torch_step_plan: random interleaving would run the ranks' benchmarks in "
                           "different orders; use --benchmark_repetitions without it\n");
      return 2;
    }
  char dir[] = "/tmp/reco_bench_plan_XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string store = std::string(dir) + "/store";
  std::fflush(stdout);
  // One rank (NCCL): no second process.
  const pid_t child = world > 1 ? fork() : 1;  // before LibTorch starts any thread
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  int code = 0;
  if (child == 0) {
    rank = 1;
    if (std::freopen("/dev/null", "w", stdout) == nullptr) _exit(1);
  }
  try {
    code = run_rank(argc, argv, store);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = 1;
  }
  if (child == 0) {
    std::fflush(nullptr);
    _exit(code);
  }
  int status = 0;
  if (world > 1) waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "rank 1 failed (status %d)\n", status);
    code = code ? code : 1;
  }
  std::remove(store.c_str());
  rmdir(dir);
  return code;
}
