// Split steps (reco/step_plan.hpp): a step cut into parts (micro-batches, ranks) and run with its
// plan gives the loss and gradient of one call on the whole step, for every preset and the
// components with step-wide statistics, in float and double, whatever the split: uneven parts,
// empty parts, parts of masked tokens only, groups across parts, entropy ties across the cut.
// The summaries are combined here by plain addition (what an all-reduce SUM does across ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <thread>
#include <utility>
#include <string>
#include <vector>

#include "core/compare.hpp"
#include "core/random_batch.hpp"
#include "core/step_split.hpp"
#include "reco/advantage/batch_std.hpp"
#include "reco/advantage/gpg.hpp"
#include "reco/advantage/opo.hpp"
#include "reco/advantage/pass_at_k.hpp"
#include "reco/advantage/reinforce_pp.hpp"
#include "reco/advantage/rloo.hpp"
#include "reco/aggregate/selectable.hpp"
#include "reco/aggregate/seq_mean_token_sum.hpp"
#include "reco/clip/entropy_split_clip.hpp"
#include "reco/entropy/entropy_bonus.hpp"
#include "reco/presets.hpp"
#include "reco/given_advantages.hpp"
#include "reco/step_plan.hpp"
#include "reco/weight/caller_weight.hpp"
#include "reference/reco_ref.hpp"

namespace {

using reco::index_t;
using reco_test::master_batch;
using reco_test::typed_batch;
using reco_test::slice;

// The windowed stage 0 (reco::window_sampling) that run_split's plans use. Test batches are too
// small for the default (every part counts every first digit); the 80/20 sweeps also run with
// every part windowed, and with windows of a rank or so around each part's own quantile, which
// often miss the step's targets (the plan then counts every first digit in one more round).
reco::window_sampling g_sampling;
reco::window_sampling every_part_windowed(double margin = 5, double slack = 0.005, index_t stride = 1) {
  reco::window_sampling w;
  w.stride = stride;
  w.min_samples = 1;
  w.max_fraction = 1;
  w.margin = margin;
  w.slack = slack;
  return w;
}
// Sets run_split's sampling back to the default when a test leaves (also by an exception).
struct sampling_reset {
  ~sampling_reset() { g_sampling = reco::window_sampling{}; }
};
template <class F>
void under_each_sampling(F&& f) {
  const sampling_reset reset;
  const std::pair<const char*, reco::window_sampling> modes[] = {
      {"every first digit", reco::window_sampling{}},
      {"windowed", every_part_windowed()},
      {"narrow windows", every_part_windowed(0, 0)}};
  for (const auto& [name, w] : modes) {
    SCOPED_TRACE(name);
    g_sampling = w;
    f();
    if (::testing::Test::HasFatalFailure()) break;
  }
}

struct split_output {
  double loss = 0, policy = 0, kl = 0, entropy = 0;
  std::vector<double> grad_logp, grad_entropy;
  reco::step_plan plan;
};

// Runs the step as parts cut at `cuts` (inner boundaries, sorted, duplicates = empty parts).
template <class T, class Obj>
split_output run_split(const Obj& obj, const master_batch& m, const std::vector<index_t>& cuts,
                       std::uint64_t step_id = 7, double scale = 1.0, const std::vector<T>* rollout = nullptr) {
  reco_test::split_step<T> sp(m, cuts, reco::step_info{step_id, m.R, scale, 0});
  const std::vector<index_t>& bounds = sp.bounds;
  const std::vector<master_batch>& subs = sp.subs;
  const std::vector<reco::step_part>& parts = sp.parts;
  std::vector<reco::batch_view<T>>& views = sp.views;
  if (rollout != nullptr)  // each part's slice of the rollout log-probs
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const index_t t0 = bounds[p] < bounds[p + 1] ? m.begin(bounds[p]) : 0;
      views[p].rollout_logp = reco::span<const T>(rollout->data() + t0, static_cast<index_t>(subs[p].logp.size()));
    }

  split_output out;
  out.plan = reco::plan_step(obj, sp.step, views, parts, g_sampling);
  out.grad_logp.assign(m.logp.size(), 0.0);
  if (Obj::has_entropy_gradient) out.grad_entropy.assign(m.logp.size(), 0.0);
  reco::workspace<reco::cpu> ws;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto N = subs[p].logp.size();
    std::vector<T> g(N, T(-5)), gh(N, T(-5));
    const auto r = obj(reco::cpu{}, views[p],
                       reco::gradients<T>{g, Obj::has_entropy_gradient ? reco::span<T>(gh) : reco::span<T>()}, ws,
                       out.plan, parts[p]);
    out.loss += r.loss;
    out.policy += r.policy_loss;
    out.kl += r.kl_loss;
    out.entropy += r.entropy_loss;
    const index_t t0 = bounds[p] < bounds[p + 1] ? m.begin(bounds[p]) : 0;
    for (std::size_t t = 0; t < N; ++t) {
      out.grad_logp[t0 + t] = static_cast<double>(g[t]);
      if (Obj::has_entropy_gradient) out.grad_entropy[t0 + t] = static_cast<double>(gh[t]);
    }
  }
  return out;
}

// The largest relative errors seen, for the report.
struct worst {
  double loss = 0, grad = 0;
};
worst& worst_for(bool is_float) {
  static worst w32, w64;
  return is_float ? w32 : w64;
}

// Parts' sum vs one call on the whole step: values relative to the loss's magnitude (its largest
// part, at least 1e-3), gradients relative to the largest gradient.
template <class T>
void expect_same(const split_output& s, const reco_test::library_output& whole, const std::string& label) {
  SCOPED_TRACE(label);
  const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-12;
  const auto& w = whole.result;
  const double scale = std::max({std::fabs(w.policy_loss), std::fabs(w.kl_loss), std::fabs(w.entropy_loss), 1e-3});
  worst& wr = worst_for(std::is_same_v<T, float>);
  for (auto [got, want, name] : {std::tuple{s.loss, w.loss, "loss"}, std::tuple{s.policy, w.policy_loss, "policy"},
                                 std::tuple{s.kl, w.kl_loss, "kl"}, std::tuple{s.entropy, w.entropy_loss, "entropy"}}) {
    const double rel = std::fabs(got - want) / scale;
    wr.loss = std::max(wr.loss, rel);
    EXPECT_LE(rel, tol) << name << ": parts " << got << ", whole " << want;
  }
  ASSERT_EQ(s.grad_logp.size(), whole.grad_logp.size());
  double gmax = 1e-300;
  for (double x : whole.grad_logp) gmax = std::max(gmax, std::fabs(x));
  int bad = 0;
  for (std::size_t t = 0; t < s.grad_logp.size() && bad < 5; ++t) {
    const double rel = std::fabs(s.grad_logp[t] - whole.grad_logp[t]) / gmax;
    wr.grad = std::max(wr.grad, rel);
    if (rel > tol) {
      ++bad;
      ADD_FAILURE() << "grad_logp[" << t << "]: parts " << s.grad_logp[t] << ", whole " << whole.grad_logp[t];
    }
  }
  for (std::size_t t = 0; t < s.grad_entropy.size(); ++t)
    ASSERT_NEAR(s.grad_entropy[t], whole.grad_entropy[t], tol * 1e-3) << "grad_entropy[" << t << "]";
}

// A random step: packed or padded, 2 to groups + 1 groups of 1 to `group` responses of up to
// `length` tokens, a fifth of the responses masked.
reco_test::batch_spec random_spec(std::mt19937_64& rng, int groups, int group, int length) {
  reco_test::batch_spec spec;
  spec.padded = rng() % 2 == 0;
  spec.groups = 2 + static_cast<int>(rng() % static_cast<std::uint64_t>(groups));
  spec.max_group = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(group));
  spec.max_length = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(length));
  spec.masked_row = 0.2;
  return spec;
}
// Random inner boundaries (sorted, repeats: empty parts) of 1 to `parts` parts of R responses.
std::vector<index_t> random_cuts(std::mt19937_64& rng, index_t R, int parts) {
  const int n = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(parts));
  std::vector<index_t> cuts;
  for (int k = 0; k + 1 < n; ++k) cuts.push_back(static_cast<index_t>(rng() % static_cast<std::uint64_t>(R + 1)));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Cut sets: 1, 2, 3, 4 and 6 parts, uneven, with empty parts (repeated boundaries).
std::vector<std::vector<index_t>> standard_cuts(index_t R, std::uint64_t seed) {
  std::vector<std::vector<index_t>> cuts;
  cuts.push_back({});
  cuts.push_back({R / 2});
  cuts.push_back({1, R - 1});               // uneven: 1, R - 2, 1
  cuts.push_back({0, R / 3, R / 3});        // empty first part, empty middle part
  cuts.push_back({R / 4, R / 2, R});        // empty last part
  std::mt19937_64 rng(seed);
  for (int n : {2, 3, 4, 6}) {
    std::vector<index_t> c;
    for (int k = 0; k + 1 < n; ++k) c.push_back(static_cast<index_t>(rng() % static_cast<std::uint64_t>(R + 1)));
    std::sort(c.begin(), c.end());
    cuts.push_back(c);
  }
  cuts.push_back({1, 2, 3, 4, 5});  // six parts, the first five of one response
  for (auto& c : cuts)
    for (auto& x : c) x = std::min(std::max<index_t>(x, 0), R);
  return cuts;
}

// Batches of the sweep: both layouts, continuous or tied entropies, one with a part of masked
// tokens only (responses [R/3, R/2) fully masked).
std::vector<master_batch> standard_batches(std::uint64_t seed) {
  std::vector<master_batch> out;
  for (int k = 0; k < 4; ++k) {
    reco_test::batch_spec spec;
    spec.padded = k % 2 == 1;
    spec.groups = 5 + k;
    spec.max_group = 6;
    spec.max_length = 9;
    spec.response_weights = true;
    spec.token_weights = k == 2;
    master_batch m = reco_test::make_batch(seed + static_cast<std::uint64_t>(k), spec);
    if (k >= 2)  // heavy ties: 7 distinct entropies
      for (double& h : m.entropy) h = std::round(h * 2.0) / 2.0;
    if (k == 3)
      for (index_t i = m.R / 3; i < m.R / 2; ++i)
        for (index_t t = m.begin(i); t < m.end(i); ++t) m.mask[static_cast<std::size_t>(t)] = 0;
    out.push_back(m);
  }
  return out;
}

