// What a summed summary of the step plan can hold, checked before the plan reads it: a checksum
// that every part writes over its own summary and that survives the element-wise sum (seal,
// checksum_holds), and the ranges a sum of valid summaries keeps (counts that are integers, a
// header whose counters fit its parts, histograms whose group counts are the sums of their
// buckets). A summary that fails is a reco::error naming `summaries` and the field.
//
// The checksum. The positions several parts add (the header, digit histograms, a count that
// trails a round) hold integers, and every other position is written by exactly one part, the
// others adding zeros. So per position k a contribution g_k(v) with g_k(0) = 0 that is linear on
// the integers where parts add (w_k * v, w_k odd) and any function of the bits elsewhere
// (a multiply-fold of bits(v) and k) adds up: the sum's checksum is the sum of the parts',
// modulo 2^63. A part writes its checksum in three 21-bit chunks, which add up exactly in a
// double for up to 2^29 parts. A value altered after its part sealed it (in flight, in a rank's
// memory) passes with odds about 2^-63 (where parts add: never, for counts below 2^53); the
// sums are exact, so no tolerance is needed. The layout (where the added positions end, how many
// trail the summary) rides in the header.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "reco/config.hpp"
#include "reco/step_plan/step.hpp"
#include "reco/step_plan/summary.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline constexpr std::uint64_t check_mask = (std::uint64_t{1} << 63) - 1;
inline constexpr double max_count = 9007199254740992.0;  // 2^53: counts beyond it are not exact
// The most parts one summary may sum (their checksum chunks stay exact in a double).
inline constexpr double max_parts = 536870912.0;  // 2^29

inline std::uint64_t check_mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline std::uint64_t check_weight(std::size_t k) { return ((k + 1) * 0x9e3779b97f4a7c15ull) | 1; }

// Whether the 8 values at v are all zero (either sign): one OR over their bits, so that the
// loops below pass over a histogram's empty stretches 8 buckets at a time.
inline bool zero8(const double* v) {
  std::uint64_t b[8];
  std::memcpy(b, v, sizeof b);
  return ((b[0] | b[1] | b[2] | b[3] | b[4] | b[5] | b[6] | b[7]) << 1) == 0;
}

// Positions several parts add: w_k * v (mod 2^64) for the integer v (a fixed odd constant when v
// is no integer below 2^62, which a sum of valid summaries never holds there: it then fails the
// checksum). A zero adds nothing.
inline std::uint64_t added_term(double x, std::size_t k) {
  const double in_range = std::fabs(x) < 4611686018427387904.0 ? x : 0.0;  // NaN: 0
  const auto i = static_cast<std::int64_t>(in_range);
  return check_weight(k) * (static_cast<double>(i) == x ? static_cast<std::uint64_t>(i) : 0x5bd1e995u);
}
inline std::uint64_t added_checksum(const double* v, std::size_t begin, std::size_t end) {
  std::uint64_t acc = 0;
  std::size_t k = begin;
  for (; k + 8 <= end; k += 8)
    if (!zero8(v + k))
      for (std::size_t j = k; j < k + 8; ++j) acc += added_term(v[j], j);
  for (; k < end; ++k) acc += added_term(v[k], k);
  return acc;
}
// Positions one part writes: a multiply-fold of the value's bits (-0 as +0) and k.
inline std::uint64_t written_checksum(const double* v, std::size_t begin, std::size_t end) {
  std::uint64_t acc = 0;
  for (std::size_t k = begin; k < end; ++k) {
    const double x = v[k] + 0.0;
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const std::uint64_t p = (bits ^ (bits >> 32)) * check_weight(k);
    acc += bits == 0 ? 0 : p ^ (p >> 29);
  }
  return acc;
}

