// Bad input: every case must throw reco::error whose argument() names the culprit.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/random_batch.hpp"
#include "reco/batch_ops/filter_groups.hpp"
#include "reco/batch_ops/overlong_penalty.hpp"
#include "reco/batch_ops/prompt_groups.hpp"
#include "reco/batch_ops/truncation_mask.hpp"
#include "reco/reco.hpp"
#include "reco/batch_ops/entropy_threshold.hpp"

namespace {

using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::typed_batch;
using reco::index_t;

const double nan_v = std::numeric_limits<double>::quiet_NaN();
const double inf_v = std::numeric_limits<double>::infinity();

// Runs f and returns the argument named by the reco::error it throws ("" if none).
std::string thrown_argument(const std::function<void()>& f) {
  try {
    f();
  } catch (const reco::error& e) {
    EXPECT_NE(std::string(e.what()).find(e.argument()), std::string::npos) << "message must name the argument";
    return e.argument();
  }
  return "";
}

struct fixture {
  reco_test::master_batch m;
  fixture(bool padded = false) {
    batch_spec s;
    s.padded = padded;
    s.groups = 4;
    s.max_group = 4;
    s.max_length = 6;
    s.masked_row = 0.0;
    m = make_batch(7, s);
  }
  // The first valid token (tests poison it).
  std::size_t first_valid() const {
    for (std::size_t t = 0; t < m.mask.size(); ++t)
      if (m.mask[t]) return t;
    return 0;
  }
};

template <class Obj>
std::string run_case(const Obj& obj, typed_batch<float>& tb, const std::function<void(reco::batch_view<float>&)>& edit,
                     std::vector<float>* grad_override = nullptr, const reco::normalisers& norm = {}) {
  return thrown_argument([&] {
    reco::batch_view<float> v = tb.view();
    edit(v);
    std::vector<float> g(tb.logp.size());
    std::vector<float> gh(tb.logp.size());
    reco::gradients<float> gr{grad_override ? reco::span<float>(*grad_override) : reco::span<float>(g),
                              Obj::has_entropy_gradient ? reco::span<float>(gh) : reco::span<float>()};
    obj(reco::cpu{}, v, gr, norm);
  });
}

// reco::error: "reco: <argument>: <words>", the words alone as message() (to raise again under
// another argument's name).
TEST(Errors, MessageIsTheWordsAfterTheArgument) {
  const reco::error e("batch.rewards", "has shape [3]");
  EXPECT_STREQ(e.what(), "reco: batch.rewards: has shape [3]");
  EXPECT_EQ(e.argument(), "batch.rewards");
  EXPECT_EQ(e.message(), "has shape [3]");
  EXPECT_EQ(reco::error("", "").message(), "");
}

TEST(Errors, SizesAndRequiredInputs) {
  fixture f;
  typed_batch<float> tb(f.m);
  reco::presets::reco reco_obj;
  std::vector<float> shorter(tb.logp.begin(), tb.logp.end() - 1);
  std::vector<float> shorter_r(tb.rewards.begin(), tb.rewards.end() - 1);
  std::vector<std::uint8_t> short_mask(tb.mask.begin(), tb.mask.end() - 1);

  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.old_logp = shorter; }), "batch.old_logp");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.ref_logp = shorter; }), "batch.ref_logp");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.ref_logp = {}; }), "batch.ref_logp");  // KL needs it
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.mask = short_mask; }), "batch.mask");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.rewards = shorter_r; }), "batch.rewards");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.rewards = {}; }), "batch.rewards");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.token_weights = shorter; }), "batch.token_weights");
  EXPECT_EQ(run_case(reco_obj, tb, [&](auto& v) { v.group_offsets = {}; }), "batch.group_offsets");
  std::vector<float> short_grad(tb.logp.size() - 1);
  EXPECT_EQ(run_case(reco_obj, tb, [](auto&) {}, &short_grad), "grads.logp");

  reco::presets::rule_80_20 sel;
  EXPECT_EQ(run_case(sel, tb, [&](auto& v) { v.entropy = {}; }), "batch.entropy");
  reco::objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> given;
  EXPECT_EQ(run_case(given, tb, [&](auto& v) { v.advantages = {}; }), "batch.advantages");
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight, reco::token_mean> cw;
  EXPECT_EQ(run_case(cw, tb, [&](auto& v) { v.response_weights = {}; }), "batch.response_weights");
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
                  reco::entropy_bonus>
      eb;
  // The entropy bonus needs somewhere to write d loss / d H.
  EXPECT_EQ(thrown_argument([&] {
              std::vector<float> g(tb.logp.size());
              eb(reco::cpu{}, tb.view(), reco::gradients<float>{g, {}});
            }),
            "grads.entropy");
  EXPECT_EQ(run_case(reco_obj, tb, [](auto&) {}, nullptr, reco::normalisers{-1, 0, 0, 0}), "normalisers");
}

