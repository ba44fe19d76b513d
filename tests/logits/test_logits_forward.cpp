// reco::logits::forward against the two-pass double reference: every storage type, temperatures
// 1, 0.6 and 1.7, -inf logits, masked rows, V from 1 to 32,000, strided rows, > 65,535 rows, and
// the error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "logits/logits_reference.hpp"
#include "reco/logits/logp_entropy.hpp"

namespace {

namespace rl = reco::logits;
using namespace logits_test;

// Error allowed per unit of magnitude: fp64 accumulation for double logits, fp32 for the others.
// Observed worst cases up to V = 262,144 are ~1.4e-7 (fp32) and ~4e-14 (fp64): the bounds leave a
// factor of ~15 for other data.
template <class T>
double forward_tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-6;
}

template <class T>
struct forward_outputs {
  std::vector<rl::accum_t<T>> logp, entropy, lse, sum_p_squared;
};

template <class T>
forward_outputs<T> run_forward(const batch<T>& b, double tau, bool use_mask = true) {
  forward_outputs<T> o;
  const std::size_t n = static_cast<std::size_t>(b.rows);
  o.logp.assign(n, -7), o.entropy.assign(n, -7), o.lse.assign(n, -7), o.sum_p_squared.assign(n, -7);
  rl::forward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, use_mask ? b.mask.data() : nullptr,
              o.logp.data(), o.entropy.data(), o.lse.data(), o.sum_p_squared.data());
  return o;
}

template <class T>
void expect_forward_matches_reference(const batch<T>& b, double tau) {
  const auto o = run_forward(b, tau);
  const double tol = forward_tolerance<T>();
  for (reco::index_t r = 0; r < b.rows; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    if (!b.mask[r]) {
      // Masked: exactly zero, although the row holds NaN logits and token -100.
      EXPECT_EQ(o.logp[r], 0);
      EXPECT_EQ(o.entropy[r], 0);
      EXPECT_EQ(o.lse[r], 0);
      EXPECT_EQ(o.sum_p_squared[r], 0);
      continue;
    }
    const reference_row ref = reference_forward(b.row(r), b.tokens[r], tau);
    EXPECT_NEAR(o.logp[r], ref.logp, tol * (1 + std::fabs(ref.logp)));
    EXPECT_NEAR(o.entropy[r], ref.entropy, tol * (1 + ref.entropy));
    EXPECT_NEAR(o.lse[r], ref.lse, tol * (1 + std::fabs(ref.lse)));
    EXPECT_NEAR(o.sum_p_squared[r], ref.sum_p_squared, tol * ref.sum_p_squared + tol * 1e-3);
    EXPECT_GE(o.entropy[r], 0);
  }
}

template <class T>
class LogitsForward : public ::testing::Test {};
using storage_types = ::testing::Types<float, double, reco::bf16_t, reco::f16_t>;
TYPED_TEST_SUITE(LogitsForward, storage_types);

TYPED_TEST(LogitsForward, MatchesTwoPassReference) {
  using T = TypeParam;
  const std::vector<std::pair<reco::index_t, reco::index_t>> shapes = {{40, 1}, {40, 7}, {24, 1000}, {10, 32000}};
  std::uint64_t seed = 1;
  for (const auto& [rows, vocab] : shapes)
    for (double tau : {1.0, 0.6, 1.7}) {
      SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(vocab) + " tau=" + std::to_string(tau));
      batch_options o;
      o.mask_every = 4;
      o.neg_inf_fraction = vocab > 1 ? 0.15 : 0.0;
      expect_forward_matches_reference(make_batch<T>(rows, vocab, seed++, o), tau);
    }
}

TYPED_TEST(LogitsForward, StridedRowsAndLargeOffsets) {
  using T = TypeParam;
  batch_options o;
  o.pad = 5;
  o.mask_every = 3;
  // bf16 keeps 8 significant bits: an offset of 1000 would leave only a handful of distinct values.
  o.offset = std::is_same_v<T, reco::bf16_t> ? 50.0 : 1000.0;
  expect_forward_matches_reference(make_batch<T>(9, 3001, 77, o), 0.6);
}

TEST(LogitsForwardExact, OneHotAndUniformRows) {
  // One finite logit: p = 1, H = 0, logp = 0, LSE = z. All equal: p = 1/V, H = log V.
  const reco::index_t v = 1000;
  std::vector<float> x(2 * v, -std::numeric_limits<float>::infinity());
  x[17] = 3.5f;
  for (reco::index_t j = 0; j < v; ++j) x[v + j] = -2.0f;
  const std::int64_t tokens[2] = {17, 5};
  float logp[2], h[2], lse[2], sq[2];
  rl::forward(x.data(), 2, v, v, tokens, 0.5, nullptr, logp, h, lse, sq);
  EXPECT_EQ(logp[0], 0.0f);
  EXPECT_EQ(h[0], 0.0f);
  EXPECT_FLOAT_EQ(lse[0], 7.0f);
  EXPECT_EQ(sq[0], 1.0f);
  EXPECT_NEAR(logp[1], -std::log(1000.0), 1e-5);
  EXPECT_NEAR(h[1], std::log(1000.0), 1e-5);
  EXPECT_NEAR(sq[1], 1e-3, 1e-8);
}

