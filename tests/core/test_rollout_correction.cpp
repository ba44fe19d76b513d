// The rollout importance-sampling correction (reco/batch_ops/rollout_importance_weights.hpp)
// against a naive double reference written from the definitions, on ragged padded and packed
// batches; hand-computed values; the errors naming each argument.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/named_argument.hpp"
#include "reco/batch_ops/rollout_importance_weights.hpp"

namespace {

using reco::index_t;
const double inf = std::numeric_limits<double>::infinity();

struct ref_out {
  std::vector<double> w;
  std::vector<int> keep;
  double normaliser = 1;
  double rejected_tokens = 0, rejected_responses = 0, k1_mean = 0, bounded = 0;
};

// Response i holds the valid tokens of row i; the reference works on per-response lists.
ref_out reference(const std::vector<std::vector<double>>& old_lp, const std::vector<std::vector<double>>& roll_lp,
                  const std::vector<std::vector<int>>& valid, const std::vector<double>& adv,
                  const reco::rollout_correction_params& p, const std::vector<reco::rollout_filter>& filters) {
  const std::size_t R = old_lp.size();
  std::vector<std::vector<double>> w(R), keep_f(R);
  ref_out out;
  auto clampB = [&](double x) { return std::min(std::max(x, -p.log_ratio_bound), p.log_ratio_bound); };
  double total = 0, count = 0, seq_total = 0, seq_count = 0, k1 = 0, rej = 0, rej_resp = 0;
  for (std::size_t i = 0; i < R; ++i) {
    const std::size_t T = old_lp[i].size();
    double sum_log = 0, n = 0;
    for (std::size_t t = 0; t < T; ++t)
      if (valid[i][t]) sum_log += old_lp[i][t] - roll_lp[i][t], n += 1;
    w[i].assign(T, 0.0);
    double wsum = 0;
    for (std::size_t t = 0; t < T; ++t) {
      if (!valid[i][t]) continue;
      double raw = 1;
      if (p.level == reco::rollout_is_level::token) raw = std::exp(clampB(old_lp[i][t] - roll_lp[i][t]));
      if (p.level == reco::rollout_is_level::sequence) raw = std::exp(clampB(sum_log));
      double x = raw;
      if (p.level != reco::rollout_is_level::none) {
        if (p.bound == reco::rollout_is_bound::truncate) x = std::min(std::max(raw, p.lower), p.upper);
        else x = (raw < p.lower || raw > p.upper) ? 0.0 : raw;
      }
      w[i][t] = x;
      if (x != raw) out.bounded += 1;
      wsum += x;
      total += x;
      count += 1;
      k1 += roll_lp[i][t] - old_lp[i][t];
    }
    if (n > 0) seq_total += wsum / (n + p.count_eps), seq_count += 1;
    // Filters: the statistic of each, then the verdict per token.
    std::vector<int> keep(T, 0);
    for (std::size_t t = 0; t < T; ++t) keep[t] = valid[i][t];
    for (const auto& f : filters) {
      const int s = static_cast<int>(f.statistic);
      const int k = s % 3 + 1;
      auto est = [&](std::size_t t) {
        const double l = clampB(old_lp[i][t] - roll_lp[i][t]);
        return k == 1 ? -l : (k == 2 ? l * l / 2 : std::exp(l) - 1 - l);
      };
      const bool exempt = f.negative_advantages_only && adv[i] >= 0;
      if (exempt) continue;
      if (s < 3) {
        for (std::size_t t = 0; t < T; ++t)
          if (valid[i][t] && !(est(t) >= f.lower && est(t) <= f.upper)) keep[t] = 0;
        continue;
      }
      std::vector<double> vals;
      for (std::size_t t = 0; t < T; ++t)
        if (valid[i][t]) vals.push_back(est(t));
      double stat = 0;
      if (s < 6) {
        for (double v : vals) stat += v;
      } else if (s < 9) {
        for (double v : vals) stat += v;
        stat = vals.empty() ? 0.0 : stat / (static_cast<double>(vals.size()) + p.count_eps);
      } else {
        stat = vals.empty() ? 0.0 : -inf;
        for (double v : vals) stat = std::max(stat, v);
      }
      if (!(stat >= f.lower && stat <= f.upper)) std::fill(keep.begin(), keep.end(), 0);
    }
    bool lost = false;
    for (std::size_t t = 0; t < T; ++t) {
      out.keep.push_back(keep[t]);
      if (valid[i][t] && !keep[t]) rej += 1, lost = true;
    }
    if (lost) rej_resp += 1;
  }
  if (p.normalise && p.level != reco::rollout_is_level::none && count > 0) {
    const double mean = p.level == reco::rollout_is_level::token ? total / (count + p.count_eps) : seq_total / seq_count;
    if (mean > 0) {
      out.normaliser = mean;
      for (auto& row : w)
        for (double& x : row) x /= mean;
    }
  }
  for (const auto& row : w) out.w.insert(out.w.end(), row.begin(), row.end());
  if (count > 0) {
    out.rejected_tokens = rej / count;
    out.rejected_responses = rej_resp / seq_count;
    out.k1_mean = k1 / count;
    out.bounded /= count;
  }
  return out;
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::max(1.0, std::abs(want))) << what << ": " << got << " vs " << want;
}