template <class T, class Obj>
void check_all_splits(const Obj& obj, const std::string& name, std::uint64_t seed,
                      const std::vector<master_batch>& batches) {
  for (master_batch m : batches) {
    reco_test::round_to<T>(m);
    const auto whole = reco_test::run_library<T>(obj, m);
    for (const auto& cuts : standard_cuts(m.R, seed)) {
      std::string label = name + (std::is_same_v<T, float> ? " float" : " double") +
                          (m.padded ? " padded" : " packed") + " R=" + std::to_string(m.R) + " cuts:";
      for (auto c : cuts) label += " " + std::to_string(c);
      expect_same<T>(run_split<T>(obj, m, cuts), whole, label);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

template <class T, class Obj>
void check_all_splits(const Obj& obj, const std::string& name, std::uint64_t seed) {
  check_all_splits<T>(obj, name, seed, standard_batches(seed));
}

template <class Obj>
void check_both(const Obj& obj, const std::string& name, std::uint64_t seed) {
  check_all_splits<double>(obj, name, seed);
  check_all_splits<float>(obj, name, seed);
}

TEST(StepPlan, PresetsGrpo) { check_both(reco::presets::grpo{}, "grpo", 11); }
TEST(StepPlan, PresetsDrGrpo) { check_both(reco::presets::dr_grpo{}, "dr_grpo", 12); }
TEST(StepPlan, PresetsDapo) { check_both(reco::presets::dapo{}, "dapo", 13); }
TEST(StepPlan, PresetsGspo) { check_both(reco::presets::gspo{}, "gspo", 14); }
TEST(StepPlan, PresetsCispo) { check_both(reco::presets::cispo{}, "cispo", 15); }
TEST(StepPlan, PresetsAspo) { check_both(reco::presets::aspo{}, "aspo", 16); }
TEST(StepPlan, PresetsReco) { check_both(reco::presets::reco{}, "reco", 17); }
TEST(StepPlan, PresetsRecoNoCap) { check_both(reco::presets::reco_no_cap{}, "reco_no_cap", 18); }
TEST(StepPlan, PresetsRecoResponseOnly) { check_both(reco::presets::reco_response_only{}, "reco_response_only", 19); }
TEST(StepPlan, PresetsRecoTokenOnly) { check_both(reco::presets::reco_token_only{}, "reco_token_only", 20); }
TEST(StepPlan, PresetsDapoReco) { check_both(reco::presets::dapo_reco{}, "dapo_reco", 21); }
TEST(StepPlan, PresetsRule8020) {
  under_each_sampling([] { check_both(reco::presets::rule_80_20{}, "rule_80_20", 22); });
}
TEST(StepPlan, PresetsRule8020Reco) {
  under_each_sampling([] { check_both(reco::presets::rule_80_20_reco{}, "rule_80_20_reco", 23); });
}
TEST(StepPlan, PresetsTrlBnpo) { check_both(reco::presets::trl_bnpo{}, "trl_bnpo", 24); }
TEST(StepPlan, PresetsTrlLuspo) { check_both(reco::presets::trl_luspo{}, "trl_luspo", 25); }
TEST(StepPlan, PresetsTrlVespo) { check_both(reco::presets::trl_vespo{}, "trl_vespo", 26); }
// TRL's delta cap and importance-weighted KL (docs/peers.md).
// Clip-Cov and KL-Cov: the step's means, its k and the tokens' places in the step. The presets'
// own ratio selects one token of these small steps; wider ratios and bands select many, and a
// ratio of 1 takes every Clip-Cov candidate.
TEST(StepPlan, PresetsClipCov) {
  reco::presets::clip_cov o;
  check_both(o, "clip_cov", 27);
  o.select.params.ratio = 0.2;
  o.select.params.lb = -0.3;
  o.select.params.ub = 0.3;
  check_both(o, "clip_cov band", 28);
  o.select.params.ratio = 1;
  check_both(o, "clip_cov every candidate", 29);
}
TEST(StepPlan, PresetsKlCov) {
  reco::presets::kl_cov o;
  check_both(o, "kl_cov", 30);
  o.select.params.ratio = 0.3;
  check_both(o, "kl_cov 30%", 31);
}
// Equal covariances across parts: log-probabilities on a grid of 4 values and binary rewards give
// many tokens one (A, logp) pair, so the k-th largest covariance is shared by tokens of several
// parts; the step order decides, as in one call.
TEST(StepPlan, KlCovTiesAcrossPartsKeepStepOrder) {
  std::vector<master_batch> batches = standard_batches(32);
  for (master_batch& m : batches)
    for (std::size_t t = 0; t < m.logp.size(); ++t) m.logp[t] = -0.25 - 0.5 * static_cast<double>(t % 4);
  reco::presets::kl_cov o;
  o.select.params.ratio = 0.37;
  check_all_splits<double>(o, "kl_cov ties", 32, batches);
  check_all_splits<float>(o, "kl_cov ties", 32, batches);
  reco::presets::clip_cov c;  // equal keys need a 53-bit collision: the ties here are of the clip
  c.select.params.ratio = 0.37;
  c.select.params.lb = -0.4;
  c.select.params.ub = 0.4;
  check_all_splits<double>(c, "clip_cov on a logp grid", 33, batches);
}

// Larger steps (about 2000 tokens): each part's candidates are then a fraction of its tokens above
// a threshold (reco/algorithm/covariance_tokens.hpp), the rest left out, and the split still
// selects what one call on the step does.
std::vector<master_batch> long_batches(std::uint64_t seed) {
  std::vector<master_batch> out;
  for (int k = 0; k < 2; ++k) {
    reco_test::batch_spec spec;
    spec.padded = k == 1;
    spec.groups = 6;
    spec.max_group = 6;
    spec.max_length = 140;
    spec.token_advantages = k == 1;
    out.push_back(reco_test::make_batch(seed + static_cast<std::uint64_t>(k), spec));
  }
  return out;
}
TEST(StepPlan, CovarianceSplitsLeaveTokensOut) {
  const std::vector<master_batch> batches = long_batches(40);  // the second with advantages per token
  reco::presets::kl_cov kl;
  reco::presets::clip_cov clip;
  clip.select.params.lb = -0.3;
  clip.select.params.ub = 0.3;
  for (double ratio : {0.002, 0.02, 0.1}) {
    kl.select.params.ratio = clip.select.params.ratio = ratio;
    const std::string r = " ratio " + std::to_string(ratio);
    check_all_splits<double>(kl, "kl_cov long" + r, 41, {batches[0]});
    check_all_splits<float>(kl, "kl_cov long" + r, 42, {batches[0]});
    check_all_splits<double>(clip, "clip_cov long" + r, 43, {batches[0]});
    check_all_splits<double>(reco::with_given_advantages(kl), "kl_cov long, A_t" + r, 44, {batches[1]});
    check_all_splits<double>(reco::with_given_advantages(clip), "clip_cov long, A_t" + r, 45, {batches[1]});
  }
}

// KL-Cov and Clip-Cov at one ratio (Clip-Cov's band (lb, ub)), the step split at `cuts` against
// one call on it: KL-Cov in double and float, Clip-Cov in double.
void expect_covariance_splits(const master_batch& m, const std::vector<index_t>& cuts, double ratio, double lb,
                              double ub, const std::string& label) {
  reco::presets::kl_cov kl;
  kl.select.params.ratio = ratio;
  reco::presets::clip_cov clip;
  clip.select.params.ratio = ratio;
  clip.select.params.lb = lb;
  clip.select.params.ub = ub;
  expect_same<double>(run_split<double>(kl, m, cuts), reco_test::run_library<double>(kl, m), "kl_cov " + label);
  expect_same<double>(run_split<double>(clip, m, cuts), reco_test::run_library<double>(clip, m), "clip_cov " + label);
  master_batch m32 = m;
  reco_test::round_to<float>(m32);
  expect_same<float>(run_split<float>(kl, m32, cuts), reco_test::run_library<float>(kl, m32), "kl_cov float " + label);
}

// Random steps of up to 26K token slots (parts large enough for a sampled threshold, and for
// tokens left out), random splits, ratios from 1e-4 to 0.7, logp on a grid in a third of them
// (ties at the cut across parts): the split selects what one call does.
TEST(StepPlan, CovarianceRandomLargeSplits) {
  std::mt19937_64 rng(99);
  for (int it = 0; it < 200; ++it) {
    reco_test::batch_spec spec = random_spec(rng, 10, 8, 300);
    spec.binary_rewards = rng() % 2 == 0;
    master_batch m = reco_test::make_batch(rng(), spec);
    if (rng() % 3 == 0)
      for (double& x : m.logp) x = -0.25 - 0.5 * std::floor(-x / 0.5);
    const std::vector<index_t> cuts = random_cuts(rng, m.R, 6);
    const double ratios[] = {1e-4, 0.003, 0.03, 0.2, 0.7};
    const double ratio = ratios[rng() % 5];
    expect_covariance_splits(m, cuts, ratio, -0.4, 0.6, "iteration " + std::to_string(it) + ", ratio " + std::to_string(ratio));
    if (::testing::Test::HasFailure()) break;
  }
}

// The plan's first round after the summaries: the parts' top values in one table of P(2k + 1) + 1
// values, or radix rounds over the candidates when that table would exceed
// covariance_table_limit (many parts, a large k). Both select what one call on the step does.
template <class Obj>
reco::step_plan summed_summaries(const Obj& obj, const master_batch& m, const std::vector<index_t>& cuts) {
  reco_test::split_step<double> sp(m, cuts, reco::step_info{5, m.R, 1.0, 0});
  reco::step_summary total;
  for (std::size_t p = 0; p < sp.parts.size(); ++p) total += reco::summarize(obj, sp.views[p], sp.parts[p]);
  return reco::finish_plan(obj, sp.step, total);
}
TEST(StepPlan, CovarianceTopValuesOrDigitRounds) {
  reco_test::batch_spec spec;
  spec.groups = 64;
  spec.max_group = 8;
  spec.max_length = 600;
  const master_batch m = reco_test::make_batch(123, spec);  // about 75K valid tokens
  const std::vector<index_t> cuts = {m.R / 5, 2 * m.R / 5, 2 * m.R / 5, 3 * m.R / 5, 4 * m.R / 5};  // 5 + 1 empty
  using stage = reco::step_plan::stage_kind;
  for (const auto& [ratio, want] : {std::pair{0.05, stage::top_values}, std::pair{0.7, stage::histogram}}) {
    const std::string label = "ratio " + std::to_string(ratio);
    reco::presets::kl_cov kl;
    kl.select.params.ratio = ratio;
    const reco::step_plan plan = summed_summaries(kl, m, cuts);
    const std::size_t table = 5 * (2 * static_cast<std::size_t>(plan.selected_count()) + 1) + 1;
    EXPECT_EQ(plan.stage(), want) << label << ": a table of " << table << " values";
    EXPECT_EQ(table <= reco::detail::covariance_table_limit, want == stage::top_values) << label;
    reco::presets::clip_cov clip;
    clip.select.params.ratio = ratio;
    EXPECT_EQ(summed_summaries(clip, m, cuts).stage(), want) << label;
    expect_covariance_splits(m, cuts, ratio, -0.5, 0.5, label);
  }
}

// A part's candidates (detail::covariance_candidates) against the values one call ranks
// (covariance_values): at least min(k, selectable) of them, every token left out below all of
// them; a threshold that leaves fewer than k above gathers again (all selectable tokens), as does
// a sample too small for it.
template <class T, class Obj>
void check_candidates(const Obj& obj, const master_batch& m0, const std::string& name) {
  SCOPED_TRACE(name + (sizeof(T) == 4 ? " float" : " double"));
  master_batch m = m0;
  reco_test::round_to<T>(m);
  reco_test::split_step<T> sp(m, {}, reco::step_info{3, m.R, 1.0, 0});
  const reco::step_plan plan = reco::plan_step(obj, sp.step, sp.views, sp.parts);
  const auto b = reco::detail::pointers_of(sp.views[0]);
  reco::detail::covariance_means means;
  means.adv = plan.covariance_adv_mean();
  means.logp = plan.covariance_logp_mean();
  const double* adv = plan.advantages().data();
  const index_t N = b.layout.tokens, k = plan.selected_count();
  std::vector<double> value(static_cast<std::size_t>(N));
  std::vector<std::uint8_t> in(static_cast<std::size_t>(N));
  reco::detail::covariance_values(obj, b, adv, means, 0, value.data(), in.data());
  std::vector<double> selectable;
  for (index_t t = 0; t < N; ++t)
    if (in[static_cast<std::size_t>(t)]) selectable.push_back(value[static_cast<std::size_t>(t)]);
  ASSERT_GT(static_cast<index_t>(selectable.size()), 3 * k) << "the batch must leave tokens out";
  if (obj.select.params.mode == reco::covariance_mode::clip) {
    // Clip-Cov's threshold comes from the number of candidates, not from sampled keys: with every
    // chunk sampled it is -floor(e / n 2^53) for the n candidates and e = spare k + least, and the
    // keys, uniform over [0, 2^53), put about e candidates at or above it.
    const double n = static_cast<double>(selectable.size());
    for (const double spare : {0.5, 2.0}) {
      const reco::detail::covariance_sampling all{index_t(1) << 40, 16, spare};
      const double e = spare * static_cast<double>(k) + 16;
      const double tau = reco::detail::covariance_threshold(obj, b, adv, means, k, all);
      ASSERT_LT(e, n);
      EXPECT_EQ(tau, -std::floor(e / n * std::ldexp(1.0, 53))) << "spare " << spare;
      double above = 0;
      for (double v : selectable) above += v >= tau;
      EXPECT_NEAR(above, e, 5 * std::sqrt(e) + 5) << "spare " << spare;
    }
    const reco::detail::covariance_sampling beyond{index_t(1) << 40, 16, n};  // e >= n: every candidate
    EXPECT_EQ(reco::detail::covariance_threshold(obj, b, adv, means, k, beyond), -HUGE_VAL);
  }
  struct mode {
    const char* name;
    reco::detail::covariance_sampling sampling;
    bool leaves_out;  // whether the mode's candidates leave tokens out
    bool too_few;     // whether its threshold leaves fewer than k above
  };
  // {4096, 1, 0}: every chunk of these small parts sampled, the largest value the threshold.
  const mode modes[] = {{"default sampling", {}, true, false},
                        {"threshold above all but a few: gathers again", {4096, 1, 0}, false, true},
                        {"sample smaller than j: every token", {4096, 1e9, 2}, false, false}};
  for (const mode& md : modes) {
    SCOPED_TRACE(md.name);
    const double tau = reco::detail::covariance_threshold(obj, b, adv, means, k, md.sampling);
    std::size_t above = 0;
    for (double v : selectable) above += v >= tau;
    if (md.too_few) {
      EXPECT_LT(above, static_cast<std::size_t>(k)) << "the threshold must leave too few";
    }
    reco::detail::cut_candidates c;
    const bool left = reco::detail::covariance_candidates(obj, b, adv, means, 0, k, c, md.sampling);
    EXPECT_EQ(left, md.leaves_out);
    // Given the part's valid tokens (counted here from the mask), the read skips chunks on their
    // logp alone: the same candidates, the same answer.
    std::int64_t valid = 0;
    for (index_t i = 0; i < b.layout.responses; ++i)
      for (index_t t = b.layout.begin(i); t < b.layout.end(i); ++t) valid += b.mask == nullptr || b.mask[t] != 0;
    reco::detail::cut_candidates skipping;
    EXPECT_EQ(reco::detail::covariance_candidates(obj, b, adv, means, 0, k, skipping, md.sampling, valid), left);
    EXPECT_EQ(skipping.keys, c.keys);
    EXPECT_EQ(skipping.responses, c.responses);
    ASSERT_EQ(c.keys.size(), c.responses.size());
    EXPECT_GE(c.keys.size(), std::min<std::size_t>(static_cast<std::size_t>(k), selectable.size()));
    // The candidates are exactly the selectable tokens at or above the least of them, and every
    // other selectable token lies strictly below it.
    double least = HUGE_VAL;
    for (std::uint64_t key : c.keys) least = std::min(least, reco::detail::key_value(key, sizeof(double)));
    std::size_t at_or_above = 0;
    for (double v : selectable) at_or_above += v >= least;
    EXPECT_EQ(at_or_above, c.keys.size());
    if (!left) {
      EXPECT_EQ(c.keys.size(), selectable.size());
    }
    // Each candidate is a selectable token of its response with that value.
    std::vector<double> by_response;
    for (std::size_t j = 0; j < c.keys.size(); ++j) {
      const index_t i = c.responses[j];
      const double x = reco::detail::key_value(c.keys[j], sizeof(double));
      bool found = false;
      for (index_t t = b.layout.begin(i); t < b.layout.end(i) && !found; ++t)
        found = in[static_cast<std::size_t>(t)] && value[static_cast<std::size_t>(t)] == x;
      EXPECT_TRUE(found) << "candidate " << j << " of response " << i;
    }
  }
}
TEST(StepPlan, CovarianceCandidatesHoldTheSelection) {
  reco_test::batch_spec spec;
  spec.groups = 8;
  spec.max_group = 6;
  spec.max_length = 200;
  const master_batch m = reco_test::make_batch(77, spec);
  reco::presets::kl_cov kl;
  kl.select.params.ratio = 0.05;
  check_candidates<double>(kl, m, "kl_cov");
  check_candidates<float>(kl, m, "kl_cov");
  reco::presets::clip_cov clip;
  clip.select.params.ratio = 0.05;
  clip.select.params.lb = -0.5;
  clip.select.params.ub = 0.5;
  check_candidates<double>(clip, m, "clip_cov");
  check_candidates<float>(clip, m, "clip_cov");
}

// Chunks skipped on their logp (a response far below KL-Cov's threshold) count as left out: here
// the threshold takes response 0's one token, fewer than k = 2, and response 1's 300 tokens,
// never read in double, must make the part gather again (every valid token).
TEST(StepPlan, CovarianceSkippedChunksCountAsLeftOut) {
  constexpr index_t W = 320;
  std::vector<double> logp(2 * W, 0.0), adv{2.0, 0.01};
  std::vector<std::uint8_t> mask(2 * W, 0);
  logp[0] = -0.1;
  mask[0] = 1;
  for (index_t t = 0; t < 300; ++t) {
    logp[W + t] = -2 - static_cast<double>(t) / 300;
    mask[W + t] = 1;
  }
  reco::batch_view<double> v;
  v.layout.responses = 2;
  v.layout.max_length = W;
  v.layout.tokens = 2 * W;
  v.logp = {logp.data(), 2 * W};
  v.mask = {mask.data(), 2 * W};
  const auto b = reco::detail::pointers_of(v);
  reco::detail::covariance_means m;
  double sum = 0;
  for (index_t t = 0; t < 2 * W; ++t) sum += mask[static_cast<std::size_t>(t)] ? logp[static_cast<std::size_t>(t)] : 0;
  m.n = 301;
  m.adv = (2.0 + 300 * 0.01) / 301;
  m.logp = sum / 301;
  const reco::presets::kl_cov kl;
  const reco::detail::covariance_sampling every{4096, 1, 0};  // the threshold: the largest value
  for (const std::int64_t valid : {std::int64_t(-1), std::int64_t(301)}) {
    reco::detail::cut_candidates c;
    EXPECT_FALSE(reco::detail::covariance_candidates(kl, b, adv.data(), m, 0, 2, c, every, valid)) << valid;
    EXPECT_EQ(c.keys.size(), 301u) << "gathered again: every valid token (valid " << valid << ")";
  }
}

// detail::logp_range: every logp whose covariance d (x - mean logp) passes the test (KL-Cov
// cov >= tau; Clip-Cov lb < cov < ub) lies in [lo, hi], for logp within a few thousand steps of
// each end and at random, in float and double; and each end lies within 64 steps of the exact
// boundary (the interval is tight, else the pass would read in double what it could skip).
template <class T>
void check_logp_range(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const T inf = std::numeric_limits<T>::infinity();
  int ranged = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const double lbar = -1.5 + u(g), d = trial % 50 == 0 ? 0.0 : 3 * u(g) * std::pow(10.0, 2 * u(g));
    const bool kl = trial % 2 == 0;
    const double tau = u(g) * 4, lb = 1 + u(g), ub = lb + 2 + 2 * u(g);
    reco::detail::covariance_means m;
    m.logp = lbar;
    T lo{}, hi{};
    if (!reco::detail::logp_range(d, m, kl, tau, lb, ub, lo, hi)) {
      EXPECT_EQ(d, 0.0) << "only d = 0 has no interval here";
      continue;
    }
    ++ranged;
    auto cov = [&](T x) { return d * (static_cast<double>(x) - lbar); };  // the definition
    auto passes = [&](T x) { return kl ? cov(x) >= tau : (cov(x) > lb && cov(x) < ub); };
    auto probe = [&](T x) {
      if (passes(x)) {
        EXPECT_TRUE(x >= lo && x <= hi) << "x " << x << " passes outside [" << lo << ", " << hi << "], d " << d;
      }
    };
    for (T end : {lo, hi}) {
      if (!(end > -inf && end < inf)) continue;
      T x = end, y = end;
      for (int step = 0; step < 2000; ++step) {
        probe(x);
        probe(y);
        x = std::nextafter(x, -inf);
        y = std::nextafter(y, inf);
      }
      // Tight: the end's neighbour inward passes or a neighbour within 64 steps does.
      const T inward = end == lo ? inf : -inf;
      bool near = false;
      T z = end;
      for (int step = 0; step < 64 && !near; ++step) near = passes(z = std::nextafter(z, inward));
      EXPECT_TRUE(near || !kl) << "end " << end << " is not within 64 steps of a passing logp, d " << d;
    }
    for (int r = 0; r < 2000; ++r) probe(static_cast<T>(lbar + 20 * u(g)));
  }
  EXPECT_GT(ranged, 300);
}
TEST(StepPlan, CovarianceLogpRangeHoldsEveryFlaggedToken) {
  check_logp_range<float>(5);
  check_logp_range<double>(6);
}

TEST(StepPlan, PeerSwitches) {
  reco::presets::grpo o;
  o.clip.params.delta = 1.3;
  o.kl.params.importance_weighted = true;
  check_both(o, "grpo delta + importance-weighted kl", 27);
}

// Components whose statistics span the step: batch whitening, batch and group weight
// normalisation, batch reward std, GPG's nonzero count, pass@k, OPO, the quantile rule, the kept
// denominator, the entropy-split clip, the entropy bonus.
TEST(StepPlan, ComponentsBatchStages) {
  reco::objective<reco::reinforce_pp_advantage, reco::token_ratio, reco::ppo_clip, reco::expected_count_weight,
                  reco::seq_mean_token_sum>
      whiten;
  whiten.weight.params.normalise = reco::weight_normalisation::batch_mean;
  check_both(whiten, "reinforce_pp + batch-mean weights", 31);

  reco::objective<reco::rloo_advantage, reco::token_ratio, reco::ppo_clip, reco::expected_count_weight,
                  reco::seq_mean_token_mean>
      group_norm;
  group_norm.weight.params.normalise = reco::weight_normalisation::group_mean;
  check_both(group_norm, "rloo + group-mean weights", 32);

  reco::objective<reco::batch_std_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight,
                  reco::token_mean>
      batch_std;
  batch_std.weight.params.normalise = reco::weight_normalisation::batch_mean;
  check_both(batch_std, "batch_std + caller weights", 33);

  reco::objective<reco::gpg_advantage, reco::token_ratio, reco::no_clip, reco::uniform_weight,
                  reco::seq_mean_token_sum_norm>
      gpg;
  check_both(gpg, "gpg + sum_norm", 34);
}

TEST(StepPlan, ComponentsSelection) {
  reco::objective<reco::pass_at_k_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                  reco::token_mean, reco::top_entropy_selection>
      quantile;
  quantile.select.params.rule = reco::selection_rule::quantile;
  quantile.select.params.denominator = reco::selection_denominator::kept;
  check_both(quantile, "pass@k + quantile cut, kept denominator", 41);

  reco::objective<reco::opo_advantage, reco::variance_ratio, reco::entropy_split_clip, reco::expected_count_weight,
                  reco::seq_mean_token_mean, reco::top_entropy_selection, reco::kl_penalty, reco::entropy_bonus>
      kept;
  kept.select.params.denominator = reco::selection_denominator::kept;
  kept.select.params.rho = 0.35;
  check_both(kept, "opo + top-k kept denominator + split clip + KL + entropy bonus", 42);

  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::top_entropy_selection>
      given;
  given.select.params.use_given = true;
  given.select.params.given = reco::entropy_cut{1.5, 3};
  check_both(given, "given cut with a tie budget", 43);
}

// The sum of the parts against the independent reference on the whole step.
TEST(StepPlan, PartsMatchReference) {
  auto check = [](const auto& obj, const std::string& name) {
    const reco_ref::config cfg = reco_ref::preset(name);
    for (const master_batch& m0 : standard_batches(50)) {
      const reco_ref::output ref = reco_ref::evaluate(reco_test::to_reference(m0), cfg);
      const split_output s = run_split<double>(obj, m0, {2, 5, 5, m0.R - 3});
      const double scale = std::max({std::fabs(ref.policy_loss), std::fabs(ref.kl_loss), 1e-3});
      EXPECT_NEAR(s.loss, ref.loss, 1e-10 * scale) << name;
      double gmax = 0;
      for (double x : ref.grad_logp) gmax = std::max(gmax, std::fabs(x));
      for (std::size_t t = 0; t < ref.grad_logp.size(); ++t)
        ASSERT_NEAR(s.grad_logp[t], ref.grad_logp[t], 1e-10 * gmax) << name << " token " << t;
      // The kept set of the 80/20 presets: the reference's per-token flags, counted per response.
      if (cfg.select != reco_ref::selection::all) {
        for (index_t i = 0; i < m0.R; ++i) {
          index_t n = 0;
          for (index_t t = m0.begin(i); t < m0.end(i); ++t) n += ref.kept[static_cast<std::size_t>(t)];
          ASSERT_EQ(s.plan.kept()[static_cast<std::size_t>(i)], n) << name << " response " << i;
        }
      }
    }
  };
  check(reco::presets::grpo{}, "grpo");
  check(reco::presets::dr_grpo{}, "dr_grpo");
  check(reco::presets::reco{}, "reco");
  under_each_sampling([&] {
    check(reco::presets::rule_80_20{}, "rule_80_20");
    check(reco::presets::rule_80_20_reco{}, "rule_80_20_reco");
  });
}

// Every entropy equal: the cut keeps the first k valid tokens of the step, whatever the split.
TEST(StepPlan, TiesAcrossPartsKeepStepOrder) {
  reco_test::batch_spec spec;
  spec.groups = 6;
  spec.max_length = 7;
  master_batch m = reco_test::make_batch(77, spec);
  for (double& h : m.entropy) h = 1.25;
  index_t valid = 0;
  for (auto v : m.mask) valid += v;
  const index_t k = std::max<index_t>(1, static_cast<index_t>(std::ceil(0.2 * static_cast<double>(valid) - 1e-9)));
  reco::presets::rule_80_20 obj;
  const sampling_reset reset;
  for (const auto& cuts : standard_cuts(m.R, 5)) {
    g_sampling = cuts.size() % 2 ? every_part_windowed() : reco::window_sampling{};
    const split_output s = run_split<float>(obj, m, cuts);
    index_t budget = k;
    for (index_t i = 0; i < m.R; ++i) {
      index_t want = 0;
      for (index_t t = m.begin(i); t < m.end(i); ++t)
        if (m.mask[static_cast<std::size_t>(t)] && budget > 0) {
          ++want;
          --budget;
        }
      ASSERT_EQ(s.plan.kept()[static_cast<std::size_t>(i)], want) << "response " << i;
    }
    EXPECT_EQ(s.plan.cut().value, 1.25);
    EXPECT_EQ(s.plan.policy_counts().tokens, static_cast<double>(valid));  // valid denominator
  }
}

// The rounds after the summaries read each part's cut candidates (reco::part_rounds) when given
// one, the part's data otherwise: both give the same summaries, round by round, and the kept
// counts of a naive top-k over the step (value descending, then step position), on value sets
// that stress the keys: heavy ties, negative values, -0 and +0, subnormals, huge values, every
// value equal, and values whose quantile targets fall in different key digits.
template <class T>
void check_candidate_rounds(const std::vector<double>& values, reco::selection_rule rule, const std::string& label) {
  reco_test::batch_spec spec;
  spec.groups = 7;
  spec.max_length = 19;
  master_batch m = reco_test::make_batch(91, spec);
  for (std::size_t t = 0; t < m.entropy.size(); ++t) m.entropy[t] = values[t % values.size()];
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::top_entropy_selection>
      obj;
  obj.select.params.rule = rule;
  obj.select.params.rho = 0.3;
  for (const auto& cuts : standard_cuts(m.R, 3)) {
    std::vector<index_t> bounds{0};
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(m.R);
    const reco::step_info step{5, m.R, 1.0, 0};
    std::vector<typed_batch<T>> typed;
    std::vector<reco::step_part> parts;
    for (std::size_t p = 0; p + 1 < bounds.size(); ++p) {
      index_t fg = 0;
      typed.emplace_back(slice(m, bounds[p], bounds[p + 1], fg));
      parts.push_back(reco::step_part{step, bounds[p], fg});
    }
    // Early candidates (gather_early, before the summaries are summed) around the digits each
    // part's own histogram suggests, and around a window that misses the cut (digit 1).
    reco::step_summary total;
    std::vector<reco::part_rounds> early(parts.size()), missed(parts.size());
    for (std::size_t p = 0; p < parts.size(); ++p) {
      reco::step_summary own = reco::summarize(obj, typed[p].view(), parts[p]);
      reco::gather_early(obj, typed[p].view(), reco::early_window(obj, own), early[p]);
      reco::gather_early(obj, typed[p].view(), reco::digit_window{1, 1}, missed[p]);
      total += std::move(own);
    }
    reco::step_plan with = reco::finish_plan(obj, step, total), without = with, with_early = with, with_missed = with;
    std::vector<reco::part_rounds> states(parts.size());
    int rounds = 0;
    while (!with.complete()) {
      ASSERT_FALSE(without.complete()) << label;
      reco::step_summary a, b, c, d;
      for (std::size_t p = 0; p < parts.size(); ++p) {
        a += reco::plan_round(obj, with, typed[p].view(), parts[p], &states[p]);
        b += reco::plan_round(obj, without, typed[p].view(), parts[p]);
        c += reco::plan_round(obj, with_early, typed[p].view(), parts[p], &early[p]);
        d += reco::plan_round(obj, with_missed, typed[p].view(), parts[p], &missed[p]);
      }
      ASSERT_EQ(a.values, b.values) << label << ", round " << rounds;
      ASSERT_EQ(c.values, b.values) << label << ", early candidates, round " << rounds;
      ASSERT_EQ(d.values, b.values) << label << ", missed window, round " << rounds;
      with.advance(a);
      without.advance(b);
      with_early.advance(c);
      with_missed.advance(d);
      ++rounds;
    }
    ASSERT_TRUE(without.complete()) << label;
    // The histogram rounds, the counts and the confirmation.
    EXPECT_EQ(rounds, static_cast<int>(sizeof(T) * 8 / 16) + 1) << label;
    ASSERT_EQ(with.kept(), without.kept()) << label;
    ASSERT_EQ(with_early.kept(), without.kept()) << label;
    ASSERT_EQ(with_missed.kept(), without.kept()) << label;
    if (rule != reco::selection_rule::top_k) continue;
    // Naive top-k over the step, the values as the parts see them (type T), -0 equal to +0.
    std::vector<std::pair<double, index_t>> order;  // (value, step position of a valid token)
    std::vector<index_t> owner;
    for (index_t i = 0; i < m.R; ++i)
      for (index_t t = m.begin(i); t < m.end(i); ++t)
        if (m.mask[static_cast<std::size_t>(t)]) {
          order.emplace_back(static_cast<double>(static_cast<T>(m.entropy[static_cast<std::size_t>(t)])),
                             static_cast<index_t>(owner.size()));
          owner.push_back(i);
        }
    std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    const auto k = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(0.3 * order.size() - 1e-9)));
    std::vector<index_t> want(static_cast<std::size_t>(m.R), 0);
    for (std::size_t j = 0; j < k && j < order.size(); ++j) ++want[static_cast<std::size_t>(owner[order[j].second])];
    ASSERT_EQ(with.kept(), want) << label;
  }
}