TEST(LogitsForwardExact, SampledTokenWithProbabilityZero) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f, -inf, 1.0f};
  const std::int64_t token = 1;
  float logp = 0, h = 0, lse = 0;
  rl::forward(x.data(), 1, 3, 3, &token, 1.0, nullptr, &logp, &h, &lse);
  EXPECT_EQ(logp, -inf);
  EXPECT_TRUE(std::isfinite(h));
}

TEST(LogitsForwardExact, OptionalOutputsAndNoTokens) {
  auto b = make_batch<float>(6, 50, 3);
  std::vector<float> h(6), h_all(6), logp(6), lse(6);
  // Entropy only: tokens may be null when logp is not requested.
  rl::forward(b.stored.data(), 6, 50, 50, nullptr, 1.3, nullptr, nullptr, h.data(), nullptr);
  rl::forward(b.stored.data(), 6, 50, 50, b.tokens.data(), 1.3, nullptr, logp.data(), h_all.data(), lse.data());
  EXPECT_EQ(0, std::memcmp(h.data(), h_all.data(), sizeof(float) * 6));
}

TEST(LogitsForwardExact, NaNLogitsGiveNaNRow) {
  std::vector<float> x = {0.5f, std::numeric_limits<float>::quiet_NaN(), -1.0f, 0.25f, 2.0f, -3.0f};
  const std::int64_t tokens[2] = {0, 1};
  float logp[2], h[2], lse[2];
  rl::forward(x.data(), 2, 3, 3, tokens, 1.0, nullptr, logp, h, lse);
  EXPECT_TRUE(std::isnan(logp[0]) && std::isnan(h[0]) && std::isnan(lse[0]));
  EXPECT_TRUE(std::isfinite(logp[1]) && std::isfinite(h[1]));
}

// 70,000 rows: nothing in the host path depends on a grid limit, and every row is checked.
TEST(LogitsForwardExact, MoreThan65535Rows) {
  batch_options o;
  o.mask_every = 7;
  const auto b = make_batch<float>(70000, 8, 11, o);
  const auto out = run_forward(b, 0.8);
  double worst = 0;
  for (reco::index_t r = 0; r < b.rows; ++r) {
    if (!b.mask[r]) {
      ASSERT_EQ(out.logp[r], 0) << r;
      continue;
    }
    const auto ref = reference_forward(b.row(r), b.tokens[r], 0.8);
    worst = std::max({worst, std::fabs(out.logp[r] - ref.logp) / (1 + std::fabs(ref.logp)),
                      std::fabs(out.entropy[r] - ref.entropy) / (1 + ref.entropy)});
  }
  EXPECT_LT(worst, 2e-6);
}

#if defined(_OPENMP)
TEST(LogitsForwardExact, IndependentOfThreadCount) {
  batch_options o;
  o.mask_every = 5;
  const auto b = make_batch<reco::bf16_t>(257, 4099, 5, o);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = run_forward(b, 0.9);
  omp_set_num_threads(std::max(2, saved));
  const auto many = run_forward(b, 0.9);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(one.logp.data(), many.logp.data(), sizeof(float) * one.logp.size()));
  EXPECT_EQ(0, std::memcmp(one.entropy.data(), many.entropy.data(), sizeof(float) * one.entropy.size()));
}
#endif

// bf16 logits against float64 math on the *unrounded* logits. The difference is dominated by the
// input rounding (|δx| <= 2^-9 |x|), bounded to first order by
//   |Δlogp| <= |δz_y| + max_j |δz_j|,  |ΔH| <= Σ_j p_j |log p_j + H| |δz_j|
// (∂logp/∂z_j = δ_jy - p_j, ∂H/∂z_j = -p_j (log p_j + H)). The documented tolerance is twice that
// bound plus the fp32 accumulation allowance.
TEST(LogitsForwardExact, Bf16AgainstFloat64OfUnroundedLogits) {
  const reco::index_t rows = 16, v = 32000;
  const double tau = 0.7;
  std::mt19937_64 rng(99);
  std::normal_distribution<double> normal(0.0, 2.5);
  std::vector<double> exact(static_cast<std::size_t>(rows * v));
  std::vector<reco::bf16_t> stored(exact.size());
  std::vector<std::int64_t> tokens(rows);
  for (reco::index_t r = 0; r < rows; ++r) tokens[r] = (r * 7919) % v;
  for (std::size_t i = 0; i < exact.size(); ++i) {
    exact[i] = normal(rng);
    stored[i] = reco::bf16_t(static_cast<float>(exact[i]));
  }
  std::vector<float> logp(rows), h(rows), lse(rows);
  rl::forward(stored.data(), rows, v, v, tokens.data(), tau, nullptr, logp.data(), h.data(), lse.data());
  for (reco::index_t r = 0; r < rows; ++r) {
    const std::vector<double> row(exact.begin() + r * v, exact.begin() + (r + 1) * v);
    const auto ref = reference_forward(row, tokens[r], tau);
    double max_dz = 0, h_bound = 0;
    for (reco::index_t j = 0; j < v; ++j) {
      const double dz = std::fabs(static_cast<float>(stored[r * v + j]) - row[j]) / tau;
      max_dz = std::max(max_dz, dz);
      h_bound += std::exp(ref.log_p[j]) * std::fabs(ref.log_p[j] + ref.entropy) * dz;
    }
    const double dz_y = std::fabs(static_cast<float>(stored[r * v + tokens[r]]) - row[tokens[r]]) / tau;
    EXPECT_NEAR(logp[r], ref.logp, 2 * (dz_y + max_dz) + 2e-5 * (1 + std::fabs(ref.logp))) << r;
    EXPECT_NEAR(h[r], ref.entropy, 2 * h_bound + 2e-5 * (1 + ref.entropy)) << r;
    // The bound is not vacuous: it is far below the values themselves.
    EXPECT_LT(2 * h_bound, 0.05 * ref.entropy);
  }
}

