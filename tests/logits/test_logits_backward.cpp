// reco::logits::backward: central finite differences of the library's own forward (double),
// the reference formula for every storage type, in place = out of place bit for bit, exact zeros
// for masked rows and -inf logits, > 65,535 rows, and the error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "logits/logits_reference.hpp"
#include "reco/logits/logp_entropy.hpp"

namespace {

namespace rl = reco::logits;
using namespace logits_test;

struct upstream {
  std::vector<double> g_logp, g_entropy;
};
upstream make_upstream(reco::index_t rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  upstream g;
  for (reco::index_t r = 0; r < rows; ++r) g.g_logp.push_back(u(rng)), g.g_entropy.push_back(u(rng));
  return g;
}

template <class A>
std::vector<A> cast_all(const std::vector<double>& v) {
  return std::vector<A>(v.begin(), v.end());
}

// Runs forward, then backward out of place; returns dlogits widened to double.
template <class T>
std::vector<double> run_backward(const batch<T>& b, double tau, const upstream& g, bool with_logp, bool with_entropy) {
  using A = rl::accum_t<T>;
  const std::size_t n = static_cast<std::size_t>(b.rows);
  std::vector<A> logp(n), h(n), lse(n);
  rl::forward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, b.mask.data(), logp.data(), h.data(),
              lse.data());
  const auto gl = cast_all<A>(g.g_logp), gh = cast_all<A>(g.g_entropy);
  std::vector<T> d(b.stored.size(), store_as<T>(-123.0));
  rl::backward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, b.mask.data(),
               with_logp ? gl.data() : nullptr, with_entropy ? gh.data() : nullptr, lse.data(), h.data(), d.data());
  std::vector<double> out(d.size());
  for (std::size_t i = 0; i < d.size(); ++i) out[i] = load_from<T>(d[i]);
  return out;
}

// L(x) = Σ_r g_r logp_r + gh_r H_r through the library's double forward.
double objective(const batch<double>& b, const std::vector<double>& x, double tau, const upstream& g, bool with_logp,
                 bool with_entropy) {
  const std::size_t n = static_cast<std::size_t>(b.rows);
  std::vector<double> logp(n), h(n), lse(n);
  rl::forward(x.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, b.mask.data(), logp.data(), h.data(), lse.data());
  double l = 0;
  for (std::size_t r = 0; r < n; ++r) l += (with_logp ? g.g_logp[r] * logp[r] : 0) + (with_entropy ? g.g_entropy[r] * h[r] : 0);
  return l;
}

TEST(LogitsBackward, CentralFiniteDifferencesInDouble) {
  for (reco::index_t vocab : {7, 33})
    for (double tau : {0.6, 1.7})
      for (int which = 0; which < 3; ++which) {
        const bool with_logp = which != 1, with_entropy = which != 0;
        SCOPED_TRACE("V=" + std::to_string(vocab) + " tau=" + std::to_string(tau) + " logp=" + std::to_string(with_logp) +
                     " entropy=" + std::to_string(with_entropy));
        batch_options o;
        o.mask_every = 3;
        o.neg_inf_fraction = 0.25;
        o.pad = 2;
        auto b = make_batch<double>(6, vocab, 100 + vocab, o);
        const auto g = make_upstream(b.rows, 7);
        const auto grad = run_backward(b, tau, g, with_logp, with_entropy);
        const double step = 1e-5;
        int checked = 0, neg_inf_checked = 0;
        for (reco::index_t r = 0; r < b.rows; ++r)
          for (reco::index_t j = 0; j < b.stride; ++j) {
            const std::size_t i = static_cast<std::size_t>(r * b.stride + j);
            if (j >= vocab) {
              EXPECT_EQ(grad[i], -123.0) << "padding between rows was written";
              continue;
            }
            if (!b.mask[r]) {
              EXPECT_EQ(grad[i], 0.0) << "masked row " << r;
              EXPECT_FALSE(std::signbit(grad[i]));
              continue;
            }
            if (std::isinf(b.x[i])) {
              EXPECT_EQ(grad[i], 0.0) << "-inf logit (" << r << ", " << j << ")";
              ++neg_inf_checked;
              continue;
            }
            auto x = b.x;
            x[i] += step;
            const double up = objective(b, x, tau, g, with_logp, with_entropy);
            x[i] -= 2 * step;
            const double down = objective(b, x, tau, g, with_logp, with_entropy);
            const double fd = (up - down) / (2 * step);
            EXPECT_NEAR(grad[i], fd, 1e-7 * (1 + std::fabs(fd))) << "(" << r << ", " << j << ")";
            ++checked;
          }
        EXPECT_GT(checked, 0);
        EXPECT_GT(neg_inf_checked, 0);
      }
}