TEST(StepPlan, CandidateRoundsEqualDataRounds) {
  const double inf_free_huge = 3.0e38, tiny = 1e-40;  // float's range: a huge and a subnormal value
  const std::vector<std::pair<std::string, std::vector<double>>> sets = {
      {"heavy ties", {0.5, 0.5, 0.25, 0.5, 1.0, 1.0, 0.25}},
      {"signs and zeros", {-0.0, 0.0, -1.5, 2.0, -0.0, -3.25, 0.0, 1e-3, -1e-3}},
      {"subnormal and huge", {tiny, -tiny, inf_free_huge, 0.0, -inf_free_huge, 1.0, tiny}},
      {"all equal", {-2.0}},
      {"two digits apart", {1.0, 1.0, 1.0, 1000.0, 1000.0, 1e-6, 1e6}},
      {"spread", {0.1, 0.7, 2.3, 0.05, 1.1, 3.9, 0.8, 1.7, 0.3, 2.9, 0.6}},
  };
  for (const auto& [name, values] : sets)
    for (auto rule : {reco::selection_rule::top_k, reco::selection_rule::quantile}) {
      const std::string label = name + (rule == reco::selection_rule::top_k ? ", top-k" : ", quantile");
      check_candidate_rounds<float>(values, rule, label + ", float");
      check_candidate_rounds<double>(values, rule, label + ", double");
    }
}

