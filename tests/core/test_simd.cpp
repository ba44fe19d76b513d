// The vectorised token pass of the CPU backend (reco/backend/cpu/simd.hpp, packed_tokens in
// reco/backend/cpu/packed_tokens.hpp): its exponentials against libm, every component's pack math
// against its double math lane by lane, the packed objective against the scalar one, invalid
// lanes that must never change a result, and the scalar fallback for double-only components.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/random_batch.hpp"
#include "reco/reco.hpp"

#if RECO_SIMD

namespace {

using reco::index_t;
using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::master_batch;
using reco_test::typed_batch;

constexpr int W = reco::simd::width;
using P = reco::simd::pack<W>;

// |got - want| in units in the last place of want (subnormal spacing below the normal range).
double ulps(double got, long double want) {
  const double w = static_cast<double>(want);
  if (std::isnan(got) || std::isnan(w)) return std::isnan(got) && std::isnan(w) ? 0 : 1e300;
  if (std::isinf(got) || std::isinf(w)) return got == w ? 0 : 1e300;
  const double a = std::fabs(w);
  const double ulp = a < std::numeric_limits<double>::min() ? std::numeric_limits<double>::denorm_min()
                                                            : std::nextafter(a, INFINITY) - a;
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

// exp and expm1 of n values (n a multiple of W) at the unit's own width.
void exp_pair(const double* x, double* e, double* em1, int n) {
  for (int k = 0; k < n; k += W) {
    const reco::simd::exp_parts<W> parts = reco::simd::reduce_exp(reco::simd::load<W>(x + k));
    reco::simd::store<W>(e + k, reco::simd::exp_from(parts));
    reco::simd::store<W>(em1 + k, reco::simd::expm1_from(parts));
  }
}

#if RECO_SIMD_DISPATCH
// The same compiled as the dispatched variants are (wider packs, FMA).
RECO_SIMD_TARGET_AVX512 void exp_pair_avx512(const double* x, double* e, double* em1, int n) {
  for (int k = 0; k < n; k += 8) {
    const reco::simd::exp_parts<8> parts = reco::simd::reduce_exp(reco::simd::load<8>(x + k));
    reco::simd::store<8>(e + k, reco::simd::exp_from(parts));
    reco::simd::store<8>(em1 + k, reco::simd::expm1_from(parts));
  }
}
#if RECO_SIMD_DISPATCH_AVX2
RECO_SIMD_TARGET_AVX2 void exp_pair_avx2(const double* x, double* e, double* em1, int n) {
  for (int k = 0; k < n; k += 4) {
    const reco::simd::exp_parts<4> parts = reco::simd::reduce_exp(reco::simd::load<4>(x + k));
    reco::simd::store<4>(e + k, reco::simd::exp_from(parts));
    reco::simd::store<4>(em1 + k, reco::simd::expm1_from(parts));
  }
}
#endif
#endif

std::vector<double> exp_arguments() {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x;
  for (double scale : {1e-300, 1e-12, 1e-6, 0.01, 0.35, 0.7, 3.0, 25.0, 100.0, 745.0}) {
    for (int k = 0; k < 20000; ++k) x.push_back(scale * u(rng));
  }
  for (int k = 0; k < 4000; ++k) x.push_back(-708.0 - 38.0 * std::fabs(u(rng)));  // subnormal results
  for (int k = 0; k < 4000; ++k) x.push_back(709.0 + std::fabs(u(rng)));          // overflow threshold
  const double inf = std::numeric_limits<double>::infinity();
  for (double s : {0.0, -0.0, 709.78, 709.79, 710.0, 800.0, -745.13, -745.14, -746.0, -800.0, inf, -inf,
                   std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
                   -std::numeric_limits<double>::denorm_min(), 0.5 * std::log(2.0), -0.5 * std::log(2.0)})
    x.push_back(s);
  while (x.size() % 8 != 0) x.push_back(1.0);
  return x;
}

void check_exp(void (*fn)(const double*, double*, double*, int), const std::string& name) {
  const std::vector<double> x = exp_arguments();
  const int n = static_cast<int>(x.size());
  std::vector<double> e(x.size()), em1(x.size());
  fn(x.data(), e.data(), em1.data(), n);
  double worst_e = 0, worst_m = 0;
  for (int k = 0; k < n; ++k) {
    worst_e = std::max(worst_e, ulps(e[k], expl(static_cast<long double>(x[k]))));
    worst_m = std::max(worst_m, ulps(em1[k], expm1l(static_cast<long double>(x[k]))));
    ASSERT_LE(ulps(e[k], expl(static_cast<long double>(x[k]))), 2.0) << name << " exp(" << x[k] << ")";
    ASSERT_LE(ulps(em1[k], expm1l(static_cast<long double>(x[k]))), 3.0) << name << " expm1(" << x[k] << ")";
  }
  ::testing::Test::RecordProperty(name + "_exp_worst_ulp", std::to_string(worst_e));
  ::testing::Test::RecordProperty(name + "_expm1_worst_ulp", std::to_string(worst_m));
}

TEST(Simd, ExpAndExpm1MatchLibm) {
#if RECO_SIMD_DISPATCH && !RECO_SIMD_DISPATCH_AVX512
  // A build without the AVX-512 variant (RECO_NO_SIMD_AVX512) never picks it.
  EXPECT_NE(reco::simd::dispatch(), reco::simd::level::avx512);
#endif
  check_exp(exp_pair, "unit width");
#if RECO_SIMD_DISPATCH
  if (reco::simd::dispatch() == reco::simd::level::avx512) check_exp(exp_pair_avx512, "avx512");
#if RECO_SIMD_DISPATCH_AVX2
  if (reco::simd::dispatch() != reco::simd::level::baseline) check_exp(exp_pair_avx2, "avx2");
#endif
#endif
}

TEST(Simd, BernoulliVarianceMatchesScalar) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int k = 0; k < 40000; k += W) {
    double x[W];
    for (double& v : x) {
      const double r = u(rng);
      v = r < 0.2 ? -1e-9 * u(rng) : (r < 0.4 ? -std::ldexp(u(rng), -(static_cast<int>(u(rng) * 50))) : -30.0 * u(rng));
    }
    x[0] = k == 0 ? 0.0 : x[0];
    x[W - 1] = k == W ? -800.0 : x[W - 1];
    for (double floor : {0.0, 1e-12}) {
      const P got = reco::detail::bernoulli_variance(reco::simd::load<W>(x), floor);
      for (int j = 0; j < W; ++j) {
        const double want = reco::detail::bernoulli_variance(x[j], floor);
        ASSERT_LE(ulps(got[j], want), 4.0) << "logq " << x[j] << " floor " << floor;
      }
    }
  }
}

// ---- the components, lane by lane ----------------------------------------------------------------

struct lane_inputs {
  double logp[W], old_logp[W], ref_logp[W], entropy[W];
};

lane_inputs random_lanes(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> g(0.0, 1.0);
  lane_inputs in;
  for (int j = 0; j < W; ++j) {
    const double r = u(rng);
    double lp = r < 0.1 ? 0.0 : (r < 0.2 ? -1e-9 * u(rng) : -8.0 * u(rng) * u(rng));
    double shift = 0.3 * g(rng);
    if (u(rng) < 0.05) shift = 40.0 * g(rng);  // clamps bite
    in.logp[j] = lp;
    in.old_logp[j] = std::min(lp + shift, 0.0);
    in.ref_logp[j] = std::min(lp + (u(rng) < 0.05 ? 30.0 : 0.2) * g(rng), 0.0);
    in.entropy[j] = 3.0 * u(rng);
  }
  return in;
}

