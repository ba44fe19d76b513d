// Rule-based verifiable reward for math answers written as \boxed{...}.
//
//   auto r = reco::eval::boxed_answer_reward(response_text, "\\frac{1}{2}");
//   r.reward        // 1.0 or 0.0
//   r.found_box     // a well-formed \boxed{...} was found
//   r.extracted     // its raw content ("" when none)
//   r.normalised_answer, r.normalised_reference, r.numeric_match
//   std::optional<std::string> box = reco::eval::last_boxed_content(text);
//   std::string n = reco::eval::normalise_math_answer("\\dfrac12");   // "\frac{1}{2}"
//
// Which rules: the family used by verl's math reward and the MATH benchmark's answer check
// (Hendrycks et al. 2021): take the last box, normalise both strings, compare them exactly;
// plus a numeric tier in the spirit of lighteval / math-verify's number comparison. It is a
// string normaliser, not a symbolic checker: x^2 - 1 and (x-1)(x+1) are different answers here.
//
// Extraction. The last "\boxed" (or "\fbox") command of the text. If a '{' follows (after
// optional spaces) its content up to the matching '}' is the answer; escaped braces \{ and \}
// count as literal characters. "\boxed 5" (a space, no brace) takes the text up to the next
// whitespace or '$'. If that last box is unbalanced or empty-headed, nothing is extracted (an
// earlier box is not used: a truncated final answer is not an answer).
//
// Normalisation (normalise_math_answer), in this order:
//   1. line breaks dropped, tabs become spaces; \displaystyle, \textstyle dropped;
//   2. spacing commands \! \, \: \; "\ " \quad \qquad become spaces (removed in step 9);
//   3. \dfrac and \tfrac become \frac;
//   4. \left and \right before a delimiter are dropped (so \left( equals ( );
//   5. degree marks ^{\circ}, ^\circ, \degree and U+00B0 dropped;
//   6. dollar signs (\$ and $) and percent signs (\% and %) dropped; "{,}" becomes ",";
//   7. units: trailing text-mode groups (\text, \textrm, \textbf, \textnormal, \mbox, \mathrm)
//      that hold only a unit-like word (letters, spaces, '.', '/', '-'), with an optional
//      exponent such as ^2 after them, are dropped when something precedes them
//      ("5\text{ cm}^2" -> "5"); any other text-mode group is unwrapped to its content;
//   8. a short "x =" prefix: exactly one '=' whose left side is at most two characters starting
//      with a letter ("x = 5", "k=3", "a1 = 2") keeps only the right side;
//   9. all whitespace removed;
//  10. missing braces restored: \sqrt3 -> \sqrt{3}, \frac12 -> \frac{1}{2}, \frac1{b} ->
//      \frac{1}{b}, \frac\pi2 -> \frac{\pi}{2} (an argument without braces is one character or
//      one control word, as in TeX);
//  11. a decimal point without a leading digit gets one (.5 -> 0.5, -.5 -> -0.5);
//  12. an integer ratio a/b (optionally negative) becomes \frac{a}{b};
//  13. trailing full stops dropped.
//
// Comparison. Equal normalised strings match. Otherwise, if both parse as plain numbers, they
// match when |a - b| <= relative_tolerance * max(|a|, |b|) (default 1e-4; 27 equals 27.0).
// Numbers: optional sign, digits with an optional fraction and exponent (1e-3), thousands
// groups "1,234,567", and \frac{a}{b} of two such numbers. A reference that itself holds a
// \boxed{} is reduced to its last box first.
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <locale>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "reco/config.hpp"
#include "reco/eval/detail/common.hpp"