TEST(Errors, Layouts) {
  fixture packed;
  typed_batch<float> tb(packed.m);
  reco::presets::grpo obj;
  // Offsets that decrease, do not start at 0, or do not end at N.
  std::vector<index_t> bad = tb.offsets;
  std::swap(bad[1], bad[2]);
  if (bad[1] == bad[2]) bad[1] += 1;
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.layout = reco::packed(reco::span<const index_t>(bad)); }),
            "batch.layout.offsets");
  std::vector<index_t> shifted = tb.offsets;
  shifted[0] = 1;
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.layout = reco::packed(reco::span<const index_t>(shifted)); }),
            "batch.layout.offsets");
  std::vector<index_t> short_end = tb.offsets;
  short_end.back() -= 1;
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.layout = reco::packed(reco::span<const index_t>(short_end)); }),
            "batch.layout.offsets");
  std::vector<index_t> empty_offsets;
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.layout = reco::packed(reco::span<const index_t>(empty_offsets)); }),
            "batch.layout.offsets");
  // Group offsets that decrease or do not cover every response.
  std::vector<index_t> gbad = tb.group_offsets;
  std::swap(gbad[1], gbad[2]);
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.group_offsets = gbad; }), "batch.group_offsets");
  std::vector<index_t> gshort = tb.group_offsets;
  gshort.back() -= 1;
  EXPECT_EQ(run_case(obj, tb, [&](auto& v) { v.group_offsets = gshort; }), "batch.group_offsets");

  fixture padded(true);
  typed_batch<float> tp(padded.m);
  EXPECT_EQ(run_case(obj, tp, [&](auto& v) { v.layout = reco::padded(tp.R, tp.T_len + 1); }), "batch.logp");
  EXPECT_EQ(run_case(obj, tp, [&](auto& v) { v.layout = reco::padded(-1, tp.T_len); }), "batch.layout.responses");
}

TEST(Errors, NonFiniteValues) {
  fixture f;
  reco::presets::reco obj;
  const std::size_t t0 = f.first_valid();
  auto poisoned = [&](std::vector<double> reco_test::master_batch::*field, std::size_t at, double value) {
    reco_test::master_batch m = f.m;
    (m.*field)[at] = value;
    typed_batch<float> tb(m);
    return run_case(obj, tb, [](auto&) {});
  };
  EXPECT_EQ(poisoned(&reco_test::master_batch::logp, t0, nan_v), "batch.logp");
  EXPECT_EQ(poisoned(&reco_test::master_batch::logp, t0, inf_v), "batch.logp");
  EXPECT_EQ(poisoned(&reco_test::master_batch::logp, t0, 0.5), "batch.logp");  // a probability above 1
  EXPECT_EQ(poisoned(&reco_test::master_batch::old_logp, t0, -inf_v), "batch.old_logp");
  EXPECT_EQ(poisoned(&reco_test::master_batch::ref_logp, t0, nan_v), "batch.ref_logp");
  EXPECT_EQ(poisoned(&reco_test::master_batch::rewards, 0, nan_v), "batch.rewards");
  // A NaN in a masked (padding) token is never read: no error.
  {
    reco_test::master_batch m = f.m;
    std::size_t masked = m.mask.size();
    for (std::size_t t = 0; t < m.mask.size(); ++t)
      if (!m.mask[t]) masked = t;
    if (masked < m.mask.size()) {
      m.logp[masked] = nan_v;
      typed_batch<float> tb(m);
      EXPECT_EQ(run_case(obj, tb, [](auto&) {}), "");
    }
  }
  reco::presets::rule_80_20 sel;
  {
    reco_test::master_batch m = f.m;
    m.entropy[t0] = nan_v;
    typed_batch<float> tb(m);
    EXPECT_EQ(run_case(sel, tb, [](auto&) {}), "batch.entropy");
  }
  reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight, reco::token_mean> cw;
  {
    reco_test::master_batch m = f.m;
    m.response_weights.assign(static_cast<std::size_t>(m.R), 1.0);
    m.response_weights[1] = -2.0;
    typed_batch<float> tb(m);
    EXPECT_EQ(run_case(cw, tb, [](auto&) {}), "batch.response_weights");
  }
  {
    reco_test::master_batch m = f.m;
    m.token_weights.assign(m.logp.size(), 1.0);
    m.token_weights[t0] = nan_v;
    typed_batch<float> tb(m);
    EXPECT_EQ(run_case(obj, tb, [](auto&) {}), "batch.token_weights");
  }
  reco::objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean> given;
  {
    reco_test::master_batch m = f.m;
    m.advantages[0] = inf_v;
    typed_batch<float> tb(m);
    EXPECT_EQ(run_case(given, tb, [](auto&) {}), "batch.advantages");
  }
  // The singleton policy "error" (OpenRLHF) names the groups.
  reco::presets::grpo strict;
  strict.advantage.params.singleton = reco::singleton_policy::error;
  typed_batch<float> tb(f.m);
  EXPECT_EQ(run_case(strict, tb, [](auto&) {}), "batch.group_offsets");
}