// The windowed stage 0 (summarize with a part_rounds): the plan of a split step equals the plan
// that counts every first digit — the cut, its ties, the kept tokens per response, the counts —
// whether the parts' windows hold the step's targets (the first round confirms them) or miss
// them (the plan counts every digit in one more round: two stages more), on steps with spread
// entropies, heavy ties, and parts whose values differ (the later responses' entropies shifted
// up, so that each part's own quantile lies far from the step's).
template <class T>
void check_windowed_plans(std::uint64_t seed, reco::selection_rule rule, int values, int& confirmed, int& missed) {
  reco_test::batch_spec spec;
  spec.padded = seed % 2 == 0;
  spec.groups = 24;
  spec.max_group = 6;
  spec.max_length = 150;
  master_batch m = reco_test::make_batch(seed, spec);
  for (std::size_t t = 0; t < m.entropy.size(); ++t) {
    if (values == 1) m.entropy[t] = std::round(m.entropy[t] * 8.0) / 8.0;  // heavy ties
    if (values == 2 && t >= m.entropy.size() / 2) m.entropy[t] += 40.0;   // parts that differ
  }
  reco_test::round_to<T>(m);
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::top_entropy_selection>
      obj;
  obj.select.params.rule = rule;
  obj.select.params.rho = 0.2;
  reco::window_sampling never;
  never.min_samples = 1e300;
  for (const auto& cuts : standard_cuts(m.R, seed)) {
    reco_test::split_step<T> sp(m, cuts, reco::step_info{3, m.R, 1.0, 0});
    const reco::step_plan full = reco::plan_step(obj, sp.step, sp.views, sp.parts, never);
    for (const reco::window_sampling& w : {every_part_windowed(), every_part_windowed(5, 0.005, 3),
                                           every_part_windowed(0, 0), every_part_windowed(1, 0, 2)}) {
      const reco::step_plan p = reco::plan_step(obj, sp.step, sp.views, sp.parts, w);
      const std::string label = "values " + std::to_string(values) + " parts " + std::to_string(cuts.size() + 1) +
                                " margin " + std::to_string(w.margin) + " stride " + std::to_string(w.stride);
      ASSERT_EQ(p.cut().value, full.cut().value) << label;
      ASSERT_EQ(p.cut().ties, full.cut().ties) << label;
      ASSERT_EQ(p.kept(), full.kept()) << label;
      ASSERT_EQ(p.policy_counts().tokens, full.policy_counts().tokens) << label;
      ASSERT_EQ(p.valid_counts().tokens, full.valid_counts().tokens) << label;
      const int extra = p.stage_index() - full.stage_index();
      ASSERT_TRUE(extra == 0 || extra == 2) << label << ": " << extra << " stages more";
      (extra == 0 ? confirmed : missed) += 1;
    }
  }
}

TEST(StepPlan, WindowedStageZeroGivesThePlanOfEveryDigit) {
  int confirmed = 0, missed = 0;
  for (auto rule : {reco::selection_rule::top_k, reco::selection_rule::quantile})
    for (int values = 0; values < 3; ++values) {
      check_windowed_plans<float>(31 + values, rule, values, confirmed, missed);
      check_windowed_plans<double>(41 + values, rule, values, confirmed, missed);
      if (HasFatalFailure()) return;
    }
  EXPECT_GT(confirmed, 100);  // both paths ran, many times
  EXPECT_GT(missed, 20);
}

// A windowed part whose state does not come back to the first round (no state, or a state that a
// second summary of the part replaced) cannot confirm its window: the plan counts every first
// digit again and ends as the plan that counted them at stage 0.
TEST(StepPlan, WindowedPartsThatCannotConfirmCountEveryDigit) {
  reco_test::batch_spec spec;
  spec.groups = 20;
  spec.max_length = 100;
  const master_batch m = reco_test::make_batch(5, spec);
  reco::presets::rule_80_20 obj;
  reco_test::split_step<float> sp(m, {m.R / 3, 2 * m.R / 3}, reco::step_info{9, m.R, 1.0, 0});
  reco::window_sampling never;
  never.min_samples = 1e300;
  const reco::step_plan full = reco::plan_step(obj, sp.step, sp.views, sp.parts, never);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<reco::part_rounds> states(sp.parts.size());
    reco::step_summary total;
    for (std::size_t p = 0; p < sp.parts.size(); ++p)
      total += reco::summarize(obj, sp.views[p], sp.parts[p], states[p], every_part_windowed());
    for (const auto& st : states) ASSERT_NE(st.window, 0u) << "every part windowed";
    if (variant == 1)  // part 1 summarised again: its state holds another window id
      (void)reco::summarize(obj, sp.views[1], sp.parts[1], states[1], every_part_windowed());
    reco::step_plan plan = reco::finish_plan(obj, sp.step, total);
    while (!plan.complete()) {
      reco::step_summary r;
      for (std::size_t p = 0; p < sp.parts.size(); ++p)
        r += reco::plan_round(obj, plan, sp.views[p], sp.parts[p], variant == 2 && p == 0 ? nullptr : &states[p]);
      plan.advance(r);
    }
    ASSERT_EQ(plan.kept(), full.kept()) << "variant " << variant;
    ASSERT_EQ(plan.cut().value, full.cut().value);
    EXPECT_EQ(plan.stage_index(), full.stage_index() + (variant == 0 ? 0 : 2)) << "variant " << variant;
  }
}

