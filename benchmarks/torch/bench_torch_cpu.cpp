// LibTorch CPU benchmarks, each against the LibTorch eager composite of the same formulas (the
// way TRL and verl write them), in the same binary and the same run:
//   (a) the per-token objective, forward + backward (loss and d loss / d logp), presets grpo,
//       reco, dapo and rule_80_20, and other forms: sapo (SAPO's soft gate), gpg (REINFORCE,
//       -A logp, with GPG's batch-scaled advantage), kl_cov (verl's KL-Cov, its eager code's
//       formula), dppo (verl's DPPO-TV: truncated detached ratio inside a probability trust
//       region), dapo_token_adv (dapo on given per-token advantages, GAE-like) and grpo_kl_iw
//       (grpo with TRL's importance-weighted KL, kl.importance_weighted = 1);
//       N = 8K, 256K, 4M tokens;
//   (b) log-probability + entropy from logits, forward and forward + backward, N = 1K and 4K
//       rows, V = 32,000 and 151,936, float32 and bfloat16.
// Both sides use the same thread count (RECO_BENCH_THREADS, default: every core) through
// at::set_num_threads, which also sets OpenMP's count used by reco's CPU backend.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/version.h>

#include "reco/torch/policy_loss.hpp"
#include "reco/torch/token_logp_entropy.hpp"