TEST(BatchOps, RolloutCorrectionHandComputed) {
  // Response 0: log ratios 1, -0.5, (masked); response 1: log ratio 0.2, 0.3.
  const std::vector<double> old_lp = {-1.0, -2.0, -0.1, -0.4, -0.2};
  const std::vector<double> roll_lp = {-2.0, -1.5, -0.1, -0.6, -0.5};
  const std::vector<std::uint8_t> mask = {1, 1, 0, 1, 1};
  const std::vector<index_t> offsets = {0, 3, 5};
  const auto layout = reco::packed(reco::span<const index_t>(offsets));
  std::vector<double> w(5, 9.0);
  std::vector<std::uint8_t> keep(5, 9);
  reco::rollout_correction_params p;  // token TIS at 2
  std::vector<reco::rollout_filter> filters(1);
  filters[0].statistic = reco::rollout_statistic::seq_max_k2;
  filters[0].upper = 0.3;  // response 0: max(1/2, 1/8) = 0.5 -> dropped; response 1: 0.045 -> kept
  const auto m = reco::rollout_importance_weights<double>(
      layout, old_lp, roll_lp, mask, {}, p, filters, reco::span<double>(w), reco::span<std::uint8_t>(keep));
  EXPECT_DOUBLE_EQ(w[0], 2.0);  // e^1 truncated
  EXPECT_DOUBLE_EQ(w[1], std::exp(-0.5));
  EXPECT_EQ(w[2], 0.0);
  EXPECT_DOUBLE_EQ(w[3], std::exp(0.2));
  EXPECT_DOUBLE_EQ(w[4], std::exp(0.3));
  EXPECT_EQ(keep, (std::vector<std::uint8_t>{0, 0, 0, 1, 1}));
  EXPECT_EQ(m.valid_tokens, 4);
  EXPECT_EQ(m.valid_responses, 2);
  EXPECT_DOUBLE_EQ(m.bounded_fraction, 0.25);
  EXPECT_DOUBLE_EQ(m.rejected_token_fraction, 0.5);
  EXPECT_DOUBLE_EQ(m.rejected_response_fraction, 0.5);
  EXPECT_DOUBLE_EQ(m.weight_max, 2.0);
  EXPECT_DOUBLE_EQ(m.weight_min, std::exp(-0.5));
  EXPECT_DOUBLE_EQ(m.k1_mean, -(1.0 - 0.5 + 0.2 + 0.3) / 4);

  // Sequence level, masked at [0.5, 2]: response 0 exp(0.5) kept, response 1 exp(0.5) kept;
  // at [0.5, 1.5] both are zeroed.
  p.level = reco::rollout_is_level::sequence;
  p.bound = reco::rollout_is_bound::mask;
  p.lower = 0.5;
  reco::rollout_importance_weights<double>(layout, old_lp, roll_lp, mask, {}, p, {}, reco::span<double>(w), {});
  EXPECT_DOUBLE_EQ(w[0], std::exp(0.5));
  EXPECT_DOUBLE_EQ(w[4], std::exp(0.5));
  p.upper = 1.5;
  reco::rollout_importance_weights<double>(layout, old_lp, roll_lp, mask, {}, p, {}, reco::span<double>(w), {});
  EXPECT_EQ(w, std::vector<double>(5, 0.0));
}