TEST(Errors, Parameters) {
  fixture f;
  typed_batch<float> tb(f.m);
  auto named = [&](auto obj) { return run_case(obj, tb, [](auto&) {}); };
  {
    reco::presets::grpo o;
    o.clip.params.eps_low = 1.5;
    EXPECT_EQ(named(o), "clip.params.eps_low");
  }
  {
    reco::presets::grpo o;
    o.clip.params.eps_high = -0.1;
    EXPECT_EQ(named(o), "clip.params.eps_high");
  }
  {
    reco::presets::grpo o;
    o.clip.params.dual_clip_c = 0.5;
    EXPECT_EQ(named(o), "clip.params.dual_clip_c");
  }
  {
    reco::presets::rule_80_20 o;
    o.select.params.rho = 0.0;
    EXPECT_EQ(named(o), "select.params.rho");
  }
  {
    reco::presets::rule_80_20 o;
    o.select.params.rho = 1.5;
    EXPECT_EQ(named(o), "select.params.rho");
  }
  {
    reco::presets::grpo o;
    o.advantage.params.eps = nan_v;
    EXPECT_EQ(named(o), "advantage.params.eps");
  }
  {
    reco::presets::grpo o;
    o.kl.params.beta = -1;
    EXPECT_EQ(named(o), "kl.params.beta");
  }
  {
    reco::presets::reco o;
    o.ratio.params.variance_floor = 0;
    EXPECT_EQ(named(o), "ratio.params.variance_floor");
  }
  {
    reco::presets::reco o;
    o.weight.params.cap = nan_v;
    EXPECT_EQ(named(o), "weight.params.cap");
  }
  {
    reco::presets::dr_grpo o;
    o.aggregate.params.constant = -3;
    EXPECT_EQ(named(o), "aggregate.params.constant");
  }
  {
    reco::objective<reco::grpo_advantage, reco::sapo_ratio, reco::no_clip, reco::uniform_weight, reco::token_mean> o;
    o.ratio.params.tau_neg = 0;
    EXPECT_EQ(named(o), "ratio.params.tau_neg");
  }
  {
    reco::objective<reco::grpo_advantage, reco::token_ratio, reco::entropy_split_clip, reco::uniform_weight,
                    reco::token_mean>
        o;
    o.clip.params.percentile = 1.2;
    EXPECT_EQ(named(o), "clip.params.percentile");
  }
  // The peers' switches and loss types (docs/peers.md).
  {
    reco::presets::grpo o;
    o.clip.params.delta = -1;
    EXPECT_EQ(named(o), "clip.params.delta");
    o.clip.params.delta = nan_v;
    EXPECT_EQ(named(o), "clip.params.delta");
  }
  {
    reco::objective<reco::grpo_advantage, reco::vespo_ratio, reco::no_clip, reco::uniform_weight, reco::token_mean> o;
    o.ratio.params.k_pos = -0.5;
    EXPECT_EQ(named(o), "ratio.params.k_pos");
    o.ratio.params.k_pos = 2;
    o.ratio.params.lambda_neg = nan_v;
    EXPECT_EQ(named(o), "ratio.params.lambda_neg");
  }
}

