// Token variance by relative position (paper, token-variance figure), and the training-time
// token entropy and |KL| summaries (paper, entropy/KL table).
//
//   // p: per-token probabilities of the sampled tokens, packed; offsets: R + 1 response bounds
//   auto tv = reco::eval::token_variance_by_position(p, offsets);
//   tv.mean[reco::eval::early], tv.standard_error[reco::eval::late], ...
//   auto tv2 = reco::eval::token_variance_by_position(logp, offsets,
//                                                     reco::eval::probability_input::log_probability);
//   auto h  = reco::eval::mean_token_entropy(entropy, offsets);     // h.token_mean, h.response_mean
//   auto kl = reco::eval::mean_abs_kl(logp, ref_logp, offsets);     // mean |logp - ref_logp|
//
// Layout: response r owns tokens [offsets[r], offsets[r + 1]); offsets[0] = 0 and
// offsets[R] = number of tokens. A nested vector (one inner vector per response) is accepted too.
//
// Variance: v = p (1 - p) for every sampled token. Token t (0-based) of a response of length L
// falls in third b = floor(3 t / L): early [0, 1/3), middle [1/3, 2/3), late [2/3, 1] of t / L,
// computed in integers so boundaries are exact. mean[b] is token-weighted (all tokens of third b
// pooled); standard_error[b] is the standard error across responses: the sample standard
// deviation (ddof = 1) of the per-response means of third b over the responses that have tokens
// there, divided by the square root of their number. A third with no token has mean NaN; one
// with fewer than 2 responses has standard_error NaN.
//
// Summaries: token_mean averages over all response tokens of the batch (token-level mean);
// response_mean averages each response's token mean over the non-empty responses (sequence-level
// mean). |KL| uses the k1 estimator per token, |logp - ref_logp|. Both handle any finite
// input: values large enough to overflow a sum are summed scaled by a power of two; a mean that
// exceeds the largest double throws (naming entropy / logp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

enum position_third : int { early = 0, middle = 1, late = 2 };

enum class probability_input {
  probability,      // values are p in [0, 1]
  log_probability,  // values are log p <= 0 (-inf allowed: p = 0)
};

struct position_variance_result {
  std::array<double, 3> mean{};            // token-weighted mean of p (1 - p) per third
  std::array<double, 3> standard_error{};  // across responses (see above)
  std::array<index_t, 3> tokens{};         // tokens in each third
  std::array<index_t, 3> responses{};      // responses with at least one token in each third
};

struct token_mean_summary {
  double token_mean = 0.0;     // sum over all tokens / number of tokens
  double response_mean = 0.0;  // mean over non-empty responses of the response's token mean
  index_t tokens = 0;
  index_t responses = 0;       // non-empty responses
};

namespace detail {

inline void check_offsets(span<const index_t> offsets, index_t num_tokens, const char* values_name) {
  require(offsets.size() >= 2, "offsets", "needs R + 1 >= 2 entries, got " + std::to_string(offsets.size()));
  require(offsets[0] == 0, "offsets", "must start at 0, got " + std::to_string(offsets[0]));
  for (index_t r = 0; r + 1 < offsets.size(); ++r)
    if (offsets[r + 1] < offsets[r])
      fail("offsets", "decreases at entry " + std::to_string(r + 1));
  if (offsets[offsets.size() - 1] != num_tokens)
    fail("offsets", "ends at " + std::to_string(offsets[offsets.size() - 1]) + " but " +
                        std::string(values_name) + " has " + std::to_string(num_tokens) + " tokens");
  require(num_tokens > 0, values_name, "no response token at all: the mean is undefined");
}

inline double token_probability(double value, probability_input input, index_t t, const char* name) {
  if (input == probability_input::probability) {
    if (!(value >= 0.0 && value <= 1.0))
      fail(name, "token " + std::to_string(t) + ": probability must be in [0, 1], got " + std::to_string(value));
    return value;
  }
  if (!(value <= 0.0))  // also rejects NaN
    fail(name, "token " + std::to_string(t) + ": log-probability must be <= 0, got " + std::to_string(value));
  return std::exp(value);
}

// Token and response means of per-token values. value_at(t, scale) returns token t's value times
// `scale`, a power of two, computed without overflow; half_max is the largest value / 2 (which the
// caller can compute without overflow). While N values cannot overflow a sum, scale is 1 and the
// sums are plain; otherwise every value is scaled below 2 (exactly: a power of two) and the means
// are scaled back at the end. A mean beyond the largest double throws naming `name`.
template <class ValueAt>
token_mean_summary summarise_tokens(span<const index_t> offsets, double half_max, const char* name,
                                    ValueAt value_at) {
  const double num_tokens = static_cast<double>(offsets[offsets.size() - 1]);
  const int exponent =
      half_max > std::numeric_limits<double>::max() / (4.0 * num_tokens) ? std::ilogb(half_max) + 1 : 0;
  const double scale = std::ldexp(1.0, -exponent);
  token_mean_summary out;
  double total = 0.0, response_sum = 0.0;
  for (index_t r = 0; r + 1 < offsets.size(); ++r) {
    const index_t b = offsets[r], e = offsets[r + 1];
    if (e == b) continue;
    double s = 0.0;
    for (index_t t = b; t < e; ++t) s += value_at(t, scale);
    total += s;
    response_sum += s / static_cast<double>(e - b);
    out.tokens += e - b;
    ++out.responses;
  }
  out.token_mean = std::ldexp(total / static_cast<double>(out.tokens), exponent);
  out.response_mean = std::ldexp(response_sum / static_cast<double>(out.responses), exponent);
  if (!std::isfinite(out.token_mean) || !std::isfinite(out.response_mean))
    fail(name, "the mean exceeds the largest double");
  return out;
}

inline std::vector<index_t> offsets_of(const std::vector<std::vector<double>>& per_response) {
  std::vector<index_t> offsets(per_response.size() + 1, 0);
  for (std::size_t r = 0; r < per_response.size(); ++r)
    offsets[r + 1] = offsets[r] + static_cast<index_t>(per_response[r].size());
  return offsets;
}

inline std::vector<double> flatten(const std::vector<std::vector<double>>& per_response) {
  std::vector<double> flat;
  for (const auto& v : per_response) flat.insert(flat.end(), v.begin(), v.end());
  return flat;
}

}  // namespace detail

