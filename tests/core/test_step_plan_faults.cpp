// A split step's summaries as a hostile network or a faulty rank delivers them
// (reco/step_plan/summary_check.hpp): every position of a summed summary altered after its parts
// made it (in flight) is refused naming `summaries`; a part that sends impossible values (NaN,
// infinities, sealed with a valid checksum) is refused, or the value is provably unread (the
// loss and gradients stay bit for bit those of the intact plan). Bad inputs in every part's data
// are carried in the summaries and fail every part alike in finish_plan; a part's fields are
// bounded before anything is allocated; ranks that hold different sums, or one that refused the
// last stage's sums, fail alike at the confirmation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/random_batch.hpp"
#include "core/step_split.hpp"
#include "reco/given_advantages.hpp"
#include "reco/presets.hpp"
#include "reco/step_plan.hpp"
#include "reco/weight/caller_weight.hpp"

namespace {

using reco::index_t;
using reco_test::master_batch;

// What a split run gave: an error (its argument and message), or the loss and gradients.
struct outcome {
  bool refused = false;
  std::string argument, what;
  double loss = 0;
  std::vector<double> grad;
  bool same_as(const outcome& o) const {
    return !refused && !o.refused && std::memcmp(&loss, &o.loss, sizeof loss) == 0 && grad.size() == o.grad.size() &&
           std::memcmp(grad.data(), o.grad.data(), grad.size() * sizeof(double)) == 0;
  }
};

// Stage `stage`'s summed summary is handed to `alter` before the plan takes it.
using alteration = std::function<void(int stage, reco::step_summary&)>;

template <class T, class Obj>
outcome run_split(const Obj& obj, const reco_test::split_step<T>& sp, const alteration& alter) {
  outcome o;
  try {
    reco::step_summary total;
    for (std::size_t p = 0; p < sp.parts.size(); ++p) total += reco::summarize(obj, sp.views[p], sp.parts[p]);
    int stage = 0;
    if (alter) alter(stage, total);
    reco::step_plan plan = reco::finish_plan(obj, sp.step, total);
    while (!plan.complete()) {
      reco::step_summary r;
      for (std::size_t p = 0; p < sp.parts.size(); ++p) r += reco::plan_round(obj, plan, sp.views[p], sp.parts[p]);
      if (alter) alter(++stage, r);
      plan.advance(r);
    }
    reco::workspace<reco::cpu> ws;
    for (std::size_t p = 0; p < sp.parts.size(); ++p) {
      const std::size_t N = sp.subs[p].logp.size();
      std::vector<T> g(N), gh(N);
      const auto res = obj(reco::cpu{}, sp.views[p],
                           reco::gradients<T>{g, Obj::has_entropy_gradient ? reco::span<T>(gh) : reco::span<T>()}, ws,
                           plan, sp.parts[p]);
      o.loss += res.loss;
      for (std::size_t t = 0; t < N; ++t) o.grad.push_back(static_cast<double>(g[t]));
      if (Obj::has_entropy_gradient)
        for (std::size_t t = 0; t < N; ++t) o.grad.push_back(static_cast<double>(gh[t]));
    }
  } catch (const reco::error& e) {
    o.refused = true;
    o.argument = e.argument();
    o.what = e.what();
  }
  return o;
}

// The positions of a summed summary worth altering: every one outside digit histograms, and in
// each histogram its nonzero buckets and run sums, every 16th zero run sum and `zeros` zero buckets.
std::vector<std::size_t> positions(const reco::step_summary& s, std::size_t histograms, std::size_t zeros,
                                   std::uint64_t seed) {
  using namespace reco::detail;
  std::vector<std::size_t> at;
  std::mt19937_64 rng(seed);
  const std::size_t end = plan_header + histograms * plan_histogram;
  for (std::size_t k = 0; k < s.size(); ++k) {
    if (k < plan_header || k >= end) {
      at.push_back(k);
      continue;
    }
    const std::size_t d = (k - plan_header) % plan_histogram;
    // Nonzero buckets and run sums, and every 16th zero run sum.
    if (s.values[k] != 0 || (d >= key_digits && (d - key_digits) % 16 == 0)) at.push_back(k);
  }
  for (std::size_t h = 0; h < histograms; ++h)
    for (std::size_t z = 0; z < zeros; ++z) {
      const std::size_t k = plan_header + h * plan_histogram + rng() % key_digits;
      if (s.values[k] == 0) at.push_back(k);
    }
  return at;
}

struct tally {
  int refused = 0, unchanged = 0, changed = 0;
};

// Alters every position of stage `stage`'s sum in turn: in flight (the checksum stands as the
// parts wrote it) every alteration must be refused naming `summaries`; sealed again (a part that
// sent the value) NaN and infinities must be refused or leave the result bit for bit unchanged.
template <class T, class Obj>
tally alter_every_position(const Obj& obj, const reco_test::split_step<T>& sp, int stage, std::size_t histograms,
                           const std::string& label) {
  SCOPED_TRACE(label + ", stage " + std::to_string(stage));
  const outcome intact = run_split<T>(obj, sp, {});
  EXPECT_FALSE(intact.refused) << intact.what;
  reco::step_summary seen;
  run_split<T>(obj, sp, [&](int s, reco::step_summary& v) {
    if (s == stage) seen = v;
  });
  EXPECT_GT(seen.size(), 0u) << "the plan has no stage " << stage;
  tally t;
  const double inf = std::numeric_limits<double>::infinity();
  const std::size_t histogram_end = reco::detail::plan_header + histograms * reco::detail::plan_histogram;
  for (const std::size_t k : positions(seen, histograms, 8, 7 + stage)) {
    // Inside a histogram (its 2^16 buckets are alike) fewer alterations each.
    const bool bucket = k >= reco::detail::plan_header && k < histogram_end;
    std::vector<double> in_flight{std::nan(""), seen.values[k] + 1};
    if (!bucket) in_flight.insert(in_flight.end(), {-seen.values[k] - 0.5, 1e300});
    for (const double x : in_flight) {
      const outcome o = run_split<T>(obj, sp, [&](int s, reco::step_summary& v) {
        if (s == stage) v.values[k] = x;
      });
      // A response's claim altered reads as parts that claimed it twice or not at all.
      const bool claim = o.argument == "plan" && o.what.find("exactly one part") != std::string::npos;
      EXPECT_TRUE(o.refused && (o.argument == "summaries" || claim))
          << "position " << k << " altered in flight to " << x << ": " << (o.refused ? o.what : "not refused");
    }
    for (const double x : {std::nan(""), inf, -inf}) {
      if (bucket && x == x) continue;  // NaN only
      const outcome o = run_split<T>(obj, sp, [&](int s, reco::step_summary& v) {
        if (s != stage) return;
        v.values[k] = x;
        reco::detail::seal(v);
      });
      if (o.refused) ++t.refused;
      else if (o.same_as(intact)) ++t.unchanged;
      else {
        ++t.changed;
        ADD_FAILURE() << "position " << k << " set to " << x << " changed the loss silently: " << o.loss << " vs "
                      << intact.loss;
      }
    }
  }
  std::printf("%s stage %d: %zu positions; NaN/inf sent by a part: %d refused, %d unread (unchanged), %d changed\n",
              label.c_str(), stage, seen.size(), t.refused, t.unchanged, t.changed);
  return t;
}

master_batch small_step(std::uint64_t seed, int groups, int max_group, int max_length) {
  reco_test::batch_spec spec;
  spec.groups = groups;
  spec.max_group = max_group;
  spec.max_length = max_length;
  return reco_test::make_batch(seed, spec);
}

// The finding: one grpo step of 8 responses, each position of its summed summary set to
// NaN (then to infinities and other values). Before the checks 19 of its 93 positions changed
// the result silently; now none does.
TEST(StepPlanFaults, EveryPositionOfAGrpoSummary) {
  master_batch m;
  for (std::uint64_t seed = 1; m.R != 8 && seed < 1000; ++seed) m = small_step(seed, 3, 4, 9);
  ASSERT_EQ(m.R, 8);
  const reco_test::split_step<double> sp(m, {3}, reco::step_info{4, m.R, 1.0, 0});
  const tally t = alter_every_position<double>(reco::presets::grpo{}, sp, 0, 0, "grpo");
  EXPECT_EQ(t.changed, 0);
  EXPECT_GT(t.refused, 0);
}

TEST(StepPlanFaults, EveryPositionOfAnEightyTwentyPlan) {
  const master_batch m = small_step(5, 4, 4, 10);
  const reco_test::split_step<float> sp(m, {m.R / 3, 2 * m.R / 3}, reco::step_info{2, m.R, 2.0, 0});
  reco::presets::rule_80_20_reco obj;
  // Stage 0 (with the first histogram), the second histogram round, the cut counts, the
  // confirmation.
  for (int stage = 0; stage < 4; ++stage) {
    const tally t = alter_every_position<float>(obj, sp, stage, stage < 2 ? 1 : 0, "rule_80_20_reco");
    EXPECT_EQ(t.changed, 0);
  }
}

TEST(StepPlanFaults, EveryPositionOfACovariancePlan) {
  master_batch m = small_step(9, 4, 4, 12);
  reco_test::round_to<double>(m);
  const reco_test::split_step<double> sp(m, {m.R / 2}, reco::step_info{3, m.R, 1.0, 0});
  reco::presets::kl_cov obj;
  obj.select.params.ratio = 0.05;
  for (int stage = 0; stage < 3; ++stage) {  // the summaries, the top values, the confirmation
    const tally t = alter_every_position<double>(obj, sp, stage, 0, "kl_cov");
    EXPECT_EQ(t.changed, 0);
  }
}

// ---- bad inputs carried to every part -----------------------------------------------------

// Part b's data hold a bad value: its own summary does not throw, and finish_plan (or the
// confirmation) fails on the sum naming `argument`, as it would on every rank.
template <class T, class Obj>
void expect_carried(const Obj& obj, const master_batch& m, index_t cut, const char* argument,
                    const std::function<void(reco_test::split_step<T>&)>& spoil = {}) {
  SCOPED_TRACE(argument);
  reco_test::split_step<T> sp(m, {cut}, reco::step_info{6, m.R, 1.0, 0});
  if (spoil) spoil(sp);
  for (std::size_t p = 0; p < sp.parts.size(); ++p)
    EXPECT_NO_THROW(reco::summarize(obj, sp.views[p], sp.parts[p])) << "part " << p;
  const outcome o = run_split<T>(obj, sp, {});
  EXPECT_TRUE(o.refused);
  EXPECT_EQ(o.argument, argument) << o.what;
}

// The first valid token at or after response `from`.
index_t valid_token(const master_batch& m, index_t from) {
  for (index_t i = from; i < m.R; ++i)
    for (index_t t = m.begin(i); t < m.end(i); ++t)
      if (m.mask[static_cast<std::size_t>(t)]) return t;
  return -1;
}

TEST(StepPlanFaults, EveryInputErrorIsCarried) {
  reco_test::batch_spec spec;
  spec.groups = 5;
  spec.token_advantages = true;
  const master_batch base = reco_test::make_batch(31, spec);
  const index_t cut = base.R / 2;
  const auto t = static_cast<std::size_t>(valid_token(base, cut));
  const double nan = std::nan("");
  {  // per-token advantages (KL-Cov reads them for its covariances; reco's weights around them)
    master_batch m = base;
    m.token_advantages[t] = nan;
    expect_carried<double>(reco::with_given_advantages(reco::presets::kl_cov{}), m, cut, "batch.token_advantages");
    expect_carried<double>(reco::with_given_advantages(reco::presets::reco{}), m, cut, "batch.token_advantages");
  }
  master_batch m = base;
  m.token_advantages.clear();
  {  // rollout log-probabilities averaged by ReCo's weight (weight.sampling = rollout)
    reco::presets::reco obj;
    obj.weight.params.sampling = reco::weight_sampling::rollout;
    for (const double bad : {nan, 0.5}) {
      std::vector<double> rollout(m.old_logp);
      rollout[t] = bad;
      std::vector<std::vector<double>> keep;  // each part's slice
      expect_carried<double>(obj, m, cut, "batch.rollout_logp", [&](reco_test::split_step<double>& sp) {
        for (std::size_t p = 0; p < sp.parts.size(); ++p) {
          const index_t t0 = sp.first_token(m, p);
          keep.emplace_back(rollout.begin() + t0, rollout.begin() + t0 + static_cast<index_t>(sp.subs[p].logp.size()));
        }
        for (std::size_t p = 0; p < sp.parts.size(); ++p) sp.views[p].rollout_logp = keep[p];
      });
    }
  }
  {  // rewards, entropies, old log-probabilities, logp of a covariance selection
    master_batch r = m;
    r.rewards[static_cast<std::size_t>(cut)] = nan;
    expect_carried<double>(reco::presets::grpo{}, r, cut, "batch.rewards");
    master_batch e = m;
    e.entropy[t] = std::numeric_limits<double>::infinity();
    expect_carried<float>(reco::presets::rule_80_20{}, e, cut, "batch.entropy");
    master_batch o = m;
    o.old_logp[t] = 0.25;
    expect_carried<double>(reco::presets::reco{}, o, cut, "batch.old_logp");
    master_batch l = m;
    l.logp[t] = nan;
    expect_carried<double>(reco::presets::kl_cov{}, l, cut, "batch.logp");
  }
  {  // given advantages and weights
    master_batch a = m;
    a.advantages.assign(static_cast<std::size_t>(m.R), 0.5);
    a.advantages[static_cast<std::size_t>(cut)] = nan;
    expect_carried<double>(reco::with_given_advantages(reco::presets::grpo{}), a, cut, "batch.advantages");
    reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight, reco::token_mean>
        weighted;
    master_batch w = m;
    w.response_weights.assign(static_cast<std::size_t>(m.R), 1.0);
    for (const double bad : {nan, -1.0}) {
      w.response_weights[static_cast<std::size_t>(cut)] = bad;
      expect_carried<double>(weighted, w, cut, "batch.response_weights");
    }
  }
  {  // offsets that do not describe the part's tokens: nothing of the part is read
    expect_carried<double>(reco::presets::grpo{}, m, cut, "batch.layout.offsets", [](reco_test::split_step<double>& sp) {
      auto& o = sp.typed[1].offsets;
      ASSERT_GE(o.size(), 3u);
      o[1] = o[2] + 1;  // decreasing
      sp.views[1] = sp.typed[1].view();
    });
    expect_carried<double>(reco::presets::grpo{}, m, cut, "batch.group_offsets", [](reco_test::split_step<double>& sp) {
      auto& g = sp.typed[1].group_offsets;
      ASSERT_GE(g.size(), 3u);
      g[1] = g[2] + 1;
      sp.views[1] = sp.typed[1].view();
    });
  }
}

// A part its rank cannot summarise sends reco::refusal_summary: the same size as the others',
// summed with them it fails every part in finish_plan naming the argument (micro_batches when the
// refusing parts name different ones, or one the table does not hold); its counters are checked
// like the header's others, and an altered code fails the checksum (then the responses the
// refusing part never claimed are the error).
TEST(StepPlanFaults, RefusedPartsFailEveryPartNamingTheArgument) {
  const master_batch m = reco_test::make_batch(32, reco_test::batch_spec{});
  const index_t cut = m.R / 2;
  const reco::step_info step{9, m.R, 1.0, 0};
  auto run = [&](const auto& obj, const std::vector<std::string>& refused) {
    const reco_test::split_step<double> sp(m, {cut}, step);
    reco::step_summary total;
    for (std::size_t p = 0; p < sp.parts.size(); ++p) {
      reco::step_summary own = refused[p].empty() ? reco::summarize(obj, sp.views[p], sp.parts[p])
                                                  : reco::refusal_summary(obj, sp.step, refused[p]);
      EXPECT_EQ(own.size(), reco::summarize(obj, sp.views[p], sp.parts[p]).size());
      total += own;
    }
    return total;
  };
  auto refusal_of = [&](const auto& obj, const reco::step_summary& total) {
    try {
      reco::finish_plan(obj, step, total);
    } catch (const reco::error& e) {
      return e.argument() + " | " + e.what();
    }
    return std::string("no error");
  };
  const reco::presets::grpo grpo;
  const reco::presets::rule_80_20 cut_rule;  // a summary with its first histogram
  EXPECT_EQ(refusal_of(grpo, run(grpo, {"", "batch.rewards"})).substr(0, 9), "rewards |");
  EXPECT_NE(refusal_of(grpo, run(grpo, {"", "rewards"})).find("failed its checks on 1 of 2 parts"), std::string::npos);
  EXPECT_EQ(refusal_of(cut_rule, run(cut_rule, {"entropy", ""})).substr(0, 9), "entropy |");
  EXPECT_EQ(refusal_of(grpo, run(grpo, {"mask", "mask"})).substr(0, 6), "mask |");
  EXPECT_NE(refusal_of(grpo, run(grpo, {"mask", "mask"})).find("on 2 of 2 parts"), std::string::npos);
  EXPECT_EQ(refusal_of(grpo, run(grpo, {"logp", "mask"})).substr(0, 15), "micro_batches |");
  EXPECT_EQ(refusal_of(grpo, run(grpo, {"", "not_an_input"})).substr(0, 15), "micro_batches |");
  {  // the code altered in flight: the checksum fails, and the responses the refusing part
     // never claimed make the parts' layout the error
    reco::step_summary t = run(grpo, {"", "rewards"});
    t.values[reco::detail::plan_h_refused] += 1;
    EXPECT_EQ(refusal_of(grpo, t).substr(0, 6), "plan |");
  }
  {  // a code beyond the table, sealed again: the header's check
    reco::step_summary t = run(grpo, {"", "rewards"});
    t.values[reco::detail::plan_h_refused] = 1e6;
    reco::detail::seal(t);
    EXPECT_NE(refusal_of(grpo, t).find("header.refused"), std::string::npos);
  }
}

// ---- bounds ----------------------------------------------------------------------------------

template <class F>
void expect_named(F&& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one naming " << argument << ")";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

// A part's fields, the step's scale and responses, checked before the summary is allocated.
TEST(StepPlanFaults, PartFieldsAreBoundedBeforeAllocation) {
  const master_batch m = small_step(3, 3, 4, 6);
  reco_test::typed_batch<double> tb(m);
  reco::presets::grpo obj;
  const reco::step_info ok{1, m.R, 1.0, 0};
  auto with = [&](auto change) {
    reco::step_part p{ok, 0, 0};
    change(p);
    return p;
  };
  for (const index_t huge : {index_t{1} << 62, index_t{1} << 40, index_t{1} << 32})
    expect_named([&] { reco::summarize(obj, tb.view(), with([&](reco::step_part& p) { p.step.responses = huge; })); },
                 "part.step.responses");
  expect_named([&] { reco::summarize(obj, tb.view(), with([](reco::step_part& p) { p.step.responses = -1; })); },
               "part.step.responses");
  for (const index_t first : {index_t{-1}, index_t{1} << 62, std::numeric_limits<index_t>::max()})
    expect_named([&] { reco::summarize(obj, tb.view(), with([&](reco::step_part& p) { p.first_response = first; })); },
                 "part.first_response");
  for (const index_t g : {index_t{-1}, index_t{1} << 53, std::numeric_limits<index_t>::max()})
    expect_named([&] { reco::summarize(obj, tb.view(), with([&](reco::step_part& p) { p.first_group = g; })); },
                 "part.first_group");
  for (const double scale : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()})
    expect_named([&] { reco::summarize(obj, tb.view(), with([&](reco::step_part& p) { p.step.scale = scale; })); },
                 "part.step.scale");
  const reco::step_summary s = reco::summarize(obj, tb.view(), reco::step_part{ok, 0, 0});
  reco::step_info big = ok;
  big.responses = index_t{1} << 40;
  expect_named([&] { reco::finish_plan(obj, big, s); }, "step.responses");
}

