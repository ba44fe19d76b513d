// Every preset (and the components with their own device code paths) on the CUDA backend must
// match the CPU backend: same loss, gradients and diagnostics up to summation order.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/random_batch.hpp"
#include "reco/backend/cuda.cuh"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/reco.hpp"
#include "reco/batch_ops/entropy_threshold.hpp"

namespace {

using reco::index_t;
using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::master_batch;
using reco_test::typed_batch;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device on this machine: CPU-vs-CUDA parity not run"

template <class T>
struct device_array {
  T* ptr = nullptr;
  index_t n = 0;
  device_array() = default;
  explicit device_array(const std::vector<T>& host) : n(static_cast<index_t>(host.size())) {
    if (n == 0) return;
    cudaMalloc(&ptr, sizeof(T) * host.size());
    cudaMemcpy(ptr, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice);
  }
  explicit device_array(index_t count) : n(count) {
    if (n > 0) cudaMalloc(&ptr, sizeof(T) * static_cast<std::size_t>(n));
  }
  ~device_array() { cudaFree(ptr); }
  device_array(const device_array&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(static_cast<std::size_t>(n));
    if (n > 0) cudaMemcpy(h.data(), ptr, sizeof(T) * h.size(), cudaMemcpyDeviceToHost);
    return h;
  }
  reco::span<const T> cspan() const { return reco::span<const T>(ptr, n); }
  reco::span<T> span() { return reco::span<T>(ptr, n); }
};

// The same batch in device memory.
template <class T>
struct device_batch {
  device_array<T> logp, old_logp, ref_logp, entropy, token_weights, rewards, advantages, response_weights;
  device_array<std::uint8_t> mask;
  device_array<index_t> offsets, group_offsets;
  reco::batch_view<T> v;
  explicit device_batch(const typed_batch<T>& h)
      : logp(h.logp), old_logp(h.old_logp), ref_logp(h.ref_logp), entropy(h.entropy), token_weights(h.token_weights),
        rewards(h.rewards), advantages(h.advantages), response_weights(h.response_weights), mask(h.mask),
        offsets(h.offsets), group_offsets(h.group_offsets) {
    v.layout = h.padded ? reco::padded(h.R, h.T_len) : reco::packed(offsets.cspan());
    v.group_offsets = group_offsets.cspan();
    v.logp = logp.cspan();
    v.old_logp = old_logp.cspan();
    v.ref_logp = ref_logp.cspan();
    v.entropy = entropy.cspan();
    v.mask = mask.cspan();
    v.token_weights = token_weights.cspan();
    v.rewards = rewards.cspan();
    v.advantages = advantages.cspan();
    v.response_weights = response_weights.cspan();
  }
};

void expect_close(double a, double b, const std::string& what) {
  EXPECT_NEAR(a, b, 1e-12 * (1 + std::fabs(b))) << what;
}

template <class Obj, class T>
void check_parity(const Obj& obj, const master_batch& m, const std::string& label) {
  SCOPED_TRACE(label);
  typed_batch<T> h(m);
  std::vector<T> g_cpu(m.logp.size()), gh_cpu(m.logp.size());
  reco::workspace<reco::cpu> ws_cpu;
  const auto r_cpu = obj(reco::cpu{}, h.view(),
                         reco::gradients<T>{g_cpu, Obj::has_entropy_gradient ? reco::span<T>(gh_cpu) : reco::span<T>()},
                         ws_cpu);
  device_batch<T> d(h);
  device_array<T> g(static_cast<index_t>(m.logp.size())), gh(static_cast<index_t>(m.logp.size()));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  reco::workspace<reco::cuda> ws;
  const auto r_gpu = obj(reco::cuda{stream}, d.v,
                         reco::gradients<T>{g.span(), Obj::has_entropy_gradient ? gh.span() : reco::span<T>()}, ws);
  // A second call reuses the workspace (no growth) and must give the same bits.
  const auto r_again = obj(reco::cuda{stream}, d.v,
                           reco::gradients<T>{g.span(), Obj::has_entropy_gradient ? gh.span() : reco::span<T>()}, ws);
  cudaStreamDestroy(stream);
  EXPECT_EQ(std::memcmp(&r_gpu.loss, &r_again.loss, sizeof(double)), 0) << "run-to-run determinism";
  expect_close(r_gpu.loss, r_cpu.loss, "loss");
  expect_close(r_gpu.policy_loss, r_cpu.policy_loss, "policy_loss");
  expect_close(r_gpu.kl_loss, r_cpu.kl_loss, "kl_loss");
  expect_close(r_gpu.entropy_loss, r_cpu.entropy_loss, "entropy_loss");
  expect_close(r_gpu.stats.clip_frac, r_cpu.stats.clip_frac, "clip_frac");
  expect_close(r_gpu.stats.ratio_mean, r_cpu.stats.ratio_mean, "ratio_mean");
  expect_close(r_gpu.stats.weight_mean, r_cpu.stats.weight_mean, "weight_mean");
  expect_close(r_gpu.stats.advantage_std, r_cpu.stats.advantage_std, "advantage_std");
  EXPECT_EQ(r_gpu.stats.policy_tokens, r_cpu.stats.policy_tokens);
  EXPECT_EQ(r_gpu.stats.weight_cap_hits, r_cpu.stats.weight_cap_hits);
  const auto g_gpu = g.to_host();
  for (std::size_t t = 0; t < g_cpu.size(); ++t)
    ASSERT_NEAR(static_cast<double>(g_gpu[t]), static_cast<double>(g_cpu[t]),
                1e-12 + 1e-6 * std::fabs(static_cast<double>(g_cpu[t])))
        << "token " << t;
  if (Obj::has_entropy_gradient) {
    const auto gh_gpu = gh.to_host();
    for (std::size_t t = 0; t < gh_cpu.size(); ++t) ASSERT_EQ(gh_gpu[t], gh_cpu[t]);
  }
}

template <class Obj>
void check_preset(const std::string& name) {
  const auto specs = reco_test::standard_specs();
  for (std::size_t k = 0; k < specs.size(); k += 3) {
    master_batch m = make_batch(4000 + k, specs[k]);
    check_parity<Obj, double>(Obj{}, m, name + " double " + std::to_string(k));
    reco_test::round_to<float>(m);
    check_parity<Obj, float>(Obj{}, m, name + " float " + std::to_string(k));
  }
  // A large ragged batch: many tokens per response, so the flat token reduction matters.
  batch_spec big;
  big.groups = 64;
  big.max_length = 2000;
  big.response_weights = true;  // as in every standard spec (caller_weight reads them)
  check_parity<Obj, float>(Obj{}, make_batch(77, big), name + " large");
}

TEST(CudaParity, Presets) {
  REQUIRE_DEVICE();
  check_preset<reco::presets::grpo>("grpo");
  check_preset<reco::presets::dr_grpo>("dr_grpo");
  check_preset<reco::presets::dapo>("dapo");
  check_preset<reco::presets::gspo>("gspo");
  check_preset<reco::presets::cispo>("cispo");
  check_preset<reco::presets::aspo>("aspo");
  check_preset<reco::presets::reco>("reco");
  check_preset<reco::presets::reco_no_cap>("reco_no_cap");
  check_preset<reco::presets::reco_response_only>("reco_response_only");
  check_preset<reco::presets::reco_token_only>("reco_token_only");
  check_preset<reco::presets::dapo_reco>("dapo_reco");
  check_preset<reco::presets::rule_80_20>("rule_80_20");
  check_preset<reco::presets::rule_80_20_reco>("rule_80_20_reco");
  check_preset<reco::presets::trl_bnpo>("trl_bnpo");
  check_preset<reco::presets::trl_luspo>("trl_luspo");
  check_preset<reco::presets::trl_vespo>("trl_vespo");
}

TEST(CudaParity, DevicePathsOfComponents) {
  REQUIRE_DEVICE();
  // Entropy quantiles (segmented sort), sequence ratios, batch-stage advantages, weight
  // normalisation, the quantile selection and the entropy gradient.
  check_preset<reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::caller_weight,
                               reco::seq_mean_token_mean>>("reinforce_pp + gmpo + caller weights");
  {
    using obj_t = reco::objective<reco::batch_std_advantage, reco::variance_ratio, reco::entropy_split_clip,
                                  reco::expected_count_weight, reco::token_mean, reco::entropy_bonus, reco::kl_penalty>;
    check_preset<obj_t>("entropy split + entropy bonus");
  }
  {
    using obj_t = reco::objective<reco::gpg_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                  reco::seq_mean_token_mean, reco::top_entropy_selection>;
    obj_t o;
    o.select.params.rule = reco::selection_rule::quantile;
    o.select.params.denominator = reco::selection_denominator::kept;
    const auto specs = reco_test::standard_specs();
    for (std::size_t k = 0; k < specs.size(); k += 4)
      check_parity<obj_t, double>(o, make_batch(5000 + k, specs[k]), "quantile selection " + std::to_string(k));
  }
}

TEST(CudaParity, SelectionTiesAndPopulationCut) {
  REQUIRE_DEVICE();
  // Quantised entropies: many ties at the cut, which the CUDA path resolves with a scan.
  batch_spec s;
  s.groups = 30;
  s.max_length = 200;
  master_batch m = make_batch(9, s);
  for (double& h : m.entropy) h = std::round(h * 4.0) / 4.0;
  check_parity<reco::presets::rule_80_20, double>(reco::presets::rule_80_20{}, m, "ties");
  typed_batch<double> h(m);
  device_batch<double> d(h);
  reco::workspace<reco::cpu> wc;
  reco::workspace<reco::cuda> wg;
  reco::top_entropy_selection::params_type p;
  const auto c_cpu = reco::entropy_threshold(reco::cpu{}, reco::span<const double>(h.entropy),
                                             reco::span<const std::uint8_t>(h.mask), p, wc);
  const auto c_gpu = reco::entropy_threshold(reco::cuda{}, d.entropy.cspan(), d.mask.cspan(), p, wg);
  EXPECT_EQ(c_cpu.value, c_gpu.value);
  EXPECT_EQ(c_cpu.ties, c_gpu.ties);
}

TEST(CudaParity, GroupFilterCompaction) {
  REQUIRE_DEVICE();
  std::vector<double> rewards = {1, 1, 1, 0, 1, 5, 0, 0, 2, 3, 2};
  std::vector<index_t> groups = {0, 3, 5, 6, 8, 11};
  device_array<double> dr(rewards);
  device_array<index_t> dg(groups), kept(static_cast<index_t>(rewards.size())), kg(static_cast<index_t>(groups.size()));
  reco::workspace<reco::cuda> ws;
  const auto c = reco::filter_groups(reco::cuda{}, dr.cspan(), dg.cspan(), reco::group_filter_params{}, kept.span(),
                                     kg.span(), ws);
  EXPECT_EQ(c.groups, 3);
  EXPECT_EQ(c.responses, 6);
  const auto k = kept.to_host();
  EXPECT_EQ(std::vector<index_t>(k.begin(), k.begin() + 6), (std::vector<index_t>{3, 4, 5, 8, 9, 10}));
}

}  // namespace