template <class Obj>
void expect_surrogates_agree(const Obj& obj, const std::string& name) {
  std::mt19937_64 rng(11);
  for (double advantage : {-1.3, 0.0, 0.7}) {
    for (double seq : {-0.3, 0.2, 11.0}) {
      for (int rep = 0; rep < 200; ++rep) {
        const lane_inputs in = random_lanes(rng);
        reco::basic_token_context<P> c;
        c.logp = reco::simd::load<W>(in.logp);
        c.old_logp = reco::simd::load<W>(in.old_logp);
        c.entropy = reco::simd::load<W>(in.entropy);
        c.advantage = advantage;
        c.sequence_log_ratio = seq;
        c.entropy_quantile = 1.5;
        const reco::basic_surrogate_value<P> sp = reco::detail::policy_surrogate(obj, c);
        for (int j = 0; j < W; ++j) {
          reco::token_context s;
          s.logp = in.logp[j];
          s.old_logp = in.old_logp[j];
          s.entropy = in.entropy[j];
          s.advantage = advantage;
          s.sequence_log_ratio = seq;
          s.entropy_quantile = 1.5;
          const reco::surrogate_value sv = reco::detail::policy_surrogate(obj, s);
          const std::string at = name + ": A " + std::to_string(advantage) + ", logp " + std::to_string(s.logp) +
                                 ", old " + std::to_string(s.old_logp);
          // Relative, plus an absolute floor at the scale of A x for SAPO's 1 - sigmoid, which
          // cancels (in both paths) when the sigmoid is near 1.
          const double floor = 1e-14 * (1 + std::fabs(sv.x)) * (1 + std::fabs(advantage));
          auto near = [&](double a, double b) { return std::fabs(a - b) <= 1e-13 * std::fabs(b) + floor; };
          ASSERT_TRUE(near(sp.x[j], sv.x)) << at << ": x " << sp.x[j] << " vs " << sv.x;
          ASSERT_TRUE(near(sp.loss[j], sv.loss)) << at << ": loss " << sp.loss[j] << " vs " << sv.loss;
          ASSERT_TRUE(near(sp.grad[j], sv.grad)) << at << ": grad " << sp.grad[j] << " vs " << sv.grad;
          ASSERT_EQ(sp.clipped.v[j] != 0, sv.clipped) << at;
          ASSERT_EQ(sp.dual.v[j] != 0, sv.dual) << at;
        }
      }
    }
  }
}

template <class Ratio, class Clip = reco::ppo_clip>
using obj_t = reco::objective<reco::grpo_advantage, Ratio, Clip, reco::uniform_weight, reco::token_mean>;

TEST(Simd, RatioFormsAndClipsMatchScalarLaneByLane) {
  for (double clamp : {20.0, 0.25, 0.0}) {
    obj_t<reco::token_ratio> o;
    o.ratio.params.log_ratio_clamp = clamp;
    expect_surrogates_agree(o, "token ratio, clamp " + std::to_string(clamp));
    obj_t<reco::variance_ratio> v;
    v.ratio.params.log_ratio_clamp = clamp;
    expect_surrogates_agree(v.prepared(), "variance ratio, clamp " + std::to_string(clamp));
    obj_t<reco::flipped_ratio> f;
    f.ratio.params.log_ratio_clamp = clamp;
    expect_surrogates_agree(f, "flipped ratio, clamp " + std::to_string(clamp));
    f.ratio.params.flip_all = true;
    expect_surrogates_agree(f, "flipped ratio (all), clamp " + std::to_string(clamp));
    obj_t<reco::cispo_ratio, reco::no_clip> ci;
    ci.ratio.params.log_ratio_clamp = clamp;
    ci.ratio.params.eps_low = 0.1;
    ci.ratio.params.eps_high = 0.15;
    expect_surrogates_agree(ci, "cispo, clamp " + std::to_string(clamp));
    obj_t<reco::sapo_ratio, reco::no_clip> sa;
    sa.ratio.params.log_ratio_clamp = clamp;
    expect_surrogates_agree(sa, "sapo, clamp " + std::to_string(clamp));
    obj_t<reco::reinforce_ratio, reco::no_clip> re;
    re.ratio.params.log_ratio_clamp = clamp;
    expect_surrogates_agree(re, "reinforce, clamp " + std::to_string(clamp));
  }
  expect_surrogates_agree(obj_t<reco::sequence_ratio>{}, "sequence ratio");
  obj_t<reco::gmpo_ratio, reco::no_clip> gm;
  gm.ratio.params.eps_low = 0.1;
  gm.ratio.params.eps_high = 0.05;
  expect_surrogates_agree(gm, "gmpo");
  expect_surrogates_agree(obj_t<reco::variance_ratio, reco::no_clip>{}.prepared(), "variance ratio, no clip");
  for (auto mode : {reco::dual_clip_mode::off, reco::dual_clip_mode::hard, reco::dual_clip_mode::soft}) {
    const std::string m = std::to_string(static_cast<int>(mode));
    obj_t<reco::token_ratio> o;
    o.clip.params.eps_low = 0.1;
    o.clip.params.eps_high = 0.28;
    o.clip.params.dual_clip = mode;
    o.clip.params.dual_clip_c = 1.3;
    expect_surrogates_agree(o, "ppo clip, dual mode " + m);
    obj_t<reco::flipped_ratio> f;
    f.clip.params = o.clip.params;
    expect_surrogates_agree(f, "flipped + ppo clip, dual mode " + m);
    obj_t<reco::token_ratio, reco::entropy_split_clip> es;
    es.clip.params.dual_clip = mode;
    es.clip.params.dual_clip_c = 1.4;
    expect_surrogates_agree(es, "entropy split clip, dual mode " + m);
  }
}

TEST(Simd, KlEstimatorsMatchScalarLaneByLane) {
  std::mt19937_64 rng(5);
  for (auto est : {reco::kl_estimator::k1, reco::kl_estimator::abs, reco::kl_estimator::k2, reco::kl_estimator::k3}) {
    for (bool clamp : {true, false}) {
      for (bool st : {false, true}) {
        reco::kl_penalty kl;
        kl.params.estimator = est;
        kl.params.clamp = clamp;
        kl.params.straight_through = st;
        for (int rep = 0; rep < 2000; ++rep) {
          lane_inputs in = random_lanes(rng);
          if (rep == 0) in.ref_logp[0] = in.logp[0];  // d = 0
          if (rep == 1) in.ref_logp[0] = in.logp[0] - 1e-9;
          const reco::basic_kl_value<P> kp =
              kl.estimate(reco::simd::load<W>(in.logp), reco::simd::load<W>(in.ref_logp));
          for (int j = 0; j < W; ++j) {
            const reco::kl_value ks = kl.eval(in.logp[j], in.ref_logp[j]);
            // k3's value is expm1(e) - e: a few ulps of expm1(e) relative to e^2 / 2 for small e.
            const double e = in.ref_logp[j] - in.logp[j];
            const double tol_v = 1e-13 * std::fabs(ks.value) + 4e-16 * std::fabs(e);
            ASSERT_NEAR(kp.value[j], ks.value, tol_v) << "estimator " << static_cast<int>(est) << " d " << -e;
            ASSERT_NEAR(kp.grad[j], ks.grad, 1e-13 * std::fabs(ks.grad) + 1e-300)
                << "estimator " << static_cast<int>(est) << " d " << -e;
          }
        }
      }
    }
  }
}

// ---- packs of floats (float inputs) against the double math on the same float inputs ------------
//
// The bounds of docs/conventions.md, "Precision", in units of u = 2^-24.

constexpr int FL = 2 * W;
using FP = reco::simd::fpack<FL>;
const double unit = std::ldexp(1.0, -24);

// |got - want| / |want|, in units of u (0 when both are 0; huge when only one is NaN or inf).
double rel_u(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want) ? 0 : 1e300;
  if (std::isinf(got) || std::isinf(want)) return got == want ? 0 : 1e300;
  if (want == 0) return got == 0 ? 0 : 1e300;
  return std::fabs(got - want) / std::fabs(want) / unit;
}

// exp, expm1 and expm1(x) - x of n floats (n a multiple of L) at L lanes.
template <int L>
RECO_SIMD_INLINE void fexp_lanes(const float* x, float* e, float* em1, float* excess, int n) {
  using Q = reco::simd::fpack<L>;
  for (int k = 0; k < n; k += L) {
    const Q v = reco::simd::fload<L>(x + k);
    reco::simd::fstore<L>(e + k, reco::simd::exp(v));
    Q m;
    const Q ex = reco::detail::lanes<Q>::expm1_excess(v, m);
    reco::simd::fstore<L>(em1 + k, m);
    reco::simd::fstore<L>(excess + k, ex);
  }
}
void fexp_unit(const float* x, float* e, float* em1, float* excess, int n) { fexp_lanes<FL>(x, e, em1, excess, n); }
#if RECO_SIMD_DISPATCH_AVX512
RECO_SIMD_TARGET_AVX512 void fexp_avx512(const float* x, float* e, float* em1, float* excess, int n) {
  fexp_lanes<16>(x, e, em1, excess, n);
}
#endif
#if RECO_SIMD_DISPATCH_AVX2
RECO_SIMD_TARGET_AVX2 void fexp_avx2(const float* x, float* e, float* em1, float* excess, int n) {
  fexp_lanes<8>(x, e, em1, excess, n);
}
#endif

