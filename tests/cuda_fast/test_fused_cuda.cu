// The fused CUDA objective on a GPU: against the generic CUDA passes and the CPU backend for every
// preset and the components with their own device stages (ragged batches, > 65,535 responses,
// token offsets past 2^31 bytes), bitwise run-to-run determinism, CUDA-graph capture and replay
// (with the number of kernels captured), steady-state workspace reuse, device-side error flags,
// and the raw adapter end to end (C++ and C interfaces, the logits op). Every test skips on a
// machine without a CUDA device.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <thrust/fill.h>
#include <thrust/system/cuda/execution_policy.h>

#include "core/random_batch.hpp"
#include "core/step_split.hpp"
#include "cuda_fast/fused_compare.hpp"
#include "reco/backend/cuda.cuh"
#include "reco/fused/objective.cuh"
#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/objective.cuh"
#include "reco/cuda_adapter/presets_by_name.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/logits/logp_entropy.cuh"
#include "reco/reco.hpp"

namespace {

using reco::index_t;
using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::master_batch;
using reco_test::typed_batch;
namespace ps = reco::presets;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device"

void ok(cudaError_t e, const char* what = "CUDA call") {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <class T>
struct device_array {
  T* ptr = nullptr;
  index_t n = 0;
  device_array() = default;
  explicit device_array(index_t count) : n(count) {
    if (n > 0) ok(cudaMalloc(&ptr, sizeof(T) * static_cast<std::size_t>(n)), "cudaMalloc");
  }
  explicit device_array(const std::vector<T>& host) : device_array(static_cast<index_t>(host.size())) {
    if (n > 0) ok(cudaMemcpy(ptr, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), "upload");
  }
  ~device_array() { cudaFree(ptr); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> h(static_cast<std::size_t>(n));
    // The calls run on non-blocking streams, which a plain cudaMemcpy does not wait for.
    ok(cudaDeviceSynchronize(), "synchronize before download");
    if (n > 0) ok(cudaMemcpy(h.data(), ptr, sizeof(T) * h.size(), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  reco::span<const T> cspan() const { return reco::span<const T>(ptr, n); }
  reco::span<T> span() { return reco::span<T>(ptr, n); }
};

// A master batch in device memory, with its view.
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

struct stream_guard {
  cudaStream_t s = nullptr;
  stream_guard() { ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream"); }
  ~stream_guard() { cudaStreamDestroy(s); }
};

reco::objective_result read_result(const reco::objective_result* d, cudaStream_t s) {
  reco::objective_result r;
  ok(cudaMemcpyAsync(&r, d, sizeof(r), cudaMemcpyDeviceToHost, s), "result");
  ok(cudaStreamSynchronize(s), "sync");
  return r;
}

::testing::AssertionResult close(double got, double want, double rel, const std::string& what) {
  if (std::fabs(got - want) <= rel * std::fabs(want) + 1e-300 || (std::isnan(got) && std::isnan(want)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << got << " vs " << want;
}

// Scalars agree up to summation order; counts exactly; status bits exactly.
void expect_same(const reco::objective_result& a, const reco::objective_result& b, const std::string& what) {
  const double rel = 1e-11;
  EXPECT_TRUE(close(a.loss, b.loss, rel, what + " loss"));
  EXPECT_TRUE(close(a.policy_loss, b.policy_loss, rel, what + " policy_loss"));
  EXPECT_TRUE(close(a.kl_loss, b.kl_loss, rel, what + " kl_loss"));
  EXPECT_TRUE(close(a.entropy_loss, b.entropy_loss, rel, what + " entropy_loss"));
  const auto &x = a.stats, &y = b.stats;
  EXPECT_TRUE(close(x.clip_frac, y.clip_frac, rel, what + " clip_frac"));
  EXPECT_TRUE(close(x.clip_frac_low, y.clip_frac_low, rel, what + " clip_frac_low"));
  EXPECT_TRUE(close(x.clip_frac_high, y.clip_frac_high, rel, what + " clip_frac_high"));
  EXPECT_TRUE(close(x.dual_clip_frac, y.dual_clip_frac, rel, what + " dual_clip_frac"));
  EXPECT_TRUE(close(x.ppo_kl, y.ppo_kl, rel, what + " ppo_kl"));
  EXPECT_TRUE(close(x.ratio_mean, y.ratio_mean, rel, what + " ratio_mean"));
  EXPECT_TRUE(close(x.ratio_min, y.ratio_min, rel, what + " ratio_min"));
  EXPECT_TRUE(close(x.ratio_max, y.ratio_max, rel, what + " ratio_max"));
  EXPECT_TRUE(close(x.ref_kl_mean, y.ref_kl_mean, rel, what + " ref_kl_mean"));
  EXPECT_TRUE(close(x.entropy_mean, y.entropy_mean, rel, what + " entropy_mean"));
  EXPECT_TRUE(close(x.entropy_kept_mean, y.entropy_kept_mean, rel, what + " entropy_kept_mean"));
  EXPECT_TRUE(close(x.kept_frac, y.kept_frac, rel, what + " kept_frac"));
  EXPECT_TRUE(close(x.weight_mean, y.weight_mean, rel, what + " weight_mean"));
  EXPECT_TRUE(close(x.weight_min, y.weight_min, rel, what + " weight_min"));
  EXPECT_TRUE(close(x.weight_max, y.weight_max, rel, what + " weight_max"));
  EXPECT_TRUE(close(x.zero_std_group_frac, y.zero_std_group_frac, rel, what + " zero_std_group_frac"));
  // Standardised advantages have a mean of 0 up to rounding: the summation order of the two
  // paths shows at eps times their spread, so the mean is compared on that scale.
  EXPECT_LE(std::fabs(x.advantage_mean - y.advantage_mean),
            1e-9 * std::fabs(y.advantage_mean) + 1e-12 * (1 + std::fabs(y.advantage_std)))
      << what << " advantage_mean: " << x.advantage_mean << " vs " << y.advantage_mean;
  EXPECT_TRUE(close(x.advantage_std, y.advantage_std, 1e-9, what + " advantage_std"));
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(close(x.token_variance[k], y.token_variance[k], rel, what + " variance"));
  EXPECT_EQ(x.weight_cap_hits, y.weight_cap_hits) << what;
  EXPECT_EQ(x.valid_tokens, y.valid_tokens) << what;
  EXPECT_EQ(x.policy_tokens, y.policy_tokens) << what;
  EXPECT_EQ(x.nonempty_responses, y.nonempty_responses) << what;
  EXPECT_EQ(a.status, b.status) << what;
}

// Double inputs: the per-token math is the same double arithmetic; the inputs it gets from
// per-response reductions (mean old log-prob, sequence log-ratio, batch statistics) may differ in
// the last bits.
template <class T>
void expect_same_gradients(const std::vector<T>& a, const std::vector<T>& b, const std::string& what) {
  const double rel = std::is_same_v<T, float> ? 2e-7 : 1e-12;
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t t = 0; t < a.size(); ++t)
    ASSERT_TRUE(close(static_cast<double>(a[t]), static_cast<double>(b[t]), rel, what + " token " + std::to_string(t)));
}

template <class Obj, class T>
void check_fused(const Obj& obj, const master_batch& m, reco::fused_options opt, const std::string& label) {
  SCOPED_TRACE(label);
  typed_batch<T> h(m);
  const auto N = static_cast<index_t>(m.logp.size());
  const bool eg = Obj::has_entropy_gradient;
  // CPU backend
  std::vector<T> g_cpu(m.logp.size()), gh_cpu(m.logp.size());
  reco::workspace<reco::cpu> ws_cpu;
  const auto r_cpu = obj(reco::cpu{}, h.view(),
                         reco::gradients<T>{g_cpu, eg ? reco::span<T>(gh_cpu) : reco::span<T>()}, ws_cpu);
  // generic and fused CUDA paths
  device_batch<T> d(h);
  device_array<T> g_gen(N), gh_gen(N), g_fus(N), gh_fus(N);
  stream_guard stream;
  reco::workspace<reco::cuda> ws_gen;
  reco::workspace<reco::cuda_fused> ws_fus;
  const auto r_gen = obj(reco::cuda{stream.s}, d.v,
                         reco::gradients<T>{g_gen.span(), eg ? gh_gen.span() : reco::span<T>()}, ws_gen);
  const reco::cuda_fused fb(stream.s, opt);
  const auto r_fus = obj(fb, d.v, reco::gradients<T>{g_fus.span(), eg ? gh_fus.span() : reco::span<T>()}, ws_fus);
  const std::vector<T> first = g_fus.to_host();
  const std::size_t capacity = ws_fus.capacity();
  // Run to run: the same bits, and no workspace growth.
  const auto r_again = obj(fb, d.v, reco::gradients<T>{g_fus.span(), eg ? gh_fus.span() : reco::span<T>()}, ws_fus);
  EXPECT_EQ(std::memcmp(&r_fus, &r_again, sizeof(r_fus)), 0) << "fused results differ between two runs";
  const std::vector<T> second = g_fus.to_host();
  EXPECT_EQ(std::memcmp(first.data(), second.data(), sizeof(T) * first.size()), 0) << "gradients differ run to run";
  EXPECT_EQ(ws_fus.capacity(), capacity) << "steady state allocates nothing";

  if constexpr (std::is_same_v<T, float>) {
    // Float inputs: the fused terms in float, the CPU's packed pass in float with other
    // exponentials, the generic CUDA passes in double: within the float bound of each other.
    const std::vector<T> gh_first = eg ? gh_fus.to_host() : std::vector<T>(first.size());
    {
      SCOPED_TRACE("fused vs CPU");
      fused_test::expect_same_call(r_fus, r_cpu, first, g_cpu, gh_first, gh_cpu, eg);
    }
    {
      SCOPED_TRACE("fused vs generic CUDA");
      const std::vector<T> gh_generic = eg ? gh_gen.to_host() : std::vector<T>(first.size());
      fused_test::expect_same_call(r_fus, r_gen, first, g_gen.to_host(), gh_first, gh_generic, eg);
    }
  } else {
    expect_same(r_fus, r_gen, "fused vs generic CUDA");
    expect_same(r_fus, r_cpu, "fused vs CPU");
    expect_same_gradients(first, g_gen.to_host(), "fused vs generic CUDA grad");
    expect_same_gradients(first, g_cpu, "fused vs CPU grad");
    if (eg) expect_same_gradients(gh_fus.to_host(), gh_gen.to_host(), "fused vs generic CUDA entropy grad");
  }
}

std::vector<reco::fused_options> option_sets() {
  reco::fused_options def, few, scalar;
  few.max_blocks = 3;  // long grid-stride walks and a deep last-block merge
  scalar.vector_loads = false;
  return {def, few, scalar};
}

template <class Obj>
void check_objective(const Obj& obj, const std::string& name, int stride = 3) {
  const auto specs = reco_test::standard_specs();
  const auto opts = option_sets();
  for (std::size_t k = 0; k < specs.size(); k += static_cast<std::size_t>(stride)) {
    master_batch m = make_batch(9000 + k, specs[k]);
    const auto& o = opts[k % opts.size()];
    check_fused<Obj, double>(obj, m, o, name + " double " + std::to_string(k));
    reco_test::round_to<float>(m);
    check_fused<Obj, float>(obj, m, o, name + " float " + std::to_string(k));
    if (::testing::Test::HasFatalFailure()) return;
  }
  batch_spec big;
  big.groups = 64;
  big.max_length = 2000;
  big.response_weights = true;  // as in every standard spec (caller_weight reads them)
  for (const auto& o : opts) check_fused<Obj, float>(obj, make_batch(77, big), o, name + " large ragged");
}

TEST(CudaFused, EveryPresetMatchesGenericAndCpu) {
  REQUIRE_DEVICE();
  check_objective(ps::grpo{}, "grpo");
  check_objective(ps::dr_grpo{}, "dr_grpo");
  check_objective(ps::dapo{}, "dapo");
  check_objective(ps::gspo{}, "gspo");
  check_objective(ps::cispo{}, "cispo");
  check_objective(ps::aspo{}, "aspo");
  check_objective(ps::reco{}, "reco");
  check_objective(ps::reco_no_cap{}, "reco_no_cap");
  check_objective(ps::reco_response_only{}, "reco_response_only");
  check_objective(ps::reco_token_only{}, "reco_token_only");
  check_objective(ps::dapo_reco{}, "dapo_reco");
  check_objective(ps::rule_80_20{}, "rule_80_20");
  check_objective(ps::rule_80_20_reco{}, "rule_80_20_reco");
  check_objective(ps::trl_bnpo{}, "trl_bnpo");
  check_objective(ps::trl_luspo{}, "trl_luspo");
  check_objective(ps::trl_vespo{}, "trl_vespo");
}

TEST(CudaFused, ComponentsWithTheirOwnDeviceStages) {
  REQUIRE_DEVICE();
  check_objective(reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::caller_weight,
                                  reco::seq_mean_token_mean>{},
                  "reinforce_pp + gmpo (kernel F + sequence) + caller weights", 2);
  check_objective(reco::objective<reco::batch_std_advantage, reco::variance_ratio, reco::entropy_split_clip,
                                  reco::expected_count_weight, reco::token_mean, reco::entropy_bonus,
                                  reco::kl_penalty>{},
                  "batch std + entropy split (segmented sort) + entropy bonus + kl", 2);
  reco::objective<reco::gpg_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::seq_mean_token_mean, reco::top_entropy_selection>
      q;
  q.select.params.rule = reco::selection_rule::quantile;
  q.select.params.denominator = reco::selection_denominator::kept;
  check_objective(q, "gpg + quantile selection + kept denominator", 2);
  ps::reco bm;
  bm.weight.params.normalise = reco::weight_normalisation::batch_mean;
  check_objective(bm, "reco + batch-mean weights", 2);
}

// Calls of a split step on the device: a step cut into uneven parts (one empty) and planned on
// the CPU; each part's fused call with the plan (its slice copied to the device) equals the CPU
// backend's planned call of that part, and the parts add up to one call on the whole step.
template <class Obj, class T>
void check_planned(const Obj& obj, const master_batch& m, double scale, const std::string& label) {
  SCOPED_TRACE(label);
  const index_t R = m.R;
  reco_test::split_step<T> sp(m, {R / 3, R / 3, (2 * R) / 3 + 1 > R ? R : (2 * R) / 3 + 1},
                              reco::step_info{5, R, scale, 0});
  const reco::step_plan plan = reco::plan_step(obj, sp.step, sp.views, sp.parts);
  const bool eg = Obj::has_entropy_gradient;
  stream_guard stream;
  reco::workspace<reco::cpu> ws_cpu;
  reco::workspace<reco::cuda_fused> ws_fus;
  double loss = 0;
  for (std::size_t p = 0; p < sp.parts.size(); ++p) {
    const std::string part = label + " part " + std::to_string(p);
    const auto N = static_cast<index_t>(sp.subs[p].logp.size());
    std::vector<T> g_cpu(N), gh_cpu(N);
    const auto r_cpu = obj(reco::cpu{}, sp.views[p],
                           reco::gradients<T>{g_cpu, eg ? reco::span<T>(gh_cpu) : reco::span<T>()}, ws_cpu, plan,
                           sp.parts[p]);
    device_batch<T> d(sp.typed[p]);
    device_array<T> g_fus(N), gh_fus(N);
    const auto r_fus = obj(reco::cuda_fused(stream.s), d.v,
                           reco::gradients<T>{g_fus.span(), eg ? gh_fus.span() : reco::span<T>()}, ws_fus, plan,
                           sp.parts[p]);
    if constexpr (std::is_same_v<T, float>) {
      SCOPED_TRACE(part + " fused vs CPU");
      const std::vector<T> gh_part = eg ? gh_fus.to_host() : std::vector<T>(g_cpu.size());
      fused_test::expect_same_call(r_fus, r_cpu, g_fus.to_host(), g_cpu, gh_part, gh_cpu, eg);
    } else {
      expect_same(r_fus, r_cpu, part + " fused vs CPU");
      expect_same_gradients(g_fus.to_host(), g_cpu, part + " grad");
      if (eg) expect_same_gradients(gh_fus.to_host(), gh_cpu, part + " entropy grad");
    }
    loss += r_fus.loss;
  }
  // The whole step in one unplanned call on the device.
  typed_batch<T> h(m);
  device_batch<T> d(h);
  device_array<T> g(static_cast<index_t>(m.logp.size())), gh(static_cast<index_t>(m.logp.size()));
  const auto whole = obj(reco::cuda_fused(stream.s), d.v, reco::gradients<T>{g.span(), eg ? gh.span() : reco::span<T>()},
                         ws_fus);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-11;
  EXPECT_TRUE(close(loss, scale * whole.loss, tol, label + " parts' loss vs the whole step's"));
}

TEST(CudaFused, PlannedPartsMatchCpuAndTheWholeStep) {
  REQUIRE_DEVICE();
  const auto specs = reco_test::standard_specs();
  auto each = [&](const auto& obj, const std::string& name) {
    for (std::size_t k = 0; k < specs.size(); k += 6) {
      master_batch m = make_batch(9300 + k, specs[k]);
      check_planned<std::decay_t<decltype(obj)>, double>(obj, m, 1.0, name + " double, batch " + std::to_string(k));
      reco_test::round_to<float>(m);
      check_planned<std::decay_t<decltype(obj)>, float>(obj, m, 2.0, name + " float, batch " + std::to_string(k));
    }
  };
  each(ps::grpo{}, "grpo");
  each(ps::dr_grpo{}, "dr_grpo");
  each(ps::reco{}, "reco");
  each(ps::gspo{}, "gspo");
  each(ps::dapo_reco{}, "dapo_reco");
  each(ps::rule_80_20{}, "rule_80_20");
  each(ps::rule_80_20_reco{}, "rule_80_20_reco");
  each(reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::caller_weight,
                       reco::seq_mean_token_mean>{},
       "reinforce_pp + gmpo");
}

TEST(CudaFused, MoreThan65535ResponsesAndGroups) {
  REQUIRE_DEVICE();
  batch_spec spec;
  spec.groups = 40000;
  spec.max_group = 3;
  spec.max_length = 9;
  master_batch m = make_batch(11, spec);
  ASSERT_GT(m.R, 65535);
  check_fused<ps::reco, double>(ps::reco{}, m, {}, "reco, > 65,535 responses");
  reco_test::round_to<float>(m);
  check_fused<ps::rule_80_20, float>(ps::rule_80_20{}, m, {}, "rule_80_20, > 65,535 responses");
  check_fused<ps::gspo, float>(ps::gspo{}, m, {}, "gspo, > 65,535 responses");
}

// Token offsets past 2^31 bytes (and the grid-stride walk at over half a billion tokens), checked
// against the closed form: on-policy DAPO with equal log-probs has ratio 1 everywhere, so each
// valid token's gradient is -A_i / N_valid and the loss is -sum_i |o_i| A_i / N_valid.
TEST(CudaFused, TokenOffsetsPast2To31Bytes) {
  REQUIRE_DEVICE();
  const index_t R = 4, len = (index_t(1) << 29) / R + 1001;  // 2^29 + 4004 tokens: 2.15 GB per float array
  const index_t N = R * len;
  std::size_t free_bytes = 0, total = 0;
  ok(cudaMemGetInfo(&free_bytes, &total));
  const std::size_t need = static_cast<std::size_t>(N) * (4 + 4 + 1) + (std::size_t(1) << 28);
  if (free_bytes < need) GTEST_SKIP() << "needs " << need / (1 << 20) << " MiB of free device memory";
  device_array<float> logp(N), grad(N);
  device_array<std::uint8_t> mask(N);
  stream_guard stream;
  auto pol = thrust::cuda::par.on(stream.s);
  thrust::fill_n(pol, logp.ptr, N, -0.5f);
  thrust::fill_n(pol, grad.ptr, N, 123.0f);  // every entry must be overwritten
  thrust::fill_n(pol, mask.ptr, N, std::uint8_t(1));
  // Masked tokens past 2^31 (index and bytes) and at a response boundary.
  const std::vector<index_t> holes = {(index_t(1) << 31) / 4 + 3, len, N - 1};
  for (index_t t : holes) ok(cudaMemsetAsync(mask.ptr + t, 0, 1, stream.s));
  std::vector<index_t> offsets = {0, len, 2 * len, 3 * len, 4 * len}, groups = {0, R};
  std::vector<float> rewards = {1, 0, 0, 0};
  device_array<index_t> d_off(offsets), d_groups(groups);
  device_array<float> d_rewards(rewards);
  reco::batch_view<float> v;
  v.layout = reco::packed(d_off.cspan());
  v.group_offsets = d_groups.cspan();
  v.logp = logp.cspan();
  v.mask = mask.cspan();
  v.rewards = d_rewards.cspan();
  reco::workspace<reco::cuda_fused> ws;
  const ps::dapo obj;
  const auto r = obj(reco::cuda_fused{stream.s}, v, reco::gradients<float>{grad.span(), {}}, ws);

  // Valid counts per response, and the advantages exactly as the group stage computes them.
  std::vector<index_t> n(4, len);
  for (index_t t : holes) --n[static_cast<std::size_t>(t / len)];
  std::vector<double> adv(4);
  std::uint32_t st = 0;
  obj.advantage.group(reco::group_input<float>{4, rewards.data(), n.data()}, adv.data(), st);
  const double nvalid = static_cast<double>(n[0] + n[1] + n[2] + n[3]);
  EXPECT_EQ(r.stats.valid_tokens, N - static_cast<index_t>(holes.size()));
  double loss = 0;
  for (std::size_t i = 0; i < 4; ++i) loss += static_cast<double>(n[i]) * -adv[i];
  EXPECT_NEAR(r.loss, loss / nvalid, 1e-9) << "the terms nearly cancel: an absolute tolerance";
  EXPECT_EQ(r.status, 0u);
  // Spot checks, including past 2^31 bytes and both sides of every boundary.
  std::vector<index_t> probes = {0, len - 1, len, len + 1, 2 * len, (index_t(1) << 31) / 4 - 1,
                                 (index_t(1) << 31) / 4, (index_t(1) << 31) / 4 + 2, 3 * len, N - 2};
  probes.insert(probes.end(), holes.begin(), holes.end());
  for (index_t t : probes) {
    float got = 0;
    ok(cudaMemcpy(&got, grad.ptr + t, sizeof(float), cudaMemcpyDeviceToHost));
    const bool hole = std::find(holes.begin(), holes.end(), t) != holes.end();
    const double a = adv[static_cast<std::size_t>(t / len)];
    // scale * (-A * omega) with scale = (1 / N_valid) * 1 and omega = r = 1: the token step
    // rounds the scale and -A to float and multiplies them in float (two roundings).
    const float want = hole ? 0.0f : static_cast<float>((1.0 / nvalid * 1.0) * (-a * 1.0));
    EXPECT_LE(std::fabs(got - want), 0x1p-22f * std::fabs(want)) << "token " << t;
  }
}

TEST(CudaFused, GraphCaptureReplaysWithTwoKernels) {
  REQUIRE_DEVICE();
  batch_spec spec;
  spec.groups = 50;
  spec.max_length = 300;
  master_batch m = make_batch(21, spec);
  reco_test::round_to<float>(m);
  typed_batch<float> h(m);
  device_batch<float> d(h);
  const auto N = static_cast<index_t>(m.logp.size());
  device_array<float> g_direct(N), g_graph(N);
  stream_guard stream;

  auto capture = [&](const auto& obj, reco::workspace<reco::cuda_fused>& ws, const reco::objective_result** out,
                     int& kernels) {
    const reco::cuda_fused be(stream.s);
    obj.run(be, d.v, reco::gradients<float>{g_graph.span(), {}}, ws);  // warm-up: the workspace grows here
    ok(cudaStreamSynchronize(stream.s));
    cudaGraph_t graph;
    ok(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), "begin capture");
    *out = obj.run(be, d.v, reco::gradients<float>{g_graph.span(), {}}, ws);
    ok(cudaStreamEndCapture(stream.s, &graph), "end capture");
    std::size_t count = 0;
    ok(cudaGraphGetNodes(graph, nullptr, &count));
    std::vector<cudaGraphNode_t> nodes(count);
    ok(cudaGraphGetNodes(graph, nodes.data(), &count));
    kernels = 0;
    for (auto node : nodes) {
      cudaGraphNodeType type;
      ok(cudaGraphNodeGetType(node, &type));
      EXPECT_TRUE(type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemcpy ||
                  type == cudaGraphNodeTypeMemset)
          << "no allocation inside the captured call";
      kernels += type == cudaGraphNodeTypeKernel;
    }
    cudaGraphExec_t exec;
    ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaGraphDestroy(graph);
    return exec;
  };

  auto replay_matches = [&](const auto& obj, const std::string& name, int expected_kernels) {
    SCOPED_TRACE(name);
    reco::workspace<reco::cuda_fused> ws;
    const reco::objective_result* res = nullptr;
    int kernels = 0;
    cudaGraphExec_t exec = capture(obj, ws, &res, kernels);
    if (expected_kernels > 0) {
      EXPECT_EQ(kernels, expected_kernels) << "kernel launches of one call";
      const auto plan = reco::fused::launch_config_for(obj, reco::cuda_fused(stream.s), d.v,
                                               reco::gradients<float>{g_graph.span(), {}});
      EXPECT_EQ(plan.fused_kernels, expected_kernels) << "the planner's count";
      EXPECT_TRUE(plan.vector_loads) << "cudaMalloc'd arrays take the vector path";
    }
    std::string key = "kernels_" + name;
    for (char& ch : key)
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
    RecordProperty(key, kernels);
    // New data in the same buffers, then the graph: it must compute the new batch.
    std::vector<float> shifted(h.logp);
    for (float& x : shifted) x = std::min(x * 0.9f, 0.0f);
    ok(cudaMemcpy(d.logp.ptr, shifted.data(), sizeof(float) * shifted.size(), cudaMemcpyHostToDevice));
    ok(cudaGraphLaunch(exec, stream.s), "launch");
    const auto r1 = read_result(res, stream.s);
    const auto g1 = g_graph.to_host();
    ok(cudaGraphLaunch(exec, stream.s), "launch again");
    const auto r2 = read_result(res, stream.s);
    EXPECT_EQ(std::memcmp(&r1, &r2, sizeof(r1)), 0) << "replays agree bit for bit";
    // The same batch through a direct call on a fresh workspace.
    reco::workspace<reco::cuda_fused> ws2;
    const auto direct = obj(reco::cuda_fused{stream.s}, d.v, reco::gradients<float>{g_direct.span(), {}}, ws2);
    EXPECT_EQ(std::memcmp(&r1, &direct, sizeof(r1)), 0) << "graph replay == direct call";
    const auto gd = g_direct.to_host();
    EXPECT_EQ(std::memcmp(g1.data(), gd.data(), sizeof(float) * g1.size()), 0);
    cudaGraphExecDestroy(exec);
    ok(cudaMemcpy(d.logp.ptr, h.logp.data(), sizeof(float) * h.logp.size(), cudaMemcpyHostToDevice));
  };
  replay_matches(ps::grpo{}, "grpo", 2);
  replay_matches(ps::dapo{}, "dapo", 2);
  replay_matches(ps::reco{}, "reco", 2);
  replay_matches(ps::gspo{}, "gspo", 2);
  replay_matches(ps::cispo{}, "cispo", 2);
  replay_matches(ps::aspo{}, "aspo", 2);
  replay_matches(ps::dr_grpo{}, "dr_grpo", 2);
  replay_matches(ps::dapo_reco{}, "dapo_reco", 2);
  replay_matches(reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::uniform_weight,
                                 reco::seq_mean_token_mean>{},
                 "reinforce_pp + gmpo", 3);
  replay_matches(ps::rule_80_20{}, "rule_80_20 (sort-based selection)", 0);  // count recorded, not fixed
}

// The same batch in buffers shifted by one element (misaligned for 16-byte loads): the scalar
// path must give the vector path's bits.
TEST(CudaFused, ScalarAndVectorPathsGiveTheSameBits) {
  REQUIRE_DEVICE();
  batch_spec spec;
  spec.groups = 40;
  spec.max_length = 500;
  master_batch m = make_batch(17, spec);
  reco_test::round_to<float>(m);
  typed_batch<float> h(m);
  device_batch<float> d(h);
  const auto N = static_cast<index_t>(m.logp.size());
  auto shifted = [&](const std::vector<float>& host, device_array<float>& storage) {
    ok(cudaMemcpy(storage.ptr + 1, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice));
    return reco::span<const float>(storage.ptr + 1, N);
  };
  device_array<float> s_logp(N + 1), s_old(N + 1), s_ref(N + 1), g_shift(N + 1), g_aligned(N);
  reco::batch_view<float> v = d.v;
  v.logp = shifted(h.logp, s_logp);
  v.old_logp = shifted(h.old_logp, s_old);
  v.ref_logp = shifted(h.ref_logp, s_ref);
  stream_guard stream;
  const ps::reco obj;
  const reco::cuda_fused be(stream.s);
  const reco::gradients<float> ga{g_aligned.span(), {}}, gs{reco::span<float>(g_shift.ptr + 1, N), {}};
  EXPECT_TRUE(reco::fused::launch_config_for(obj, be, d.v, ga).vector_loads);
  EXPECT_FALSE(reco::fused::launch_config_for(obj, be, v, gs).vector_loads);
  reco::workspace<reco::cuda_fused> ws;
  const auto ra = obj(be, d.v, ga, ws);
  const auto rs = obj(be, v, gs, ws);
  EXPECT_EQ(std::memcmp(&ra, &rs, sizeof(ra)), 0);
  const auto a = g_aligned.to_host(), b = g_shift.to_host();
  EXPECT_EQ(std::memcmp(a.data(), b.data() + 1, sizeof(float) * a.size()), 0);
}

TEST(CudaFused, BitwiseDeterministicAcrossRunsAndPinnedGrids) {
  REQUIRE_DEVICE();
  batch_spec spec;
  spec.groups = 300;
  spec.max_length = 700;
  const master_batch m = make_batch(5, spec);
  typed_batch<double> h(m);
  device_batch<double> d(h);
  const auto N = static_cast<index_t>(m.logp.size());
  device_array<double> g(N);
  stream_guard stream;
  for (int blocks : {0, 1, 7, 64}) {
    reco::fused_options o;
    o.max_blocks = blocks;
    reco::workspace<reco::cuda_fused> ws;
    std::vector<reco::objective_result> results;
    std::vector<std::vector<double>> grads;
    for (int run = 0; run < 5; ++run) {
      results.push_back(ps::reco{}(reco::cuda_fused{stream.s, o}, d.v, reco::gradients<double>{g.span(), {}}, ws));
      grads.push_back(g.to_host());
    }
    for (int run = 1; run < 5; ++run) {
      EXPECT_EQ(std::memcmp(&results[0], &results[static_cast<std::size_t>(run)], sizeof(results[0])), 0)
          << "max_blocks " << blocks << ", run " << run;
      EXPECT_EQ(grads[0], grads[static_cast<std::size_t>(run)]) << "max_blocks " << blocks;
    }
  }
}

TEST(CudaFused, DeviceStatusMatchesTheGenericPath) {
  REQUIRE_DEVICE();
  batch_spec spec;
  spec.groups = 8;
  spec.token_weights = true;
  master_batch base = make_batch(41, spec);
  index_t t = 0;
  while (!base.mask[static_cast<std::size_t>(t)]) ++t;
  auto statuses = [&](const auto& obj, const master_batch& m) {
    typed_batch<double> h(m);
    device_batch<double> d(h);
    device_array<double> g(static_cast<index_t>(m.logp.size()));
    stream_guard stream;
    reco::workspace<reco::cuda> wg;
    reco::workspace<reco::cuda_fused> wf;
    const auto* a = obj.run(reco::cuda{stream.s}, d.v, reco::gradients<double>{g.span(), {}}, wg);
    const auto ra = read_result(a, stream.s);
    const auto* b = obj.run(reco::cuda_fused{stream.s}, d.v, reco::gradients<double>{g.span(), {}}, wf);
    const auto rb = read_result(b, stream.s);
    return std::make_pair(ra.status, rb.status);
  };
  const auto ts = static_cast<std::size_t>(t);
  std::vector<std::pair<std::string, master_batch>> cases;
  {
    master_batch m = base;
    m.logp[ts] = std::nan("");
    m.old_logp[ts] = 0.25;
    cases.emplace_back("NaN logp, old_logp > 0", m);
  }
  {
    master_batch m = base;
    m.ref_logp[ts] = INFINITY;
    m.token_weights[ts] = -1;
    m.rewards[0] = std::nan("");
    cases.emplace_back("inf ref_logp, negative token weight, NaN reward", m);
  }
  {
    master_batch m = base;
    std::swap(m.offsets[1], m.offsets[2]);
    m.group_offsets[1] = m.group_offsets[2] + 1;
    cases.emplace_back("malformed offsets", m);
  }
  for (const auto& c : cases) {
    for (const auto& p : {statuses(ps::reco{}, c.second), statuses(ps::grpo{}, c.second)}) {
      EXPECT_NE(p.first, 0u) << c.first;
      EXPECT_EQ(p.second, p.first) << c.first << ": fused " << reco::describe_status(p.second) << ", generic "
                                   << reco::describe_status(p.first);
    }
  }
}

// ---- the raw adapter -------------------------------------------------------------------------

template <class T>
reco_cuda_objective_args args_of(device_batch<T>& d, const typed_batch<T>& h, device_array<T>& grad,
                                 device_array<T>* grad_entropy = nullptr) {
  reco_cuda_objective_args a{};
  a.dtype = std::is_same_v<T, double> ? RECO_CUDA_FLOAT64 : RECO_CUDA_FLOAT32;
  a.responses = h.R;
  a.tokens = static_cast<int64_t>(h.logp.size());
  a.max_length = h.T_len;
  a.offsets = h.padded ? nullptr : d.offsets.ptr;
  a.groups = static_cast<int64_t>(h.group_offsets.size()) - 1;
  a.group_offsets = d.group_offsets.ptr;
  a.logp = d.logp.ptr;
  a.old_logp = d.old_logp.ptr;
  a.ref_logp = d.ref_logp.ptr;
  a.entropy = d.entropy.ptr;
  a.mask = d.mask.ptr;
  a.rewards = d.rewards.ptr;
  a.grad_logp = grad.ptr;
  a.grad_entropy = grad_entropy ? grad_entropy->ptr : nullptr;
  return a;
}

// The first byte at which two results differ (sizeof when none), for the failure message.
std::size_t first_difference(const reco::objective_result& a, const reco::objective_result& b) {
  const auto* x = reinterpret_cast<const unsigned char*>(&a);
  const auto* y = reinterpret_cast<const unsigned char*>(&b);
  std::size_t k = 0;
  while (k < sizeof(a) && x[k] == y[k]) ++k;
  return k;
}

TEST(CudaAdapter, PresetsByNameMatchTheDirectFusedCall) {
  REQUIRE_DEVICE();
  namespace ca = reco::cuda_adapter;
  batch_spec spec;
  spec.groups = 12;
  spec.max_length = 90;
  for (bool padded : {false, true}) {
    spec.padded = padded;
    master_batch m = make_batch(padded ? 3 : 4, spec);
    reco_test::round_to<float>(m);
    typed_batch<float> h(m);
    device_batch<float> d(h);
    const auto N = static_cast<index_t>(m.logp.size());
    device_array<float> g_adapter(N), g_direct(N);
    device_array<reco::objective_result> on_device(1);
    stream_guard stream;
    ca::context ctx;
    reco_cuda_context* cctx = reco_cuda_context_create();
    for (const std::string& name : ca::preset_names()) {
      SCOPED_TRACE(name + (padded ? " padded" : " packed"));
      const auto args = args_of(d, h, g_adapter);
      if (name == "clip_cov" || name == "kl_cov") {
        // Clip-Cov / KL-Cov select on the host: the adapter refuses them, naming the preset.
        try {
          ca::run_preset(name, args, stream.s, ctx);
          ADD_FAILURE() << name << " ran on the fused path";
        } catch (const reco::error& e) {
          EXPECT_EQ(e.argument(), "preset");
          EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
        continue;
      }
      const reco::objective_result host = ca::run_preset(name, args, stream.s, ctx);
      const auto g1 = g_adapter.to_host();
      // The direct call on the same backend options.
      reco::workspace<reco::cuda_fused> ws;
      reco::objective_result direct;
      reco::cuda_adapter::visit_preset<0, ca::preset_count>(ca::preset_index(name), [&](auto obj) {
        if constexpr (!reco::is_covariance_selection_v<typename decltype(obj)::selector_type>)
          direct = obj(reco::cuda_fused{stream.s}, d.v, reco::gradients<float>{g_direct.span(), {}}, ws);
      });
      EXPECT_EQ(std::memcmp(&host, &direct, sizeof(host)), 0)
          << "adapter == direct; first difference at byte " << first_difference(host, direct) << " of "
          << sizeof(host) << " (loss " << host.loss << " vs " << direct.loss << ")";
      const auto g2 = g_direct.to_host();
      EXPECT_EQ(std::memcmp(g1.data(), g2.data(), sizeof(float) * g1.size()), 0);
      // Stream-ordered into device memory, and in the workspace.
      ca::run_preset_async(name, args, stream.s, ctx, on_device.ptr);
      const auto dev = read_result(on_device.ptr, stream.s);
      EXPECT_EQ(std::memcmp(&dev, &direct, sizeof(dev)), 0);
      const reco::objective_result* in_ws = ca::run_preset_async(name, args, stream.s, ctx);
      const auto wsr = read_result(in_ws, stream.s);
      EXPECT_EQ(std::memcmp(&wsr, &direct, sizeof(wsr)), 0);
      // The C interface, all three result locations.
      reco_cuda_result c_host{};
      ASSERT_EQ(reco_cuda_objective(cctx, name.c_str(), &args, stream.s, RECO_CUDA_RESULT_HOST, &c_host, nullptr),
                RECO_CUDA_OK)
          << reco_cuda_last_error();
      EXPECT_EQ(std::memcmp(&c_host, &direct, sizeof(c_host)), 0);
      ASSERT_EQ(reco_cuda_objective(cctx, name.c_str(), &args, stream.s, RECO_CUDA_RESULT_DEVICE,
                                    reinterpret_cast<reco_cuda_result*>(on_device.ptr), nullptr),
                RECO_CUDA_OK);
      const auto c_dev = read_result(on_device.ptr, stream.s);
      EXPECT_EQ(std::memcmp(&c_dev, &direct, sizeof(c_dev)), 0);
      const reco_cuda_result* c_ws = nullptr;
      ASSERT_EQ(reco_cuda_objective(cctx, name.c_str(), &args, stream.s, RECO_CUDA_RESULT_WORKSPACE, nullptr, &c_ws),
                RECO_CUDA_OK);
      const auto c_wsr = read_result(reinterpret_cast<const reco::objective_result*>(c_ws), stream.s);
      EXPECT_EQ(std::memcmp(&c_wsr, &direct, sizeof(c_wsr)), 0);
    }
    reco_cuda_context_destroy(cctx);
  }
}

TEST(CudaAdapter, ComposedObjectiveBadDataAndPointerChecks) {
  REQUIRE_DEVICE();
  namespace ca = reco::cuda_adapter;
  master_batch m = make_batch(8, batch_spec{});
  typed_batch<double> h(m);
  device_batch<double> d(h);
  const auto N = static_cast<index_t>(m.logp.size());
  device_array<double> g(N), gh(N), g2(N), gh2(N);
  stream_guard stream;
  ca::context ctx;
  using obj_t = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip, reco::expected_count_weight,
                                reco::token_mean, reco::entropy_bonus>;
  obj_t obj;
  obj.entropy.params.coef = 0.01;
  auto args = args_of(d, h, g, &gh);
  const auto r = ca::run_objective(obj, args, stream.s, ctx);
  reco::workspace<reco::cuda_fused> ws;
  const auto direct = obj(reco::cuda_fused{stream.s}, d.v, reco::gradients<double>{g2.span(), gh2.span()}, ws);
  EXPECT_EQ(std::memcmp(&r, &direct, sizeof(r)), 0);
  EXPECT_EQ(gh.to_host(), gh2.to_host());
  // Bad data: the synchronous call throws naming the input; the C interface says BAD_DATA.
  std::vector<double> bad = h.logp;
  for (std::size_t t = 0; t < bad.size(); ++t)
    if (m.mask[t]) {
      bad[t] = 0.5;
      break;
    }
  ok(cudaMemcpy(d.logp.ptr, bad.data(), sizeof(double) * bad.size(), cudaMemcpyHostToDevice));
  try {
    ca::run_objective(obj, args, stream.s, ctx);
    ADD_FAILURE() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "batch.logp");
  }
  reco_cuda_context* cctx = reco_cuda_context_create();
  reco_cuda_result res{};
  auto pargs = args_of(d, h, g);
  EXPECT_EQ(reco_cuda_objective(cctx, "reco", &pargs, stream.s, RECO_CUDA_RESULT_HOST, &res, nullptr),
            RECO_CUDA_BAD_DATA);
  EXPECT_EQ(std::string(reco_cuda_last_error()).rfind("reco: batch.logp:", 0), 0u) << reco_cuda_last_error();
  // A host pointer is named before any kernel runs when pointer checks are on.
  ASSERT_EQ(reco_cuda_context_set_options(cctx, 0, 1, 1), RECO_CUDA_OK);
  pargs.old_logp = h.old_logp.data();
  EXPECT_EQ(reco_cuda_objective(cctx, "reco", &pargs, stream.s, RECO_CUDA_RESULT_HOST, &res, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(reco_cuda_last_error()).rfind("reco: args.old_logp:", 0), 0u) << reco_cuda_last_error();
  reco_cuda_context_destroy(cctx);
}

TEST(CudaAdapter, LogitsOpMatchesTheLibraryKernels) {
  REQUIRE_DEVICE();
  namespace ca = reco::cuda_adapter;
  const index_t rows = 300, vocab = 5000;
  std::vector<reco::bf16_t> logits(static_cast<std::size_t>(rows * vocab));
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(rows));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(rows), 1);
  for (std::size_t k = 0; k < logits.size(); ++k) logits[k] = reco::bf16_t(static_cast<float>(std::sin(0.37 * k)) * 4);
  for (std::size_t r = 0; r < tokens.size(); ++r) tokens[r] = static_cast<std::int64_t>((r * 7919) % vocab);
  mask[5] = 0;
  device_array<reco::bf16_t> d_logits(logits), d_dl1(rows * vocab), d_dl2(rows * vocab);
  device_array<std::int64_t> d_tokens(tokens);
  device_array<std::uint8_t> d_mask(mask);
  device_array<float> lp1(rows), h1(rows), lse1(rows), lp2(rows), h2(rows), lse2(rows), gl(rows), gh(rows);
  std::vector<float> up(static_cast<std::size_t>(rows)), uh(static_cast<std::size_t>(rows));
  for (std::size_t r = 0; r < up.size(); ++r) up[r] = 0.01f * static_cast<float>(r % 13), uh[r] = -0.002f;
  ok(cudaMemcpy(gl.ptr, up.data(), 4 * up.size(), cudaMemcpyHostToDevice));
  ok(cudaMemcpy(gh.ptr, uh.data(), 4 * uh.size(), cudaMemcpyHostToDevice));
  stream_guard stream;
  reco_cuda_logits_args a{};
  a.dtype = RECO_CUDA_BFLOAT16;
  a.logits = d_logits.ptr;
  a.rows = rows;
  a.vocab = vocab;
  a.row_stride = vocab;
  a.tokens = d_tokens.ptr;
  a.temperature = 0.7;
  a.row_mask = d_mask.ptr;
  a.logp = lp1.ptr;
  a.entropy = h1.ptr;
  a.lse = lse1.ptr;
  ASSERT_EQ(reco_cuda_logits_forward(&a, stream.s), RECO_CUDA_OK) << reco_cuda_last_error();
  reco::logits::forward_cuda(d_logits.ptr, rows, vocab, vocab, d_tokens.ptr, 0.7, d_mask.ptr, lp2.ptr, h2.ptr,
                             lse2.ptr, stream.s);
  EXPECT_EQ(lp1.to_host(), lp2.to_host());
  EXPECT_EQ(h1.to_host(), h2.to_host());
  a.grad_logp = gl.ptr;
  a.grad_entropy = gh.ptr;
  a.saved_lse = lse1.ptr;
  a.saved_entropy = h1.ptr;
  a.dlogits = d_dl1.ptr;
  ca::logits_backward(a, stream.s);
  reco::logits::backward_cuda(d_logits.ptr, rows, vocab, vocab, d_tokens.ptr, 0.7, d_mask.ptr, gl.ptr, gh.ptr,
                              lse2.ptr, h2.ptr, d_dl2.ptr, stream.s);
  const auto x = d_dl1.to_host(), y = d_dl2.to_host();
  EXPECT_EQ(std::memcmp(x.data(), y.data(), sizeof(reco::bf16_t) * x.size()), 0);
  // The masked row's gradient is exactly zero.
  for (index_t j = 0; j < vocab; ++j) ASSERT_EQ(static_cast<float>(x[static_cast<std::size_t>(5 * vocab + j)]), 0.0f);
}

}  // namespace