TEST(BatchOps, RolloutCorrectionRaggedAgainstReference) {
  std::mt19937 rng(2024);
  std::normal_distribution<double> g(0, 1);
  std::uniform_real_distribution<double> u(0, 1);
  using S = reco::rollout_statistic;
  double rejected = 0, bounded = 0, kept = 0;  // the batches exercise both verdicts and the bounds
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t R = 1 + rng() % 7, T = 1 + rng() % 9;
    std::vector<std::vector<double>> o(R), r(R);
    std::vector<std::vector<int>> v(R);
    std::vector<double> adv(R);
    const double spread = trial % 8 == 3 ? 30.0 : std::exp(-3 + 3 * u(rng));  // some beyond the clamp
    for (std::size_t i = 0; i < R; ++i) {
      const std::size_t len = rng() % (T + 1);  // 0 .. T valid tokens, some with a hole
      adv[i] = g(rng);
      for (std::size_t t = 0; t < T; ++t) {
        o[i].push_back(-std::abs(g(rng)) - 0.01);
        r[i].push_back(std::min(-1e-3, o[i][t] - spread * g(rng)));
        v[i].push_back(t < len && !(t == 1 && i % 3 == 0) ? 1 : 0);
      }
    }
    reco::rollout_correction_params p;
    p.level = static_cast<reco::rollout_is_level>(trial % 3);
    p.bound = static_cast<reco::rollout_is_bound>((trial / 3) % 2);
    p.lower = trial % 5 == 0 ? 0.0 : 0.3 + 0.5 * u(rng);
    p.upper = trial % 7 == 0 ? inf : 1.0 + 2 * u(rng);
    p.log_ratio_bound = trial % 2 ? 20.0 : (trial % 4 == 0 ? inf : 3.0);
    p.normalise = (trial / 2) % 2 == 1;
    p.count_eps = trial % 3 == 0 ? 1e-8 : 0.0;
    std::vector<reco::rollout_filter> filters;
    const int n_filters = trial % 4;
    for (int f = 0; f < n_filters; ++f) {
      reco::rollout_filter x;
      x.statistic = static_cast<S>(rng() % 12);
      const int k = static_cast<int>(x.statistic) % 3 + 1;
      // Thresholds on the scale of the statistic, so that filters both keep and drop.
      const bool sum = x.statistic >= S::seq_sum_k1 && x.statistic <= S::seq_sum_k3;
      const double scale = (k == 1 ? spread : spread * spread) * (sum ? 3 : 1);
      x.lower = k == 1 ? -scale * 2 * u(rng) : (trial % 5 == 0 ? 0.01 * scale : -inf);
      x.upper = scale * 2 * u(rng);
      x.negative_advantages_only = (trial + f) % 5 == 0;
      filters.push_back(x);
    }
    bool any_adv = false;
    for (const auto& f : filters) any_adv = any_adv || f.negative_advantages_only;
    const ref_out want = reference(o, r, v, adv, p, filters);

    // Padded.
    std::vector<double> po, pr, pw(R * T, 7.0);
    std::vector<std::uint8_t> pm, pk(R * T, 7);
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t t = 0; t < T; ++t) {
        po.push_back(o[i][t]);
        pr.push_back(r[i][t]);
        pm.push_back(static_cast<std::uint8_t>(v[i][t]));
      }
    const auto adv_span = any_adv ? reco::span<const double>(adv) : reco::span<const double>();
    const auto m = reco::rollout_importance_weights<double>(
        reco::padded(static_cast<index_t>(R), static_cast<index_t>(T)), po, pr, pm, adv_span, p, filters,
        reco::span<double>(pw), reco::span<std::uint8_t>(pk));
    for (std::size_t k = 0; k < pw.size(); ++k) {
      expect_rel(pw[k], want.w[k], 1e-12, "trial " + std::to_string(trial) + " weight " + std::to_string(k));
      EXPECT_EQ(pk[k], want.keep[k]) << "trial " << trial << " token " << k;
      if (!pm[k]) {
        EXPECT_EQ(pw[k], 0.0);
      }
    }
    rejected += m.rejected_token_fraction;
    kept += 1 - m.rejected_token_fraction;
    bounded += m.bounded_fraction;
    expect_rel(m.normaliser, want.normaliser, 1e-12, "normaliser");
    expect_rel(m.rejected_token_fraction, want.rejected_tokens, 1e-12, "rejected tokens");
    expect_rel(m.rejected_response_fraction, want.rejected_responses, 1e-12, "rejected responses");
    expect_rel(m.k1_mean, want.k1_mean, 1e-12, "k1 mean");
    expect_rel(m.bounded_fraction, want.bounded, 1e-12, "bounded fraction");

    // Packed, float, each response cut after a random number of its (trailing) tokens.
    std::vector<index_t> offsets = {0};
    std::vector<float> fo, fr;
    std::vector<std::uint8_t> fm;
    std::vector<double> fw_want;
    std::vector<int> fk_want;
    std::vector<std::vector<double>> co(R), cr(R);
    std::vector<std::vector<int>> cv(R);
    for (std::size_t i = 0; i < R; ++i) {
      std::size_t last = 0;
      for (std::size_t t = 0; t < T; ++t)
        if (v[i][t]) last = t + 1;
      const std::size_t keep = std::min(T, last + (i % 2));
      for (std::size_t t = 0; t < keep; ++t) {
        fo.push_back(static_cast<float>(o[i][t]));
        fr.push_back(static_cast<float>(r[i][t]));
        fm.push_back(static_cast<std::uint8_t>(v[i][t]));
        co[i].push_back(static_cast<float>(o[i][t]));
        cr[i].push_back(static_cast<float>(r[i][t]));
        cv[i].push_back(v[i][t]);
      }
      offsets.push_back(static_cast<index_t>(fo.size()));
    }
    const ref_out fwant = reference(co, cr, cv, adv, p, filters);
    std::vector<float> fw(fo.size(), 7.0f);
    std::vector<float> fadv(adv.begin(), adv.end());
    std::vector<std::uint8_t> fk(fo.size(), 7);
    reco::rollout_importance_weights<float>(reco::packed(reco::span<const index_t>(offsets)), fo, fr, fm,
                                            any_adv ? reco::span<const float>(fadv) : reco::span<const float>(), p,
                                            filters, reco::span<float>(fw), reco::span<std::uint8_t>(fk));
    for (std::size_t k = 0; k < fw.size(); ++k) {
      expect_rel(fw[k], fwant.w[k], 1e-5, "packed trial " + std::to_string(trial));
      EXPECT_EQ(fk[k], fwant.keep[k]) << "packed trial " << trial << " token " << k;
    }
  }
  EXPECT_GT(rejected, 1.0);
  EXPECT_GT(kept, 1.0);
  EXPECT_GT(bounded, 1.0);
}