void check_fexp(void (*fn)(const float*, float*, float*, float*, int), const std::string& name) {
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> x;
  for (double scale : {1e-30, 1e-7, 1e-3, 0.1, 0.35, 0.7, 3.0, 20.0, 88.0}) {
    for (int k = 0; k < 20000; ++k) x.push_back(static_cast<float>(scale * u(rng)));
  }
  for (int k = 0; k < 4000; ++k) x.push_back(static_cast<float>(-87.0 - 16.0 * std::fabs(u(rng))));  // subnormal
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f, -0.0f, 88.72f, 88.73f, 89.0f, 100.0f, -103.9f, -104.0f, -200.0f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), 0.34657359f, -0.34657359f, 0.34657360f})
    x.push_back(s);
  while (x.size() % 16 != 0) x.push_back(1.0f);
  const int n = static_cast<int>(x.size());
  std::vector<float> e(x.size()), em1(x.size()), ex(x.size());
  fn(x.data(), e.data(), em1.data(), ex.data(), n);
  const double smallest = std::numeric_limits<float>::min();
  for (int k = 0; k < n; ++k) {
    const long double xd = x[k];
    const double we = static_cast<double>(expl(xd)), wm = static_cast<double>(expm1l(xd));
    const double wx = static_cast<double>(expm1l(xd) - xd);
    const std::string at = name + " x = " + std::to_string(x[k]);
    // Results below the normal range are subnormals: one spacing (2^-149) absolute there.
    if (std::fabs(we) < smallest) {
      ASSERT_LE(std::fabs(e[k] - we), std::ldexp(1.0, -149)) << at;
    } else if (we > std::numeric_limits<float>::max()) {
      ASSERT_TRUE(std::isinf(e[k])) << at;
    } else {
      ASSERT_LE(rel_u(e[k], we), 2.0) << at << " exp " << e[k] << " vs " << we;
    }
    if (std::fabs(wm) >= smallest && std::fabs(wm) <= std::numeric_limits<float>::max()) {
      ASSERT_LE(rel_u(em1[k], wm), 3.0) << at << " expm1 " << em1[k] << " vs " << wm;
    }
    if (std::fabs(wx) >= smallest && std::fabs(wx) <= std::numeric_limits<float>::max()) {
      ASSERT_LE(rel_u(ex[k], wx), 16.0) << at << " expm1(x) - x " << ex[k] << " vs " << wx;
    }
  }
}

TEST(SimdFloat, ExpExpm1AndExcessWithinTheirBounds) {
  check_fexp(fexp_unit, "unit width");
#if RECO_SIMD_DISPATCH_AVX512
  if (reco::simd::dispatch() == reco::simd::level::avx512) check_fexp(fexp_avx512, "avx512");
#endif
#if RECO_SIMD_DISPATCH_AVX2
  if (reco::simd::dispatch() != reco::simd::level::baseline) check_fexp(fexp_avx2, "avx2");
#endif
}

// The forms for arguments a caller keeps within |x| <= 64 (no range clamp; expm1 with one power
// of two) against the general ones: the same bits, float and double packs; and the float token
// variance at each width against the double one.
template <int L, int D>
RECO_SIMD_INLINE int within_mismatches(const float* x, int n) {
  using Q = reco::simd::fpack<L>;
  using DP = reco::simd::pack<D>;
  int bad = 0;
  for (int k = 0; k < n; k += L) {
    const Q v = reco::simd::fload<L>(x + k);
    Q m, m_within;
    const Q ex = reco::detail::lanes<Q>::expm1_excess(v, m);
    const Q ex_within = reco::detail::vexpm1_excess_within(v, m_within);
    float got[6][L];
    reco::simd::fstore<L>(got[0], reco::simd::exp(v));
    reco::simd::fstore<L>(got[1], reco::detail::vexp_within(v));
    reco::simd::fstore<L>(got[2], m);
    reco::simd::fstore<L>(got[3], m_within);
    reco::simd::fstore<L>(got[4], ex);
    reco::simd::fstore<L>(got[5], ex_within);
    for (int f = 0; f < 6; f += 2) bad += std::memcmp(got[f], got[f + 1], sizeof(got[f])) != 0;
    for (int h = 0; h < L; h += D) {
      double d[D], de[D], de_within[D];
      for (int j = 0; j < D; ++j) d[j] = static_cast<double>(x[k + h + j]) * 1.0000001;
      const DP dv = reco::simd::load<D>(d);
      reco::simd::store<D>(de, reco::simd::exp(dv));
      reco::simd::store<D>(de_within, reco::detail::vexp_within(dv));
      bad += std::memcmp(de, de_within, sizeof(de)) != 0;
    }
  }
  return bad;
}
template <int L>
RECO_SIMD_INLINE void float_variance(const float* x, float* v, int n, double floor) {
  for (int k = 0; k < n; k += L)
    reco::simd::fstore<L>(v + k, reco::detail::bernoulli_variance(reco::simd::fload<L>(x + k), floor));
}
int within_unit(const float* x, int n) { return within_mismatches<FL, W>(x, n); }
void variance_unit(const float* x, float* v, int n, double floor) { float_variance<FL>(x, v, n, floor); }
#if RECO_SIMD_DISPATCH_AVX512
RECO_SIMD_TARGET_AVX512 int within_avx512(const float* x, int n) { return within_mismatches<16, 8>(x, n); }
RECO_SIMD_TARGET_AVX512 void variance_avx512(const float* x, float* v, int n, double floor) {
  float_variance<16>(x, v, n, floor);
}
#endif
#if RECO_SIMD_DISPATCH_AVX2
RECO_SIMD_TARGET_AVX2 int within_avx2(const float* x, int n) { return within_mismatches<8, 4>(x, n); }
RECO_SIMD_TARGET_AVX2 void variance_avx2(const float* x, float* v, int n, double floor) {
  float_variance<8>(x, v, n, floor);
}
#endif

TEST(SimdFloat, ExpWithinBoundsGivesTheClampedFormsBits) {
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> x;
  for (double scale : {1e-20, 1e-4, 0.3, 0.35, 1.0, 5.0, 20.0, 40.0, 64.0}) {
    for (int k = 0; k < 8000; ++k) x.push_back(static_cast<float>(scale * u(rng)));
  }
  for (float s : {0.0f, -0.0f, 20.0f, -20.0f, 64.0f, -64.0f, 0.34657359f, -0.34657359f}) x.push_back(s);
  while (x.size() % 16 != 0) x.push_back(1.0f);
  const int n = static_cast<int>(x.size());
  EXPECT_EQ(within_unit(x.data(), n), 0) << "unit width";
#if RECO_SIMD_DISPATCH_AVX512
  if (reco::simd::dispatch() == reco::simd::level::avx512) {
    EXPECT_EQ(within_avx512(x.data(), n), 0) << "avx512";
  }
#endif
#if RECO_SIMD_DISPATCH_AVX2
  if (reco::simd::dispatch() != reco::simd::level::baseline) {
    EXPECT_EQ(within_avx2(x.data(), n), 0) << "avx2";
  }
#endif
}

void check_float_variance(void (*fn)(const float*, float*, int, double), const std::string& name) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> x;
  for (int k = 0; k < 40000; ++k) {
    const double r = u(rng);
    x.push_back(static_cast<float>(r < 0.2 ? -1e-6 * u(rng)
                                           : (r < 0.4 ? -std::ldexp(u(rng), -static_cast<int>(u(rng) * 30))
                                                      : (r < 0.95 ? -100.0 * u(rng) : -1e4 * u(rng)))));
  }
  for (float s : {0.0f, -0.0f, -0.34657359f, -0.6931472f, -87.3f, -103.0f, -104.0f, -150.0f, -3e38f}) x.push_back(s);
  while (x.size() % 16 != 0) x.push_back(-1.0f);
  const int n = static_cast<int>(x.size());
  std::vector<float> v(x.size());
  const double smallest = std::numeric_limits<float>::min();
  for (double floor : {0.0, 1e-40, 1e-12}) {
    fn(x.data(), v.data(), n, floor);
    for (int j = 0; j < n; ++j) {
      const double want = std::max(reco::detail::bernoulli_variance(static_cast<double>(x[j]), 0.0), std::max(floor, smallest));
      ASSERT_LE(rel_u(v[j], want), 4.0) << name << " logq " << x[j] << " floor " << floor;
    }
  }
}