RECO_NAMESPACE_BEGIN
namespace eval {

struct boxed_answer_params {
  double relative_tolerance = 1e-4;  // numeric tier; 0 requires exact numeric equality
};

struct boxed_answer_result {
  double reward = 0.0;               // 1 when the answer matches the reference
  bool found_box = false;            // the response has a well-formed last box
  std::string extracted;             // raw content of that box
  std::string normalised_answer;     // extracted, normalised
  std::string normalised_reference;  // reference, normalised
  bool numeric_match = false;        // matched through the numeric tier (strings differ)
};

namespace detail {

constexpr std::size_t npos = std::string::npos;

inline bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Index of the '}' closing the '{' at `open`, or npos. A backslash escapes the next character,
// so \{ and \} are literal.
inline std::size_t closing_brace(std::string_view s, std::size_t open) {
  int depth = 0;
  for (std::size_t i = open; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      ++i;
      continue;
    }
    if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (--depth == 0) return i;
    }
  }
  return npos;
}

// Whether s[i] is preceded by an odd number of backslashes.
inline bool escaped(std::string_view s, std::size_t i) {
  std::size_t n = 0;
  while (i > n && s[i - n - 1] == '\\') ++n;
  return n % 2 == 1;
}

// Index of the '{' opening the '}' at `close`, or npos.
inline std::size_t opening_brace(std::string_view s, std::size_t close) {
  int depth = 0;
  for (std::size_t i = close + 1; i-- > 0;) {
    if ((s[i] != '{' && s[i] != '}') || escaped(s, i)) continue;
    if (s[i] == '}') {
      ++depth;
    } else if (--depth == 0) {
      return i;
    }
  }
  return npos;
}

// Occurrences of the control sequence `\name` in s: name must not be followed by a letter when
// it ends with one (so \left does not match \leftarrow).
inline bool command_at(std::string_view s, std::size_t i, std::string_view command) {
  if (s.substr(i, command.size()) != command) return false;
  const std::size_t after = i + command.size();
  return !is_letter(command.back()) || after >= s.size() || !is_letter(s[after]);
}

inline std::string replace_command(std::string_view s, std::string_view command, std::string_view by) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\\' && command_at(s, i, command)) {
      out += by;
      i += command.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