namespace {

// ---- (a) per-token objective -----------------------------------------------------------------

constexpr int64_t group_size = 8;
constexpr int64_t width = 1024;  // padded response length; valid lengths are ragged in [256, 1024]

struct objective_batch {
  int64_t R = 0, T = width;
  at::Tensor logp, old_logp, ref_logp, entropy, mask, maskf, rewards, group_offsets;
  at::Tensor token_adv;  // per-token advantages: the group advantage plus noise, 0 outside the mask
};

// N tokens as [N / 1024, 1024] float32, ragged by the mask, groups of 8, binary rewards.
const objective_batch& objective_data(int64_t N) {
  static std::map<int64_t, std::unique_ptr<objective_batch>> cache;
  auto& slot = cache[N];
  if (slot) return *slot;
  at::manual_seed(1234);
  auto b = std::make_unique<objective_batch>();
  b->R = N / width;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  b->logp = -at::rand({b->R, width}, f32) * 3 - 1e-4;
  b->old_logp = at::clamp_max(b->logp + 0.2 * at::randn({b->R, width}, f32), -1e-6);
  b->ref_logp = at::clamp_max(b->logp + 0.1 * at::randn({b->R, width}, f32), 0.0);
  b->entropy = at::rand({b->R, width}, f32) * 3;
  const at::Tensor lengths = at::randint(width / 4, width + 1, {b->R, 1}, at::kLong);
  b->mask = at::arange(width, at::kLong).unsqueeze(0) < lengths;
  b->maskf = b->mask.to(at::kFloat);
  b->rewards = (at::rand({b->R}, f32) < 0.5).to(at::kFloat);
  b->group_offsets = at::arange(0, b->R + 1, group_size, at::kLong);
  const at::Tensor r = b->rewards.view({-1, group_size});
  const at::Tensor A = ((r - r.mean(1, true)) / (r.std(1, true, true) + 1e-6)).view({-1, 1});
  b->token_adv = ((A + 0.3 * at::randn({b->R, width}, f32)) * b->maskf).contiguous();
  slot = std::move(b);
  return *slot;
}

struct preset_constants {
  bool variance = false, weight = false, kl = false, top20 = false, token_mean = false, sapo = false, gpg = false,
       kl_cov = false, dppo = false, token_adv = false, kl_iw = false;
  double eps_low = 0.2, eps_high = 0.2, dual_c = 3.0;
};

preset_constants constants_of(const std::string& name) {
  preset_constants c;
  if (name == "reco") c.variance = c.weight = c.kl = true;
  if (name == "grpo" || name == "grpo_kl_iw") c.kl = true;
  if (name == "grpo_kl_iw") c.kl_iw = true;
  if (name == "dapo" || name == "rule_80_20" || name == "dapo_token_adv") {
    c.token_mean = true;
    c.eps_high = 0.28;
    c.dual_c = 10.0;
  }
  if (name == "rule_80_20") c.top20 = true;
  if (name == "sapo") c.sapo = true;
  if (name == "gpg") c.gpg = c.token_mean = true;
  if (name == "kl_cov") c.kl_cov = c.token_mean = true;
  if (name == "dppo") c.dppo = c.token_mean = true;
  if (name == "dapo_token_adv") c.token_adv = true;
  return c;
}

// The reco preset a benchmark case runs and its overrides (dapo_token_adv: dapo on given
// per-token advantages; grpo_kl_iw: grpo with the KL estimate times the ratio).
std::string reco_preset_of(const std::string& name) {
  if (name == "dapo_token_adv") return "dapo";
  if (name == "grpo_kl_iw") return "grpo";
  return name;
}
std::map<std::string, double> overrides_of(const std::string& name) {
  if (name == "grpo_kl_iw") return {{"kl.importance_weighted", 1.0}};
  return {};
}

at::Tensor masked_mean(const at::Tensor& x, const at::Tensor& m) { return (x * m).sum() / m.sum(); }

// The eager composite: group advantages, ratio, PPO clip with the dual clip, response weights,
// top-k entropy selection, aggregation, k3 KL and the usual two diagnostics (clip fraction and
// ppo_kl, read back with .item() as trainers log them).
at::Tensor eager_kl_cov(const objective_batch& b, const at::Tensor& logp, const at::Tensor& A);

at::Tensor eager_objective(const preset_constants& c, const objective_batch& b, const at::Tensor& logp) {
  const at::Tensor& m = b.maskf;
  const at::Tensor r = b.rewards.view({-1, group_size});
  const at::Tensor log_ratio = at::clamp(logp - b.old_logp, -20.0, 20.0);
  if (c.gpg) {  // GPG: A = R / max(1, #non-zero rewards) (r - group mean); loss -A logp, token mean
    const double alpha = double(r.numel()) / std::max<double>(1.0, (r != 0).sum().item<double>());
    const at::Tensor A = (alpha * (r - r.mean(1, true))).view({-1, 1});
    {
      at::NoGradGuard no_grad;
      benchmark::DoNotOptimize(masked_mean(-log_ratio, m).item<float>());
    }
    return (-A * logp * m).sum() / m.sum();
  }
  const at::Tensor A =
      c.token_adv ? b.token_adv : ((r - r.mean(1, true)) / (r.std(1, true, true) + 1e-6)).view({-1, 1});
  if (c.kl_cov) return eager_kl_cov(b, logp, A);
  if (c.dppo) {  // DPPO-TV: -A sg(min(r, 20)) logp where p - p_old stays in [-0.2, 0.2] by A's sign
    const at::Tensor w = at::clamp_max(at::exp(log_ratio), 20.0).detach();
    at::Tensor valid;
    {
      at::NoGradGuard no_grad;
      const at::Tensor dp = at::exp(logp) - at::exp(b.old_logp);
      valid = at::where(A > 0, dp <= 0.2, dp >= -0.2).to(at::kFloat);
      benchmark::DoNotOptimize(masked_mean(1 - valid, m).item<float>());
      benchmark::DoNotOptimize(masked_mean(-log_ratio, m).item<float>());
    }
    return (-A * w * logp * valid * m).sum() / m.sum();
  }
  if (c.sapo) {  // SAPO: gate (4 / tau) sigmoid(tau (r - 1)), tau 1 (A > 0) or 1.05; seq-mean-token-mean
    const at::Tensor tau = at::where(A > 0, at::full_like(A, 1.0), at::full_like(A, 1.05));
    const at::Tensor pg = -at::sigmoid(tau * (at::exp(log_ratio) - 1)) * 4 / tau * A;
    {
      at::NoGradGuard no_grad;
      benchmark::DoNotOptimize(masked_mean(-log_ratio, m).item<float>());
    }
    return ((pg * m).sum(1) / m.sum(1).clamp_min(1)).mean();
  }
  at::Tensor ratio;
  if (c.variance) {
    auto log_var = [](const at::Tensor& q) { return at::clamp_min(q + at::log(-at::expm1(q)), std::log(1e-12)); };
    const at::Tensor lv = at::clamp(log_var(logp.detach()) - log_var(b.old_logp), -20.0, 20.0);
    ratio = at::exp(lv) * at::exp(logp - logp.detach());
  } else {
    ratio = at::exp(log_ratio);
  }
  const at::Tensor pg1 = -A * ratio;
  const at::Tensor pg2 = -A * at::clamp(ratio, 1 - c.eps_low, 1 + c.eps_high);
  at::Tensor pg = at::maximum(pg1, pg2);
  pg = at::where(A < 0, at::minimum(pg, -A * c.dual_c), pg);
  if (c.weight) {
    const at::Tensor mean_old = (b.old_logp * m).sum(1, true) / m.sum(1, true).clamp_min(1);
    pg = pg * at::clamp_max(at::exp(-std::log(double(group_size)) - mean_old), 10.0);
  }
  at::Tensor kept = m;
  if (c.top20) {
    const at::Tensor h = b.entropy.masked_fill(~b.mask, -INFINITY).view({-1});
    const int64_t n_valid = b.mask.sum().item<int64_t>();
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(0.2 * double(n_valid))));
    kept = at::zeros({h.numel()}, at::kFloat).index_fill_(0, std::get<1>(at::topk(h, k)), 1.0).view(m.sizes());
  }
  auto aggregate = [&](const at::Tensor& x, const at::Tensor& w) {
    if (c.token_mean) return (x * w).sum() / m.sum();
    return ((x * w).sum(1) / m.sum(1).clamp_min(1)).mean();
  };
  at::Tensor loss = aggregate(pg, kept);
  if (c.kl) {
    const at::Tensor e = at::clamp(b.ref_logp - logp, -20.0, 20.0);
    at::Tensor k3 = at::clamp(at::exp(e) - e - 1, -10.0, 10.0);
    if (c.kl_iw) k3 = k3 * at::exp(logp - b.old_logp);  // not detached: the product rule applies
    loss = loss + 1e-3 * aggregate(k3, m);
  }
  {
    at::NoGradGuard no_grad;
    benchmark::DoNotOptimize(masked_mean((pg2 > pg1).to(at::kFloat), m).item<float>());
    benchmark::DoNotOptimize(masked_mean(-log_ratio, m).item<float>());
  }
  return loss;
}

