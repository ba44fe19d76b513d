// The step's plan (step_plan): what every call of a split step needs from the rest of the step,
// built by finish_plan (reco/step_plan/finish.hpp) from the summed stage-0 summaries and advanced
// by the rounds of an 80/20 cut or a covariance selection (step_plan::advance) until complete;
// then each part's call reads its slice (call_for).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/step_slice.hpp"
#include "reco/config.hpp"
#include "reco/detail/radix_keys.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/step_plan/step.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_check.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// One counter for every plan of the process, whatever its objective type.
inline std::uint64_t next_plan_serial() {
  static std::atomic<std::uint64_t> serials{1};
  return serials.fetch_add(1, std::memory_order_relaxed);
}
// The step's order of a covariance selection's tokens, as far as the table needs it: value (its
// order key) descending, then response. The parts and the plan must rank alike.
inline bool before_in_step(std::uint64_t key_a, index_t response_a, std::uint64_t key_b, index_t response_b) {
  return key_a != key_b ? key_a > key_b : response_a < response_b;
}

}  // namespace detail

// The step's plan: what every call of a split step needs from the rest of the step.
class step_plan {
 public:
  // top_values: a covariance selection's round of each part's first k candidates; confirm: the
  // last stage, where every part confirms that it holds the same sums as the others (a digest of
  // every stage's sums) and that the last stage's sums passed its checksum.
  enum class stage_kind : std::uint8_t { histogram, cut_counts, complete, top_values, confirm };

  bool complete() const { return stage_ == stage_kind::complete; }
  stage_kind stage() const { return stage_; }
  int stage_index() const { return stage_index_; }
  std::uint64_t fingerprint() const { return fingerprint_; }
  // A number no other plan of this process has (copies share it): what a part_rounds is bound to.
  std::uint64_t serial() const { return serial_; }
  const step_info& step() const { return step_; }

  // The step's counts (valid tokens, non-empty responses, R, L_max) and the policy term's (kept
  // tokens and responses with a kept-denominator selector).
  const aggregation_counts& valid_counts() const { return valid_; }
  const aggregation_counts& policy_counts() const { return policy_; }
  // The step's cut (selection only) and the final per-response values of the step.
  const entropy_cut& cut() const { return cut_; }
  const std::vector<double>& advantages() const { return adv_; }
  const std::vector<double>& weights() const { return weight_; }
  const std::vector<index_t>& kept() const { return kept_; }