TEST(Errors, BatchHelpers) {
  std::vector<long> split = {3, 1, 3};
  EXPECT_EQ(thrown_argument([&] { reco::group_offsets_from_prompt_ids(reco::span<const long>(split)); }), "prompt_ids");

  std::vector<index_t> lengths = {1, 2};
  std::vector<float> rewards = {0, 0, 0};
  EXPECT_EQ(thrown_argument([&] {
              reco::add_overlong_penalty(reco::cpu{}, reco::span<const index_t>(lengths), reco::overlong_params{},
                                         reco::span<float>(rewards));
            }),
            "lengths");
  EXPECT_EQ(thrown_argument([&] {
              reco::overlong_params p;
              p.buffer = 0;
              reco::add_overlong_penalty(reco::cpu{}, reco::span<const index_t>(lengths), p, reco::span<float>(rewards));
            }),
            "params.buffer");

  std::vector<float> h = {0.1f, static_cast<float>(nan_v), 0.3f};
  reco::workspace<reco::cpu> ws;
  EXPECT_EQ(thrown_argument([&] {
              reco::entropy_threshold(reco::cpu{}, reco::span<const float>(h), reco::span<const std::uint8_t>(),
                                      reco::top_entropy_selection::params_type{}, ws);
            }),
            "entropy");
  std::vector<float> r2 = {1, 0, 1};
  std::vector<index_t> go = {0, 3};
  std::vector<index_t> kr(3), kg(1);  // kg too small
  EXPECT_EQ(thrown_argument([&] {
              reco::filter_groups(reco::cpu{}, reco::span<const float>(r2), reco::span<const index_t>(go),
                                  reco::group_filter_params{}, reco::span<index_t>(kr), reco::span<index_t>(kg), ws);
            }),
            "kept_group_offsets");
  std::vector<int> tokens = {1, 2, 3};
  std::vector<std::uint8_t> out(2);
  EXPECT_EQ(thrown_argument([&] {
              reco::mask_truncated(reco::cpu{}, reco::padded(1, 3), reco::span<const int>(tokens),
                                   reco::span<const std::uint8_t>(), 2, reco::span<std::uint8_t>(out));
            }),
            "mask_out");
}

}  // namespace

// ---- per-token value checks: every preset, every cause, the failing token named -------------