TEST(SimdFloat, BernoulliVarianceAtEachWidth) {
  check_float_variance(variance_unit, "unit width");
#if RECO_SIMD_DISPATCH_AVX512
  if (reco::simd::dispatch() == reco::simd::level::avx512) check_float_variance(variance_avx512, "avx512");
#endif
#if RECO_SIMD_DISPATCH_AVX2
  if (reco::simd::dispatch() != reco::simd::level::baseline) check_float_variance(variance_avx2, "avx2");
#endif
}

// The token pass's deferred log-probability check (simd::log_probability_keys) at each width: a
// pack fails exactly when a lane holds what is not a log-probability (NaN of either sign, +-inf,
// a value above 0), whichever lane and whatever the other lanes hold (+0, -0, -max among them).
template <class X>
std::vector<X> key_cases() {
  using U = std::conditional_t<sizeof(X) == 4, std::uint32_t, std::uint64_t>;
  constexpr int shift = 8 * sizeof(X) - 1;
  const U sign = U(1) << shift, exponent = sizeof(X) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  std::vector<X> v = {X(0), -X(0), -std::numeric_limits<X>::max(), X(-1), X(-0.5),
                      -std::numeric_limits<X>::min(), -std::numeric_limits<X>::denorm_min(),
                      std::numeric_limits<X>::denorm_min(), std::numeric_limits<X>::min(), X(1e-30), X(0.5),
                      std::numeric_limits<X>::max(), std::numeric_limits<X>::infinity(),
                      -std::numeric_limits<X>::infinity(), std::numeric_limits<X>::quiet_NaN(),
                      -std::numeric_limits<X>::quiet_NaN()};
  for (U bits : {exponent + 1, sign | (exponent + 1), ~U(0), ~U(0) >> 1, sign | 1, U(1)}) {
    X x;
    std::memcpy(&x, &bits, sizeof x);
    v.push_back(x);
  }
  return v;
}
template <class Pack>
struct key_load;
template <int L>
struct key_load<reco::simd::fpack<L>> {
  static RECO_SIMD_INLINE reco::simd::fpack<L> from(const float* x) { return reco::simd::fload<L>(x); }
};
template <int D>
struct key_load<reco::simd::pack<D>> {
  static RECO_SIMD_INLINE reco::simd::pack<D> from(const double* x) { return reco::simd::load<D>(x); }
};
template <class X, class Pack, int N>
RECO_SIMD_INLINE int key_errors() {
  int bad = 0;
  const std::vector<X> cases = key_cases<X>();
  const X others[] = {X(0), -X(0), -std::numeric_limits<X>::max(), X(-2)};
  for (const X c : cases) {
    const bool want = !(c <= X(0) && c >= -std::numeric_limits<X>::max());
    for (int j = 0; j < N; ++j)
      for (const X other : others) {
        X lanes[N];
        for (int k = 0; k < N; ++k) lanes[k] = k % 2 ? other : X(-0.25);
        lanes[j] = c;
        reco::simd::log_probability_keys<Pack> keys;
        X valid[N];
        for (int k = 0; k < N; ++k) valid[k] = other;
        keys.add(key_load<Pack>::from(valid));  // a valid pack before, as in a pass
        keys.add(key_load<Pack>::from(lanes));
        bad += keys.failed() != want;
      }
  }
  return bad;
}
template <int L, int D>
RECO_SIMD_INLINE int log_probability_key_errors() {
  return key_errors<float, reco::simd::fpack<L>, L>() + key_errors<double, reco::simd::pack<D>, D>();
}
int keys_unit() { return log_probability_key_errors<FL, W>(); }
#if RECO_SIMD_DISPATCH_AVX512
RECO_SIMD_TARGET_AVX512 int keys_avx512() { return log_probability_key_errors<16, 8>(); }
#endif
#if RECO_SIMD_DISPATCH_AVX2
RECO_SIMD_TARGET_AVX2 int keys_avx2() { return log_probability_key_errors<8, 4>(); }
#endif

TEST(Simd, LogProbabilityKeysFailExactlyOnWhatIsNotALogProbability) {
  EXPECT_EQ(keys_unit(), 0) << "unit width";
#if RECO_SIMD_DISPATCH_AVX512
  if (reco::simd::dispatch() == reco::simd::level::avx512) {
    EXPECT_EQ(keys_avx512(), 0) << "avx512";
  }
#endif
#if RECO_SIMD_DISPATCH_AVX2
  if (reco::simd::dispatch() != reco::simd::level::baseline) {
    EXPECT_EQ(keys_avx2(), 0) << "avx2";
  }
#endif
}

TEST(SimdFloat, BernoulliVarianceWithinItsBoundAndFloored) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double smallest = std::numeric_limits<float>::min();
  for (int k = 0; k < 40000; k += FL) {
    float x[FL];
    for (float& v : x) {
      const double r = u(rng);
      v = static_cast<float>(r < 0.2 ? -1e-6 * u(rng)
                                     : (r < 0.4 ? -std::ldexp(u(rng), -(static_cast<int>(u(rng) * 30))) : -100.0 * u(rng)));
    }
    x[0] = k == 0 ? 0.0f : x[0];
    for (double floor : {0.0, 1e-40, 1e-12}) {
      const FP got = reco::detail::bernoulli_variance(reco::simd::fload<FL>(x), floor);
      for (int j = 0; j < FL; ++j) {
        const double f = std::max(floor, smallest);  // the float floor is at least 2^-126
        const double want = std::max(reco::detail::bernoulli_variance(static_cast<double>(x[j]), 0.0), f);
        ASSERT_LE(rel_u(got[j], want), 4.0) << "logq " << x[j] << " floor " << floor;
      }
    }
  }
}

// The float inputs of random_lanes: each lane's values rounded to float.
struct float_lanes {
  float logp[FL], old_logp[FL], ref_logp[FL], entropy[FL];
};
float_lanes random_float_lanes(std::mt19937_64& rng) {
  float_lanes f;
  for (int half = 0; half < 2; ++half) {
    const lane_inputs in = random_lanes(rng);
    for (int j = 0; j < W; ++j) {
      f.logp[half * W + j] = static_cast<float>(in.logp[j]);
      f.old_logp[half * W + j] = static_cast<float>(in.old_logp[j]);
      f.ref_logp[half * W + j] = static_cast<float>(in.ref_logp[j]);
      f.entropy[half * W + j] = static_cast<float>(in.entropy[j]);
    }
  }
  return f;
}