  // Combines the summed summaries of the current round (see plan_round).
  void advance(const step_summary& total) {
    detail::require(!complete(), "plan", "is complete; no round is pending");
    if (stage_ == stage_kind::confirm) return take_confirmation(total);
    // The checksum first: a sum altered after its parts made it is refused before anything reads
    // it. After the last round (cut counts, top values) the refusal waits for the confirmation,
    // so that every rank refuses alike; after a histogram round the next round's size depends on
    // these sums, and this rank refuses at once.
    std::uint64_t digest = 0;
    if (!detail::checksum_holds(total, &digest)) {
      if (stage_ != stage_kind::histogram) return refuse_to_confirm();
      detail::refuse_summary("of stage " + std::to_string(stage_index_), detail::checksum_failure());
    }
    digest_ = detail::check_mix(digest_ ^ digest);
    std::uint64_t fp = fingerprint_;
    detail::check_plan_header(total, stage_index_, fp, true);
    detail::check_header_counts(total);
    const double* v = total.values.data() + detail::plan_header;
    if (stage_ == stage_kind::top_values) {
      detail::require(total.values.size() == detail::plan_header + round_body(), "plan",
                      "top-value summary of the wrong size");
      take_top_values(v);
      return;
    }
    if (stage_ == stage_kind::histogram) {
      detail::require(total.values.size() == detail::plan_header + round_body(), "plan",
                      "histogram summary of the wrong size");
      check_round_histograms(v);
      ++stage_index_;
      if (covariance_ && round_ == 0) {
        // The k largest values among the parts' candidates (covariance_candidates), whose number
        // the first histogram gives: all of them when there are k or fewer and no part left a
        // selectable token out; else the k-th largest (the least, when there are k or fewer).
        double candidates = 0;
        for (std::size_t g = 0; g < detail::digit_groups; ++g) candidates += v[detail::key_digits + g];
        const auto n = static_cast<index_t>(candidates);
        if (n <= select_k_ && v[detail::plan_histogram] == 0) {
          cut_ = entropy_cut{-HUGE_VAL, -1};
          stage_ = stage_kind::cut_counts;
          return;
        }
        ranks_[0] = ranks_[1] = rank_[0] = rank_[1] = n > select_k_ ? n - select_k_ : 0;
      }
      if (windows_ > 0) {
        // The first round after a windowed stage 0: unless every windowed part confirmed that its
        // window holds the target digits, they may be wrong; count every first digit again.
        const bool confirmed = total.values[detail::plan_h_windows] == windows_ &&
                               total.values[detail::plan_h_window_ids] == window_ids_;
        windows_ = window_ids_ = 0;
        if (!confirmed) {
          round_ = 0;
          for (int j = 0; j < 2; ++j) {
            rank_[j] = ranks_[j];
            prefix_[j] = 0;
          }
          return;
        }
      }
      take_histogram(v, round_ == 0 ? 0 : detail::plan_histogram);
      return;
    }
    // Cut counts: per response, tokens above and on the cut.
    const index_t R = step_.responses;
    detail::require(total.values.size() == detail::plan_header + 2 * static_cast<std::size_t>(R), "plan",
                    "cut-count summary of the wrong size");
    double greater = 0;
    for (index_t i = 0; i < R; ++i) {
      const double above = v[2 * i], on = v[2 * i + 1];
      if (!(detail::is_count(above) && detail::is_count(on) && above + on <= static_cast<double>(length_[i])))
        detail::refuse_summary("cut_counts", "of response " + std::to_string(i) + " are " + std::to_string(above) +
                                                 " above and " + std::to_string(on) + " on the cut (counts of its " +
                                                 std::to_string(length_[i]) + " valid tokens)");
      greater += above;
    }
    index_t budget = -1;  // ties to keep in step order (-1: all)
    if (cut_.ties >= 0) {
      budget = select_.use_given ? cut_.ties : select_k_ - static_cast<index_t>(greater);
      if (budget < 0) detail::fail("plan", "more tokens above the cut than the selection keeps (inconsistent parts)");
    }
    ties_.assign(R, 0);
    kept_.assign(R, 0);
    for (index_t i = 0; i < R; ++i) {
      const auto above = static_cast<index_t>(v[2 * i]), on = static_cast<index_t>(v[2 * i + 1]);
      index_t take = on;
      if (budget >= 0) {
        take = on < budget ? on : budget;
        budget -= take;
      }
      // -1 where the response keeps every token on the cut (all but the one response of the step
      // the budget runs out in): its kept flags then need no walk in position order.
      ties_[i] = budget < 0 || take == on ? -1 : take;
      kept_[i] = above + take;
    }
    finish_kept();
  }

  // The slice of the plan a call of `responses` responses starting at `first` reads.
  detail::step_slice call_for(index_t first, index_t responses) const {
    detail::require(complete(), "plan", "is not complete: run its rounds (plan_round / advance) first");
    detail::require(first >= 0 && responses >= 0 && first + responses <= step_.responses, "plan",
                    "part [" + std::to_string(first) + ", " + std::to_string(first + responses) +
                        ") lies outside the step's " + std::to_string(step_.responses) + " responses");
    detail::step_slice c;
    c.advantage = adv_.data() + first;
    c.weight = weight_.data() + first;
    c.capped = capped_.data() + first;
    c.length = length_.data() + first;
    c.ties = has_selection_ ? ties_.data() + first : nullptr;
    c.kept = has_selection_ ? kept_.data() + first : nullptr;
    c.cut = cut_;
    c.valid = valid_;
    c.policy = policy_;
    c.scale = step_.scale;
    c.first = first;
    c.covariance_adv = covariance_means_[0];
    c.covariance_logp = covariance_means_[1];
    return c;
  }