// Tolerance for dlogits relative to the row's gradient scale: the fp32 relative error of p_j is
// ~|log p_j| eps, and narrowing to bf16/fp16 adds 2^-9 / 2^-12 relative.
template <class T>
double backward_relative_tolerance() {
  if (std::is_same_v<T, double>) return 1e-11;
  if (std::is_same_v<T, float>) return 5e-6;
  if (std::is_same_v<T, reco::bf16_t>) return 1.0 / 256;
  return 1.0 / 1024;
}

template <class T>
class LogitsBackwardTyped : public ::testing::Test {};
using storage_types = ::testing::Types<float, double, reco::bf16_t, reco::f16_t>;
TYPED_TEST_SUITE(LogitsBackwardTyped, storage_types);

TYPED_TEST(LogitsBackwardTyped, MatchesReferenceFormula) {
  using T = TypeParam;
  const double rel = backward_relative_tolerance<T>();
  std::uint64_t seed = 40;
  for (reco::index_t vocab : {7, 1000, 32000})
    for (double tau : {1.0, 0.6, 1.7}) {
      SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(vocab) + " tau=" + std::to_string(tau));
      batch_options o;
      o.mask_every = 4;
      o.neg_inf_fraction = 0.15;
      const auto b = make_batch<T>(vocab > 1000 ? 6 : 12, vocab, seed++, o);
      const auto g = make_upstream(b.rows, seed);
      const auto grad = run_backward(b, tau, g, true, true);
      for (reco::index_t r = 0; r < b.rows; ++r) {
        const double* got = grad.data() + r * b.stride;
        if (!b.mask[r]) {
          for (reco::index_t j = 0; j < vocab; ++j) ASSERT_EQ(got[j], 0.0) << r;
          continue;
        }
        const auto x = b.row(r);
        const auto ref = reference_backward(x, b.tokens[r], tau, g.g_logp[r], g.g_entropy[r]);
        const auto fwd = reference_forward(x, b.tokens[r], tau);
        // Row scale: the size of the upstream terms before the probabilities multiply them.
        const double scale = (std::fabs(g.g_logp[r]) + std::fabs(g.g_entropy[r]) * (1 + fwd.entropy)) / tau;
        for (reco::index_t j = 0; j < vocab; ++j) {
          if (std::isinf(x[j])) {
            ASSERT_EQ(got[j], 0.0) << "-inf logit at (" << r << ", " << j << ")";
            continue;
          }
          ASSERT_NEAR(got[j], ref[j], rel * std::fabs(ref[j]) + 1e-2 * rel * scale) << "(" << r << ", " << j << ")";
        }
      }
    }
}

TYPED_TEST(LogitsBackwardTyped, InPlaceEqualsOutOfPlace) {
  using T = TypeParam;
  using A = rl::accum_t<T>;
  batch_options o;
  o.mask_every = 3;
  o.pad = 3;
  auto b = make_batch<T>(7, 5003, 9, o);
  const auto g = make_upstream(b.rows, 10);
  const auto gl = cast_all<A>(g.g_logp), gh = cast_all<A>(g.g_entropy);
  std::vector<A> logp(7), h(7), lse(7);
  rl::forward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), 1.3, b.mask.data(), logp.data(), h.data(), lse.data());
  std::vector<T> out_of_place(b.stored.size(), store_as<T>(-5.0));
  rl::backward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), 1.3, b.mask.data(), gl.data(), gh.data(),
               lse.data(), h.data(), out_of_place.data());
  std::vector<T> in_place = b.stored;
  rl::backward(in_place.data(), b.rows, b.vocab, b.stride, b.tokens.data(), 1.3, b.mask.data(), gl.data(), gh.data(),
               lse.data(), h.data(), in_place.data());
  for (reco::index_t r = 0; r < b.rows; ++r) {
    // Rows compare bit for bit; the padding keeps the input's values in place.
    EXPECT_EQ(0, std::memcmp(in_place.data() + r * b.stride, out_of_place.data() + r * b.stride, sizeof(T) * b.vocab)) << r;
    EXPECT_EQ(0, std::memcmp(in_place.data() + r * b.stride + b.vocab, b.stored.data() + r * b.stride + b.vocab, sizeof(T) * 3));
  }
}