// ---------------------------------------------------------------------------------------------
// Errors: the message names the argument.
// ---------------------------------------------------------------------------------------------

template <class F>
std::string argument_of(F&& f) {
  try {
    f();
  } catch (const reco::error& e) {
    return e.argument();
  }
  return "<no error>";
}

TEST(LogitsForwardErrors, TokenOutOfRange) {
  auto b = make_batch<float>(4, 10, 21);
  std::vector<float> logp(4, 5.0f), h(4), lse(4);
  for (std::int64_t bad : {std::int64_t(-1), std::int64_t(10), std::int64_t(1) << 40}) {
    auto t = b.tokens;
    t[2] = bad;
    EXPECT_EQ(argument_of([&] { rl::forward(b.stored.data(), 4, 10, 10, t.data(), 1.0, nullptr, logp.data(), h.data(), lse.data()); }),
              "tokens");
    EXPECT_EQ(logp[0], 5.0f);  // thrown before anything was written
  }
  // The same bad token in a masked row is never looked at.
  auto t = b.tokens;
  t[2] = -1;
  std::vector<std::uint8_t> mask = {1, 1, 0, 1};
  EXPECT_NO_THROW(rl::forward(b.stored.data(), 4, 10, 10, t.data(), 1.0, mask.data(), logp.data(), h.data(), lse.data()));
  // logp requested without tokens.
  EXPECT_EQ(argument_of([&] { rl::forward(b.stored.data(), 4, 10, 10, nullptr, 1.0, nullptr, logp.data(), h.data(), lse.data()); }),
            "tokens");
}

TEST(LogitsForwardErrors, RowOfAllNegInf) {
  auto b = make_batch<float>(5, 16, 22);
  for (reco::index_t j = 0; j < 16; ++j) b.stored[3 * 16 + j] = -std::numeric_limits<float>::infinity();
  std::vector<float> logp(5, 9.0f), h(5), lse(5);
  try {
    rl::forward(b.stored.data(), 5, 16, 16, b.tokens.data(), 1.0, nullptr, logp.data(), h.data(), lse.data());
    ADD_FAILURE() << "no error for an all -inf row";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "logits");
    EXPECT_NE(std::string(e.what()).find("row 3"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::isnan(logp[3]));
  EXPECT_TRUE(std::isfinite(logp[4]));  // the other rows are complete
  // Masked, the same row is fine.
  std::vector<std::uint8_t> mask = {1, 1, 1, 0, 1};
  EXPECT_NO_THROW(rl::forward(b.stored.data(), 5, 16, 16, b.tokens.data(), 1.0, mask.data(), logp.data(), h.data(), lse.data()));
  EXPECT_EQ(logp[3], 0.0f);
}

TEST(LogitsForwardErrors, BadSizesAndTemperature) {
  std::vector<float> x(20, 0.0f), out(4);
  std::vector<std::int64_t> t(4, 0);
  auto call = [&](reco::index_t rows, reco::index_t vocab, reco::index_t stride, double tau, const float* logits) {
    return argument_of([&] { rl::forward(logits, rows, vocab, stride, t.data(), tau, nullptr, out.data(), nullptr, nullptr); });
  };
  EXPECT_EQ(call(4, 5, 5, 0.0, x.data()), "temperature");
  EXPECT_EQ(call(4, 5, 5, -1.0, x.data()), "temperature");
  EXPECT_EQ(call(4, 5, 5, std::nan(""), x.data()), "temperature");
  EXPECT_EQ(call(4, 5, 5, HUGE_VAL, x.data()), "temperature");
  EXPECT_EQ(call(4, 0, 5, 1.0, x.data()), "vocab");
  EXPECT_EQ(call(4, 5, 4, 1.0, x.data()), "row_stride");
  EXPECT_EQ(call(-1, 5, 5, 1.0, x.data()), "rows");
  EXPECT_EQ(call(4, 5, 5, 1.0, nullptr), "logits");
  EXPECT_EQ(call(4, 5, 5, 1.0, x.data()), "<no error>");
  EXPECT_EQ(call(0, 5, 5, 1.0, nullptr), "<no error>");  // an empty batch needs no buffers
}

}  // namespace