// verl's compute_policy_loss_kl_cov (kl_cov_ratio 2e-4, ppo_kl_coef 0.1), token-mean: the
// covariance of advantage and log-probability over the valid tokens, top-k, + coef |log ratio|
// on those tokens, and verl's ppo_kl diagnostic.
at::Tensor eager_kl_cov(const objective_batch& b, const at::Tensor& logp, const at::Tensor& A) {
  const at::Tensor& m = b.maskf;
  const at::Tensor adv = A.expand_as(logp);
  const at::Tensor d = logp - b.old_logp;
  const at::Tensor ratio = at::exp(d);
  at::Tensor pg = -adv * ratio;
  const at::Tensor pg_kl = -adv * ratio + 0.1 * d.abs();
  const at::Tensor valid_idx = at::nonzero(b.mask.reshape({-1})).squeeze(1);
  const at::Tensor va = adv.reshape({-1}).index_select(0, valid_idx);
  const at::Tensor vl = logp.detach().reshape({-1}).index_select(0, valid_idx);
  const at::Tensor cov = (va - va.mean()) * (vl - vl.mean());
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(double(cov.numel()) * 2e-4));
  const at::Tensor top = valid_idx.index_select(0, std::get<1>(at::topk(cov, k)));
  const at::Tensor sel = at::zeros({logp.numel()}, at::kBool).index_fill_(0, top, true).view(logp.sizes());
  pg = at::where(sel, pg_kl, pg);
  const at::Tensor loss = (pg * m).sum() / m.sum();
  {
    at::NoGradGuard no_grad;
    benchmark::DoNotOptimize(masked_mean(d.abs(), m).item<float>());
  }
  return loss;
}