// A NaN or infinite valid entropy fails a windowed plan as it fails one that counts every digit.
TEST(StepPlan, WindowedStageZeroRejectsNonFiniteEntropies) {
  reco_test::batch_spec spec;
  spec.groups = 10;
  spec.max_length = 90;
  spec.masked_row = 0;
  spec.mask_hole = 0;
  reco::presets::rule_80_20 obj;
  for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    master_batch m = reco_test::make_batch(8, spec);
    m.entropy[m.entropy.size() / 2] = bad;
    reco_test::split_step<double> sp(m, {m.R / 2}, reco::step_info{4, m.R, 1.0, 0});
    for (const reco::window_sampling& w : {reco::window_sampling{}, every_part_windowed()}) {
      try {
        (void)reco::plan_step(obj, sp.step, sp.views, sp.parts, w);
        ADD_FAILURE() << "no error for entropy " << bad;
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("batch.entropy"), std::string::npos) << e.what();
      }
    }
  }
}

// reco::recycle hands a used summary's storage to the next summaries of the thread: those are
// the same as from fresh storage (every value the part does not write is zero), whatever the
// recycled buffer held, and at most 4 buffers are kept.
// A random batch that is a whole step by itself (one part), for the 80/20 preset.
template <class T>
struct whole_step {
  master_batch m;
  typed_batch<T> tb;
  reco::step_info step;
  reco::step_part part;
  whole_step(unsigned seed, index_t groups, index_t max_length, std::uint64_t id)
      : m(make_with(seed, groups, max_length)), tb(m), step{id, m.R, 1.0, 0}, part{step, 0, 0} {}
  static master_batch make_with(unsigned seed, index_t groups, index_t max_length) {
    reco_test::batch_spec spec;
    spec.groups = groups;
    spec.max_length = max_length;
    return reco_test::make_batch(seed, spec);
  }
};

TEST(StepPlan, RecycledSummariesEqualFreshOnes) {
  const whole_step<double> w(17, 5, 23, 3);
  reco::presets::rule_80_20 obj;
  auto dirty = [](std::size_t n) {
    reco::step_summary g;
    g.values.assign(n, 7.5);
    return g;
  };
  const reco::step_summary fresh = reco::summarize(obj, w.tb.view(), w.part);
  const reco::step_plan plan = reco::finish_plan(obj, w.step, fresh);
  ASSERT_FALSE(plan.complete());
  const reco::step_summary fresh_round = reco::plan_round(obj, plan, w.tb.view(), w.part);
  for (int k = 0; k < 6; ++k) {
    reco::step_summary g = dirty(fresh.size() + 64 * static_cast<std::size_t>(k));
    reco::recycle(std::move(g));
    EXPECT_TRUE(g.values.empty());
  }
  EXPECT_LE(reco::detail::spare_summaries().size(), 4u);
  EXPECT_EQ(reco::summarize(obj, w.tb.view(), w.part).values, fresh.values);
  reco::recycle(dirty(fresh_round.size()));
  EXPECT_EQ(reco::plan_round(obj, plan, w.tb.view(), w.part).values, fresh_round.values);
  // `+=` of a temporary adds it and takes its storage.
  reco::step_summary total = reco::summarize(obj, w.tb.view(), w.part), other = dirty(fresh.size());
  total += std::move(other);
  EXPECT_TRUE(other.values.empty());
  for (std::size_t i = 0; i < fresh.size(); ++i) ASSERT_EQ(total.values[i], fresh.values[i] + 7.5) << i;
}

// A summed summary a plan has taken goes back to the pool set to zero by recycle_taken, which
// writes the header, the values after the histograms and only the digit runs whose group count is
// not zero: the next summaries of any size from that storage are all zeros, and plans made from
// it equal a fresh thread's.
TEST(StepPlan, TakenSummariesComeBackAsZeros) {
  using reco::detail::plan_header;
  using reco::detail::plan_histogram;
  std::vector<reco::detail::spare_summary>& spare = reco::detail::spare_summaries();
  std::mt19937 rng(11);
  // A histogram round of 2 targets and 40 values after it: digits in the first and last run of a
  // group, at both ends of the histogram, and in groups far apart.
  const std::size_t n = plan_header + 2 * plan_histogram + 40;
  for (std::size_t extra : {std::size_t{0}, std::size_t{3000}}) {
    spare.clear();
    reco::step_summary s;
    s.values = reco::detail::summary_storage(n);
    for (std::size_t i = 0; i < plan_header; ++i) s.values[i] = 1.0 + static_cast<double>(i);
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t d : {std::size_t{1}, std::size_t{255}, std::size_t{256}, std::size_t{40000},
                            std::size_t{65535}, static_cast<std::size_t>(rng() % 65536)})
        reco::detail::histogram_add(s.values.data() + plan_header + k * plan_histogram, d, 1.0 + rng() % 5);
    for (std::size_t i = plan_header + 2 * plan_histogram; i < n; ++i) s.values[i] = -3.0;
    const double* storage = s.values.data();
    reco::detail::recycle_taken(std::move(s), 2);
    ASSERT_EQ(spare.size(), 1u);
    EXPECT_TRUE(spare[0].clean);
    const std::vector<double> v = reco::detail::summary_storage(n + extra);
    if (extra == 0) {
      EXPECT_EQ(v.data(), storage);  // the same storage, not a fresh vector
    }
    ASSERT_EQ(v.size(), n + extra);
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 0.0) << "value " << i << " of " << n + extra;
  }
  // More histograms than the summary holds: a plain recycle, filled before its next use.
  spare.clear();
  reco::step_summary short_one;
  short_one.values.assign(plan_histogram, 2.0);
  const double* dirty_storage = short_one.values.data();
  reco::detail::recycle_taken(std::move(short_one), 1);
  ASSERT_EQ(spare.size(), 1u);
  EXPECT_FALSE(spare[0].clean);
  const std::vector<double> w = reco::detail::summary_storage(plan_histogram);
  EXPECT_EQ(w.data(), dirty_storage);
  for (double x : w) ASSERT_EQ(x, 0.0);
  // A small summary takes a new vector, not a pooled one.
  reco::step_summary big;
  big.values = reco::detail::summary_storage(n);
  reco::detail::recycle_taken(std::move(big), 2);
  ASSERT_EQ(spare.size(), 1u);
  const std::vector<double> tiny = reco::detail::summary_storage(100);
  EXPECT_EQ(spare.size(), 1u);
  EXPECT_EQ(tiny, std::vector<double>(100, 0.0));

  // 80/20 plans of steps of other sizes and entropies, one after another on this thread (each
  // recycling its taken summaries), equal the plans of fresh threads.
  reco::presets::rule_80_20 obj;
  const whole_step<double> a(31, 9, 17, 5), b(32, 3, 11, 6), c(33, 12, 29, 7);
  auto plan_of = [&](const whole_step<double>& x) {
    return reco::plan_step(obj, x.step, std::vector<reco::batch_view<double>>{x.tb.view()},
                           std::vector<reco::step_part>{x.part});
  };
  auto fresh_thread_plan = [&](const whole_step<double>& x) {
    reco::step_plan p;
    std::thread t([&] { p = plan_of(x); });
    t.join();
    return p;
  };
  spare.clear();
  for (const whole_step<double>* x : {&a, &b, &c, &a, &c, &b}) {
    const reco::step_plan mine = plan_of(*x), fresh = fresh_thread_plan(*x);
    EXPECT_EQ(mine.cut().value, fresh.cut().value);
    EXPECT_EQ(mine.cut().ties, fresh.cut().ties);
    EXPECT_EQ(mine.kept(), fresh.kept());
    EXPECT_EQ(mine.policy_counts().tokens, fresh.policy_counts().tokens);
    EXPECT_EQ(mine.advantages(), fresh.advantages());
  }
  bool any_clean = false;
  for (const auto& sp : spare) any_clean = any_clean || sp.clean;
  EXPECT_TRUE(any_clean);
}

// finish_plan keeps its per-response arrays for the thread's next plans: a plan made after larger
// and dirtied ones equals the plan of a thread that never made one (none of the old values leak).
TEST(StepPlan, ReusedFinishScratchEqualsAFreshThread) {
  reco::presets::reco obj;  // reads old means, rewards and batch-normalised weights
  const whole_step<double> big(31, 9, 17, 5), small(32, 3, 11, 6);
  auto plan_of = [&](const whole_step<double>& w) {
    return reco::finish_plan(obj, w.step, reco::summarize(obj, w.tb.view(), w.part));
  };
  auto fresh_thread_plan = [&](const whole_step<double>& w) {
    reco::step_plan p;
    std::thread t([&] { p = plan_of(w); });
    t.join();
    return p;
  };
  auto expect_same_plan = [](const reco::step_plan& a, const reco::step_plan& b, const char* label) {
    EXPECT_EQ(a.advantages(), b.advantages()) << label;
    EXPECT_EQ(a.weights(), b.weights()) << label;
    EXPECT_EQ(a.valid_counts().tokens, b.valid_counts().tokens) << label;
    EXPECT_EQ(a.valid_counts().responses, b.valid_counts().responses) << label;
    EXPECT_EQ(a.valid_counts().max_length, b.valid_counts().max_length) << label;
  };
  const reco::step_plan small_fresh = fresh_thread_plan(small), big_fresh = fresh_thread_plan(big);
  ASSERT_GT(big.step.responses, small.step.responses);
  (void)plan_of(big);
  // Dirty every array of this thread's scratch beyond the next step's size.
  reco::detail::finish_scratch& sc = reco::detail::thread_finish_scratch();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto* v : {&sc.old_mean, &sc.input, &sc.given, &sc.log_weight}) v->assign(v->size() + 8, nan);
  for (auto* v : {&sc.group_offsets, &sc.token_offsets}) v->assign(v->size() + 8, 12345);
  for (auto* v : {&sc.response_status, &sc.group_status}) v->assign(v->size() + 8, ~0u);
  sc.group_zero.assign(sc.group_zero.size() + 8, 1);
  expect_same_plan(plan_of(small), small_fresh, "small after big");
  expect_same_plan(plan_of(big), big_fresh, "big after small");
}

// A part_rounds kept from one step to the next (the same step id, objective and layout, other
// entropies) is not read for the next step's plan: its candidates are gathered again.
TEST(StepPlan, PartRoundsKeptAcrossStepsAreGatheredAgain) {
  reco_test::batch_spec spec;
  spec.groups = 5;
  spec.max_length = 13;
  const master_batch first = reco_test::make_batch(17, spec);
  // The same valid entropies in another order: the same cut, the same first digit, other
  // responses above and on it (a stale state would cover the range and count the old ones).
  master_batch second = first;
  std::vector<std::size_t> valid;
  for (std::size_t t = 0; t < first.mask.size(); ++t)
    if (first.mask[t]) valid.push_back(t);
  ASSERT_GT(valid.size(), 8u);
  for (std::size_t j = 0; j < valid.size(); ++j)
    second.entropy[valid[j]] = first.entropy[valid[(j + valid.size() / 3) % valid.size()]];
  reco::presets::rule_80_20 obj;
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::top_entropy_selection>
      given;
  given.select.params.use_given = true;  // no histogram round: straight to the cut counts
  given.select.params.given = reco::entropy_cut{1.0, -1};
  auto kept_with = [](const auto& o, const master_batch& m, reco::part_rounds& state) {
    const typed_batch<float> tb(m);
    const reco::step_info step{3, m.R, 1.0, 0};
    const reco::step_part part{step, 0, 0};
    reco::step_plan plan = reco::finish_plan(o, step, reco::summarize(o, tb.view(), part));
    while (!plan.complete()) plan.advance(reco::plan_round(o, plan, tb.view(), part, &state));
    return plan.kept();
  };
  auto kept_fresh = [](const auto& o, const master_batch& m) {
    const typed_batch<float> tb(m);
    const reco::step_info step{3, m.R, 1.0, 0};
    return reco::plan_step(o, step, std::vector<reco::batch_view<float>>{tb.view()},
                           std::vector<reco::step_part>{reco::step_part{step, 0, 0}})
        .kept();
  };
  reco::part_rounds state;
  kept_with(obj, first, state);
  ASSERT_GT(state.candidates.keys.size(), 0u);
  ASSERT_NE(kept_fresh(obj, first), kept_fresh(obj, second));  // the split of the kept set moved
  EXPECT_EQ(kept_with(obj, second, state), kept_fresh(obj, second));
  kept_with(obj, first, state);
  EXPECT_EQ(kept_with(given, second, state), kept_fresh(given, second));
}

