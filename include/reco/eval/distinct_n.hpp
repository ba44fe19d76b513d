// Distinct-n: the share of unique n-grams in generated text, in the two variants in use.
//
//   double d2 = reco::eval::distinct_n(prompts, 2);                    // pooled per prompt
//   reco::eval::distinct_params per{reco::eval::distinct_scope::per_response,
//                                   reco::eval::distinct_denominator::tokens};
//   double li = reco::eval::distinct_n(prompts, 2, per);               // Li et al. 2016 wording
//
// `prompts[i]` is prompt i's list of responses (token ids, or text split on ASCII whitespace);
// a single prompt's list may be passed directly.
//
// - scope pooled_per_prompt (default): unique n-grams of all of a prompt's responses together
//   divided by the denominator summed over those responses; then the mean over prompts.
// - scope per_response: each response's unique n-grams divided by its own denominator; the mean
//   over a prompt's responses, then the mean over prompts.
// - denominator ngrams (default): number of n-grams (length - n + 1); tokens: number of tokens.
//
// A unit (prompt or response) whose denominator is 0 has no value and is left out of its mean
// (e.g. a response shorter than n with the ngrams denominator); a prompt none of whose responses
// has a value is left out of the mean over prompts. If nothing is left the call throws.
// An n longer than every response of a prompt means 0 n-grams there (any n >= 1 is accepted): no
// value under the ngrams denominator, 0 under tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"
#include "reco/eval/ngram.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

enum class distinct_scope { pooled_per_prompt, per_response };
enum class distinct_denominator { ngrams, tokens };

struct distinct_params {
  distinct_scope scope = distinct_scope::pooled_per_prompt;
  distinct_denominator denominator = distinct_denominator::ngrams;
};

namespace detail {

// One prompt's value, NaN when undefined. Orders are counted only up to the first one whose
// n-grams are all unique; from there (and past the longest response, where there are none) the
// counts follow from the lengths, so a huge n (up to INT_MAX) costs no more than a small one.
inline double distinct_one_prompt(const std::vector<span<const std::int64_t>>& responses, int n,
                                  const distinct_params& p) {
  const double undefined = std::numeric_limits<double>::quiet_NaN();
  if (responses.empty()) return undefined;
  index_t longest = 0;
  for (const auto& r : responses) longest = std::max(longest, r.size());
  std::vector<ngram_groups> orders;
  if (static_cast<index_t>(n) <= longest) orders = count_ngrams(responses, n, /*stop_when_unique=*/true);
  ngram_groups derived;
  const bool from_lengths = orders.size() < static_cast<std::size_t>(n);
  std::uint64_t distinct = 0;
  if (from_lengths) {
    // Past every response, or past the order from which every n-gram is unique: each response
    // has max(0, length - n + 1) n-grams, all distinct, none shared.
    derived.total.resize(responses.size());
    derived.unique.resize(responses.size());
    for (std::size_t s = 0; s < responses.size(); ++s) {
      const index_t len = responses[s].size();
      derived.total[s] = len >= static_cast<index_t>(n) ? static_cast<std::uint64_t>(len - n + 1) : 0;
      derived.unique[s] = static_cast<std::uint32_t>(derived.total[s]);
      distinct += derived.total[s];
    }
  }
  const ngram_groups& o = from_lengths ? derived : orders.back();
  if (!from_lengths) distinct = o.distinct();
  const auto denominator = [&](std::size_t s) -> std::uint64_t {
    return p.denominator == distinct_denominator::ngrams ? o.total[s]
                                                         : static_cast<std::uint64_t>(responses[s].size());
  };
  if (p.scope == distinct_scope::pooled_per_prompt) {
    std::uint64_t den = 0;
    for (std::size_t s = 0; s < responses.size(); ++s) den += denominator(s);
    return den == 0 ? undefined : static_cast<double>(distinct) / static_cast<double>(den);
  }
  double sum = 0.0;
  std::size_t defined = 0;
  for (std::size_t s = 0; s < responses.size(); ++s) {
    const std::uint64_t den = denominator(s);
    if (den == 0) continue;
    sum += static_cast<double>(o.unique[s]) / static_cast<double>(den);
    ++defined;
  }
  return defined == 0 ? undefined : sum / static_cast<double>(defined);
}

inline double distinct_n_spans(const std::vector<std::vector<span<const std::int64_t>>>& prompts, int n,
                               const distinct_params& p) {
  require(n >= 1, "n", "must be >= 1, got " + std::to_string(n));
  require(p.scope == distinct_scope::pooled_per_prompt || p.scope == distinct_scope::per_response,
          "params.scope", "unknown scope");
  require(p.denominator == distinct_denominator::ngrams || p.denominator == distinct_denominator::tokens,
          "params.denominator", "unknown denominator");
  require(!prompts.empty(), "responses", "at least one prompt is needed");
  for (const auto& r : prompts) require_token_budget(r, "responses");
  std::vector<double> values(prompts.size());
  parallel_for(static_cast<std::int64_t>(prompts.size()), loop_schedule::dynamic, [&](std::int64_t i) {
    values[static_cast<std::size_t>(i)] = guard_allocation(
        "responses", [&] { return "counting the n-grams of order " + std::to_string(n) + " of prompt " + std::to_string(i); },
        [&] { return distinct_one_prompt(prompts[static_cast<std::size_t>(i)], n, p); });
  });
  double sum = 0.0;
  std::size_t defined = 0;
  for (double v : values)
    if (!std::isnan(v)) {
      sum += v;
      ++defined;
    }
  require(defined > 0, "responses", "no response has an n-gram of order " + std::to_string(n) +
                                        " (or a token): Distinct-n is undefined");
  return sum / static_cast<double>(defined);
}

}  // namespace detail

// Many prompts, token ids.
inline double distinct_n(const std::vector<std::vector<token_ids>>& responses, int n,
                         const distinct_params& params = {}) {
  std::vector<std::vector<span<const std::int64_t>>> spans;
  spans.reserve(responses.size());
  for (const auto& r : responses) spans.push_back(detail::as_spans(r));
  return detail::distinct_n_spans(spans, n, params);
}

// One prompt, token ids.
inline double distinct_n(const std::vector<token_ids>& responses, int n, const distinct_params& params = {}) {
  return detail::distinct_n_spans({detail::as_spans(responses)}, n, params);
}

// Many prompts, text (each prompt's responses share a vocabulary; ids never cross prompts).
inline double distinct_n(const std::vector<std::vector<std::string>>& responses, int n,
                         const distinct_params& params = {}) {
  std::vector<std::vector<token_ids>> ids;
  ids.reserve(responses.size());
  for (const auto& r : responses) ids.push_back(tokenise_whitespace(r));
  return distinct_n(ids, n, params);
}

// One prompt, text.
inline double distinct_n(const std::vector<std::string>& responses, int n, const distinct_params& params = {}) {
  return distinct_n(tokenise_whitespace(responses), n, params);
}

}  // namespace eval
RECO_NAMESPACE_END