// A component's float pack math against its double math on the same float inputs: x, loss and
// gradient weight within (16 + |l|) u of the double values (the table's bounds for each form, and
// a margin for the forms it does not list), plus an absolute floor of 4u at the scale of A x (SAPO's
// 1 - sigmoid cancels near 1). A token whose ratio sits within that bound of a threshold may take
// the other branch: at most one in 10,000 lanes may.
template <class Obj>
void expect_float_surrogates_within_bound(const Obj& obj, const std::string& name) {
  std::mt19937_64 rng(11);
  int lanes = 0, flips = 0;
  for (double advantage : {-1.3, 0.0, 0.7}) {
    for (double seq : {-0.3, 0.2, 11.0}) {
      for (int rep = 0; rep < 100; ++rep) {
        const float_lanes in = random_float_lanes(rng);
        reco::basic_token_context<FP> c;
        c.logp = reco::simd::fload<FL>(in.logp);
        c.old_logp = reco::simd::fload<FL>(in.old_logp);
        c.entropy = reco::simd::fload<FL>(in.entropy);
        c.advantage = advantage;
        c.sequence_log_ratio = seq;
        c.entropy_quantile = 1.5;
        const reco::basic_surrogate_value<FP> sp = reco::detail::policy_surrogate(obj, c);
        for (int j = 0; j < FL; ++j) {
          reco::token_context s;
          s.logp = in.logp[j];
          s.old_logp = in.old_logp[j];
          s.entropy = in.entropy[j];
          s.advantage = advantage;
          s.sequence_log_ratio = seq;
          s.entropy_quantile = 1.5;
          const reco::surrogate_value sv = reco::detail::policy_surrogate(obj, s);
          ++lanes;
          if ((sp.clipped.v[j] != 0) != sv.clipped || (sp.dual.v[j] != 0) != sv.dual) {
            ++flips;
            continue;
          }
          // Beyond float's range (no clamp, l > 88.7) the float ratio is inf, as double's is
          // beyond 709.
          if (std::fabs(sv.x) > std::numeric_limits<float>::max()) {
            ASSERT_TRUE(std::isinf(sp.x[j])) << name << ": x " << sp.x[j] << " vs " << sv.x;
            continue;
          }
          const double l = std::fabs(s.logp - s.old_logp);  // (beyond a clamp's L: only exp's own error)
          const double rel = (16 + l) * unit;
          const double floor = 4 * unit * (1 + std::fabs(sv.x)) * (1 + std::fabs(advantage));
          auto near = [&](double a, double b) { return std::fabs(a - b) <= rel * std::fabs(b) + floor; };
          const std::string at = name + ": A " + std::to_string(advantage) + ", logp " + std::to_string(s.logp) +
                                 ", old " + std::to_string(s.old_logp);
          ASSERT_TRUE(near(sp.x[j], sv.x)) << at << ": x " << sp.x[j] << " vs " << sv.x;
          ASSERT_TRUE(near(sp.loss[j], sv.loss)) << at << ": loss " << sp.loss[j] << " vs " << sv.loss;
          ASSERT_TRUE(near(sp.grad[j], sv.grad)) << at << ": grad " << sp.grad[j] << " vs " << sv.grad;
        }
      }
    }
  }
  EXPECT_LE(flips, lanes / 10000) << name << ": branch decisions differing from double";
}

TEST(SimdFloat, RatioFormsAndClipsWithinTheBound) {
  for (double clamp : {20.0, 0.25, 0.0}) {
    obj_t<reco::token_ratio> o;
    o.ratio.params.log_ratio_clamp = clamp;
    expect_float_surrogates_within_bound(o, "token ratio, clamp " + std::to_string(clamp));
    obj_t<reco::variance_ratio> v;
    v.ratio.params.log_ratio_clamp = clamp;
    expect_float_surrogates_within_bound(v.prepared(), "variance ratio, clamp " + std::to_string(clamp));
    obj_t<reco::flipped_ratio> f;
    f.ratio.params.log_ratio_clamp = clamp;
    f.ratio.params.flip_all = true;
    expect_float_surrogates_within_bound(f, "flipped ratio (all), clamp " + std::to_string(clamp));
    obj_t<reco::cispo_ratio, reco::no_clip> ci;
    ci.ratio.params.log_ratio_clamp = clamp;
    expect_float_surrogates_within_bound(ci, "cispo, clamp " + std::to_string(clamp));
    obj_t<reco::sapo_ratio, reco::no_clip> sa;
    sa.ratio.params.log_ratio_clamp = clamp;
    expect_float_surrogates_within_bound(sa, "sapo, clamp " + std::to_string(clamp));
  }
  expect_float_surrogates_within_bound(obj_t<reco::gmpo_ratio, reco::no_clip>{}, "gmpo");
  for (auto div : {reco::dppo_divergence::tv, reco::dppo_divergence::binary_kl}) {
    obj_t<reco::dppo_ratio, reco::no_clip> d;
    d.ratio.params.divergence = div;
    expect_float_surrogates_within_bound(d, "dppo " + std::to_string(static_cast<int>(div)));
  }
  for (auto mode : {reco::dual_clip_mode::off, reco::dual_clip_mode::hard, reco::dual_clip_mode::soft}) {
    obj_t<reco::token_ratio> o;
    o.clip.params.dual_clip = mode;
    o.clip.params.dual_clip_c = 1.3;
    expect_float_surrogates_within_bound(o, "ppo clip, dual mode " + std::to_string(static_cast<int>(mode)));
    obj_t<reco::flipped_ratio> f;
    f.clip.params = o.clip.params;
    expect_float_surrogates_within_bound(f, "flipped + ppo clip (ASPO), dual mode " + std::to_string(static_cast<int>(mode)));
  }
}

TEST(SimdFloat, KlEstimatorsWithinTheBound) {
  std::mt19937_64 rng(5);
  for (auto est : {reco::kl_estimator::k1, reco::kl_estimator::abs, reco::kl_estimator::k2, reco::kl_estimator::k3}) {
    reco::kl_penalty kl;
    kl.params.estimator = est;
    int lanes = 0, flips = 0;
    for (int rep = 0; rep < 2000; ++rep) {
      float_lanes in = random_float_lanes(rng);
      if (rep == 0) in.ref_logp[0] = in.logp[0];  // d = 0
      if (rep == 1) in.ref_logp[1] = in.logp[1] - 1e-6f;
      const reco::basic_kl_value<FP> kp =
          kl.estimate(reco::simd::fload<FL>(in.logp), reco::simd::fload<FL>(in.ref_logp));
      for (int j = 0; j < FL; ++j) {
        const reco::kl_value ks = kl.eval(in.logp[j], in.ref_logp[j]);
        ++lanes;
        // A clamp edge (|e| = 20, k3 = 10) or the sign of d = 0 may come out the other way.
        if ((kp.grad[j] == 0) != (ks.grad == 0)) {
          ++flips;
          continue;
        }
        const long double es = static_cast<long double>(in.ref_logp[j]) - in.logp[j];  // e, exact
        const double e = std::fabs(static_cast<double>(es));
        // k3's value to the last bit: e^e - 1 - e by its series for small e (the double path's
        // expm1(e) - e cancels: 2^-52 / |e| relative).
        double want = ks.value;
        if (est == reco::kl_estimator::k3 && ks.grad != 0) {
          want = e < 1e-3 ? static_cast<double>(es * es / 2 + es * es * es / 6 + es * es * es * es / 24)
                          : static_cast<double>(expm1l(es) - es);
        }
        const std::string at = "estimator " + std::to_string(static_cast<int>(est)) + " d " + std::to_string(-e);
        ASSERT_LE(std::fabs(kp.value[j] - want), (16 + e) * unit * std::fabs(want) + 1e-300)
            << at << ": " << kp.value[j] << " vs " << want;
        ASSERT_LE(std::fabs(kp.grad[j] - ks.grad), (3 + e) * unit * std::fabs(ks.grad) + 1e-300) << at;
      }
    }
    EXPECT_LE(flips, lanes / 10000) << "estimator " << static_cast<int>(est);
  }
}

// ---- the packed objective against the scalar one -----------------------------------------------

template <class T>
struct run_out {
  reco::objective_result r;
  std::vector<T> g, gh;
};

template <class T, class Obj>
run_out<T> run_path(const Obj& obj, const master_batch& m, bool vectorise, T poison = T(-5)) {
  typed_batch<T> tb(m);
  run_out<T> out;
  out.g.assign(m.logp.size(), poison);
  out.gh.assign(m.logp.size(), poison);
  reco::cpu be;
  be.vectorise = vectorise;
  reco::workspace<reco::cpu> ws;
  out.r = obj(be, tb.view(),
              reco::gradients<T>{out.g, Obj::has_entropy_gradient ? reco::span<T>(out.gh) : reco::span<T>()}, ws);
  return out;
}

bool near(double a, double b, double rel, double abs) { return std::fabs(a - b) <= rel * std::fabs(b) + abs; }

// Every bit of two results (the struct's trailing padding aside).
bool same_bits(const reco::objective_result& a, const reco::objective_result& b) {
  return std::memcmp(&a, &b, offsetof(reco::objective_result, status)) == 0 && a.status == b.status;
}

