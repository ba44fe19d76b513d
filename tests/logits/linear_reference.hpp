// Test support for reco::logits::linear_*: an independent double-precision reference that
// materialises the logits x = W h + bias of every row (naive triple loop), takes the row results
// and dlogits from the two-pass reference of logits_reference.hpp, and forms dh = dX W,
// dW = dX^T h, dbias = Σ_r dX_r; with each result the magnitudes its error bound is built from.
// Also generators of problems in every storage type (the double copy holds the stored values), and
// expect_error (a call that must raise a reco::error naming an argument).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "logits/logits_reference.hpp"
#include "reco/config.hpp"

namespace linear_test {

using logits_test::load_from;
using logits_test::store_as;
using reco::index_t;

template <class T>
struct problem {
  index_t N = 0, H = 0, V = 0;
  std::vector<double> h, w, b;  // stored values, in double: h [N, H], w [V, H], b [V] (empty: none)
  std::vector<T> hs, ws, bs;     // the same in the storage type
  std::vector<std::int64_t> tokens;
  std::vector<std::uint8_t> mask;
  std::vector<double> g_logp, g_entropy;  // upstream gradients
};

// Logits of spread ~sigma; every mask_every-th row masked (NaN hidden states, token -100).
template <class T>
problem<T> make_problem(index_t N, index_t H, index_t V, std::uint64_t seed, bool bias, int mask_every = 0,
                        double sigma = 3.0) {
  problem<T> p;
  p.N = N, p.H = H, p.V = V;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::uniform_int_distribution<std::int64_t> token(0, V - 1);
  auto put = [](std::vector<double>& d, std::vector<T>& s, double v) {
    s.push_back(store_as<T>(v));
    d.push_back(load_from<T>(s.back()));
  };
  for (index_t r = 0; r < N; ++r) {
    const bool masked = mask_every > 0 && r % mask_every == mask_every - 1;
    p.mask.push_back(masked ? 0 : 1);
    p.tokens.push_back(masked ? -100 : token(rng));
    for (index_t k = 0; k < H; ++k) put(p.h, p.hs, masked ? std::numeric_limits<double>::quiet_NaN() : normal(rng));
    p.g_logp.push_back(u(rng));
    p.g_entropy.push_back(u(rng));
  }
  const double scale = sigma / std::sqrt(static_cast<double>(H));
  for (index_t i = 0; i < V * H; ++i) put(p.w, p.ws, scale * normal(rng));
  if (bias)
    for (index_t j = 0; j < V; ++j) put(p.b, p.bs, normal(rng));
  return p;
}

struct reference {
  std::vector<double> logp, entropy, lse, sum_p_squared;
  std::vector<double> logit_error;  // per row: max_j of the bound on the fp GEMM's error of x_j (unit u = 1)
  std::vector<double> entropy_error;  // per row: Σ_j p_j |log p_j + H| (bound on x_j's error, u = 1)
  std::vector<double> dh, dw, db;
  // Magnitudes: Σ_j |dX_rj| |W_jk| (dh), Σ_r |dX_rj| |h_rk| (dW), Σ_r |dX_rj| (db), and the same
  // with |dX| replaced by the scale m_rj of dX's error (p_rj (|g| + |g_H| (|log p_rj| + H + 1)) / τ).
  std::vector<double> dh_mag, dw_mag, db_mag, dh_err_mag, dw_err_mag, db_err_mag;
};

template <class T>
reference compute_reference(const problem<T>& p, double tau) {
  reference ref;
  const index_t N = p.N, H = p.H, V = p.V;
  ref.logp.assign(N, 0), ref.entropy.assign(N, 0), ref.lse.assign(N, 0), ref.sum_p_squared.assign(N, 0);
  ref.logit_error.assign(N, 0), ref.entropy_error.assign(N, 0);
  ref.dh.assign(N * H, 0), ref.dw.assign(V * H, 0), ref.db.assign(V, 0);
  ref.dh_mag = ref.dh_err_mag = ref.dh;
  ref.dw_mag = ref.dw_err_mag = ref.dw;
  ref.db_mag = ref.db_err_mag = ref.db;
  std::vector<double> x(V), xabs(V);
  for (index_t r = 0; r < N; ++r) {
    if (!p.mask[r]) continue;
    for (index_t j = 0; j < V; ++j) {
      double s = p.b.empty() ? 0.0 : p.b[j], a = p.b.empty() ? 0.0 : std::fabs(p.b[j]);
      for (index_t k = 0; k < H; ++k) {
        s += p.h[r * H + k] * p.w[j * H + k];
        a += std::fabs(p.h[r * H + k] * p.w[j * H + k]);
      }
      x[j] = s, xabs[j] = a;
    }
    const auto f = logits_test::reference_forward(x, p.tokens[r], tau);
    ref.logp[r] = f.logp, ref.entropy[r] = f.entropy, ref.lse[r] = f.lse, ref.sum_p_squared[r] = f.sum_p_squared;
    const double gamma = static_cast<double>(H + 1);  // γ_{H+1} / u: a GEMM of depth H, then the bias
    for (index_t j = 0; j < V; ++j) {
      const double p_j = std::exp(f.log_p[j]);
      ref.logit_error[r] = std::max(ref.logit_error[r], gamma * xabs[j]);
      ref.entropy_error[r] += p_j * std::fabs(f.log_p[j] + f.entropy) * gamma * xabs[j];
    }
    const auto d = logits_test::reference_backward(x, p.tokens[r], tau, p.g_logp[r], p.g_entropy[r]);
    for (index_t j = 0; j < V; ++j) {
      const double p_j = std::exp(f.log_p[j]);
      const double m = p_j * (std::fabs(p.g_logp[r]) + std::fabs(p.g_entropy[r]) * (std::fabs(f.log_p[j]) + f.entropy + 1)) / tau;
      ref.db[j] += d[j];
      ref.db_mag[j] += std::fabs(d[j]);
      ref.db_err_mag[j] += m;
      for (index_t k = 0; k < H; ++k) {
        const double hv = p.h[r * H + k], wv = p.w[j * H + k];
        ref.dh[r * H + k] += d[j] * wv;
        ref.dh_mag[r * H + k] += std::fabs(d[j] * wv);
        ref.dh_err_mag[r * H + k] += m * std::fabs(wv);
        ref.dw[j * H + k] += d[j] * hv;
        ref.dw_mag[j * H + k] += std::fabs(d[j] * hv);
        ref.dw_err_mag[j * H + k] += m * std::fabs(hv);
      }
    }
  }
  return ref;
}

// Each bad input is a reco::error naming its argument.
inline void expect_error(const std::function<void()>& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one naming " << argument;
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

}  // namespace linear_test