// A summary's layout for its checksum, as its header holds it (parts that agree sum it).
struct check_layout {
  std::size_t added = 0, trailing = 0;  // [0, added) and the last `trailing` positions are added
  bool valid = false;
};
inline check_layout layout_of(const step_summary& s) {
  check_layout l;
  const double parts = s.values[plan_h_parts];
  if (!(parts >= 1 && parts <= 536870912.0 && parts == std::floor(parts))) return l;
  const double a = s.values[plan_h_layout] / parts, t = s.values[plan_h_layout + 1] / parts;
  const auto n = static_cast<double>(s.values.size());
  if (!(a >= static_cast<double>(plan_header) && a <= n && a == std::floor(a) && t >= 0 && t <= n - a && t == std::floor(t))) return l;
  l.added = static_cast<std::size_t>(a);
  l.trailing = static_cast<std::size_t>(t);
  l.valid = true;
  return l;
}
// The checksum of a summary's values (its own slots left out), modulo 2^63.
inline std::uint64_t summary_checksum(const step_summary& s, const check_layout& l) {
  const double* v = s.values.data();
  const std::size_t n = s.values.size(), tail = n - l.trailing;
  const std::uint64_t c = added_checksum(v, 0, plan_h_check) + added_checksum(v, plan_h_check + 3, l.added) +
                          written_checksum(v, l.added, tail) + added_checksum(v, tail, n);
  return c & check_mask;
}

// Writes a part's checksum into its summary (after every other value is final): positions
// [0, added) and the last `trailing` are those parts add. The one-argument form seals a summary
// again with the layout its header holds (a sum of parts, moved or altered on purpose by a test).
inline void seal(step_summary& s) {
  if (s.values.size() < plan_header) return;
  const check_layout l = layout_of(s);
  if (!l.valid) return;
  const std::uint64_t c = summary_checksum(s, l);
  for (int j = 0; j < 3; ++j) s.values[plan_h_check + j] = static_cast<double>((c >> (21 * j)) & 0x1fffffu);
}
inline void seal(step_summary& s, std::size_t added, std::size_t trailing) {
  s.values[plan_h_layout] = static_cast<double>(added) * s.values[plan_h_parts];
  s.values[plan_h_layout + 1] = static_cast<double>(trailing) * s.values[plan_h_parts];
  seal(s);
}

inline bool is_count(double x) { return x >= 0 && x <= max_count && x == std::floor(x); }

[[noreturn]] inline void refuse_summary(const std::string& field, const std::string& what) {
  fail("summaries", field + " " + what);
}

// Whether a summed summary's values match the checksums its parts wrote; `digest` receives a
// 64-bit digest of the values, the same on every rank that holds the same sums.
inline bool checksum_holds(const step_summary& s, std::uint64_t* digest = nullptr) {
  if (s.values.size() < plan_header) return false;
  const check_layout l = layout_of(s);
  if (!l.valid) return false;
  std::uint64_t sum = 0;  // the parts' checksums: sum_j chunk_j 2^(21 j), modulo 2^63
  for (int j = 0; j < 3; ++j) {
    const double c = s.values[plan_h_check + j];
    if (!is_count(c)) return false;
    sum += static_cast<std::uint64_t>(c) << (21 * j);
  }
  const std::uint64_t mine = summary_checksum(s, l);
  if (digest) *digest = check_mix(mine ^ check_mix(s.values.size()));
  return (sum & check_mask) == mine;
}

inline const char* checksum_failure() {
  return "do not match the checksums their parts wrote: a summary was altered after its part made it "
         "(in flight or in a rank's memory), or was not made by this library";
}