// Without a plan each call normalises by its own counts (the per-call convention): a two-way
// split of Dr.GRPO is off by the ratio of the constants; with the plan it is not.
TEST(StepPlan, PerCallModeDiffersPlanDoesNot) {
  reco_test::batch_spec spec;
  spec.padded = true;
  spec.groups = 6;
  spec.max_group = 4;
  const master_batch m = reco_test::make_batch(5, spec);
  reco::presets::dr_grpo obj;
  const auto whole = reco_test::run_library<double>(obj, m);
  const index_t half = m.group_offsets[3];
  index_t fg = 0;
  const auto a = reco_test::run_library<double>(obj, slice(m, 0, half, fg));
  const auto b = reco_test::run_library<double>(obj, slice(m, half, m.R, fg));
  // Each half divides by its own R_part * T instead of R * T.
  const double naive = a.result.loss * static_cast<double>(half) / static_cast<double>(m.R) +
                       b.result.loss * static_cast<double>(m.R - half) / static_cast<double>(m.R);
  EXPECT_NEAR(naive, whole.result.loss, 1e-12 * std::fabs(whole.result.loss));  // (the groups are whole)
  EXPECT_GT(std::fabs(a.result.loss + b.result.loss - whole.result.loss), 1e-3 * std::fabs(whole.result.loss));
  const split_output s = run_split<double>(obj, m, {half});
  EXPECT_NEAR(s.loss, whole.result.loss, 1e-12 * std::fabs(whole.result.loss));
  EXPECT_EQ(s.plan.valid_counts().all_responses * s.plan.valid_counts().max_length, static_cast<double>(m.R * m.T));
}

// The plan's scale multiplies every part's loss and gradient (data-parallel averaging).
TEST(StepPlan, ScaleMultipliesLossAndGradient) {
  reco_test::batch_spec spec;
  const master_batch m = reco_test::make_batch(9, spec);
  reco::presets::reco obj;
  const split_output one = run_split<double>(obj, m, {3, 9}, 7, 1.0);
  const split_output four = run_split<double>(obj, m, {3, 9}, 7, 4.0);
  EXPECT_NEAR(four.loss, 4.0 * one.loss, 1e-12 * std::fabs(one.loss));
  for (std::size_t t = 0; t < one.grad_logp.size(); ++t)
    ASSERT_NEAR(four.grad_logp[t], 4.0 * one.grad_logp[t], 1e-12 * (std::fabs(one.grad_logp[t]) + 1e-300));
}

// Many random batches and splits, random presets of each kind.
TEST(StepPlan, RandomSplitsProperty) {
  const sampling_reset reset;
  std::mt19937_64 rng(2024);
  for (int it = 0; it < 120; ++it) {
    reco_test::batch_spec spec = random_spec(rng, 8, 7, 15);
    spec.response_weights = true;
    master_batch m = reco_test::make_batch(rng(), spec);
    if (rng() % 2 == 0)
      for (double& h : m.entropy) h = std::round(h * 4.0) / 4.0;
    const std::vector<index_t> cuts = random_cuts(rng, m.R, 8);
    const std::string label = "iteration " + std::to_string(it);
    g_sampling = it % 3 == 0 ? reco::window_sampling{} : every_part_windowed(it % 3 == 1 ? 5 : 0, it % 3 == 1 ? 0.005 : 0);
    switch (it % 4) {
      case 0: expect_same<double>(run_split<double>(reco::presets::rule_80_20_reco{}, m, cuts),
                                  reco_test::run_library<double>(reco::presets::rule_80_20_reco{}, m), label); break;
      case 1: expect_same<double>(run_split<double>(reco::presets::dr_grpo{}, m, cuts),
                                  reco_test::run_library<double>(reco::presets::dr_grpo{}, m), label); break;
      case 2: {
        master_batch m32 = m;
        reco_test::round_to<float>(m32);
        expect_same<float>(run_split<float>(reco::presets::reco{}, m32, cuts),
                           reco_test::run_library<float>(reco::presets::reco{}, m32), label);
        break;
      }
      default: {
        master_batch m32 = m;
        reco_test::round_to<float>(m32);
        expect_same<float>(run_split<float>(reco::presets::rule_80_20{}, m32, cuts),
                           reco_test::run_library<float>(reco::presets::rule_80_20{}, m32), label);
      }
    }
    // Clip-Cov and KL-Cov with a random ratio (and band) on the same steps.
    reco::presets::kl_cov kl;
    kl.select.params.ratio = 0.01 + 0.5 * static_cast<double>(rng() % 1000) / 1000.0;
    reco::presets::clip_cov cc;
    cc.select.params.ratio = kl.select.params.ratio;
    cc.select.params.lb = -0.1 - static_cast<double>(rng() % 100) / 100.0;
    cc.select.params.ub = 0.1 + static_cast<double>(rng() % 100) / 100.0;
    if (it % 2 == 0)
      expect_same<double>(run_split<double>(kl, m, cuts), reco_test::run_library<double>(kl, m), label + " kl_cov");
    else
      expect_same<double>(run_split<double>(cc, m, cuts), reco_test::run_library<double>(cc, m), label + " clip_cov");
    if (HasFailure()) return;
  }
}

TEST(StepPlan, ReportWorstErrors) {
  // Printed for the record (run after the sweeps in the same binary).
  std::printf("worst relative error, float64: loss %.3g grad %.3g; float32: loss %.3g grad %.3g\n",
              worst_for(false).loss, worst_for(false).grad, worst_for(true).loss, worst_for(true).grad);
}

// ---- bad input -------------------------------------------------------------------------------

struct two_parts {
  master_batch m, a, b;
  index_t half = 0, fg_a = 0, fg_b = 0;
  two_parts() {
    reco_test::batch_spec spec;
    spec.groups = 4;
    m = reco_test::make_batch(3, spec);
    half = m.R / 2;
    a = slice(m, 0, half, fg_a);
    b = slice(m, half, m.R, fg_b);
  }
};

template <class T>
std::vector<reco::batch_view<T>> views(const typed_batch<T>& a, const typed_batch<T>& b) {
  return {a.view(), b.view()};
}

template <class F>
void expect_plan_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one naming 'plan' with \"" << needle << "\")";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "plan") << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A histogram round carries each bucket's count and the sums of runs of 256 buckets (a rank is
// found in the sums first, then in one run): sums or buckets that hold fewer tokens than the
// summaries counted are an error naming the plan, not a wrong cut.
TEST(StepPlan, HistogramRoundsThatLoseTokensAreRejected) {
  const whole_step<float> w(23, 4, 21, 9);
  reco::presets::rule_80_20 obj;
  const reco::step_plan plan = reco::finish_plan(obj, w.step, reco::summarize(obj, w.tb.view(), w.part));
  ASSERT_EQ(plan.stage(), reco::step_plan::stage_kind::histogram);
  const reco::step_summary round = reco::plan_round(obj, plan, w.tb.view(), w.part);
  const std::size_t h = reco::detail::plan_header, buckets = reco::detail::plan_buckets;
  ASSERT_EQ(round.size(), h + reco::detail::plan_histogram);
  {
    reco::step_plan ok = plan;
    ok.advance(round);  // untouched: fine
    EXPECT_EQ(ok.stage(), reco::step_plan::stage_kind::cut_counts);
  }
  // Sent so by the parts (sealed; altered in flight, the checksum refuses them): the runs' sums
  // disagree with their buckets. Both emptied: fewer tokens than the summaries counted.
  reco::step_summary no_groups = round, no_buckets = round, empty = round;
  for (std::size_t g = 0; g < reco::detail::digit_groups; ++g) no_groups.values[h + buckets + g] = 0;
  for (std::size_t b = 0; b < buckets; ++b) no_buckets.values[h + b] = 0;
  for (std::size_t b = 0; b < reco::detail::plan_histogram; ++b) empty.values[h + b] = 0;
  for (auto [bad, needle] : {std::pair{&no_groups, "but its buckets"}, std::pair{&no_buckets, "but its buckets"},
                             std::pair{&empty, "the previous stage found there"}}) {
    reco::detail::seal(*bad);
    reco::step_plan p = plan;
    try {
      p.advance(*bad);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), "summaries") << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// A covariance plan's top-value round: a part claiming more values than k, a value of a response
// outside the step, or parts that say they left tokens out with fewer than k values in the table
// are an error naming the plan; a part that starts where no part of the summaries started is
// named by its first response.
TEST(StepPlan, CovarianceTopValueRoundsThatDisagreeAreRejected) {
  reco_test::batch_spec spec;
  spec.groups = 8;
  spec.max_length = 200;
  master_batch m = reco_test::make_batch(61, spec);
  reco_test::round_to<double>(m);
  reco::presets::kl_cov obj;
  obj.select.params.ratio = 0.01;
  reco_test::split_step<double> sp(m, {m.R / 2}, reco::step_info{9, m.R, 1.0, 0});
  reco::step_summary total = reco::summarize(obj, sp.views[0], sp.parts[0]);
  total += reco::summarize(obj, sp.views[1], sp.parts[1]);
  const reco::step_plan plan = reco::finish_plan(obj, sp.step, total);
  ASSERT_EQ(plan.stage(), reco::step_plan::stage_kind::top_values);
  const auto K = static_cast<std::size_t>(plan.selected_count());
  ASSERT_GT(K, 1u);
  reco::step_summary round = reco::plan_round(obj, plan, sp.views[0], sp.parts[0]);
  round += reco::plan_round(obj, plan, sp.views[1], sp.parts[1]);
  const std::size_t h = reco::detail::plan_header, slots = 2 * K + 1;
  ASSERT_EQ(round.size(), h + 2 * slots + 1);
  ASSERT_EQ(round.values[h], static_cast<double>(K)) << "the first part holds more than k candidates";
  ASSERT_EQ(round.values[h + 2 * slots], 2) << "both parts hold more than they send";
  {
    reco::step_plan ok = plan;
    ok.advance(round);
    ASSERT_EQ(ok.stage(), reco::step_plan::stage_kind::confirm);
    reco::step_summary confirm = reco::plan_round(obj, ok, sp.views[0], sp.parts[0]);
    confirm += reco::plan_round(obj, ok, sp.views[1], sp.parts[1]);
    ok.advance(confirm);
    EXPECT_TRUE(ok.complete());
  }
  // Parts that sent these values (their checksums sealed over them; altered in flight, the
  // checksum refuses them: tests/core/test_step_plan_faults.cpp).
  reco::step_summary too_many = round, too_few = round, outside = round;
  too_many.values[h] = static_cast<double>(K + 1);
  too_few.values[h] = too_few.values[h + slots] = 1;
  outside.values[h + 2] = static_cast<double>(m.R);
  for (auto [bad, needle] : {std::pair{&too_many, "top values for a selection"}, std::pair{&too_few, "fewer than"},
                             std::pair{&outside, "outside the step"}}) {
    reco::detail::seal(*bad);
    reco::step_plan p = plan;
    expect_plan_error([&] { p.advance(*bad); }, needle);
  }
  reco::step_part shifted = sp.parts[0];  // still inside the step
  shifted.first_response += 1;
  try {
    reco::plan_round(obj, plan, sp.views[0], shifted);
    ADD_FAILURE() << "no error for a part that starts where no part started";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "part.first_response") << e.what();
    EXPECT_NE(std::string(e.what()).find("starts no part"), std::string::npos) << e.what();
  }
}

