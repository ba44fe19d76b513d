// What a summed summary of the step plan can hold, checked before the plan reads it: a checksum
// that every part writes over its own summary and that survives the element-wise sum (seal,
// checksum_holds), and the ranges a sum of valid summaries keeps (counts that are integers, a
// header whose counters fit its parts, histograms whose group counts are the sums of their
// buckets). A summary that fails is a reco::error naming `summaries` and the field.
//
// The checksum. Every multi-part position of a summary holds integers (counts, ids, flags), and
// every real value (a response's mean, reward, weight, sums of its tokens; a part's top values)
// sits in a position that exactly one part writes, the others adding zeros. So per position k a
// contribution f_k(v) with f_k(0) = 0 that is linear on integers (w_k * v mod 2^64) and a hash of
// the bits elsewhere adds up: the f_k of the sum is the sum of the parts' f_k, modulo 2^64. A part
// writes its sum of f_k mod 2^24 in each of two header slots (two weights per position); those
// slots add up exactly in a double for up to 2^29 parts, and the sum's own f_k must match them
// modulo 2^24. A value altered after its part sealed it (in flight, in a rank's memory) fails
// with odds 2^-48 of passing; the sums are exact, so no tolerance is needed.
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

inline constexpr std::uint64_t check_modulus = std::uint64_t{1} << 24;
inline constexpr double max_count = 9007199254740992.0;  // 2^53: counts beyond it are not exact
// The most parts one summary may sum (their checksum slots stay exact in a double).
inline constexpr double max_parts = 536870912.0;  // 2^29

inline std::uint64_t check_mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The two checksum lanes of values[0, n) (mod 2^64), the checksum slots left out.
struct check_lanes {
  std::uint64_t a = 0, b = 0;
};
inline check_lanes summary_lanes(const double* v, std::size_t n) {
  check_lanes c;
  for (std::size_t k = 0; k < n; ++k) {
    const double x = v[k];
    if (x == 0 || k == plan_h_check || k == plan_h_check + 1) continue;  // zeros add nothing (also -0)
    const std::uint64_t wa = check_mix(2 * k) | 1, wb = check_mix(2 * k + 1) | 1;
    if (std::fabs(x) < 4611686018427387904.0 && x == std::floor(x)) {  // an integer below 2^62
      const auto i = static_cast<std::uint64_t>(static_cast<std::int64_t>(x));
      c.a += wa * i;
      c.b += wb * i;
    } else {
      std::uint64_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      c.a += check_mix(bits ^ wa);
      c.b += check_mix(bits ^ wb);
    }
  }
  return c;
}

// Writes a part's checksum into its summary (after every other value is final).
inline void seal(step_summary& s) {
  if (s.values.size() < plan_header) return;
  const check_lanes c = summary_lanes(s.values.data(), s.values.size());
  s.values[plan_h_check] = static_cast<double>(c.a % check_modulus);
  s.values[plan_h_check + 1] = static_cast<double>(c.b % check_modulus);
}

inline bool is_count(double x) { return x >= 0 && x <= max_count && x == std::floor(x); }

[[noreturn]] inline void refuse_summary(const std::string& field, const std::string& what) {
  fail("summaries", field + " " + what);
}

// Whether a summed summary's values match the checksums its parts wrote; `digest` receives a
// 64-bit digest of the values (the lanes), the same on every rank that holds the same sums.
inline bool checksum_holds(const step_summary& s, std::uint64_t* digest = nullptr) {
  if (s.values.size() < plan_header) return false;
  const double sa = s.values[plan_h_check], sb = s.values[plan_h_check + 1];
  if (!is_count(sa) || !is_count(sb)) return false;
  const check_lanes c = summary_lanes(s.values.data(), s.values.size());
  if (digest) *digest = check_mix(c.a ^ check_mix(c.b ^ s.values.size()));
  return c.a % check_modulus == static_cast<std::uint64_t>(sa) % check_modulus &&
         c.b % check_modulus == static_cast<std::uint64_t>(sb) % check_modulus;
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
  const double w = s.values[plan_h_windows], ids = s.values[plan_h_window_ids];
  if (!(is_count(w) && w <= parts))
    refuse_summary("header.windows", "is " + std::to_string(w) + " (a count of parts)");
  if (!(is_count(ids) && ids >= w && ids <= w * 1048576.0))
    refuse_summary("header.window_ids", "is " + std::to_string(ids) + " (a sum of " + std::to_string(w) +
                                            " ids in [1, 2^20])");
}

// A digit histogram of a summed summary (the buckets, then the sums of their runs of 256): every
// bucket a count, every run's sum the sum of its buckets. Returns the histogram's total.
inline double check_histogram(const double* h, const char* field) {
  double total = 0;
  for (std::size_t g = 0; g < digit_groups; ++g) {
    double run = 0;
    for (std::size_t d = g << digit_group_bits; d < (g + 1) << digit_group_bits; ++d) {
      const double x = h[d];
      if (x == 0) continue;
      if (!is_count(x))
        refuse_summary(field, "bucket " + std::to_string(d) + " is " + std::to_string(x) + " (a count of tokens)");
      run += x;
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