namespace token_value_tests {

struct caught {
  std::string argument, message;
};

// Runs obj on the CPU (packed or scalar token loops) and returns the error it throws.
template <class Obj>
caught run_on(const Obj& obj, const reco_test::master_batch& m, bool vectorise) {
  typed_batch<double> tb(m);
  std::vector<double> g(tb.logp.size()), gh(tb.logp.size());
  reco::gradients<double> gr{g, Obj::has_entropy_gradient ? reco::span<double>(gh) : reco::span<double>()};
  reco::cpu be;
  be.vectorise = vectorise;
  reco::workspace<reco::cpu> ws;
  try {
    obj(be, tb.view(), gr, ws);
  } catch (const reco::error& e) {
    return {e.argument(), e.what()};
  }
  return {};
}

// A valid token that is neither the first nor the last of its response, in a response past the
// first (so that the position and the response index are both informative), and the token's
// response and position.
struct target {
  std::size_t t = 0;
  index_t response = 0, position = 0;
};
target pick(const reco_test::master_batch& m) {
  for (index_t i = 1; i < m.R; ++i) {
    int seen = 0;
    for (index_t t = m.begin(i); t < m.end(i); ++t)
      if (m.mask[static_cast<std::size_t>(t)] && ++seen == 2) return {static_cast<std::size_t>(t), i, t - m.begin(i)};
  }
  ADD_FAILURE() << "no response with two valid tokens";
  return {};
}

reco_test::master_batch batch(bool padded) {
  batch_spec s;
  s.padded = padded;
  s.groups = 5;
  s.max_group = 4;
  s.max_length = 9;
  s.masked_row = 0.0;
  s.token_weights = true;
  return make_batch(21, s);
}

struct poison {
  std::vector<double> reco_test::master_batch::*field;
  std::string argument;
  double value;
  std::string cause;  // what the message must say about the value
};

template <class Obj>
void expect_named(const Obj& obj, const std::string& preset, const std::vector<poison>& cases) {
  for (bool padded : {false, true})
    for (const poison& p : cases) {
      reco_test::master_batch m = batch(padded);
      const target at = pick(m);
      (m.*p.field)[at.t] = p.value;
      // A later bad token of the same input: the first one is named.
      for (std::size_t t = at.t + 1; t < m.mask.size(); ++t)
        if (m.mask[t]) {
          (m.*p.field)[t] = p.value;
          break;
        }
      const std::string where = "token " + std::to_string(at.t) + " (response " + std::to_string(at.response) +
                                ", position " + std::to_string(at.position) + ") ";
      for (bool vectorise : {true, false}) {
        SCOPED_TRACE(preset + " " + p.argument + " = " + std::to_string(p.value) + (padded ? " padded" : " packed") +
                     (vectorise ? " packed loops" : " scalar loops"));
        const caught e = run_on(obj, m, vectorise);
        EXPECT_EQ(e.argument, p.argument);
        EXPECT_NE(e.message.find(p.argument + ": " + where + p.cause), std::string::npos) << e.message;
      }
    }
}

using mb = reco_test::master_batch;
const std::string must_be_log = "; log-probabilities must be <= 0";

std::vector<poison> log_probability_cases(std::vector<double> mb::*field, const std::string& argument) {
  return {{field, argument, nan_v, "is NaN"},
          {field, argument, inf_v, "is +inf"},
          {field, argument, -inf_v, "is -inf"},
          {field, argument, 0.31, "is positive (0.31)" + must_be_log},
          {field, argument, 1e-300, "is positive (1e-300)" + must_be_log}};
}

std::vector<poison> weight_cases() {
  return {{&mb::token_weights, "batch.token_weights", nan_v, "is NaN"},
          {&mb::token_weights, "batch.token_weights", inf_v, "is +inf"},
          {&mb::token_weights, "batch.token_weights", -0.5, "is negative (-0.5); weights must be >= 0"}};
}

TEST(TokenChecks, LogProbabilitiesAreCheckedForEveryPreset) {
  namespace ps = reco::presets;
  // Token and sequence ratios, with and without a KL term: a positive log-probability (often a
  // negative log-likelihood passed by mistake) is rejected by all of them.
  for (auto field : {&mb::logp, &mb::old_logp}) {
    const std::string arg = field == &mb::logp ? "batch.logp" : "batch.old_logp";
    expect_named(ps::grpo{}, "grpo", log_probability_cases(field, arg));
    expect_named(ps::dapo{}, "dapo", log_probability_cases(field, arg));
    expect_named(ps::gspo{}, "gspo", log_probability_cases(field, arg));
    expect_named(ps::reco{}, "reco", log_probability_cases(field, arg));
    // The covariance selections read logp (Clip-Cov also old_logp) before the token pass, which
    // checks them.
    expect_named(ps::kl_cov{}, "kl_cov", log_probability_cases(field, arg));
    expect_named(ps::clip_cov{}, "clip_cov", log_probability_cases(field, arg));
  }
  // ref_logp is read (and checked) when a KL term is on.
  expect_named(ps::grpo{}, "grpo", log_probability_cases(&mb::ref_logp, "batch.ref_logp"));
  expect_named(ps::reco{}, "reco", log_probability_cases(&mb::ref_logp, "batch.ref_logp"));
}

TEST(TokenChecks, EntropyAndTokenWeights) {
  namespace ps = reco::presets;
  const std::vector<poison> entropy = {{&mb::entropy, "batch.entropy", nan_v, "is NaN"},
                                       {&mb::entropy, "batch.entropy", inf_v, "is +inf"},
                                       {&mb::entropy, "batch.entropy", -inf_v, "is -inf"}};
  expect_named(ps::rule_80_20{}, "rule_80_20", entropy);
  expect_named(ps::rule_80_20_reco{}, "rule_80_20_reco", entropy);
  expect_named(ps::grpo{}, "grpo", weight_cases());
  expect_named(ps::dapo_reco{}, "dapo_reco", weight_cases());
}

// Batches large enough for the selections' sampled paths (the 80/20 cut's band from 2^20
// entropies, the covariance streams' bound from 2^18 tokens), float inputs: NaN values among the
// inputs a selection ranks, a few or all of them, are still named by the token pass's check.
TEST(TokenChecks, LargeSelectionsNameWhatTheyRank) {
  namespace ps = reco::presets;
  batch_spec spec;
  spec.groups = 330;
  spec.max_group = 8;
  spec.max_length = 2400;
  const reco_test::master_batch base = make_batch(77, spec);
  ASSERT_GT(base.logp.size(), std::size_t(1) << 20);
  auto run = [](const auto& obj, const reco_test::master_batch& m) {
    typed_batch<float> tb(m);
    std::vector<float> g(tb.logp.size());
    try {
      obj(reco::cpu{}, tb.view(), reco::gradients<float>{g, {}});
    } catch (const reco::error& e) {
      return e.argument();
    }
    return std::string();
  };
  for (const std::size_t every : {std::size_t(997), std::size_t(1)}) {
    reco_test::master_batch m = base;
    for (std::size_t t = 0; t < m.entropy.size(); t += every) m.entropy[t] = nan_v;
    EXPECT_EQ(run(ps::rule_80_20{}, m), "batch.entropy") << "every " << every;
    m = base;
    for (std::size_t t = 0; t < m.logp.size(); t += every) m.logp[t] = nan_v;
    EXPECT_EQ(run(ps::kl_cov{}, m), "batch.logp") << "every " << every;
    EXPECT_EQ(run(ps::clip_cov{}, m), "batch.logp") << "every " << every;
    m = base;
    for (std::size_t t = 0; t < m.old_logp.size(); t += every) m.old_logp[t] = nan_v;
    EXPECT_EQ(run(ps::clip_cov{}, m), "batch.old_logp") << "every " << every;
  }
  EXPECT_EQ(run(ps::rule_80_20{}, base), "");
  EXPECT_EQ(run(ps::kl_cov{}, base), "");
}

TEST(TokenChecks, LimitsAreAccepted) {
  // 0 and the most negative finite value are log-probabilities; a zero token weight is a weight.
  for (double lp : {0.0, -0.0, -1.7976931348623157e308}) {
    reco_test::master_batch m = batch(false);
    const target at = pick(m);
    m.logp[at.t] = lp;
    m.old_logp[at.t] = lp;
    m.ref_logp[at.t] = lp;
    m.token_weights[at.t] = 0.0;
    for (bool vectorise : {true, false}) {
      EXPECT_EQ(run_on(reco::presets::grpo{}, m, vectorise).message, "") << lp;
      EXPECT_EQ(run_on(reco::presets::dapo{}, m, vectorise).message, "") << lp;
    }
  }
  // Masked tokens are never checked, whatever they hold.
  reco_test::master_batch m = batch(true);
  for (std::size_t t = 0; t < m.mask.size(); ++t)
    if (!m.mask[t]) m.logp[t] = m.old_logp[t] = m.ref_logp[t] = 0.7;
  EXPECT_EQ(run_on(reco::presets::grpo{}, m, true).message, "");
  EXPECT_EQ(run_on(reco::presets::grpo{}, m, false).message, "");
}

}  // namespace token_value_tests