TEST(LogitsBackward, GradientOfEachOutputAlone) {
  // Σ_j dlogp/dz_j = 0 and Σ_j dH/dz_j = 0 (softmax is shift invariant); the token entry of the
  // logp gradient is (1 - p_y)/τ.
  batch_options o;
  o.neg_inf_fraction = 0.2;
  const auto b = make_batch<double>(3, 300, 5, o);
  upstream g;
  g.g_logp.assign(3, 1.0);
  g.g_entropy.assign(3, 1.0);
  const double tau = 0.6;
  const auto d_logp = run_backward(b, tau, g, true, false);
  const auto d_h = run_backward(b, tau, g, false, true);
  for (reco::index_t r = 0; r < 3; ++r) {
    double s_logp = 0, s_h = 0;
    for (reco::index_t j = 0; j < 300; ++j) s_logp += d_logp[r * 300 + j], s_h += d_h[r * 300 + j];
    EXPECT_NEAR(s_logp, 0.0, 1e-13);
    EXPECT_NEAR(s_h, 0.0, 1e-13);
    const auto ref = reference_forward(b.row(r), b.tokens[r], tau);
    EXPECT_NEAR(d_logp[r * 300 + b.tokens[r]], (1 - std::exp(ref.logp)) / tau, 1e-13);
  }
}

TEST(LogitsBackward, MoreThan65535Rows) {
  batch_options o;
  o.mask_every = 6;
  o.neg_inf_fraction = 0.2;
  const auto b = make_batch<float>(70000, 8, 12, o);
  const auto g = make_upstream(b.rows, 13);
  const auto grad = run_backward(b, 1.25, g, true, true);
  double worst = 0;
  for (reco::index_t r = 0; r < b.rows; ++r) {
    if (!b.mask[r]) {
      for (int j = 0; j < 8; ++j) ASSERT_EQ(grad[r * 8 + j], 0.0);
      continue;
    }
    const auto ref = reference_backward(b.row(r), b.tokens[r], 1.25, g.g_logp[r], g.g_entropy[r]);
    for (int j = 0; j < 8; ++j) worst = std::max(worst, std::fabs(grad[r * 8 + j] - ref[j]));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(LogitsBackward, NaNLseGivesNaNRow) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f};
  const std::int64_t token = 0;
  const float g = 1.0f, lse = std::numeric_limits<float>::quiet_NaN(), h = 0.5f;
  std::vector<float> d(3);
  rl::backward(x.data(), 1, 3, 3, &token, 1.0, nullptr, &g, &g, &lse, &h, d.data());
  for (float v : d) EXPECT_TRUE(std::isnan(v));
}

template <class F>
std::string argument_of(F&& f) {
  try {
    f();
  } catch (const reco::error& e) {
    return e.argument();
  }
  return "<no error>";
}

TEST(LogitsBackwardErrors, NamesTheArgument) {
  auto b = make_batch<float>(3, 10, 31);
  std::vector<float> logp(3), h(3), lse(3), g(3, 1.0f), d(30);
  rl::forward(b.stored.data(), 3, 10, 10, b.tokens.data(), 1.0, nullptr, logp.data(), h.data(), lse.data());
  auto call = [&](const std::int64_t* tokens, const float* gl, const float* gh, const float* l, const float* ent,
                  float* out) {
    return argument_of([&] { rl::backward(b.stored.data(), 3, 10, 10, tokens, 1.0, nullptr, gl, gh, l, ent, out); });
  };
  auto bad = b.tokens;
  bad[1] = 10;
  EXPECT_EQ(call(bad.data(), g.data(), g.data(), lse.data(), h.data(), d.data()), "tokens");
  bad[1] = -3;
  EXPECT_EQ(call(bad.data(), g.data(), g.data(), lse.data(), h.data(), d.data()), "tokens");
  EXPECT_EQ(call(nullptr, g.data(), g.data(), lse.data(), h.data(), d.data()), "tokens");
  EXPECT_EQ(call(b.tokens.data(), g.data(), g.data(), nullptr, h.data(), d.data()), "lse");
  EXPECT_EQ(call(b.tokens.data(), g.data(), g.data(), lse.data(), nullptr, d.data()), "entropy");
  EXPECT_EQ(call(b.tokens.data(), g.data(), g.data(), lse.data(), h.data(), nullptr), "dlogits");
  EXPECT_EQ(argument_of([&] {
              rl::backward(b.stored.data(), 3, 10, 10, b.tokens.data(), 0.0, nullptr, g.data(), g.data(), lse.data(),
                           h.data(), d.data());
            }),
            "temperature");
  // Without grad_logp the tokens are not needed; without grad_entropy the entropy is not.
  EXPECT_EQ(call(nullptr, nullptr, g.data(), lse.data(), h.data(), d.data()), "<no error>");
  EXPECT_EQ(call(b.tokens.data(), g.data(), nullptr, lse.data(), nullptr, d.data()), "<no error>");
}

}  // namespace