// The packed path against the scalar one on the same inputs. Double inputs: both in double, to
// the last bits. Float inputs: the packed path computes in float, the scalar one in double, so
// they agree within the precision policy's bound (docs/conventions.md, "Precision": 36u per term
// with the default clamps, 40u allowed here), and a token whose term sits within that bound of a
// branch's threshold may take the other branch (at most one in 10,000, plus one).
template <class T, class Obj>
void expect_paths_agree(const Obj& obj, const master_batch& m, const std::string& label) {
  SCOPED_TRACE(label);
  constexpr bool single = std::is_same_v<T, float>;
  const run_out<T> a = run_path<T>(obj, m, true), b = run_path<T>(obj, m, false);
  const double scale = std::max({std::fabs(b.r.policy_loss), std::fabs(b.r.kl_loss), std::fabs(b.r.entropy_loss), 1e-6});
  double gmax = 0, gsum = 0;
  for (T x : b.g) {
    gmax = std::max(gmax, std::fabs(static_cast<double>(x)));
    gsum += std::fabs(static_cast<double>(x));
  }
  // Float: the bound is relative to the terms' magnitudes, not to their sum (GRPO's advantages
  // sum to 0 per group, so the policy loss cancels). |loss term| = |gradient term| for every
  // unclipped token; a clipped one has no gradient, hence the division by the unclipped share.
  const double terms = gsum / std::max(0.05, 1 - b.r.stats.clip_frac - b.r.stats.dual_clip_frac);
  const double rel = single ? 40 * unit : 1e-12, abs = single ? 40 * unit * terms + 1e-14 * scale : 1e-14 * scale;
  EXPECT_TRUE(near(a.r.loss, b.r.loss, rel, abs)) << a.r.loss << " vs " << b.r.loss;
  EXPECT_TRUE(near(a.r.policy_loss, b.r.policy_loss, rel, abs));
  EXPECT_TRUE(near(a.r.kl_loss, b.r.kl_loss, rel, abs));
  EXPECT_TRUE(near(a.r.entropy_loss, b.r.entropy_loss, rel, abs));
  const auto &s = a.r.stats, &t = b.r.stats;
  EXPECT_EQ(s.valid_tokens, t.valid_tokens);
  EXPECT_EQ(s.policy_tokens, t.policy_tokens);
  const double flips = single ? (1.0 + static_cast<double>(t.policy_tokens) / 10000) /
                                    std::max<double>(1.0, static_cast<double>(t.policy_tokens))
                              : 0.0;
  EXPECT_TRUE(near(s.clip_frac, t.clip_frac, 0, flips)) << s.clip_frac << " vs " << t.clip_frac;
  EXPECT_TRUE(near(s.clip_frac_low, t.clip_frac_low, 0, flips));
  EXPECT_TRUE(near(s.clip_frac_high, t.clip_frac_high, 0, flips));
  EXPECT_TRUE(near(s.dual_clip_frac, t.dual_clip_frac, 0, flips));
  EXPECT_EQ(s.kept_frac, t.kept_frac);
  const double drel = single ? 40 * unit : 1e-12;
  for (double reco::diagnostics::*f : {&reco::diagnostics::ratio_mean, &reco::diagnostics::ratio_min,
                                         &reco::diagnostics::ratio_max, &reco::diagnostics::ref_kl_mean,
                                         &reco::diagnostics::entropy_mean, &reco::diagnostics::entropy_kept_mean})
    EXPECT_TRUE(near(s.*f, t.*f, drel, 1e-15)) << s.*f << " vs " << t.*f;
  // ppo_kl is a mean of log-ratios of both signs: its error is relative to their magnitudes
  // (u |l| each), not to the mean.
  EXPECT_TRUE(near(s.ppo_kl, t.ppo_kl, drel, single ? 1e-6 : 1e-15)) << s.ppo_kl << " vs " << t.ppo_kl;
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(near(s.token_variance[k], t.token_variance[k], drel, 1e-18));
  // A gradient adds the policy and KL parts: float's bound is relative to their magnitudes, so
  // near a cancellation (beta = 0.1 below) it is at the scale of the largest gradient.
  const double gabs = single ? 40 * unit * gmax : 1e-14 * gmax;
  std::size_t off = 0;
  for (std::size_t k = 0; k < m.logp.size(); ++k) {
    if (!near(a.g[k], b.g[k], rel, gabs)) {
      ASSERT_TRUE(single) << "token " << k << ": " << a.g[k] << " vs " << b.g[k];
      ++off;
    }
    if (!m.mask[k]) {
      ASSERT_EQ(std::memcmp(&a.g[k], &b.g[k], sizeof(T)), 0) << "masked token " << k;
    }
    if (Obj::has_entropy_gradient) {
      ASSERT_TRUE(near(a.gh[k], b.gh[k], single ? 4 * unit : 0.0, 0.0)) << "token " << k;
    }
  }
  EXPECT_LE(off, 1 + m.logp.size() / 10000) << "gradients beyond the bound (branch flips)";
}