inline std::string replace_all(std::string_view s, std::string_view what, std::string_view by) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.substr(i, what.size()) == what) {
      out += by;
      i += what.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// "\cmd{" prefixes of the text-mode groups (step 7).
inline std::size_t text_group_command_length(std::string_view s, std::size_t i) {
  static constexpr std::string_view commands[] = {"\\textnormal", "\\textrm", "\\textbf", "\\text", "\\mbox",
                                                  "\\mathrm"};
  for (std::string_view c : commands)
    if (s.substr(i, c.size()) == c && i + c.size() < s.size() && s[i + c.size()] == '{') return c.size();
  return 0;
}

inline bool unit_like(std::string_view content) {
  content = trim(content);
  bool letter = false;
  for (char c : content) {
    if (is_letter(c)) {
      letter = true;
    } else if (!(c == ' ' || c == '.' || c == '/' || c == '-')) {
      return false;
    }
  }
  return letter;
}

// Step 7a: drop trailing unit groups (with an optional ^2 / ^{2} after them).
inline std::string strip_trailing_units(std::string s) {
  for (;;) {
    std::string_view t = trim(s);
    std::size_t end = t.size();
    if (end >= 2 && t[end - 2] == '^' && is_digit(t[end - 1])) {
      end -= 2;
    } else if (end >= 4 && t[end - 1] == '}') {
      const std::size_t open = opening_brace(t, end - 1);
      if (open != npos && open >= 1 && t[open - 1] == '^') {
        bool digits = open + 1 < end - 1;
        for (std::size_t i = open + 1; i + 1 < end; ++i) digits = digits && is_digit(t[i]);
        if (digits) end = open - 1;
      }
    }
    std::string_view u = trim(t.substr(0, end));
    if (u.empty() || u.back() != '}') return s;
    const std::size_t open = opening_brace(u, u.size() - 1);
    if (open == npos) return s;
    std::size_t start = npos;
    for (std::size_t i = 0; i < open; ++i)
      if (u[i] == '\\' && i + text_group_command_length(u, i) == open) start = i;
    if (start == npos || !unit_like(u.substr(open + 1, u.size() - open - 2))) return s;
    if (trim(u.substr(0, start)).empty()) return s;  // the unit is the whole answer: keep it
    s = std::string(u.substr(0, start));
  }
}

// Step 7b: \text{X} -> X for every remaining text-mode group.
inline std::string unwrap_text_groups(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = s[i] == '\\' ? text_group_command_length(s, i) : 0;
    if (len > 0) {
      const std::size_t close = closing_brace(s, i + len);
      if (close != npos) {
        out += unwrap_text_groups(s.substr(i + len + 1, close - i - len - 1));
        i = close + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

// Step 8.
inline std::string strip_short_lhs(std::string s) {
  const std::size_t eq = s.find('=');
  if (eq == npos || s.find('=', eq + 1) != npos) return s;
  const std::string_view lhs = trim(std::string_view(s).substr(0, eq));
  if (lhs.empty() || lhs.size() > 2 || !is_letter(lhs[0])) return s;
  for (char c : lhs)
    if (!(is_letter(c) || is_digit(c))) return s;
  return std::string(trim(std::string_view(s).substr(eq + 1)));
}

// One TeX argument starting at i: a braced group, a control word/symbol, or one character.
// Appends it braced to `out` and returns the index after it (i itself when there is none).
inline std::size_t braced_argument(std::string_view s, std::size_t i, std::string& out) {
  if (i >= s.size()) return i;
  if (s[i] == '{') {
    const std::size_t close = closing_brace(s, i);
    if (close == npos) return i;
    out.append(s.substr(i, close - i + 1));
    return close + 1;
  }
  std::size_t end = i + 1;
  if (s[i] == '\\') {
    if (end < s.size() && is_letter(s[end])) {
      while (end < s.size() && is_letter(s[end])) ++end;
    } else if (end < s.size()) {
      ++end;  // control symbol such as \%
    }
  }
  out += '{';
  out.append(s.substr(i, end - i));
  out += '}';
  return end;
}

// Step 10: \frac and \sqrt get braced arguments.
inline std::string restore_braces(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    if (s[i] == '\\' && command_at(s, i, "\\frac")) {
      out += "\\frac";
      const std::size_t j = i + 5;
      const std::size_t after_first = braced_argument(s, j, out);
      i = after_first == j ? j : braced_argument(s, after_first, out);
      continue;
    }
    if (s[i] == '\\' && command_at(s, i, "\\sqrt")) {
      out += "\\sqrt";
      const std::size_t j = i + 5;
      if (j < s.size() && s[j] == '[') {  // \sqrt[n]{x}: leave as written
        i = j;
        continue;
      }
      i = braced_argument(s, j, out);
      continue;
    }
    out += s[i++];
  }
  return out;
}

// Step 11.
inline std::string add_leading_zeros(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.' && i + 1 < s.size() && is_digit(s[i + 1]) && (i == 0 || !is_digit(s[i - 1]))) out += '0';
    out += s[i];
  }
  return out;
}

// Step 12.
inline std::string integer_ratio_to_frac(const std::string& s) {
  const std::size_t slash = s.find('/');
  if (slash == npos || s.find('/', slash + 1) != npos) return s;
  std::string_view num = std::string_view(s).substr(0, slash), den = std::string_view(s).substr(slash + 1);
  const bool negative = !num.empty() && num[0] == '-';
  if (negative) num.remove_prefix(1);
  const auto all_digits = [](std::string_view v) {
    if (v.empty()) return false;
    for (char c : v)
      if (!is_digit(c)) return false;
    return true;
  };
  if (!all_digits(num) || !all_digits(den)) return s;
  return std::string(negative ? "-" : "") + "\\frac{" + std::string(num) + "}{" + std::string(den) + "}";
}

// A plain number: [+-] digits (or thousands groups) [. digits] [e [+-] digits]. Locale-free.
inline std::optional<double> parse_plain_number(std::string_view s) {
  std::string clean;
  std::size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean += s[i++];
  const std::size_t int_start = i;
  while (i < s.size() && (is_digit(s[i]) || s[i] == ',')) ++i;
  std::string_view int_part = s.substr(int_start, i - int_start);
  if (int_part.find(',') != npos) {
    // Thousands groups only: 1-3 leading digits, then ",ddd" groups.
    std::size_t pos = int_part.find(',');
    if (pos == 0 || pos > 3) return std::nullopt;
    for (; pos < int_part.size(); pos += 4) {
      if (int_part[pos] != ',' || pos + 4 > int_part.size()) return std::nullopt;
      for (std::size_t d = pos + 1; d < pos + 4; ++d)
        if (!is_digit(int_part[d])) return std::nullopt;
    }
  }
  for (char c : int_part)
    if (c != ',') clean += c;
  bool digits = !int_part.empty();
  if (i < s.size() && s[i] == '.') {
    clean += s[i++];
    while (i < s.size() && is_digit(s[i])) {
      clean += s[i++];
      digits = true;
    }
  }
  if (!digits) return std::nullopt;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    clean += 'e';
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) clean += s[i++];
    const std::size_t exp_start = i;
    while (i < s.size() && is_digit(s[i])) clean += s[i++];
    if (i == exp_start) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  std::istringstream in(clean);
  in.imbue(std::locale::classic());
  double value = 0.0;
  in >> value;
  if (in.fail() || !std::isfinite(value)) return std::nullopt;
  return value;
}

}  // namespace detail