// ---- the confirmation -------------------------------------------------------------------------

// Two ranks, each with its own copy of the sums: one copy altered after the all-reduce (its
// checksum fails there, at the last stage), or sealed with another value (both copies pass their
// own checks but differ). Each rank confirms what it holds; the confirmation's sum makes both
// fail with the same message.
TEST(StepPlanFaults, RanksThatHoldDifferentSumsFailAlike) {
  const master_batch m = small_step(12, 3, 4, 8);
  const reco_test::split_step<double> sp(m, {m.R / 2}, reco::step_info{8, m.R, 2.0, 0});
  reco::presets::grpo obj;
  reco::step_summary total;
  for (std::size_t p = 0; p < 2; ++p) total += reco::summarize(obj, sp.views[p], sp.parts[p]);
  const std::size_t reward = reco::detail::plan_header + reco::detail::plan_f_input;
  for (const bool resealed : {false, true}) {
    SCOPED_TRACE(resealed ? "sealed again" : "altered in flight");
    reco::step_summary other = total;
    other.values[reward] += 0.5;
    if (resealed) reco::detail::seal(other);
    reco::step_plan rank0 = reco::finish_plan(obj, sp.step, total), rank1 = reco::finish_plan(obj, sp.step, other);
    ASSERT_FALSE(rank0.complete());
    ASSERT_FALSE(rank1.complete());
    EXPECT_EQ(rank1.refused(), !resealed);
    // Each rank confirms for its own part; the all-reduce adds them.
    reco::step_summary confirm = reco::plan_round(obj, rank0, sp.views[0], sp.parts[0]);
    confirm += reco::plan_round(obj, rank1, sp.views[1], sp.parts[1]);
    std::string first, second;
    try {
      rank0.advance(confirm);
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), "summaries");
      first = e.what();
    }
    try {
      rank1.advance(confirm);
    } catch (const reco::error& e) {
      second = e.what();
    }
    EXPECT_FALSE(first.empty());
    EXPECT_EQ(first, second);
    EXPECT_NE(first.find(resealed ? "differ between parts" : "failed their checksum"), std::string::npos) << first;
  }
  // Intact: both confirm, and the plan is complete.
  reco::step_plan a = reco::finish_plan(obj, sp.step, total), b = a;
  reco::step_summary confirm = reco::plan_round(obj, a, sp.views[0], sp.parts[0]);
  confirm += reco::plan_round(obj, b, sp.views[1], sp.parts[1]);
  a.advance(confirm);
  b.advance(confirm);
  EXPECT_TRUE(a.complete() && b.complete());
}

}  // namespace