  // The size of the pending round's summary body: its digit histograms (and after them, in a
  // covariance selection's first round, the parts that left selectable tokens out), or per
  // response the tokens above and on the cut.
  std::size_t round_body() const {
    if (stage_ == stage_kind::confirm) return confirm_body;
    if (stage_ == stage_kind::top_values) return part_starts_.size() * part_top_values() + 1;
    if (stage_ != stage_kind::histogram) return 2 * static_cast<std::size_t>(step_.responses);
    return static_cast<std::size_t>(histograms()) * detail::plan_histogram + (covariance_ && round_ == 0 ? 1 : 0);
  }
  // The tokens a top-k or covariance selection keeps over the step (k).
  index_t selected_count() const { return select_k_; }
  // Response i's valid tokens, as the summaries counted them.
  index_t valid_tokens(index_t i) const { return length_[static_cast<std::size_t>(i)]; }
  // Covariance selection (Clip-Cov / KL-Cov): the step's mean A and mean logp.
  bool covariance() const { return covariance_; }
  double covariance_adv_mean() const { return covariance_means_[0]; }
  double covariance_logp_mean() const { return covariance_means_[1]; }
  // A covariance selection's top-value round: each part's slots (a count, then k (value, response)
  // pairs), and the index of the part that starts at response `first` among the step's non-empty
  // parts (its slots from index · part_top_values()), or -1 when no part starts there.
  std::size_t part_top_values() const { return 2 * static_cast<std::size_t>(select_k_) + 1; }
  index_t part_slot(index_t first) const {
    const auto it = std::lower_bound(part_starts_.begin(), part_starts_.end(), first);
    return it != part_starts_.end() && *it == first ? static_cast<index_t>(it - part_starts_.begin()) : -1;
  }
  // The digit histograms the stage-0 summary carried (0 or 1): what recycle_taken clears of it.
  std::size_t summary_histograms() const { return summary_histograms_; }

  // Where a part's histogram round looks (used by plan_round). Round 0 (after a windowed stage 0
  // that a part's window missed) counts every first digit, in one histogram for every target.
  int targets() const { return targets_; }
  int round() const { return round_; }
  int histograms() const { return round_ == 0 ? 1 : targets_; }
  // The windowed parts whose confirmation the pending round carries (0: none awaited).
  double windows() const { return windows_; }
  int rounds() const { return static_cast<int>(width_ * 8 / detail::plan_digit_bits); }
  std::uint64_t prefix(int j) const { return prefix_[j]; }
  std::size_t width() const { return width_; }
  // The confirmation's body (plan_round): a digest of every stage's sums this part holds, as 8
  // chunks of 8 bits and their squares (all parts agree iff parts * sum(x^2) == sum(x)^2), then
  // 1 when this part refused the last stage's sums (their checksum failed).
  static constexpr std::size_t confirm_body = 17;
  std::uint64_t digest() const { return digest_; }
  bool refused() const { return refused_; }