// Content of the last \boxed{...} / \fbox{...} of `text` (see the extraction rule above), or
// nullopt when there is none or it is unbalanced.
inline std::optional<std::string> last_boxed_content(std::string_view text) {
  std::size_t at = detail::npos, command_len = 0;
  for (std::string_view command : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    for (std::size_t from = text.size(); from > 0;) {
      const std::size_t p = text.rfind(command, from - 1);
      if (p == detail::npos) break;
      if (detail::command_at(text, p, command)) {
        if (at == detail::npos || p > at) {
          at = p;
          command_len = command.size();
        }
        break;
      }
      from = p;
    }
  }
  if (at == detail::npos) return std::nullopt;
  std::size_t i = at + command_len;
  const std::size_t after_command = i;
  while (i < text.size() && text[i] == ' ') ++i;
  if (i < text.size() && text[i] == '{') {
    const std::size_t close = detail::closing_brace(text, i);
    if (close == detail::npos) return std::nullopt;
    return std::string(text.substr(i + 1, close - i - 1));
  }
  if (i == after_command) return std::nullopt;  // "\boxed" followed directly by something odd
  std::size_t end = i;
  while (end < text.size() && !detail::is_space(text[end]) && text[end] != '$') ++end;
  if (end == i) return std::nullopt;
  return std::string(text.substr(i, end - i));
}