// The inputs the preset reads, as a trainer passes them (an input given but not read is checked
// for NaN/inf, a pass the eager composite does not make).
reco::torch::policy_inputs adapter_inputs(const objective_batch& b, const at::Tensor& logp, const std::string& preset) {
  const preset_constants c = constants_of(preset);
  reco::torch::policy_inputs in;
  in.logp = logp;
  in.old_logp = b.old_logp;
  if (c.kl) in.ref_logp = b.ref_logp;
  if (c.top20) in.entropy = b.entropy;
  in.mask = b.mask;
  if (c.token_adv) {
    in.token_advantages = b.token_adv;
  } else {
    in.rewards = b.rewards;
    in.group_offsets = b.group_offsets;
  }
  return in;
}

void set_objective_counters(benchmark::State& state, int64_t N) {
  state.SetItemsProcessed(state.iterations() * N);
  state.counters["tokens"] = static_cast<double>(N);
}

void BM_objective_reco(benchmark::State& state, const std::string& preset) {
  const int64_t N = state.range(0);
  const objective_batch& b = objective_data(N);
  const at::Tensor logp = b.logp.clone().requires_grad_(true);
  const reco::torch::policy_inputs in = adapter_inputs(b, logp, preset);
  for (auto _ : state) {
    logp.mutable_grad() = at::Tensor();
    reco::torch::policy_output out = reco::torch::policy_loss(reco_preset_of(preset), in, overrides_of(preset));
    out.loss.backward();
    benchmark::DoNotOptimize(logp.grad().data_ptr());
  }
  set_objective_counters(state, N);
}

void BM_objective_eager(benchmark::State& state, const std::string& preset) {
  const int64_t N = state.range(0);
  const objective_batch& b = objective_data(N);
  const preset_constants c = constants_of(preset);
  const at::Tensor logp = b.logp.clone().requires_grad_(true);
  for (auto _ : state) {
    logp.mutable_grad() = at::Tensor();
    at::Tensor loss = eager_objective(c, b, logp);
    loss.backward();
    benchmark::DoNotOptimize(logp.grad().data_ptr());
  }
  set_objective_counters(state, N);
}

// ---- (b) log-probability + entropy from logits -----------------------------------------------

struct logits_batch {
  at::Tensor logits, tokens, g_logp, g_entropy;
};

const logits_batch& logits_data(int64_t N, int64_t V, at::ScalarType dt) {
  static std::map<std::tuple<int64_t, int64_t, int>, std::unique_ptr<logits_batch>> cache;
  // Keep one shape alive at a time: the largest takes 2.5 GB in float32.
  const auto key = std::make_tuple(N, V, static_cast<int>(dt));
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  cache.clear();
  at::manual_seed(99);
  auto b = std::make_unique<logits_batch>();
  b->logits = (at::randn({N, V}, at::kFloat) * 2).to(dt);
  b->tokens = at::randint(0, V, {N}, at::kLong);
  b->g_logp = at::randn({N}, at::kFloat);
  b->g_entropy = at::randn({N}, at::kFloat);
  return *(cache[key] = std::move(b));
}

// TRL/verl: log_softmax in float32, gather the sampled token, entropy = -sum p log p.
std::tuple<at::Tensor, at::Tensor> eager_logp_entropy(const at::Tensor& logits, const at::Tensor& tokens) {
  const at::Tensor ls = at::log_softmax(logits, -1, at::kFloat);
  const at::Tensor logp = ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  const at::Tensor entropy = -(ls.exp() * ls).sum(-1);
  return {logp, entropy};
}

void logits_counters(benchmark::State& state, int64_t N, int64_t V, at::ScalarType dt, bool backward) {
  const double bytes = double(N) * double(V) * double(c10::elementSize(dt)) * (backward ? 3.0 : 1.0);
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  state.counters["rows"] = double(N);
  state.counters["vocab"] = double(V);
}