// A rank may summarise its micro-batches as a step of their own while the ranks' layout is being
// exchanged, and place the sum where the rank starts: the placed summary equals the summaries of
// the same micro-batches made with their real places, value for value.
template <class T, class Obj>
void check_placed_summary(const Obj& obj, const std::string& label) {
  reco_test::batch_spec spec;
  spec.groups = 6;
  const master_batch m = reco_test::make_batch(57, spec);
  const index_t c1 = m.R / 4 + 1, cm = m.R / 2, c2 = m.R - 3;  // the rank holds [c1, cm) and [cm, c2)
  index_t fg1 = 0, fg2 = 0;
  const typed_batch<T> b1(slice(m, c1, cm, fg1)), b2(slice(m, cm, c2, fg2));
  const reco::step_info step{9, m.R, 2.0, 77};
  reco::step_info provisional = step;
  provisional.responses = c2 - c1;
  reco::step_summary placed = reco::summarize(obj, b1.view(), reco::step_part{provisional, 0, 0});
  placed += reco::summarize(obj, b2.view(), reco::step_part{provisional, cm - c1, fg2 - fg1});
  reco::step_summary real = reco::summarize(obj, b1.view(), reco::step_part{step, c1, fg1});
  real += reco::summarize(obj, b2.view(), reco::step_part{step, cm, fg2});
  const reco::step_summary unplaced = placed;
  reco::place_summary(obj, placed, provisional, step, c1, fg1);
  reco::detail::seal(real);  // its checksums reduced modulo 2^24, as place_summary writes them
  ASSERT_EQ(placed.values, real.values) << label;
  // Misuse is named: a summary of another provisional step, a step that differs in more than its
  // responses, a place outside the step.
  auto expect_error = [&](auto&& f, const std::string& argument) {
    reco::step_summary copy = unplaced;
    try {
      f(copy);
      ADD_FAILURE() << label << ": no error naming " << argument;
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), argument) << label << ": " << e.what();
    }
  };
  reco::step_info other = provisional;
  other.responses += 1;
  expect_error([&](reco::step_summary& x) { reco::place_summary(obj, x, other, step, c1, fg1); }, "summary");
  reco::step_info next = step;
  next.id += 1;
  expect_error([&](reco::step_summary& x) { reco::place_summary(obj, x, provisional, next, c1, fg1); }, "step");
  expect_error([&](reco::step_summary& x) { reco::place_summary(obj, x, provisional, step, m.R - 2, fg1); },
               "first_response");
  expect_error([&](reco::step_summary& x) { reco::place_summary(obj, x, provisional, step, c1, -1); }, "first_group");
}

TEST(StepPlan, PlacedSummariesEqualRealOnes) {
  check_placed_summary<float>(reco::presets::rule_80_20{}, "rule_80_20 float");
  check_placed_summary<double>(reco::presets::rule_80_20{}, "rule_80_20 double");
  check_placed_summary<double>(reco::presets::reco{}, "reco double");
  check_placed_summary<float>(reco::presets::dr_grpo{}, "dr_grpo float");
  check_placed_summary<double>(reco::presets::kl_cov{}, "kl_cov double");  // its per-response sums move too
  check_placed_summary<float>(reco::presets::clip_cov{}, "clip_cov float");
}

// A covariance plan reads logp: a NaN in one part's valid logp fails finish_plan naming
// batch.logp (on every part alike, from the summed counters), not a NaN mean on every rank.
TEST(StepPlan, CovarianceSummaryRejectsNonFiniteLogp) {
  two_parts d;
  reco::presets::kl_cov obj;
  typed_batch<double> ta(d.a), tb(d.b);
  index_t t = d.b.begin(0);
  while (!d.b.mask[static_cast<std::size_t>(t)]) ++t;
  tb.logp[static_cast<std::size_t>(t)] = std::nan("");
  const reco::step_info step{1, d.m.R, 1.0, 0};
  const std::vector<reco::step_part> parts{{step, 0, d.fg_a}, {step, d.half, d.fg_b}};
  try {
    reco::plan_step(obj, step, views(ta, tb), parts);
    ADD_FAILURE() << "no error for a NaN logp";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "batch.logp") << e.what();
  }
  // A masked NaN is not read.
  typed_batch<double> tm(d.b);
  index_t u = d.b.begin(0);
  while (u < d.b.N && d.b.mask[static_cast<std::size_t>(u)]) ++u;
  if (u < d.b.N) {
    tm.logp[static_cast<std::size_t>(u)] = std::nan("");
    EXPECT_NO_THROW(reco::plan_step(obj, step, views(ta, tm), parts));
  }
}

TEST(StepPlan, PlanFromAnotherStepIsRejected) {
  two_parts d;
  reco::presets::grpo obj;
  typed_batch<double> ta(d.a), tb(d.b);
  reco::step_info step{1, d.m.R, 1.0, 0};
  const reco::step_part pa{step, 0, d.fg_a}, pb{step, d.half, d.fg_b};
  const reco::step_plan plan = reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, pb});
  std::vector<double> g(d.a.logp.size());
  reco::step_part next = pa;
  next.step.id = 2;
  expect_plan_error([&] { obj(reco::cpu{}, ta.view(), reco::gradients<double>{g, {}}, plan, next); }, "another step");
  // Another objective (a changed parameter) with the same step.
  reco::presets::grpo other;
  other.clip.params.eps_high = 0.3;
  expect_plan_error([&] { other(reco::cpu{}, ta.view(), reco::gradients<double>{g, {}}, plan, pa); }, "another step");
  // The same step id but other data: the plan's counts do not match the batch.
  master_batch changed = d.a;
  for (index_t t = changed.begin(0); t < changed.end(0); ++t) changed.mask[static_cast<std::size_t>(t)] = 0;
  changed.mask[static_cast<std::size_t>(changed.begin(1))] ^= 1;
  typed_batch<double> tc(changed);
  expect_plan_error([&] { obj(reco::cpu{}, tc.view(), reco::gradients<double>{g, {}}, plan, pa); }, "does not match");
  // Entropies other than the planned ones (80/20): the kept set would not be the plan's.
  {
    reco::presets::rule_80_20 sel;
    typed_batch<double> ea(d.a), eb(d.b);
    const reco::step_plan p80 =
        reco::plan_step(sel, step, views(ea, eb), std::vector<reco::step_part>{pa, pb});
    for (auto& h : ea.entropy) h = 3.0 - h;
    expect_plan_error([&] { sel(reco::cpu{}, ea.view(), reco::gradients<double>{g, {}}, p80, pa); },
                      "entropies differ");
  }
  // Log-probabilities other than the planned ones (KL-Cov): the selected set would not be the plan's.
  {
    reco::presets::kl_cov kl;
    kl.select.params.ratio = 0.3;
    typed_batch<double> ca(d.a), cb(d.b);
    const reco::step_plan pk = reco::plan_step(kl, step, views(ca, cb), std::vector<reco::step_part>{pa, pb});
    for (auto& l : ca.logp) l *= 0.5;  // still valid log-probabilities, other covariances
    expect_plan_error([&] { kl(reco::cpu{}, ca.view(), reco::gradients<double>{g, {}}, pk, pa); },
                      "by covariance");
  }
  // The part's range outside the step.
  reco::step_part far = pb;
  far.first_response = d.m.R - 1;
  std::vector<double> gb(d.b.logp.size());
  expect_plan_error([&] { obj(reco::cpu{}, tb.view(), reco::gradients<double>{gb, {}}, plan, far); }, "outside");
}

// The fingerprint reads parameters field by field: a copy with other padding bytes (and empty
// parameter structs) agrees with the original; a changed parameter does not.
TEST(StepPlan, FingerprintIgnoresPadding) {
  reco::presets::rule_80_20_reco a;
  a.weight.params.cap = 7.5;
  alignas(64) unsigned char junk[sizeof(a)];
  std::memset(junk, 0xAB, sizeof(junk));
  const auto* b = new (junk) reco::presets::rule_80_20_reco(a);
  const reco::step_info step{3, 10, 1.0, 0};
  EXPECT_EQ(reco::detail::plan_fingerprint(a, step, 4), reco::detail::plan_fingerprint(*b, step, 4));
  reco::presets::rule_80_20_reco c = a;
  c.select.params.rule = reco::selection_rule::quantile;
  EXPECT_NE(reco::detail::plan_fingerprint(a, step, 4), reco::detail::plan_fingerprint(c, step, 4));
  EXPECT_NE(reco::detail::plan_fingerprint(a, step, 4), reco::detail::plan_fingerprint(a, step, 8));
  b->~rule_80_20_reco();
}

TEST(StepPlan, InconsistentPartsAreRejected) {
  two_parts d;
  reco::presets::rule_80_20_reco obj;
  typed_batch<float> ta(d.a), tb(d.b);
  reco::step_info step{5, d.m.R, 1.0, 0};
  const reco::step_part pa{step, 0, d.fg_a}, pb{step, d.half, d.fg_b};
  // A response in two parts and one in none.
  reco::step_part shifted = pb;
  shifted.first_response = d.half - 1;
  expect_plan_error([&] { reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, shifted}); }, "exactly one part");
  // Parts that disagree on the step id, on a parameter, on the value type.
  reco::step_part other_step = pb;
  other_step.step.id = 6;
  expect_plan_error([&] { reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, other_step}); }, "disagree");
  {
    reco::presets::rule_80_20_reco other;
    other.select.params.rho = 0.3;
    reco::step_summary s = reco::summarize(obj, ta.view(), pa);
    s += reco::summarize(other, tb.view(), pb);
    expect_plan_error([&] { reco::finish_plan(obj, step, s); }, "disagree");
    typed_batch<double> tb64(d.b);
    reco::step_summary s2 = reco::summarize(obj, ta.view(), pa);
    s2 += reco::summarize(obj, tb64.view(), pb);
    expect_plan_error([&] { reco::finish_plan(obj, step, s2); }, "disagree");
  }
  // A different number of step responses: summaries of different sizes.
  reco::step_part bigger = pb;
  bigger.step.responses = d.m.R + 1;
  expect_plan_error([&] { reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, bigger}); }, "different sizes");
  // Group ids that go backwards.
  reco::step_part back = pb;
  back.first_group = 0;
  ASSERT_GT(d.fg_b, 0);
  expect_plan_error([&] { reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, back}); }, "group ids");
  // Rounds from different stages, and an incomplete plan. Double entropies: the first of their 4
  // histogram rounds comes with the summaries, and the next two have summaries of one size.
  typed_batch<double> da(d.a), db(d.b);
  reco::step_summary s = reco::summarize(obj, da.view(), pa);
  s += reco::summarize(obj, db.view(), pb);
  reco::step_plan plan = reco::finish_plan(obj, step, s);
  ASSERT_FALSE(plan.complete());
  std::vector<double> g(d.a.logp.size());
  expect_plan_error([&] { obj(reco::cpu{}, da.view(), reco::gradients<double>{g, {}}, plan, pa); }, "not complete");
  reco::step_summary r0 = reco::plan_round(obj, plan, da.view(), pa);
  r0 += reco::plan_round(obj, plan, db.view(), pb);
  reco::step_plan ahead = plan;
  ahead.advance(r0);
  ASSERT_EQ(ahead.stage(), reco::step_plan::stage_kind::histogram);
  reco::step_summary mixed = reco::plan_round(obj, plan, da.view(), pa);
  mixed += reco::plan_round(obj, ahead, db.view(), pb);
  expect_plan_error([&] { plan.advance(mixed); }, "different stages");
  // Float rounds of different stages differ in size: refused when they are added.
  reco::step_summary fs = reco::summarize(obj, ta.view(), pa);
  fs += reco::summarize(obj, tb.view(), pb);
  reco::step_plan fplan = reco::finish_plan(obj, step, fs);
  reco::step_summary f0 = reco::plan_round(obj, fplan, ta.view(), pa);
  f0 += reco::plan_round(obj, fplan, tb.view(), pb);
  reco::step_plan fahead = fplan;
  fahead.advance(f0);
  reco::step_summary fmixed = reco::plan_round(obj, fplan, ta.view(), pa);
  expect_plan_error([&] { fmixed += reco::plan_round(obj, fahead, tb.view(), pb); }, "different sizes");
}