// The header's counters against its number of parts: every counter a part writes as 0 or 1 is a
// count of at most `parts`; the windows' ids lie in [1, 2^20] each.
inline void check_header_counts(const step_summary& s) {
  const double parts = s.values[plan_h_parts];
  if (!(is_count(parts) && parts >= 1 && parts <= max_parts))
    refuse_summary("header.parts", "is " + std::to_string(parts) + " (a count of parts in [1, 2^29])");
  for (int k = 0; k < plan_status_bits; ++k) {
    const double c = s.values[plan_h_status + k];
    if (!(is_count(c) && c <= parts))
      refuse_summary("header.errors", "counter " + std::to_string(k) + " is " + std::to_string(c) +
                                          " (a count of parts in [0, " + std::to_string(parts) + "])");
  }
  const double refused = s.values[plan_h_refused], refused_sq = s.values[plan_h_refused + 1];
  const auto codes = static_cast<double>(refusal_argument_count);
  if (!(is_count(refused) && refused <= parts * codes && is_count(refused_sq) && refused_sq <= parts * codes * codes))
    refuse_summary("header.refused", "is " + std::to_string(refused) + " (squares " + std::to_string(refused_sq) +
                                         "): a sum of argument codes in [0, " + std::to_string(refusal_argument_count) +
                                         "] per part");
  const double w = s.values[plan_h_windows], ids = s.values[plan_h_window_ids];
  if (!(is_count(w) && w <= parts))
    refuse_summary("header.windows", "is " + std::to_string(w) + " (a count of parts)");
  if (!(is_count(ids) && ids >= w && ids <= w * 1048576.0))
    refuse_summary("header.window_ids", "is " + std::to_string(ids) + " (a sum of " + std::to_string(w) +
                                            " ids in [1, 2^20])");
}

// Parts that refused their inputs on their rank (refusal_summary): the error every rank raises
// from the same sums, naming the argument when the refusing parts agree on it.
inline void throw_if_refused(const step_summary& s) {
  constexpr int bit = [] {
    int k = 0;
    while (!(bad_part_input & (1u << k))) ++k;
    return k;
  }();
  const double refusing = s.values[plan_h_status + bit];
  if (refusing == 0) return;
  const double sum = s.values[plan_h_refused], sq = s.values[plan_h_refused + 1];
  std::string argument = "micro_batches";
  const double code = sum / refusing;
  if (refusing * sq == sum * sum && code >= 1 && code == std::floor(code) &&
      code <= static_cast<double>(refusal_argument_count))
    argument = refusal_arguments[static_cast<std::size_t>(code) - 1];
  fail(argument, "failed its checks on " + std::to_string(static_cast<long long>(refusing)) + " of " +
                     std::to_string(static_cast<long long>(s.values[plan_h_parts])) +
                     " parts of this step (a micro-batch its rank could not summarise: a shape, a missing input or "
                     "a conversion); every rank stops at the step's summaries");
}

// A digit histogram of a summed summary (the buckets, then the sums of their runs of 256): every
// bucket a count, every run's sum the sum of its buckets. Returns the histogram's total.
inline double check_histogram(const double* h, const char* field) {
  double total = 0;
  for (std::size_t g = 0; g < digit_groups; ++g) {
    double run = 0;
    for (std::size_t d0 = g << digit_group_bits; d0 < (g + 1) << digit_group_bits; d0 += 8) {
      if (zero8(h + d0)) continue;  // a run of 256 is 32 blocks of 8
      for (std::size_t d = d0; d < d0 + 8; ++d) {
        const double x = h[d];
        if (!is_count(x))
          refuse_summary(field, "bucket " + std::to_string(d) + " is " + std::to_string(x) + " (a count of tokens)");
        run += x;
      }
    }
    if (h[key_digits + g] != run)
      refuse_summary(field, "run " + std::to_string(g) + " sums to " + std::to_string(h[key_digits + g]) +
                                " but its buckets to " + std::to_string(run));
    total += run;
  }
  return total;
}

// The most responses a step may have: its summary's per-response fields must fit in memory and its
// response indices in a double.
inline constexpr index_t max_step_responses = index_t{1} << 31;

// A step's fields as every part and the plan read them (`name`: the caller's argument).
inline void check_step(const step_info& st, const std::string& name) {
  require(st.responses >= 0 && st.responses <= max_step_responses, name + ".responses",
          "is " + std::to_string(st.responses) + "; a step holds 0 to 2^31 responses");
  require(std::isfinite(st.scale) && st.scale > 0, name + ".scale",
          "is " + std::to_string(st.scale) + "; it must be finite and > 0");
}

}  // namespace detail
RECO_NAMESPACE_END
