// BLEU and Self-BLEU with the semantics of NLTK's sentence_bleu (uniform weights over orders
// 1..N, clipped n-gram precision, closest-reference brevity penalty, smoothing method0/method1).
//
//   reco::eval::bleu_params p;                     // BLEU-4, method1 smoothing (epsilon 0.1)
//   double b  = reco::eval::sentence_bleu(references, hypothesis, p);   // token ids or text
//   double sb = reco::eval::self_bleu(responses, p);          // leave-one-out mean over a set
//   auto per  = reco::eval::self_bleu_per_response(responses, p);
//   auto c    = reco::eval::self_bleu_among_correct(prompts, correct, p);  // c.mean, c.per_prompt
//   diversity = 1 - sb;
//
// Text inputs are split on ASCII whitespace (see ngram.hpp); token-id inputs are used as they are.
// Self-BLEU counts each response's n-grams once and keeps, for every n-gram, the largest and the
// second-largest count over the set: the clipping count against "all responses but h" is then
// the largest unless h holds it. A set of K responses of length L costs O(K·L·N) plus
// O(K log K) for the reference lengths, instead of the O(K²·L·N) of comparing every pair.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"
#include "reco/eval/ngram.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

enum class bleu_smoothing {
  method0,  // NLTK's default: an order with no match contributes log(DBL_MIN), i.e. score ~ 0
  method1,  // an order with no match gets precision epsilon / (number of hypothesis n-grams)
};

// Largest accepted bleu_params::max_order. Orders past the longest sequence only add smoothed
// empty precisions, and the per-response counts take K·max_order entries, so a larger order is
// refused rather than allocated.
constexpr int bleu_max_order_limit = 256;

struct bleu_params {
  int max_order = 4;                                  // BLEU-N; weights 1/N for orders 1..N
  bleu_smoothing smoothing = bleu_smoothing::method1;  // what diversity work uses; NLTK: method0
  double epsilon = 0.1;                               // method1's numerator
};