namespace input_rule_tests {

// reco/input_rules.hpp decides which inputs the core requires: with every other input given, a
// missing input is an error naming it exactly when the table requires it of the objective's needs.
TEST(InputRules, TheTableDecidesWhatTheCoreRequires) {
  batch_spec spec;
  spec.groups = 4;
  spec.max_group = 4;
  spec.max_length = 6;
  spec.response_weights = true;  // every optional input given
  const typed_batch<float> tb(make_batch(7, spec));
  std::vector<float> grad_logp(tb.logp.size()), grad_entropy(tb.logp.size());
  using reco::call_input;
  const call_input inputs[] = {call_input::rewards,  call_input::advantages,       call_input::ref_logp,
                               call_input::entropy,  call_input::response_weights, call_input::grad_entropy};
  int required = 0;
  for (int bits = 0; bits < 32; ++bits) {
    reco::objective_needs n;
    n.rewards = bits & 1;
    n.advantages = !n.rewards;
    n.ref_logp = bits & 2;
    n.entropy = bits & 4;
    n.response_weights = bits & 8;
    n.entropy_gradient = bits & 16;
    for (const call_input in : inputs) {
      reco::batch_view<float> v = tb.view();
      v.token_advantages = {};
      reco::gradients<float> g{reco::span<float>(grad_logp), reco::span<float>(grad_entropy)};
      switch (in) {
        case call_input::rewards: v.rewards = {}; break;
        case call_input::advantages: v.advantages = {}; break;
        case call_input::ref_logp: v.ref_logp = {}; break;
        case call_input::entropy: v.entropy = {}; break;
        case call_input::response_weights: v.response_weights = {}; break;
        default: g.entropy = {}; break;
      }
      const std::string name = reco::rule_of(in).name;
      const std::string expected = !reco::requires_input(n, in) ? ""
                                   : in == call_input::grad_entropy ? "grads.entropy"
                                                                    : "batch." + name;
      required += !expected.empty();
      EXPECT_EQ(thrown_argument([&] { reco::detail::validate_batch(v, g, reco::normalisers{}, n); }), expected)
          << name << " with needs " << bits;
    }
  }
  EXPECT_EQ(required, 32 + 4 * 16);  // rewards or advantages in every case, each of the other four in half
}

}  // namespace input_rule_tests