template <class Obj>
void check_paths(const Obj& obj, const std::string& name) {
  const auto specs = reco_test::standard_specs();
  for (std::size_t k = 0; k < specs.size(); k += 2) {
    master_batch m = make_batch(4000 + k, specs[k]);
    expect_paths_agree<double>(obj, m, name + " double, batch " + std::to_string(k));
    reco_test::round_to<float>(m);
    expect_paths_agree<float>(obj, m, name + " float, batch " + std::to_string(k));
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Long ragged responses: several 8192-token chunks, segments cut at chunk ends and thirds.
  batch_spec big;
  big.groups = 6;
  big.max_length = 3000;
  big.token_weights = true;
  big.response_weights = true;
  expect_paths_agree<float>(obj, make_batch(99, big), name + " long responses");
  big.padded = true;
  expect_paths_agree<double>(obj, make_batch(98, big), name + " long responses, padded");
}

TEST(Simd, PackedPathMatchesScalarPathForEveryPreset) {
  namespace ps = reco::presets;
  check_paths(ps::grpo{}, "grpo");
  check_paths(ps::dr_grpo{}, "dr_grpo");
  check_paths(ps::dapo{}, "dapo");
  check_paths(ps::gspo{}, "gspo");
  check_paths(ps::cispo{}, "cispo");
  check_paths(ps::aspo{}, "aspo");
  check_paths(ps::reco{}, "reco");
  check_paths(ps::reco_no_cap{}, "reco_no_cap");
  check_paths(ps::reco_response_only{}, "reco_response_only");
  check_paths(ps::reco_token_only{}, "reco_token_only");
  check_paths(ps::dapo_reco{}, "dapo_reco");
  check_paths(ps::rule_80_20{}, "rule_80_20");
  check_paths(ps::rule_80_20_reco{}, "rule_80_20_reco");
}

TEST(Simd, PackedPathMatchesScalarPathForEveryComponent) {
  using reco::objective;
  check_paths(objective<reco::grpo_advantage, reco::sapo_ratio, reco::no_clip, reco::caller_weight,
                        reco::seq_mean_token_sum>{},
              "sapo + caller weights");
  check_paths(objective<reco::rloo_advantage, reco::reinforce_ratio, reco::no_clip, reco::uniform_weight,
                        reco::seq_mean_token_sum_norm>{},
              "reinforce");
  check_paths(objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::uniform_weight,
                        reco::seq_mean_token_mean>{},
              "gmpo");
  {
    objective<reco::grpo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight, reco::token_mean,
              reco::kl_penalty>
        o;
    o.ratio.params.flip_all = true;
    o.clip.params.dual_clip = reco::dual_clip_mode::soft;
    o.clip.params.dual_clip_c = 1.5;
    check_paths(o, "flipped (all) + soft dual");
  }
  {
    objective<reco::batch_std_advantage, reco::variance_ratio, reco::entropy_split_clip, reco::expected_count_weight,
              reco::token_mean, reco::entropy_bonus, reco::kl_penalty>
        o;
    o.clip.params.dual_clip = reco::dual_clip_mode::hard;
    o.clip.params.dual_clip_c = 1.4;
    o.entropy.params.coef = 0.01;
    check_paths(o, "entropy split + entropy bonus + kl");
  }
  {
    objective<reco::gpg_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight, reco::seq_mean_token_mean,
              reco::top_entropy_selection>
        o;
    o.select.params.rule = reco::selection_rule::quantile;
    o.select.params.denominator = reco::selection_denominator::kept;
    o.ratio.params.log_ratio_clamp = 0.25;
    check_paths(o, "quantile selection, kept denominator, clamp 0.25");
  }
  for (auto est : {reco::kl_estimator::k1, reco::kl_estimator::abs, reco::kl_estimator::k2, reco::kl_estimator::k3}) {
    for (bool clamp : {true, false}) {
      objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                reco::seq_mean_token_mean, reco::kl_penalty>
          o;
      o.kl.params.estimator = est;
      o.kl.params.clamp = clamp;
      o.kl.params.straight_through = !clamp;
      o.kl.params.beta = 0.1;
      o.ratio.params.log_ratio_clamp = 0;  // no clamp: exp of the raw log-ratio
      check_paths(o, "kl estimator " + std::to_string(static_cast<int>(est)) + (clamp ? " clamped" : ""));
    }
  }
}

// Whatever invalid tokens hold (NaN, inf, huge or subnormal values), the packed pass gives the
// bits it gives when they hold ordinary values, and their gradients are +0.
TEST(Simd, InvalidTokensNeverChangeTheResult) {
  const double inf = std::numeric_limits<double>::infinity();
  const double junk[] = {std::numeric_limits<double>::quiet_NaN(), inf, -inf, 1e300, -1e300,
                         std::numeric_limits<double>::denorm_min(), -7.5};
  auto check = [&](auto obj, const std::string& name) {
    using Obj = decltype(obj);
    for (bool padded : {false, true}) {
      batch_spec spec;
      spec.padded = padded;
      spec.groups = 8;
      spec.max_length = 37;
      spec.masked_row = 0.2;
      spec.mask_hole = 0.3;
      spec.token_weights = true;
      const master_batch clean = make_batch(padded ? 61 : 62, spec);
      master_batch dirty = clean;
      std::size_t j = 0;
      for (std::size_t t = 0; t < dirty.logp.size(); ++t) {
        if (dirty.mask[t]) continue;
        for (auto* v : {&dirty.logp, &dirty.old_logp, &dirty.ref_logp, &dirty.entropy, &dirty.token_weights})
          (*v)[t] = junk[j++ % (sizeof(junk) / sizeof(junk[0]))];
      }
      const run_out<double> a = run_path<double>(obj, clean, true), b = run_path<double>(obj, dirty, true);
      EXPECT_TRUE(std::isfinite(b.r.loss)) << name;
      EXPECT_TRUE(same_bits(a.r, b.r)) << name << (padded ? " padded" : " packed");
      ASSERT_EQ(std::memcmp(a.g.data(), b.g.data(), a.g.size() * sizeof(double)), 0) << name;
      for (std::size_t t = 0; t < b.g.size(); ++t) {
        if (clean.mask[t]) continue;
        ASSERT_EQ(b.g[t], 0.0) << name << " token " << t;
        ASSERT_FALSE(std::signbit(b.g[t])) << name << " token " << t;
        if (Obj::has_entropy_gradient) {
          ASSERT_EQ(b.gh[t], 0.0) << name << " token " << t;
        }
      }
    }
  };
  check(reco::presets::reco{}, "reco");
  check(reco::presets::rule_80_20_reco{}, "rule_80_20_reco");
  check(reco::presets::aspo{}, "aspo");
  check(reco::presets::cispo{}, "cispo");
  check(reco::objective<reco::grpo_advantage, reco::sapo_ratio, reco::no_clip, reco::uniform_weight,
                        reco::token_mean, reco::entropy_bonus, reco::kl_penalty>{},
        "sapo + entropy bonus");
  check(reco::objective<reco::grpo_advantage, reco::token_ratio, reco::entropy_split_clip, reco::uniform_weight,
                        reco::token_mean>{},
        "entropy split");
}

// A component written for double only: the objective keeps the scalar token pass.
struct double_only_clip {
  using role = reco::roles::clip_policy;
  struct params_type {};
  params_type params{};
  static constexpr bool needs_entropy = false;
  static constexpr bool needs_entropy_quantile = false;
  static constexpr bool clips = false;
  reco::surrogate_value apply(const reco::ratio_value& rv, const reco::token_context& c) const {
    return reco::no_clip{}.apply(rv, c);
  }
};

TEST(Simd, DoubleOnlyComponentsKeepTheScalarPass) {
  using custom = reco::objective<reco::grpo_advantage, reco::token_ratio, double_only_clip, reco::uniform_weight,
                                 reco::token_mean>;
  static_assert(!reco::detail::packed_tokens<custom, float>::supported);
  static_assert(reco::detail::packed_tokens<reco::presets::reco, float>::supported);
  const master_batch m = make_batch(5, batch_spec{});
  const run_out<double> a = run_path<double>(custom{}, m, true), b = run_path<double>(custom{}, m, false);
  EXPECT_TRUE(same_bits(a.r, b.r));
  EXPECT_EQ(std::memcmp(a.g.data(), b.g.data(), a.g.size() * sizeof(double)), 0);
}

// The pack-ready clip of docs/extending.md, verbatim: it runs packed and agrees with its own
// scalar instance.
struct log_clip {
  using role = reco::roles::clip_policy;
  struct params_type {
    double delta = 0.2;
  };
  params_type params{};
  static constexpr bool needs_entropy = false;
  static constexpr bool needs_entropy_quantile = false;
  static constexpr bool clips = true;

  template <class V>
  RECO_TOKEN_MATH reco::basic_surrogate_value<V> apply(const reco::basic_ratio_value<V>& rv,
                                                       const reco::basic_token_context<V>& c) const {
    using namespace reco::detail;
    const double hi = ::exp(params.delta), lo = ::exp(-params.delta), a = c.advantage;
    reco::basic_surrogate_value<V> s;
    s.x = rv.x;
    mask_t<V> clipped = rv.x > hi && a > 0;
    clipped = clipped || (rv.x < lo && a < 0);
    const V rho = mind(maxd(rv.x, V(lo)), V(hi));
    const V x = select(clipped, rho, rv.x);
    s.loss = -a * (rv.reciprocal ? V(1.0) / x : x);
    s.grad = select(clipped, V(0.0), -a * rv.omega);
    s.clipped = clipped;
    return s;
  }
};

TEST(Simd, DocumentedPackReadyComponentRunsPacked) {
  using custom = reco::objective<reco::grpo_advantage, reco::variance_ratio, log_clip, reco::expected_count_weight,
                                 reco::seq_mean_token_mean>;
  static_assert(reco::detail::packed_tokens<custom, float>::supported);
  custom o;
  o.clip.params.delta = 0.05;  // small enough that both sides of the clip are hit
  check_paths(o, "log_clip (docs/extending.md)");
}

}  // namespace

#else

TEST(Simd, NotCompiled) { GTEST_SKIP() << "RECO_SIMD is 0 for this compiler: only the scalar token pass exists"; }

#endif

