// Reasoning-path uniqueness (paper appendix): how many of a prompt's rollouts start differently.
//
//   double u = reco::eval::path_uniqueness(rollouts_per_prompt);        // first 300 code points
//   double v = reco::eval::path_uniqueness(one_prompt_rollouts, 100);   // another prefix length
//
// Per prompt with K rollouts: (number of distinct prefixes) / K, where a prefix is the first C
// Unicode code points of the rollout's UTF-8 text (the whole text when it is shorter); then the
// mean over prompts. Prefixes are cut at code-point boundaries, never inside a multi-byte
// character. Every text is checked to be well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF); a malformed one throws naming `rollouts`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

namespace detail {

// Length in bytes of the well-formed UTF-8 sequence starting at text[i], or 0 if it is malformed.
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(text[j]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // below: overlong
    if (b0 == 0xED) hi = 0x9F;  // above: UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // below: overlong
    if (b0 == 0xF4) hi = 0x8F;  // above: beyond U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (i + len > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t j = 2; j < len; ++j)
    if (byte(i + j) < 0x80 || byte(i + j) > 0xBF) return 0;
  return len;
}

// Bytes taken by the first `code_points` code points of `text` (all of it when shorter). Returns
// false, with the offending byte offset in `bad_at`, if `text` is not well-formed UTF-8.
inline bool utf8_prefix(std::string_view text, std::int64_t code_points, std::size_t& bytes,
                        std::size_t& bad_at) {
  std::size_t i = 0;
  std::int64_t seen = 0;
  bytes = 0;
  while (i < text.size()) {
    const std::size_t len = utf8_sequence_length(text, i);
    if (len == 0) {
      bad_at = i;
      return false;
    }
    i += len;
    if (++seen <= code_points) bytes = i;
  }
  return true;
}

}  // namespace detail

// Number of bytes taken by the first `code_points` code points of `text` (all of it when it has
// fewer). Throws naming `text` if it is not well-formed UTF-8 (the whole text is checked).
inline std::size_t utf8_prefix_bytes(std::string_view text, std::int64_t code_points) {
  detail::require(code_points >= 0, "code_points", "must be >= 0, got " + std::to_string(code_points));
  std::size_t bytes = 0, bad_at = 0;
  if (!detail::utf8_prefix(text, code_points, bytes, bad_at))
    detail::fail("text", "malformed UTF-8 at byte " + std::to_string(bad_at));
  return bytes;
}

namespace detail {

inline double path_uniqueness_one(const std::vector<std::string>& rollouts, std::int64_t prefix_code_points,
                                  const std::string& where) {
  if (rollouts.empty()) fail("rollouts", where + "a prompt needs at least one rollout");
  std::unordered_set<std::string_view> prefixes;
  for (std::size_t j = 0; j < rollouts.size(); ++j) {
    const std::string_view text = rollouts[j];
    std::size_t bytes = 0, bad_at = 0;
    if (!utf8_prefix(text, prefix_code_points, bytes, bad_at))
      fail("rollouts", where + "rollout " + std::to_string(j) + ": malformed UTF-8 at byte " + std::to_string(bad_at));
    prefixes.insert(text.substr(0, bytes));
  }
  return static_cast<double>(prefixes.size()) / static_cast<double>(rollouts.size());
}

inline void check_prefix_code_points(std::int64_t prefix_code_points) {
  require(prefix_code_points >= 1, "prefix_code_points", "must be >= 1, got " + std::to_string(prefix_code_points));
}

}  // namespace detail

// One prompt: distinct prefixes of `prefix_code_points` code points / number of rollouts.
inline double path_uniqueness(const std::vector<std::string>& rollouts, std::int64_t prefix_code_points = 300) {
  detail::check_prefix_code_points(prefix_code_points);
  return detail::path_uniqueness_one(rollouts, prefix_code_points, "");
}

// Many prompts: the mean over prompts of the per-prompt value.
inline double path_uniqueness(const std::vector<std::vector<std::string>>& rollouts,
                              std::int64_t prefix_code_points = 300) {
  detail::check_prefix_code_points(prefix_code_points);
  detail::require(!rollouts.empty(), "rollouts", "at least one prompt is needed");
  double sum = 0.0;
  for (std::size_t i = 0; i < rollouts.size(); ++i)
    sum += detail::path_uniqueness_one(rollouts[i], prefix_code_points, "prompt " + std::to_string(i) + ": ");
  return sum / static_cast<double>(rollouts.size());
}

}  // namespace eval
RECO_NAMESPACE_END
