// Test support for reco::logits: an independent double-precision reference (log_softmax first,
// then the entropy and the gradient from the probabilities, two passes, no online rescaling) and
// generators of logit batches with -inf entries and masked rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reco/logits/half_types.hpp"
#include "reco/logits/logp_entropy.hpp"

namespace logits_test {

inline constexpr double neg_inf = -std::numeric_limits<double>::infinity();

struct reference_row {
  double logp = 0, entropy = 0, lse = 0, sum_p_squared = 0;
  std::vector<double> log_p;  // log_softmax of the row
};

// x: one row of logits (finite or -inf), y: sampled token, tau: temperature.
inline reference_row reference_forward(const std::vector<double>& x, std::int64_t y, double tau) {
  reference_row out;
  const std::size_t v = x.size();
  double m = neg_inf;
  for (double xi : x) m = std::max(m, xi / tau);
  double s = 0;
  for (double xi : x) s += std::exp(xi / tau - m);
  out.lse = m + std::log(s);
  out.log_p.resize(v);
  for (std::size_t j = 0; j < v; ++j) out.log_p[j] = x[j] / tau - out.lse;
  for (std::size_t j = 0; j < v; ++j) {
    const double p = std::exp(out.log_p[j]);
    if (p > 0) out.entropy -= p * out.log_p[j];
    out.sum_p_squared += p * p;
  }
  out.logp = out.log_p[static_cast<std::size_t>(y)];
  return out;
}

// d/dx of g * logp + g_h * entropy for one row (docs/logits.md), from the reference probabilities.
inline std::vector<double> reference_backward(const std::vector<double>& x, std::int64_t y, double tau, double g,
                                              double g_h) {
  const reference_row f = reference_forward(x, y, tau);
  std::vector<double> d(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double p = std::exp(f.log_p[j]);
    double dz = (static_cast<std::int64_t>(j) == y ? g : 0.0) - g * p;
    if (p > 0) dz -= g_h * p * (f.log_p[j] + f.entropy);
    d[j] = dz / tau;
  }
  return d;
}

// A batch of logits held in double (the values the reference sees) and the same values stored as
// T (exact for float and double; for bf16/fp16 the double copy is overwritten by the rounded
// values, so that the comparison measures the computation, not the input rounding).
template <class T>
struct batch {
  reco::index_t rows = 0, vocab = 0, stride = 0;
  std::vector<double> x;  // rows * stride, padding included
  std::vector<T> stored;
  std::vector<std::int64_t> tokens;
  std::vector<std::uint8_t> mask;

  std::vector<double> row(reco::index_t r) const {
    return std::vector<double>(x.begin() + r * stride, x.begin() + r * stride + vocab);
  }
};

struct batch_options {
  double sigma = 3.0;            // spread of the finite logits
  double offset = 0.0;           // added to every finite logit
  double neg_inf_fraction = 0.1;  // chance that an entry (other than the token) is -inf
  int mask_every = 0;            // every k-th row masked (0: no mask)
  reco::index_t pad = 0;         // row_stride = vocab + pad
};

template <class T>
T store_as(double v) {
  if constexpr (std::is_same_v<T, double>) return v;
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else return T(static_cast<float>(v));
}
template <class T>
double load_from(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double load_from<double>(double v) {
  return v;
}

// Masked rows are filled with NaN logits and an out-of-range token: the library must not read
// them. Each unmasked row keeps its token's logit finite (so the row is never all -inf).
template <class T>
batch<T> make_batch(reco::index_t rows, reco::index_t vocab, std::uint64_t seed, const batch_options& o = {}) {
  batch<T> b;
  b.rows = rows;
  b.vocab = vocab;
  b.stride = vocab + o.pad;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, o.sigma);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<std::int64_t> token(0, vocab - 1);
  b.x.assign(static_cast<std::size_t>(rows * b.stride), 0.0);
  b.stored.resize(b.x.size());
  b.tokens.resize(static_cast<std::size_t>(rows));
  b.mask.assign(static_cast<std::size_t>(rows), 1);
  for (reco::index_t r = 0; r < rows; ++r) {
    const bool masked = o.mask_every > 0 && r % o.mask_every == o.mask_every - 1;
    b.mask[r] = masked ? 0 : 1;
    b.tokens[r] = masked ? -100 : token(rng);
    for (reco::index_t j = 0; j < b.stride; ++j) {
      double v;
      if (j >= vocab) v = 1e30;  // padding between rows: must never be read either
      else if (masked) v = std::numeric_limits<double>::quiet_NaN();
      else if (j != b.tokens[r] && unit(rng) < o.neg_inf_fraction) v = neg_inf;
      else v = o.offset + normal(rng);
      const std::size_t i = static_cast<std::size_t>(r * b.stride + j);
      b.stored[i] = store_as<T>(v);
      b.x[i] = load_from<T>(b.stored[i]);
    }
  }
  return b;
}

template <class T>
std::string type_name() {
  if (std::is_same_v<T, float>) return "float";
  if (std::is_same_v<T, double>) return "double";
  if (std::is_same_v<T, reco::bf16_t>) return "bf16";
  return "fp16";
}

}  // namespace logits_test