inline position_variance_result token_variance_by_position(
    span<const double> probabilities, span<const index_t> offsets,
    probability_input input = probability_input::probability) {
  detail::require(input == probability_input::probability || input == probability_input::log_probability,
                  "input", "unknown probability_input");
  detail::check_offsets(offsets, probabilities.size(), "probabilities");
  position_variance_result out;
  std::array<double, 3> sum{}, mean_of_means{}, m2{};  // Welford over per-response means
  for (index_t r = 0; r + 1 < offsets.size(); ++r) {
    const index_t b = offsets[r], len = offsets[r + 1] - offsets[r];
    std::array<double, 3> response_sum{};
    std::array<index_t, 3> response_count{};
    for (index_t t = 0; t < len; ++t) {
      const double p = detail::token_probability(probabilities[b + t], input, b + t, "probabilities");
      const int third = static_cast<int>((3 * t) / len);
      response_sum[third] += p * (1.0 - p);
      ++response_count[third];
    }
    for (int k = 0; k < 3; ++k) {
      if (response_count[k] == 0) continue;
      sum[k] += response_sum[k];
      out.tokens[k] += response_count[k];
      const double m = response_sum[k] / static_cast<double>(response_count[k]);
      const index_t n = ++out.responses[k];
      const double delta = m - mean_of_means[k];
      mean_of_means[k] += delta / static_cast<double>(n);
      m2[k] += delta * (m - mean_of_means[k]);
    }
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int k = 0; k < 3; ++k) {
    out.mean[k] = out.tokens[k] > 0 ? sum[k] / static_cast<double>(out.tokens[k]) : nan;
    const double n = static_cast<double>(out.responses[k]);
    out.standard_error[k] = out.responses[k] >= 2 ? std::sqrt(m2[k] / (n - 1.0)) / std::sqrt(n) : nan;
  }
  return out;
}

// One inner vector per response.
inline position_variance_result token_variance_by_position(
    const std::vector<std::vector<double>>& probabilities,
    probability_input input = probability_input::probability) {
  const std::vector<double> flat = detail::flatten(probabilities);
  const std::vector<index_t> offsets = detail::offsets_of(probabilities);
  return token_variance_by_position(span<const double>(flat), span<const index_t>(offsets), input);
}

// Mean token entropy over response tokens (entropies must be finite and >= 0).
inline token_mean_summary mean_token_entropy(span<const double> entropy, span<const index_t> offsets) {
  detail::check_offsets(offsets, entropy.size(), "entropy");
  for (index_t t = 0; t < entropy.size(); ++t)
    if (!(std::isfinite(entropy[t]) && entropy[t] >= 0.0))
      detail::fail("entropy", "token " + std::to_string(t) + ": must be finite and >= 0, got " +
                                  std::to_string(entropy[t]));
  double half_max = 0.0;
  for (double h : entropy) half_max = std::max(half_max, 0.5 * h);
  return detail::summarise_tokens(offsets, half_max, "entropy",
                                  [&](index_t t, double scale) { return entropy[t] * scale; });
}

// Mean |k1| = mean |logp - ref_logp| over response tokens (both finite).
inline token_mean_summary mean_abs_kl(span<const double> logp, span<const double> ref_logp,
                                      span<const index_t> offsets) {
  detail::require(ref_logp.size() == logp.size(), "ref_logp",
                  "size " + std::to_string(ref_logp.size()) + " does not match logp (" +
                      std::to_string(logp.size()) + ")");
  detail::check_offsets(offsets, logp.size(), "logp");
  for (index_t t = 0; t < logp.size(); ++t) {
    if (!std::isfinite(logp[t])) detail::fail("logp", "token " + std::to_string(t) + ": must be finite");
    if (!std::isfinite(ref_logp[t])) detail::fail("ref_logp", "token " + std::to_string(t) + ": must be finite");
  }
  // |logp - ref_logp| itself can overflow (opposite signs near the largest double); half of it
  // cannot.
  double half_max = 0.0;
  for (index_t t = 0; t < logp.size(); ++t) half_max = std::max(half_max, std::fabs(0.5 * logp[t] - 0.5 * ref_logp[t]));
  return detail::summarise_tokens(offsets, half_max, "logp", [&](index_t t, double scale) {
    return std::fabs(logp[t] * scale - ref_logp[t] * scale);
  });
}

}  // namespace eval
RECO_NAMESPACE_END