// The plan checks the values it reads and reports them on every part alike (from finish_plan, on
// the summed summaries); a bad value it does not read is the part's call's error.
TEST(StepPlan, ValuesThePlanReadsFailOnEveryPart) {
  two_parts d;
  reco::step_info step{9, d.m.R, 1.0, 0};
  const reco::step_part pa{step, 0, d.fg_a}, pb{step, d.half, d.fg_b};
  // The first valid token of part b.
  index_t t = d.b.begin(0);
  while (!d.b.mask[static_cast<std::size_t>(t)]) ++t;
  const auto at = static_cast<std::size_t>(t);
  auto plan_error = [&](const auto& obj, const master_batch& b, const char* name, auto value_type) {
    using T = decltype(value_type);
    typed_batch<T> ta(d.a), tb(b);
    // Part a's own summary is fine: the error appears only in the sum, on every part alike.
    EXPECT_NO_THROW(reco::summarize(obj, ta.view(), pa));
    EXPECT_NO_THROW(reco::summarize(obj, tb.view(), pb));
    try {
      reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, pb});
      ADD_FAILURE() << "no error for " << name;
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), name) << e.what();
    }
  };
  {  // reco averages old_logp per response for its weight.
    master_batch b = d.b;
    b.old_logp[at] = std::nan("");
    plan_error(reco::presets::reco{}, b, "batch.old_logp", 0.0);
    b.old_logp[at] = 0.5;
    plan_error(reco::presets::reco{}, b, "batch.old_logp", 0.0);
  }
  {  // The 80/20 rule selects on entropies: NaN and +-inf are errors, in float and double; the
     // same values on a masked token are not read.
    const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
    for (const double bad : {inf, -inf, nan, -nan}) {
      master_batch b = d.b;
      b.entropy[at] = bad;
      plan_error(reco::presets::rule_80_20{}, b, "batch.entropy", 0.0);
      plan_error(reco::presets::rule_80_20{}, b, "batch.entropy", 0.0f);
    }
    master_batch b = d.b;
    std::size_t masked = 0;
    for (std::size_t t = 0; t < b.mask.size(); ++t)
      if (!b.mask[t]) {
        b.entropy[t] = (masked++ % 2) ? nan : -inf;
      }
    ASSERT_GT(masked, 0u);
    typed_batch<float> ta(d.a), tb(b);
    EXPECT_NO_THROW(reco::plan_step(reco::presets::rule_80_20{}, step, views(ta, tb),
                                    std::vector<reco::step_part>{pa, pb}));
  }
  {  // Rewards.
    master_batch b = d.b;
    b.rewards[0] = std::nan("");
    plan_error(reco::presets::grpo{}, b, "batch.rewards", 0.0);
  }
  {  // grpo's plan does not read logp: the plan is built, and the call on that part fails.
    master_batch b = d.b;
    b.logp[at] = std::nan("");
    reco::presets::grpo obj;
    typed_batch<double> ta(d.a), tb(b);
    const reco::step_plan plan = reco::plan_step(obj, step, views(ta, tb), std::vector<reco::step_part>{pa, pb});
    std::vector<double> g(b.logp.size());
    try {
      obj(reco::cpu{}, tb.view(), reco::gradients<double>{g, {}}, plan, pb);
      ADD_FAILURE() << "no error for a NaN logp";
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), "batch.logp") << e.what();
    }
  }
}

// An aggregation chosen at run time (reco::selectable_aggregate; "aggregate.kind" in the LibTorch
// adapter): the plan carries each kind's normaliser, so every kind splits exactly (double).
TEST(StepPlan, SelectableAggregationEveryKind) {
  using obj_t = reco::objective<reco::grpo_advantage, reco::variance_ratio, reco::ppo_clip,
                                reco::expected_count_weight, reco::selectable_aggregate, reco::kl_penalty>;
  for (int k = 0; k < 5; ++k) {
    obj_t obj;
    obj.aggregate.params.kind = static_cast<reco::aggregation_kind>(k);
    check_all_splits<double>(obj, std::string("selectable ") + reco::labels_of(reco::aggregation_kind{}).names[k],
                             910 + static_cast<std::uint64_t>(k));
  }
}

// ReCo's weight read from the rollout policy (weight.sampling = rollout) through the plan: the
// summaries average rollout_logp as the one call does.
// Advantages given per token: each part reads its own A_t, the step's counts and weights come
// from the plan; the parts add up to one call on the whole step.
TEST(StepPlan, TokenAdvantages) {
  for (std::uint64_t seed : {71u, 72u}) {
    reco_test::batch_spec spec;
    spec.padded = seed % 2 == 0;
    spec.groups = 6;
    spec.max_group = 5;
    spec.max_length = 9;
    spec.token_advantages = true;
    const master_batch m = reco_test::make_batch(seed, spec);
    const auto reco_given = reco::with_given_advantages(reco::presets::reco{});
    const auto dapo_given = reco::with_given_advantages(reco::presets::dapo{});
    const auto whole_reco = reco_test::run_library<double>(reco_given, m);
    const auto whole_dapo = reco_test::run_library<double>(dapo_given, m);
    for (const auto& cuts : standard_cuts(m.R, seed)) {
      expect_same<double>(run_split<double>(reco_given, m, cuts), whole_reco, "reco, token advantages");
      expect_same<double>(run_split<double>(dapo_given, m, cuts), whole_dapo, "dapo, token advantages");
    }
  }
}

TEST(StepPlan, RecoWeightFromRolloutPolicy) {
  reco_test::batch_spec spec;
  const master_batch m = reco_test::make_batch(61, spec);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> g(0.0, 0.5);
  std::vector<double> rollout(m.logp.size());
  for (std::size_t t = 0; t < rollout.size(); ++t) rollout[t] = std::min(-1e-4, m.old_logp[t] + g(rng) - 1.0);
  reco::presets::reco on;
  on.weight.params.sampling = reco::weight_sampling::rollout;
  typed_batch<double> tb(m);
  auto v = tb.view();
  v.rollout_logp = rollout;
  std::vector<double> grad(m.logp.size());
  reco::workspace<reco::cpu> ws;
  reco_test::library_output whole;
  whole.result = on(reco::cpu{}, v, reco::gradients<double>{grad, {}}, ws);
  whole.grad_logp = grad;
  const auto off = reco_test::run_library<double>(reco::presets::reco{}, m);
  EXPECT_GT(std::fabs(off.result.loss - whole.result.loss), 1e-6 * std::fabs(whole.result.loss));
  for (const auto& cuts : {std::vector<index_t>{m.R / 3, m.R / 3, 2 * m.R / 3}, std::vector<index_t>{1}})
    expect_same<double>(run_split<double>(on, m, cuts, 7, 1.0, &rollout), whole, "reco, sampling = rollout");
  // The plan refuses the rollout log-probs without the switch, naming them.
  try {
    run_split<double>(reco::presets::reco{}, m, {1}, 7, 1.0, &rollout);
    ADD_FAILURE() << "no error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "batch.rollout_logp");
  }
}

}  // namespace

// finish_plan reduces the step's batch partials in two passes (batch_partial::reduce): against a
// naive long-double computation over the observations the partials hold (groups of 0-3
// observations per partial, empty partials, log-weight sums with different maxima and none), and
// against the one-by-one merge the generic passes use.
TEST(StepPlan, BatchPartialReduceMatchesTheObservations) {
  using reco::detail::batch_partial;
  using reco::detail::moments;
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u(-3, 3);
  for (int trial = 0; trial < 40; ++trial) {
    const index_t n = trial < 3 ? trial : static_cast<index_t>(rng() % 300);
    std::vector<batch_partial> parts(static_cast<std::size_t>(n));
    long double rw = 0, rs = 0, aw = 0, as = 0;  // weights and weighted sums
    std::vector<std::pair<double, double>> rewards, advs;  // (value, weight) observations
    for (auto& p : parts) {
      const int k = static_cast<int>(rng() % 4);
      for (int j = 0; j < k; ++j) {
        const double x = u(rng), w = 1.0 + static_cast<double>(rng() % 5);
        p.reward = moments::merge(p.reward, moments::of(x));
        p.token_adv = moments::merge(p.token_adv, moments::of(x / 2, w));
        rewards.push_back({x, 1.0});
        advs.push_back({x / 2, w});
        rw += 1;
        rs += x;
        aw += w;
        as += static_cast<long double>(w) * (x / 2);
      }
      p.status = static_cast<std::uint32_t>(rng() % 3 == 0 ? 1u << (rng() % 8) : 0u);
      p.nonempty = k > 0 ? 1 : 0;
      p.tokens = static_cast<double>(rng() % 100);
      p.longest = static_cast<double>(rng() % 1000);
      p.nonzero_rewards = static_cast<double>(k);
      p.weight_sum = u(rng) + 3;
      if (rng() % 3 != 0) {
        p.weight_log_max = static_cast<double>(rng() % 4) - 1.5;  // repeated maxima: the exp(0) branch
        p.weight_log_sum = 1 + static_cast<double>(rng() % 3);
      }
    }
    auto of = [&](index_t i) { return parts[static_cast<std::size_t>(i)]; };
    const batch_partial r = batch_partial::reduce(n, of);
    batch_partial m{};
    for (index_t i = 0; i < n; ++i) m = batch_partial::merge(m, of(i));
    // Naive reference.
    std::uint32_t status = 0;
    double nonempty = 0, tokens = 0, longest = 0, nonzero = 0, wsum = 0, lmax = -HUGE_VAL;
    for (const auto& p : parts) {
      status |= p.status;
      nonempty += p.nonempty;
      tokens += p.tokens;
      longest = std::max(longest, p.longest);
      nonzero += p.nonzero_rewards;
      wsum += p.weight_sum;
      if (p.weight_log_sum != 0) lmax = std::max(lmax, p.weight_log_max);
    }
    long double lsum = 0;
    for (const auto& p : parts)
      if (p.weight_log_sum != 0) lsum += p.weight_log_sum * std::exp(static_cast<long double>(p.weight_log_max - lmax));
    auto central = [](const std::vector<std::pair<double, double>>& obs, long double w, long double s) {
      const long double mean = w > 0 ? s / w : 0;
      long double m2 = 0;
      for (const auto& [x, wt] : obs) m2 += wt * (x - mean) * (x - mean);
      return std::pair<double, double>{static_cast<double>(mean), static_cast<double>(m2)};
    };
    const auto [rmean, rm2] = central(rewards, rw, rs);
    const auto [amean, am2] = central(advs, aw, as);
    auto near = [](double a, double b) { return std::fabs(a - b) <= 1e-12 * (1 + std::fabs(b)); };
    for (const batch_partial* x : {&r, static_cast<const batch_partial*>(&m)}) {
      EXPECT_EQ(x->status, status);
      EXPECT_EQ(x->nonempty, nonempty);
      EXPECT_EQ(x->tokens, tokens);
      EXPECT_EQ(x->longest, longest);
      EXPECT_EQ(x->nonzero_rewards, nonzero);
      EXPECT_TRUE(near(x->weight_sum, wsum)) << trial;
      EXPECT_EQ(x->reward.weight, static_cast<double>(rw));
      EXPECT_TRUE(near(x->reward.mean, rmean)) << trial << " " << x->reward.mean << " " << rmean;
      EXPECT_TRUE(near(x->reward.m2, rm2)) << trial << " " << x->reward.m2 << " " << rm2;
      EXPECT_EQ(x->token_adv.weight, static_cast<double>(aw));
      EXPECT_TRUE(near(x->token_adv.mean, amean)) << trial;
      EXPECT_TRUE(near(x->token_adv.m2, am2)) << trial;
      if (lsum == 0) {
        EXPECT_EQ(x->weight_log_sum, 0.0) << trial;
      } else {
        EXPECT_EQ(x->weight_log_max, lmax) << trial;
        EXPECT_TRUE(near(x->weight_log_sum, static_cast<double>(lsum))) << trial;
      }
    }
  }
}