namespace detail {

inline void check_bleu_params(const bleu_params& p) {
  require(p.max_order >= 1 && p.max_order <= bleu_max_order_limit, "params.max_order",
          "must be in [1, " + std::to_string(bleu_max_order_limit) + "], got " + std::to_string(p.max_order));
  require(p.smoothing == bleu_smoothing::method0 || p.smoothing == bleu_smoothing::method1,
          "params.smoothing", "unknown smoothing method");
  require(std::isfinite(p.epsilon) && p.epsilon > 0, "params.epsilon", "must be finite and > 0");
}

// NLTK's closest reference length: the smallest |r - h|, ties going to the shorter reference.
inline std::uint64_t closest_reference_length(std::uint64_t best, std::uint64_t candidate,
                                              std::uint64_t hyp_len) {
  const auto distance = [hyp_len](std::uint64_t r) { return r > hyp_len ? r - hyp_len : hyp_len - r; };
  const std::uint64_t db = distance(best), dc = distance(candidate);
  return (dc < db || (dc == db && candidate < best)) ? candidate : best;
}

// BLEU from the clipped matches and hypothesis n-gram totals of each order (arrays of
// params.max_order entries).
inline double bleu_from_counts(const std::uint64_t* matches, const std::uint64_t* totals,
                               std::uint64_t hyp_len, std::uint64_t ref_len, const bleu_params& p) {
  // No unigram in common: 0 whatever the smoothing (NLTK returns before smoothing).
  if (matches[0] == 0) return 0.0;
  const double brevity =
      hyp_len > ref_len ? 1.0 : std::exp(1.0 - static_cast<double>(ref_len) / static_cast<double>(hyp_len));
  const double weight = 1.0 / static_cast<double>(p.max_order);
  double log_sum = 0.0;
  for (int n = 0; n < p.max_order; ++n) {
    const double denominator = static_cast<double>(totals[n] > 0 ? totals[n] : 1);
    double precision;
    if (matches[n] > 0)
      precision = static_cast<double>(matches[n]) / denominator;
    else if (p.smoothing == bleu_smoothing::method1)
      precision = p.epsilon / denominator;
    else
      precision = std::numeric_limits<double>::min();  // NLTK's sys.float_info.min
    log_sum += weight * std::log(precision);
  }
  return brevity * std::exp(log_sum);
}

inline double sentence_bleu_ids(const std::vector<span<const std::int64_t>>& references,
                                span<const std::int64_t> hypothesis, const bleu_params& p) {
  check_bleu_params(p);
  require(!references.empty(), "references", "at least one reference is needed");
  std::vector<span<const std::int64_t>> seqs = references;
  seqs.push_back(hypothesis);
  require_token_budget(seqs, "references");
  const std::size_t hyp = references.size();
  const auto orders = count_ngrams(seqs, p.max_order);

  std::vector<std::uint64_t> matches(static_cast<std::size_t>(p.max_order)), totals(matches.size());
  for (std::size_t n = 0; n < orders.size(); ++n) {
    const ngram_groups& o = orders[n];
    std::uint64_t clipped = 0;
    for (std::size_t r = 0; r < o.distinct(); ++r) {
      // The hypothesis is the last sequence, so its group (if any) is the run's last.
      const std::uint32_t last = o.run_begin[r + 1] - 1;
      if (o.group_seq[last] != hyp) continue;
      std::uint32_t max_ref = 0;
      for (std::uint32_t g = o.run_begin[r]; g < last; ++g) max_ref = std::max(max_ref, o.group_count[g]);
      clipped += std::min(o.group_count[last], max_ref);
    }
    matches[n] = clipped;
    totals[n] = o.total[hyp];
  }
  const std::uint64_t hyp_len = static_cast<std::uint64_t>(hypothesis.size());
  std::uint64_t ref_len = static_cast<std::uint64_t>(references[0].size());
  for (const auto& r : references)
    ref_len = closest_reference_length(ref_len, static_cast<std::uint64_t>(r.size()), hyp_len);
  return bleu_from_counts(matches.data(), totals.data(), hyp_len, ref_len, p);
}

inline std::vector<double> self_bleu_ids(const std::vector<span<const std::int64_t>>& responses,
                                         const bleu_params& p) {
  check_bleu_params(p);
  require(responses.size() >= 2, "responses", "Self-BLEU needs at least 2 responses");
  require_token_budget(responses, "responses");
  const auto orders = count_ngrams(responses, p.max_order);
  const std::size_t K = responses.size();
  const std::size_t N = static_cast<std::size_t>(p.max_order);

  // matches[h * N + n]: clipped order-(n+1) matches of h against all the other responses. For
  // each n-gram, the largest count in any response but h is the run's largest count unless h
  // holds it, then the second largest.
  std::vector<std::uint64_t> matches(K * N, 0);
  for (std::size_t n = 0; n < N; ++n) {
    const ngram_groups& o = orders[n];
    for (std::size_t r = 0; r < o.distinct(); ++r) {
      const std::uint32_t b = o.run_begin[r], e = o.run_begin[r + 1];
      std::uint32_t top1 = 0, top2 = 0, owner = 0;
      for (std::uint32_t g = b; g < e; ++g) {
        const std::uint32_t c = o.group_count[g];
        if (c > top1) {
          top2 = top1;
          top1 = c;
          owner = g;
        } else if (c > top2) {
          top2 = c;
        }
      }
      for (std::uint32_t g = b; g < e; ++g)
        matches[o.group_seq[g] * N + n] += std::min(o.group_count[g], g == owner ? top2 : top1);
    }
  }

  // Closest reference length among the others: with the lengths sorted, h's own length L is
  // the answer if another response has it too; otherwise the nearest shorter or longer one,
  // the shorter on a tie.
  std::vector<std::uint64_t> lengths(K);
  for (std::size_t s = 0; s < K; ++s) lengths[s] = static_cast<std::uint64_t>(responses[s].size());
  std::vector<std::uint64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> scores(K);
  std::vector<std::uint64_t> totals(N);
  for (std::size_t h = 0; h < K; ++h) {
    const std::uint64_t len = lengths[h];
    const auto lo = std::lower_bound(sorted.begin(), sorted.end(), len);
    const auto hi = std::upper_bound(lo, sorted.end(), len);
    std::uint64_t ref_len;
    if (hi - lo >= 2) {
      ref_len = len;
    } else {
      const bool has_shorter = lo != sorted.begin(), has_longer = hi != sorted.end();
      if (has_shorter && has_longer)
        ref_len = closest_reference_length(*(lo - 1), *hi, len);
      else
        ref_len = has_shorter ? *(lo - 1) : *hi;  // K >= 2, so one side exists
    }
    for (std::size_t n = 0; n < N; ++n) totals[n] = orders[n].total[h];
    scores[h] = bleu_from_counts(&matches[h * N], totals.data(), len, ref_len, p);
  }
  return scores;
}

inline double mean_of(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

}  // namespace detail

// ---- sentence BLEU: one hypothesis against its references --------------------------------------

inline double sentence_bleu(const std::vector<token_ids>& references, const token_ids& hypothesis,
                            const bleu_params& params = {}) {
  return detail::guard_allocation("references", [] { return std::string("counting n-grams"); }, [&] {
    return detail::sentence_bleu_ids(
        detail::as_spans(references),
        span<const std::int64_t>(hypothesis.data(), static_cast<index_t>(hypothesis.size())), params);
  });
}

inline double sentence_bleu(const std::vector<std::string>& references, const std::string& hypothesis,
                            const bleu_params& params = {}) {
  std::vector<std::string> all = references;
  all.push_back(hypothesis);
  std::vector<token_ids> ids = tokenise_whitespace(all);
  token_ids hyp = std::move(ids.back());
  ids.pop_back();
  return sentence_bleu(ids, hyp, params);
}

// ---- Self-BLEU: each response against the K - 1 others -----------------------------------------

inline std::vector<double> self_bleu_per_response(const std::vector<token_ids>& responses,
                                                  const bleu_params& params = {}) {
  return detail::guard_allocation("responses", [] { return std::string("counting n-grams"); },
                                  [&] { return detail::self_bleu_ids(detail::as_spans(responses), params); });
}

inline std::vector<double> self_bleu_per_response(const std::vector<std::string>& responses,
                                                  const bleu_params& params = {}) {
  return self_bleu_per_response(tokenise_whitespace(responses), params);
}

inline double self_bleu(const std::vector<token_ids>& responses, const bleu_params& params = {}) {
  return detail::mean_of(self_bleu_per_response(responses, params));
}

inline double self_bleu(const std::vector<std::string>& responses, const bleu_params& params = {}) {
  return detail::mean_of(self_bleu_per_response(responses, params));
}

// ---- Self-BLEU among correct responses (the paper's diversity table) ----------------------------

struct self_bleu_among_correct_result {
  double mean = 0.0;               // mean over the prompts used
  std::vector<double> per_prompt;  // NaN for a skipped prompt
  index_t prompts_used = 0;        // prompts with at least 2 correct responses
};

// prompts[i] holds prompt i's responses and correct[i][j] says whether response j of prompt i was
// verified correct. Prompts with fewer than 2 correct responses are skipped; if every prompt is
// skipped the value is undefined and the call throws.
inline self_bleu_among_correct_result self_bleu_among_correct(
    const std::vector<std::vector<token_ids>>& prompts, const std::vector<std::vector<bool>>& correct,
    const bleu_params& params = {}) {
  detail::check_bleu_params(params);
  detail::require(correct.size() == prompts.size(), "correct",
                  "has " + std::to_string(correct.size()) + " prompts, prompts has " +
                      std::to_string(prompts.size()));
  std::vector<std::vector<span<const std::int64_t>>> kept(prompts.size());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (correct[i].size() != prompts[i].size())
      detail::fail("correct", "prompt " + std::to_string(i) + " has " + std::to_string(correct[i].size()) +
                                  " flags for " + std::to_string(prompts[i].size()) + " responses");
    for (std::size_t j = 0; j < prompts[i].size(); ++j)
      if (correct[i][j])
        kept[i].emplace_back(prompts[i][j].data(), static_cast<index_t>(prompts[i][j].size()));
    if (kept[i].size() >= 2) detail::require_token_budget(kept[i], "prompts");
  }
  self_bleu_among_correct_result out;
  out.per_prompt.assign(prompts.size(), std::numeric_limits<double>::quiet_NaN());
  detail::parallel_for(static_cast<std::int64_t>(prompts.size()), detail::loop_schedule::dynamic, [&](std::int64_t ii) {
    const std::size_t i = static_cast<std::size_t>(ii);
    if (kept[i].size() < 2) return;
    out.per_prompt[i] = detail::guard_allocation(
        "prompts", [&] { return "scoring prompt " + std::to_string(i); },
        [&] { return detail::mean_of(detail::self_bleu_ids(kept[i], params)); });
  });
  double sum = 0.0;
  for (double v : out.per_prompt)
    if (!std::isnan(v)) {
      sum += v;
      ++out.prompts_used;
    }
  detail::require(out.prompts_used > 0, "correct", "no prompt has at least 2 correct responses");
  out.mean = sum / static_cast<double>(out.prompts_used);
  return out;
}

// Text form: each prompt's responses are tokenised together (ids are only compared within a
// prompt, so a per-prompt vocabulary is enough).
inline self_bleu_among_correct_result self_bleu_among_correct(
    const std::vector<std::vector<std::string>>& prompts, const std::vector<std::vector<bool>>& correct,
    const bleu_params& params = {}) {
  std::vector<std::vector<token_ids>> ids;
  ids.reserve(prompts.size());
  for (const auto& p : prompts) ids.push_back(tokenise_whitespace(p));
  return self_bleu_among_correct(ids, correct, params);
}

}  // namespace eval
RECO_NAMESPACE_END
