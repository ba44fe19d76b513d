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
#include "reco/select/entropy_threshold.hpp"

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