 private:
  // The top-value round. The step selects its first k selectable tokens in the order value
  // descending, then step position; a part's first k in that order hold every token of it the step
  // selects, so the step's selection is the first k of the table. Equal (value, response) pairs
  // are interchangeable: a response keeps its first tokens on the cut in position order, and only
  // their number matters here. When the table holds k or fewer and every part sent all its
  // selectable tokens, all are taken; a part that sent fewer sent k, so the table then holds k or
  // more. Values are ranked by their order keys, as the radix rounds rank them.
  void take_top_values(const double* v) {
    const auto K = static_cast<std::size_t>(select_k_);
    const std::size_t P = part_starts_.size(), slots = part_top_values();
    const index_t R = step_.responses;
    struct entry {
      std::uint64_t key;
      index_t response;
    };
    std::vector<entry> table;
    const double partial = v[P * slots];  // the parts that sent fewer than all their selectable tokens
    if (!(detail::is_count(partial) && partial <= static_cast<double>(P)))
      detail::refuse_summary("top_values", "count " + std::to_string(partial) + " parts that left tokens out, of " +
                                               std::to_string(P));
    for (std::size_t p = 0; p < P; ++p) {
      const double* slot = v + p * slots;
      const double n = slot[0];
      if (!(n >= 0 && n <= static_cast<double>(K) && n == std::floor(n)))
        detail::fail("plan", "a part sent " + std::to_string(n) + " top values for a selection of " +
                                 std::to_string(K) + " (inconsistent parts)");
      for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j) {
        const double i = slot[2 + 2 * j];
        if (!(i >= 0 && i < static_cast<double>(R) && i == std::floor(i)))
          detail::fail("plan", "a part sent a top value of response " + std::to_string(i) + ", outside the step's " +
                                   std::to_string(R) + " (inconsistent parts)");
        if (!std::isfinite(slot[1 + 2 * j]))
          detail::refuse_summary("top_values", "hold " + std::to_string(slot[1 + 2 * j]) + " for response " +
                                                   std::to_string(i) + " (selection values are finite)");
        table.push_back(entry{detail::order_key_bits(slot[1 + 2 * j]), static_cast<index_t>(i)});
      }
    }
    kept_.assign(R, 0);
    if (table.size() <= K && partial == 0) {
      cut_ = entropy_cut{-HUGE_VAL, -1};  // every selectable token of the step
      for (const entry& e : table) ++kept_[e.response];
      ties_.assign(R, -1);
    } else {
      ties_.assign(R, 0);
      if (table.size() < K)
        detail::fail("plan", "parts sent " + std::to_string(table.size()) + " top values, fewer than the " +
                                 std::to_string(K) + " selected, yet left tokens out (inconsistent parts)");
      std::nth_element(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(K - 1), table.end(),
                       [](const entry& a, const entry& b) { return detail::before_in_step(a.key, a.response, b.key, b.response); });
      const std::uint64_t cut = table[K - 1].key;
      cut_ = entropy_cut{detail::key_value(cut, sizeof(double)), 0};
      // ties_[i]: the response's tokens on the cut that it keeps (the first ones in position order).
      for (std::size_t j = 0; j < K; ++j) {
        ++kept_[table[j].response];
        ties_[table[j].response] += table[j].key == cut;
      }
    }
    finish_kept();
  }

  // After the cut counts or the top values: the kept counts (kept-denominator selectors), and the
  // plan is complete.
  void finish_kept() {
    double kept_tokens = 0, kept_responses = 0;
    for (const index_t k : kept_) {
      kept_tokens += static_cast<double>(k);
      kept_responses += k > 0 ? 1 : 0;
    }
    if (kept_denominator_) {
      policy_.tokens = kept_tokens;
      policy_.responses = kept_responses;
    }
    ++stage_index_;
    stage_ = stage_kind::confirm;
  }

  // The last stage's sums failed their checksum on this part: the plan waits for the
  // confirmation, where every part learns it and refuses alike.
  void refuse_to_confirm() {
    refused_ = true;
    ++stage_index_;
    stage_ = stage_kind::confirm;
  }
  // The confirmation: no part refused the last stage's sums, and all hold the same sums.
  void take_confirmation(const step_summary& total) {
    detail::require(total.values.size() == detail::plan_header + confirm_body, "plan",
                    "confirmation of the wrong size (a round of another stage?)");
    if (!detail::checksum_holds(total))
      detail::refuse_summary("of the confirmation", detail::checksum_failure());
    const double* v = total.values.data() + detail::plan_header;
    const double parts = total.values[detail::plan_h_parts];
    if (v[16] != 0)
      detail::refuse_summary("of the plan's last stage",
                             "failed their checksum on " + std::to_string(v[16]) + " of " + std::to_string(parts) +
                                 " parts: a summary was altered after its part made it (in flight or in a rank's "
                                 "memory); every part refuses the plan");
    std::uint64_t fp = fingerprint_;
    detail::check_plan_header(total, stage_index_, fp, true);
    detail::check_header_counts(total);
    std::uint64_t agreed = 0;
    if (!detail::chunks_agree(v, v + 8, parts, agreed) || agreed != digest_)
      detail::refuse_summary("of the plan's stages",
                             "differ between parts: the ranks received different sums from the same collectives");
    ++stage_index_;
    stage_ = stage_kind::complete;
  }

  // A histogram round: every bucket a count, the runs' sums their buckets' sums, and each target's
  // histogram holding the tokens of the bucket it narrows (the first round, or one that counts
  // every first digit again, all valid tokens; a covariance selection's first, its candidates).
  void check_round_histograms(const double* v) const {
    if (covariance_ && round_ == 0) {
      const double partial = v[static_cast<std::size_t>(histograms()) * detail::plan_histogram];
      if (!(detail::is_count(partial) && partial <= static_cast<double>(part_starts_.size())))
        detail::refuse_summary("histogram", "counts " + std::to_string(partial) + " parts that left tokens out");
    }
    for (int j = 0; j < histograms(); ++j) {
      const double total = detail::check_histogram(v + static_cast<std::size_t>(j) * detail::plan_histogram, "histogram");
      const double expected = round_ == 0 ? (covariance_ ? -1.0 : valid_.tokens) : in_prefix_[j];
      // A windowed stage 0's first round may be discarded (its windows unconfirmed): its counts
      // are exact only inside the windows.
      if (expected >= 0 && total != expected && windows_ == 0)
        detail::refuse_summary("histogram", "of round " + std::to_string(round_) + " counts " +
                                                std::to_string(total) + " tokens under its prefix, not the " +
                                                std::to_string(expected) + " the previous stage found there");
    }
  }

  // One histogram round: per target j, the summed histogram at v + j * stride (stride 0: one
  // histogram for every target, as in the first round) narrows its prefix by a digit.
  void take_histogram(const double* v, std::size_t stride) {
    for (int j = 0; j < targets_; ++j) {
      double below = 0;
      const std::size_t b = detail::digit_at_rank(v + j * stride, static_cast<double>(rank_[j]), below);
      if (b == detail::plan_buckets)
        detail::fail("plan", "the parts' histograms hold fewer valid tokens than their summaries counted "
                             "(inconsistent parts)");
      rank_[j] -= static_cast<index_t>(below);
      in_prefix_[j] = v[j * stride + b];
      prefix_[j] = (prefix_[j] << detail::plan_digit_bits) | b;
    }
    ++round_;
    if (round_ < rounds()) return;
    const double v0 = detail::key_value(prefix_[0], width_);
    if (select_.rule == selection_rule::top_k) {
      cut_.value = v0;
      cut_.ties = 0;  // set from the counts
    } else {
      const double v1 = detail::key_value(prefix_[1], width_);
      const double n = valid_.tokens;
      const double pos = (1.0 - select_.rho) * (n > 0 ? n - 1 : 0);
      const double frac = pos - static_cast<double>(ranks_[0]);
      cut_.value = v0 + frac * (v1 - v0);
      cut_.ties = -1;
    }
    stage_ = stage_kind::cut_counts;
  }

  template <class Obj>
  friend step_plan finish_plan(const Obj& obj, const step_info& step, const step_summary& total);

  stage_kind stage_ = stage_kind::complete;
  int stage_index_ = 0;
  std::uint64_t fingerprint_ = 0, serial_ = 0;
  step_info step_{};
  std::size_t width_ = 8;
  aggregation_counts valid_{}, policy_{};
  std::vector<double> adv_, weight_;
  std::vector<std::uint8_t> capped_;
  std::vector<index_t> length_, ties_, kept_;
  bool has_selection_ = false, kept_denominator_ = false;
  top_entropy_selection::params_type select_{};
  index_t select_k_ = 0;
  index_t ranks_[2] = {0, 0};  // ascending ranks of the cut's order statistics among valid tokens
  index_t rank_[2] = {0, 0};   // ... within the current prefix
  std::uint64_t prefix_[2] = {0, 0};
  double in_prefix_[2] = {0, 0};  // the valid tokens under each prefix (what its next histogram holds)
  std::uint64_t digest_ = 0;      // of every stage's sums this part took
  bool refused_ = false;          // the last stage's sums failed their checksum here
  int targets_ = 0, round_ = 0;
  double windows_ = 0, window_ids_ = 0;  // the windowed parts of stage 0 and the sum of their ids
  entropy_cut cut_{HUGE_VAL, -1};
  bool covariance_ = false;
  double covariance_means_[2] = {0, 0};
  std::vector<index_t> part_starts_;  // a covariance selection's non-empty parts: their first responses
  std::size_t summary_histograms_ = 0;
};

namespace detail {
// The digit histograms of a summed summary (for recycle_taken): a stage-0 summary holds
// plan.summary_histograms(); a round that `plan` is about to take (before advance) holds
// plan.targets() of them in a histogram round, none in the cut counts.
inline std::size_t round_histograms(const step_plan& plan) {
  return plan.stage() == step_plan::stage_kind::histogram ? static_cast<std::size_t>(plan.histograms()) : 0;
}
}  // namespace detail
RECO_NAMESPACE_END