// The normal form used for comparison (steps 1-13 above).
inline std::string normalise_math_answer(std::string_view answer) {
  using namespace detail;
  std::string s;
  for (char c : answer) {
    if (c == '\n' || c == '\r') continue;
    s += c == '\t' ? ' ' : c;
  }
  s = replace_command(s, "\\displaystyle", "");
  s = replace_command(s, "\\textstyle", "");
  for (std::string_view spacing : {"\\!", "\\,", "\\:", "\\;", "\\ "}) s = replace_all(s, spacing, " ");
  s = replace_command(s, "\\qquad", " ");
  s = replace_command(s, "\\quad", " ");
  s = replace_command(s, "\\dfrac", "\\frac");
  s = replace_command(s, "\\tfrac", "\\frac");
  s = replace_command(s, "\\left", "");
  s = replace_command(s, "\\right", "");
  s = replace_all(s, "^{\\circ}", "");
  s = replace_all(s, "^\\circ", "");
  s = replace_command(s, "\\degree", "");
  s = replace_all(s, "\xC2\xB0", "");
  s = replace_all(s, "\\$", "");
  s = replace_all(s, "$", "");
  s = replace_all(s, "\\%", "");
  s = replace_all(s, "%", "");
  s = replace_all(s, "{,}", ",");
  s = strip_trailing_units(s);
  s = unwrap_text_groups(s);
  s = strip_short_lhs(s);
  std::string compact;
  for (char c : s)
    if (!is_space(c)) compact += c;
  s = restore_braces(compact);
  s = add_leading_zeros(s);
  s = integer_ratio_to_frac(s);
  while (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// A normalised answer read as a number: a plain number or \frac{a}{b} of plain numbers, with an
// optional sign in front of \frac.
inline std::optional<double> parse_math_number(std::string_view normalised) {
  std::string_view s = normalised;
  if (auto v = detail::parse_plain_number(s)) return v;
  double sign = 1.0;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    sign = s[0] == '-' ? -1.0 : 1.0;
    s.remove_prefix(1);
  }
  if (s.substr(0, 6) != "\\frac{") return std::nullopt;
  const std::size_t num_close = detail::closing_brace(s, 5);
  if (num_close == detail::npos || num_close + 1 >= s.size() || s[num_close + 1] != '{') return std::nullopt;
  const std::size_t den_close = detail::closing_brace(s, num_close + 1);
  if (den_close != s.size() - 1) return std::nullopt;
  const auto num = detail::parse_plain_number(s.substr(6, num_close - 6));
  const auto den = detail::parse_plain_number(s.substr(num_close + 2, den_close - num_close - 2));
  if (!num || !den || *den == 0.0) return std::nullopt;
  return sign * *num / *den;
}

// Whether two normalised answers match: equal strings, or numbers within the relative tolerance.
// `numeric` (optional) tells whether the numeric tier decided.
inline bool normalised_answers_match(const std::string& a, const std::string& b, double relative_tolerance,
                                     bool* numeric = nullptr) {
  if (numeric) *numeric = false;
  if (a == b) return true;
  const auto x = parse_math_number(a), y = parse_math_number(b);
  if (!x || !y) return false;
  const bool close =
      *x == *y || std::fabs(*x - *y) <= relative_tolerance * std::fmax(std::fabs(*x), std::fabs(*y));
  if (numeric) *numeric = close;
  return close;
}

// Two raw answers (no box extraction): normalised, then compared.
inline bool math_answers_match(std::string_view a, std::string_view b, double relative_tolerance = 1e-4) {
  detail::require(std::isfinite(relative_tolerance) && relative_tolerance >= 0, "relative_tolerance",
                  "must be finite and >= 0");
  return normalised_answers_match(normalise_math_answer(a), normalise_math_answer(b), relative_tolerance);
}

inline boxed_answer_result boxed_answer_reward(std::string_view response, std::string_view reference,
                                               const boxed_answer_params& params = {}) {
  detail::require(std::isfinite(params.relative_tolerance) && params.relative_tolerance >= 0,
                  "params.relative_tolerance", "must be finite and >= 0");
  std::string reference_answer(reference);
  if (reference.find("\\boxed") != std::string_view::npos || reference.find("\\fbox") != std::string_view::npos) {
    auto boxed = last_boxed_content(reference);
    detail::require(boxed.has_value(), "reference", "holds a \\boxed command without a well-formed argument");
    reference_answer = *boxed;
  }
  boxed_answer_result out;
  out.normalised_reference = normalise_math_answer(reference_answer);
  detail::require(!out.normalised_reference.empty(), "reference", "is empty after normalisation");
  auto box = last_boxed_content(response);
  if (!box) return out;
  out.found_box = true;
  out.extracted = std::move(*box);
  out.normalised_answer = normalise_math_answer(out.extracted);
  if (!out.normalised_answer.empty() &&
      normalised_answers_match(out.normalised_answer, out.normalised_reference, params.relative_tolerance,
                               &out.numeric_match))
    out.reward = 1.0;
  return out;
}

}  // namespace eval
RECO_NAMESPACE_END