template <bool Reco, bool Backward>
void BM_logits(benchmark::State& state, at::ScalarType dt) {
  const int64_t N = state.range(0), V = state.range(1);
  const logits_batch& b = logits_data(N, V, dt);
  const at::Tensor logits = Backward ? b.logits.detach().requires_grad_(true) : b.logits;
  for (auto _ : state) {
    if (Backward) logits.mutable_grad() = at::Tensor();
    at::Tensor logp, entropy;
    if (Reco) std::tie(logp, entropy) = reco::torch::token_logp_entropy(logits, b.tokens);
    else std::tie(logp, entropy) = eager_logp_entropy(logits, b.tokens);
    if (Backward) (logp * b.g_logp + entropy * b.g_entropy).sum().backward();
    benchmark::DoNotOptimize(entropy.data_ptr());
  }
  logits_counters(state, N, V, dt, Backward);
}

// Checks once that both sides compute the same thing before timing them.
void check_agreement() {
  for (const char* preset : {"grpo", "reco", "dapo", "rule_80_20", "sapo", "gpg", "kl_cov", "dppo", "dapo_token_adv",
                             "grpo_kl_iw"}) {
    const objective_batch& b = objective_data(8192);
    const at::Tensor l1 = b.logp.clone().requires_grad_(true), l2 = b.logp.clone().requires_grad_(true);
    auto out = reco::torch::policy_loss(reco_preset_of(preset), adapter_inputs(b, l1, preset), overrides_of(preset));
    out.loss.backward();
    at::Tensor e = eager_objective(constants_of(preset), b, l2);
    e.backward();
    const double dl = std::abs(out.loss.item<double>() - e.item<double>());
    const double dg = (l1.grad() - l2.grad()).abs().max().item<double>();
    if (dl > 1e-5 * (1 + std::abs(e.item<double>())) || dg > 1e-6) {
      std::fprintf(stderr, "eager composite and reco disagree for %s: loss %g, grad %g\n", preset, dl, dg);
      std::exit(1);
    }
  }
  const logits_batch& lb = logits_data(64, 32000, at::kFloat);
  auto [a1, a2] = reco::torch::token_logp_entropy(lb.logits, lb.tokens);
  auto [r1, r2] = eager_logp_entropy(lb.logits, lb.tokens);
  if ((a1 - r1).abs().max().item<double>() > 1e-3 || (a2 - r2).abs().max().item<double>() > 1e-3) {
    std::fprintf(stderr, "eager and reco logits kernels disagree\n");
    std::exit(1);
  }
}

void register_all() {
  for (const char* preset : {"grpo", "reco", "dapo", "rule_80_20", "sapo", "gpg", "kl_cov", "dppo", "dapo_token_adv",
                             "grpo_kl_iw"}) {
    const std::string p = preset;
    for (int64_t N : {int64_t(8) << 10, int64_t(256) << 10, int64_t(4) << 20}) {
      benchmark::RegisterBenchmark(("objective/" + p + "/reco").c_str(), BM_objective_reco, p)
          ->Arg(N)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.5);
      benchmark::RegisterBenchmark(("objective/" + p + "/eager").c_str(), BM_objective_eager, p)
          ->Arg(N)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.5);
    }
  }
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
    const std::string d = dt == at::kFloat ? "f32" : "bf16";
    for (int64_t V : {int64_t(32000), int64_t(151936)})
      for (int64_t N : {int64_t(1024), int64_t(4096)}) {
        auto add = [&](const std::string& name, auto fn) {
          benchmark::RegisterBenchmark(("logits/" + d + "/" + name).c_str(), fn, dt)
              ->Args({N, V})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
        };
        add("forward/reco", BM_logits<true, false>);
        add("forward/eager", BM_logits<false, false>);
        add("forward_backward/reco", BM_logits<true, true>);
        add("forward_backward/eager", BM_logits<false, true>);
      }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("RECO_BENCH_THREADS");
  const int threads = env ? std::atoi(env) : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  benchmark::AddCustomContext("threads (LibTorch and OpenMP)", std::to_string(at::get_num_threads()));
  benchmark::AddCustomContext("libtorch", TORCH_VERSION);
  check_agreement();
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