TEST(BatchOps, RolloutCorrectionOffPolicySequenceMask) {
  // TRL's off-policy sequence mask: drop a response when its advantage is negative and its mean
  // k1 (rollout - trainer log-probs) exceeds delta.
  const std::vector<double> old_lp = {-1.0, -1.0, -1.0, -1.0, -1.0, -1.0};
  const std::vector<double> roll_lp = {-0.5, -0.7, -0.5, -0.7, -1.0, -1.0};  // mean k1: 0.4, 0.4, 0
  const std::vector<double> adv = {1.0, -1.0, -1.0};
  reco::rollout_correction_params p;
  p.level = reco::rollout_is_level::none;
  std::vector<reco::rollout_filter> f(1);
  f[0].statistic = reco::rollout_statistic::seq_mean_k1;
  f[0].upper = 0.3;
  f[0].negative_advantages_only = true;
  std::vector<std::uint8_t> keep(6);
  std::vector<double> w(6);
  reco::rollout_importance_weights<double>(reco::padded(3, 2), old_lp, roll_lp, {}, adv, p, f, reco::span<double>(w),
                                           reco::span<std::uint8_t>(keep));
  EXPECT_EQ(keep, (std::vector<std::uint8_t>{1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(w, std::vector<double>(6, 1.0));  // level none: weight 1 at every valid token
}

using reco_test::named_argument;

TEST(BatchOps, RolloutCorrectionErrorsNameTheArgument) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> o = {-1, -2, -0.5, -0.1}, r = {-1.1, -1.9, -0.4, -0.3};
  const std::vector<std::uint8_t> m = {1, 1, 1, 0};
  auto call = [&](reco::rollout_correction_params p, std::vector<reco::rollout_filter> f, std::vector<double> oo,
                  std::vector<double> rr, std::vector<std::uint8_t> mm, std::vector<double> adv, std::size_t nw,
                  std::size_t nk) {
    std::vector<double> w(nw);
    std::vector<std::uint8_t> k(nk);
    return named_argument([&] {
      reco::rollout_importance_weights<double>(reco::padded(2, 2), oo, rr, mm, adv, p, f, reco::span<double>(w),
                                               reco::span<std::uint8_t>(k));
    });
  };
  const reco::rollout_correction_params ok;
  EXPECT_EQ(call(ok, {}, o, r, m, {}, 4, 4), "");
  EXPECT_EQ(call(ok, {}, o, r, m, {}, 0, 0), "");  // neither output asked for
  for (const double bad : {0.0, -1.0, nan}) {
    auto p = ok;
    p.upper = bad;
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.upper");
  }
  for (const double bad : {-0.1, nan, inf, 3.0}) {  // 3 > upper = 2
    auto p = ok;
    p.lower = bad;
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.lower");
  }
  for (const double bad : {0.0, -1.0, nan}) {
    auto p = ok;
    p.log_ratio_bound = bad;
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.log_ratio_bound");
  }
  for (const double bad : {-1e-8, nan, inf}) {
    auto p = ok;
    p.count_eps = bad;
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.count_eps");
  }
  {
    auto p = ok;
    p.level = static_cast<reco::rollout_is_level>(3);
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.level");
    p = ok;
    p.bound = static_cast<reco::rollout_is_bound>(2);
    EXPECT_EQ(call(p, {}, o, r, m, {}, 4, 4), "params.bound");
  }
  reco::rollout_filter f;
  f.statistic = static_cast<reco::rollout_statistic>(12);
  EXPECT_EQ(call(ok, {reco::rollout_filter{}, f}, o, r, m, {}, 4, 4), "filters[1].statistic");
  f = reco::rollout_filter{};
  f.lower = nan;
  EXPECT_EQ(call(ok, {f}, o, r, m, {}, 4, 4), "filters[0].lower");
  f.lower = 1;
  f.upper = 0.5;
  EXPECT_EQ(call(ok, {f}, o, r, m, {}, 4, 4), "filters[0].lower");
  f.lower = 0;
  f.upper = nan;
  EXPECT_EQ(call(ok, {f}, o, r, m, {}, 4, 4), "filters[0].upper");
  f.upper = 1;
  f.negative_advantages_only = true;
  EXPECT_EQ(call(ok, {f}, o, r, m, {}, 4, 4), "advantages");  // needed, not given
  EXPECT_EQ(call(ok, {f}, o, r, m, {1.0}, 4, 4), "advantages");
  EXPECT_EQ(call(ok, {f}, o, r, m, {1.0, nan}, 4, 4), "advantages");
  EXPECT_EQ(call(ok, {f}, o, r, m, {1.0, -1.0}, 4, 4), "");
  EXPECT_EQ(call(ok, {}, o, r, m, {1.0, -1.0}, 4, 4), "advantages");  // given, not read
  EXPECT_EQ(call(ok, {}, {-1, nan, -0.5, -0.1}, r, m, {}, 4, 4), "old_logp");
  EXPECT_EQ(call(ok, {}, {-1, 0.5, -0.5, -0.1}, r, m, {}, 4, 4), "old_logp");
  EXPECT_EQ(call(ok, {}, o, {-1.1, -1.9, -inf, -0.3}, m, {}, 4, 4), "rollout_logp");
  EXPECT_EQ(call(ok, {}, o, {-1.1, -1.9, -0.4, nan}, m, {}, 4, 4), "");  // masked: not read
  EXPECT_EQ(call(ok, {}, {-1, -2, -0.5}, r, m, {}, 4, 4), "old_logp");
  EXPECT_EQ(call(ok, {}, o, {-1, -2, -0.5}, m, {}, 4, 4), "rollout_logp");
  EXPECT_EQ(call(ok, {}, o, r, {1, 1, 1}, {}, 4, 4), "mask");
  EXPECT_EQ(call(ok, {}, o, r, m, {}, 3, 4), "weights");
  EXPECT_EQ(call(ok, {}, o, r, m, {}, 4, 5), "keep_mask");
  const std::vector<index_t> bad_offsets = {0, 3, 2};
  EXPECT_EQ(named_argument([&] {
              reco::rollout_importance_weights<double>(reco::packed(reco::span<const index_t>(bad_offsets)), o, r, m, {},
                                                       ok, {}, {}, {});
            }),
            "offsets");
}

}  // namespace