// The span of a response's valid tokens, found 8 mask bytes at a time, against a byte-by-byte
// search: random masks of every short length and offset (words that straddle the span's ends),
// runs of zeros around single valid tokens, all-zero and all-one rows.
TEST(PackedScan, TrimToValidMatchesAByteScan) {
  std::mt19937 rng(7);
  std::vector<std::uint8_t> mask(96);
  int cases = 0;
  for (int density : {0, 1, 5, 50, 100}) {
    std::bernoulli_distribution on(density / 100.0);
    for (int trial = 0; trial < 40; ++trial) {
      for (auto& m : mask) m = on(rng) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
      for (reco::index_t begin = 0; begin < 20; ++begin) {
        for (reco::index_t end = begin; end <= static_cast<reco::index_t>(mask.size()); end += 1 + (end % 3)) {
          reco::index_t first = -1, last = -1;
          for (reco::index_t t = begin; t < end; ++t)
            if (mask[static_cast<std::size_t>(t)] != 0) {
              if (first < 0) first = t;
              last = t;
            }
          reco::detail::token_scan s;
          const bool any = reco::detail::trim_to_valid(mask.data(), begin, end, s);
          ASSERT_EQ(any, first >= 0) << "begin " << begin << " end " << end;
          if (any) {
            ASSERT_EQ(s.first, first) << "begin " << begin << " end " << end;
            ASSERT_EQ(s.last, last) << "begin " << begin << " end " << end;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 10000);
  // No mask: the whole span.
  reco::detail::token_scan s;
  ASSERT_TRUE(reco::detail::trim_to_valid(nullptr, 3, 11, s));
  EXPECT_EQ(s.first, 3);
  EXPECT_EQ(s.last, 10);
  EXPECT_FALSE(reco::detail::trim_to_valid(nullptr, 4, 4, s));
}

// The cut candidates of a part (detail::gather_candidates: whole chunks of 64 tokens as bit words
// on the unit's widest registers, the rest token by token) against a naive scan of the
// definition: per response, the valid tokens whose key prefix of `done` bits lies above [lo, hi],
// and each valid token inside it in position order, with its key. Floats and doubles, padded rows
// of whole and partial chunks, packed rows at odd offsets, no mask and masks of every density,
// ties on the window's edges, +-0, the whole range and the last prefix (no upper bound).
template <class T>
void check_gather_candidates() {
  using K = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr int width = static_cast<int>(sizeof(T) * 8);
  auto key_of = [](T v) {  // independent: -0 as +0, flip all bits of a negative, the sign of the rest
    if (v == T(0)) v = T(0);
    K u;
    std::memcpy(&u, &v, sizeof(u));
    return (u >> (width - 1)) ? static_cast<K>(~u) : static_cast<K>(u | (K(1) << (width - 1)));
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-0.5, 3.0);
  int whole = 0, partial = 0, gathered = 0, cases = 0, windowed = 0;
  for (int layout = 0; layout < 6; ++layout) {
    std::vector<reco::index_t> offsets{0};
    const reco::index_t R = 1 + static_cast<reco::index_t>(rng() % 9);
    const reco::index_t Tpad = layout == 0 ? 64 : layout == 1 ? 128 : layout == 2 ? 200 : 0;
    for (reco::index_t i = 0; i < R; ++i)
      offsets.push_back(offsets.back() + (Tpad ? Tpad : static_cast<reco::index_t>(rng() % 300)));
    const std::size_t N = static_cast<std::size_t>(offsets.back());
    for (int density : {-1, 0, 5, 60, 100}) {  // -1: no mask
      std::vector<T> h(N);
      std::vector<std::uint8_t> mask(N);
      std::bernoulli_distribution on(density / 100.0);
      const T pool[] = {T(0.5), T(1), T(1.25), T(2), -T(0), T(0)};  // repeated values: ties on the edges
      for (std::size_t t = 0; t < N; ++t) {
        h[t] = rng() % 3 == 0 ? pool[rng() % 6] : static_cast<T>(u(rng));
        mask[t] = density >= 0 && on(rng) ? static_cast<std::uint8_t>(1 + rng() % 255) : 0;
        if (density >= 0 && rng() % 5 == 0) h[t] = std::numeric_limits<T>::quiet_NaN();  // only where masked
        if (density >= 0 && mask[t] != 0 && std::isnan(h[t])) h[t] = T(1);
        if (density < 0 && std::isnan(h[t])) h[t] = T(1);
      }
      reco::detail::batch_pointers<T> b;
      b.layout = Tpad ? reco::padded(R, Tpad) : reco::packed(reco::span<const reco::index_t>(offsets.data(), offsets.size()));
      b.layout.tokens = static_cast<reco::index_t>(N);  // packed() leaves N to the batch
      b.entropy = h.data();
      b.mask = density >= 0 ? mask.data() : nullptr;
      for (int done : {16, 20, width - 8}) {
        for (int window = 0; window < 5; ++window) {
          std::uint64_t lo, hi;
          const std::uint64_t top = (std::uint64_t(1) << done) - 1;
          const std::uint64_t p = key_of(pool[rng() % 4]) >> (width - done);
          if (window == 0) lo = hi = p;  // one prefix: the pool's value is its least, a tie on `from`
          else if (window == 1) lo = p - 1 - rng() % 3, hi = p + rng() % 3;
          else if (window == 2) lo = 1, hi = top;  // everything valid is inside
          else if (window == 3) lo = p, hi = top;  // no upper bound
          else lo = p - 1 - rng() % 3, hi = p - 1;  // the pool's value is the least above: ties on `up`
          reco::detail::cut_candidates got;
          reco::detail::gather_candidates(b, done, lo, hi, got);
          ASSERT_EQ(got.above.size(), static_cast<std::size_t>(R));
          std::vector<std::uint64_t> keys;
          std::vector<reco::index_t> responses;
          for (reco::index_t i = 0; i < R; ++i) {
            std::int64_t above = 0;
            for (reco::index_t t = offsets[static_cast<std::size_t>(i)]; t < offsets[static_cast<std::size_t>(i) + 1]; ++t) {
              if (b.mask && mask[static_cast<std::size_t>(t)] == 0) continue;
              const K k = key_of(h[static_cast<std::size_t>(t)]);
              const std::uint64_t pre = static_cast<std::uint64_t>(k) >> (width - done);
              if (pre > hi) ++above;
              else if (pre >= lo) {
                keys.push_back(k);
                responses.push_back(i);
              }
            }
            ASSERT_EQ(got.above[static_cast<std::size_t>(i)], above)
                << "response " << i << " layout " << layout << " density " << density << " done " << done << " window " << window;
            const reco::index_t len = offsets[static_cast<std::size_t>(i) + 1] - offsets[static_cast<std::size_t>(i)];
            whole += static_cast<int>(len / 64);
            partial += len % 64 != 0;
          }
          ASSERT_EQ(got.keys, keys) << "layout " << layout << " density " << density << " done " << done << " window " << window;
          ASSERT_EQ(got.responses, responses);
          gathered += static_cast<int>(keys.size());
          ++cases;
          if (done != 16) continue;
          // The windowed stage 0's pass (detail::gather_window): the same candidates, and in the
          // same pass each response's valid tokens; every valid value here is finite.
          reco::detail::cut_candidates win;
          std::vector<reco::index_t> valid(static_cast<std::size_t>(R), -1);
          bool nonfinite = true;
          reco::detail::gather_window(b, lo, hi, win, valid.data(), &nonfinite);
          ASSERT_EQ(win.keys, keys);
          ASSERT_EQ(win.responses, responses);
          ASSERT_EQ(win.above, got.above);
          EXPECT_FALSE(nonfinite) << "layout " << layout << " density " << density;
          for (reco::index_t i = 0; i < R; ++i) {
            reco::index_t n = 0;
            for (reco::index_t t = offsets[static_cast<std::size_t>(i)]; t < offsets[static_cast<std::size_t>(i) + 1]; ++t)
              n += !b.mask || mask[static_cast<std::size_t>(t)] != 0;
            ASSERT_EQ(valid[static_cast<std::size_t>(i)], n) << "response " << i << " layout " << layout;
          }
          ++windowed;
        }
      }
    }
  }
  EXPECT_GT(whole, 1000);  // both the bit-word chunks and the token-by-token ends ran
  EXPECT_GT(partial, 100);
  EXPECT_GT(gathered, 10000);
  EXPECT_EQ(cases, 6 * 5 * 3 * 5);
  EXPECT_EQ(windowed, 6 * 5 * 5);
}

TEST(PlanScan, GatheredCandidatesMatchANaiveScan) {
  check_gather_candidates<float>();
  check_gather_candidates<double>();
}

// The windowed pass finds a valid NaN or infinite entropy in a whole chunk (bit words) and in a
// response's last, partial chunk (token by token), and ignores one under the mask.
template <class T>
void check_window_finds_nonfinite() {
  const reco::index_t R = 3, Tpad = 200;  // chunks [0, 64), ..., [192, 200) of each row
  std::vector<T> h(static_cast<std::size_t>(R * Tpad), T(1.5));
  std::vector<std::uint8_t> mask(h.size(), 1);
  reco::detail::batch_pointers<T> b;
  b.layout = reco::padded(R, Tpad);
  b.entropy = h.data();
  b.mask = mask.data();
  int cases = 0;
  for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(),
                -std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::quiet_NaN()})
    for (std::size_t at : {std::size_t(10), std::size_t(Tpad + 70), std::size_t(2 * Tpad + 195)})
      for (std::uint8_t m : {std::uint8_t(1), std::uint8_t(0)}) {
        h[at] = bad;
        mask[at] = m;
        reco::detail::cut_candidates c;
        std::vector<reco::index_t> valid(static_cast<std::size_t>(R));
        bool nonfinite = false;
        reco::detail::gather_window(b, 1, reco::detail::key_digits - 1, c, valid.data(), &nonfinite);
        EXPECT_EQ(nonfinite, m != 0) << "value " << bad << " at " << at << " mask " << int(m);
        const reco::index_t row = static_cast<reco::index_t>(at) / Tpad;
        EXPECT_EQ(valid[static_cast<std::size_t>(row)], Tpad - (m ? 0 : 1));
        h[at] = T(1.5);
        mask[at] = 1;
        ++cases;
      }
  EXPECT_EQ(cases, 24);
}

TEST(PlanScan, WindowedPassFindsNonFiniteEntropies) {
  check_window_finds_nonfinite<float>();
  check_window_finds_nonfinite<double>();
}
