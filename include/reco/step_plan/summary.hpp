// A part's summary of a stage of the step plan (step_summary) and its layout: a header that every
// summary carries (the parts, the stage, the value width, the fingerprint, the input errors) and
// the body of each stage (stage 0: an optional first-digit histogram or covariance block, then
// seven fields per response of the step; a round: its histograms or per-response counts).
// Summaries of the same stage combine by element-wise addition; what a summed summary must hold
// is checked here (check_plan_header) and where a stage is taken (finish_plan, step_plan::advance).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "reco/config.hpp"
#include "reco/detail/radix_keys.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/result.hpp"
#include "reco/select/covariance.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/step_plan/summary_pool.hpp"

RECO_NAMESPACE_BEGIN
// A part's summary of a stage of the plan; summaries of the same stage combine by addition.
struct step_summary {
  std::vector<double> values;

  step_summary& operator+=(const step_summary& o) {
    if (values.empty()) {
      values = o.values;
      return *this;
    }
    detail::require(o.values.size() == values.size(), "plan",
                    "summaries of different sizes (" + std::to_string(values.size()) + " and " +
                        std::to_string(o.values.size()) +
                        "): the parts disagree on the step, its stage or its number of responses");
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += o.values[i];
    return *this;
  }
  // Adds o and takes its storage (for this thread's next summaries, as reco::recycle).
  step_summary& operator+=(step_summary&& o);
  double* data() { return values.data(); }
  std::size_t size() const { return values.size(); }
};

// Gives a used summary's storage (after finish_plan or step_plan::advance) to this thread's next
// summaries. Optional: it saves the allocation, nothing else.
inline void recycle(step_summary&& s) { detail::keep_spare(std::move(s.values), false); }

inline step_summary& step_summary::operator+=(step_summary&& o) {
  if (values.empty()) {
    values = std::move(o.values);
    return *this;
  }
  *this += static_cast<const step_summary&>(o);
  recycle(std::move(o));
  return *this;
}

namespace detail {

// Header of every summary (all fields are sums over parts).
enum : std::size_t {
  plan_h_parts = 0,        // 1 per part
  plan_h_stage = 1,        // the stage index, per part
  plan_h_width = 2,        // sizeof(T) of the part's values
  plan_h_fp = 3,           // 8 chunks of 8 bits of the fingerprint
  plan_h_fp_sq = 11,       // their squares: all parts agree iff parts * sum(x^2) == sum(x)^2
  plan_h_status = 19,      // 24 counters, one per input_error bit (plan_status_bits)
  plan_h_windows = 43,     // stage 0: 1 per windowed part; its first round: 1 per part that confirms
  plan_h_window_ids = 44,  // ... and the ids of those windows (a part_rounds' window)
  plan_h_check = 45,       // a checksum of every other value (summary_check.hpp) in 3 chunks of 21 bits
  plan_h_layout = 48,      // per part: where the positions several parts add end, and how many trail
  plan_h_refused = 50,     // per refusing part: the code of the argument it refused (refusal_code), and its square
  plan_header = 52,
};
inline constexpr int plan_status_bits = 24;

// The inputs a part's refusal names in its summary (plan_h_refused holds the index + 1; 0: none
// of these, read as `micro_batches`), as the LibTorch adapter and the core name them without
// their "batch." prefix. Append only: the codes are part of the summaries' layout.
inline constexpr const char* refusal_arguments[] = {
    "logp", "old_logp", "ref_logp", "entropy", "mask", "offsets", "rewards", "advantages", "token_advantages",
    "group_offsets", "prompt_ids", "token_weights", "response_weights", "rollout_logp", "group_size",
    "layout.offsets", "layout.responses", "layout.max_length", "part.first_response", "part.first_group",
    "part[0]", "part[2]", "part[3]", "scale"};
inline constexpr std::size_t refusal_argument_count = sizeof(refusal_arguments) / sizeof(refusal_arguments[0]);
inline double refusal_code(const std::string& argument) {
  const std::string bare = argument.compare(0, 6, "batch.") == 0 ? argument.substr(6) : argument;
  for (std::size_t k = 0; k < refusal_argument_count; ++k)
    if (bare == refusal_arguments[k]) return static_cast<double>(k + 1);
  return 0;
}
// Per-response fields of the first stage.
enum : std::size_t {
  plan_f_claimed = 0,
  plan_f_group = 1,  // group id + 1
  plan_f_length = 2,
  plan_f_span = 3,
  plan_f_old_mean = 4,
  plan_f_input = 5,
  plan_f_weight = 6,
  plan_fields = 7,
};
inline constexpr int plan_digit_bits = key_digit_bits;
inline constexpr std::size_t plan_buckets = key_digits;
inline constexpr std::size_t plan_histogram = digit_histogram_size;  // the buckets, then their groups

// Gives a summed summary that a plan has taken (finish_plan, step_plan::advance) back to this
// thread's next summaries, set to zero by writing only what can be nonzero: the header, the
// values after its `histograms` digit histograms (the per-response fields or counts), and in each
// histogram the runs of 256 digits whose group count is not zero (a group holds the sum of its
// digits' counts, all >= 0: a zero group has only zero digits). The next summary then needs no
// fill of a histogram's 2^16 counts, of which a step reaches a few thousand (0.04 ms per 0.5 MiB
// summary on the 2-vCPU guest, 7 % of the 80/20 plan at 1M tokens). For summaries this library
// summed from its own (internal: a histogram of other values would leave nonzero digits behind);
// histograms beyond the summary's size are a caller's error and give a plain recycle.
inline void recycle_taken(step_summary&& s, std::size_t histograms) {
  std::vector<double>& v = s.values;
  const std::size_t end = plan_header + histograms * plan_histogram;
  if (v.size() < end) return recycle(std::move(s));
  std::fill(v.begin(), v.begin() + plan_header, 0.0);
  for (double* h = v.data() + plan_header; h < v.data() + end; h += plan_histogram) {
    double* groups = h + key_digits;
    for (std::size_t g = 0; g < digit_groups; ++g) {
      if (groups[g] == 0) continue;  // a NaN count is cleared with the others
      std::fill(h + (g << digit_group_bits), h + ((g + 1) << digit_group_bits), 0.0);
      groups[g] = 0;
    }
  }
  std::fill(v.begin() + static_cast<std::ptrdiff_t>(end), v.end(), 0.0);
  keep_spare(std::move(v), true);
}

// Writes a 64-bit value as `parts` parts that agree on it sum it: 8 chunks of 8 bits at `sum` and
// their squares at `sq`.
inline void write_chunks(double* sum, double* sq, std::uint64_t x, double parts) {
  for (int c = 0; c < 8; ++c) {
    const double b = static_cast<double>((x >> (8 * c)) & 0xffu);
    sum[c] = parts * b;
    sq[c] = parts * b * b;
  }
}
// Whether the `parts` parts that summed chunks written by write_chunks agree (then `x` is their
// value): each chunk's sum a multiple of parts in [0, 255 parts], parts * sum(x^2) == sum(x)^2.
inline bool chunks_agree(const double* sum, const double* sq, double parts, std::uint64_t& x) {
  x = 0;
  for (int c = 0; c < 8; ++c) {
    const double b = sum[c] / parts;
    if (!(b >= 0 && b <= 255 && b == std::floor(b) && parts * sq[c] == sum[c] * sum[c])) return false;
    x |= static_cast<std::uint64_t>(b) << (8 * c);
  }
  return true;
}
inline void write_fingerprint(step_summary& s, std::uint64_t fp, double parts) {
  write_chunks(s.values.data() + plan_h_fp, s.values.data() + plan_h_fp_sq, fp, parts);
}

inline step_summary plan_summary(std::size_t body, int stage, std::size_t width, std::uint64_t fp) {
  step_summary s;
  s.values = summary_storage(plan_header + body);
  s.values[plan_h_parts] = 1;
  s.values[plan_h_stage] = stage;
  s.values[plan_h_width] = static_cast<double>(width);
  write_fingerprint(s, fp, 1);
  return s;
}

// Checks a summed header: every part agrees with the others and with `fp` (when fp_known).
inline void check_plan_header(const step_summary& s, int stage, std::uint64_t& fp, bool fp_known) {
  require(s.values.size() >= plan_header, "plan", "summary too short");
  const double parts = s.values[plan_h_parts];
  require(parts >= 1 && parts == std::floor(parts), "plan", "summary without parts (parts = " +
                                                             std::to_string(parts) + ")");
  std::uint64_t common = 0;
  if (!chunks_agree(s.values.data() + plan_h_fp, s.values.data() + plan_h_fp_sq, parts, common))
    fail("plan", "the parts disagree on the step or the objective (step id, number of responses, scale, "
                 "configuration digest, value type, preset or parameters differ between parts)");
  if (fp_known && common != fp)
    fail("plan", "the summaries were made for another step or objective than this one");
  fp = common;
  const double width = s.values[plan_h_width] / parts;
  if (width != 4 && width != 8)
    fail("summaries", "header.width is " + std::to_string(s.values[plan_h_width]) + " for " + std::to_string(parts) +
                          " parts (each part adds its value width, 4 or 8 bytes)");
  if (s.values[plan_h_stage] != parts * stage)
    fail("plan", "the parts' summaries are from different stages of the plan (expected stage " +
                     std::to_string(stage) + ")");
}


// Whether a stage-0 summary carries the first histogram round of an 80/20 cut (a selector that
// finds its cut; the first digit needs nothing from the other parts, so it rides with the
// summaries instead of costing a round of its own).
template <class Obj>
bool summary_has_histogram(const Obj& obj) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) return false;
  else if constexpr (Obj::selector_type::active) return term_on(obj.select) && !term_of(obj.select).params.use_given;
  else return false;
}

// The block of a stage-0 summary before the per-response fields: the first histogram round of a
// cut, or for a covariance selection three values per response of the step (the sum of logp over
// its valid tokens; the sum of A_t; flags: +1 when its advantages are given per token, +2 when it
// is the first response of a part), from which the plan takes the step's means and its parts.
inline constexpr std::size_t covariance_slots = 3;
inline constexpr int covariance_token_advantages = 1, covariance_part_start = 2;
// The largest table of the parts' top values (P(2k + 1) + 1) a covariance plan sums in one round;
// beyond it, the radix rounds (each a 2^16-bucket histogram, four for doubles) and the counts
// cost less.
inline constexpr std::size_t covariance_table_limit = 2 * plan_histogram;
template <class Obj>
std::size_t stage0_block(const Obj& obj, index_t responses) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>)
    return covariance_slots * static_cast<std::size_t>(responses);
  else return summary_has_histogram(obj) ? plan_histogram : 0;
}

}  // namespace detail
RECO_NAMESPACE_END
