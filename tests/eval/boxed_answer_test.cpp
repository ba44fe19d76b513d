// Tests of the \boxed{} answer reward: extraction, each normalisation rule, the numeric tier.
#include <gtest/gtest.h>

#include <string>

#include "reco/eval/boxed_answer.hpp"

namespace ev = reco::eval;

namespace {

struct reward_case {
  const char* response;
  const char* reference;
  double reward;
  bool found;
  const char* extracted;  // expected raw box content when found
};

// One row per rule or edge; the trailing comment says what the row exercises.
const reward_case kCases[] = {
    {"Adding up, the total is \\boxed{27}.", "27", 1, true, "27"},                    // plain
    {"\\boxed{27.0}", "27", 1, true, "27.0"},                                         // numeric 27 = 27.0
    {"\\boxed{28}", "27", 0, true, "28"},                                             // wrong
    {"\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}", 1, true, "\\frac{1}{\\sqrt{2}}"},  // nested braces
    {"\\boxed{\\frac12}", "\\frac{1}{2}", 1, true, "\\frac12"},                       // \frac12
    {"\\boxed{\\dfrac{3}{4}}", "\\frac34", 1, true, "\\dfrac{3}{4}"},                 // dfrac, \frac34
    {"\\boxed{\\tfrac\\pi2}", "\\frac{\\pi}{2}", 1, true, "\\tfrac\\pi2"},            // control-word argument
    {"\\boxed{0.5}", "\\frac{1}{2}", 1, true, "0.5"},                                 // decimal vs fraction
    {"\\boxed{-\\frac{1}{2}}", "-0.5", 1, true, "-\\frac{1}{2}"},                     // signed fraction
    {"\\boxed{3/4}", "\\frac{3}{4}", 1, true, "3/4"},                                 // a/b
    {"\\boxed{5\\text{ cm}}", "5", 1, true, "5\\text{ cm}"},                          // unit
    {"\\boxed{10\\text{ cm}^2}", "10", 1, true, "10\\text{ cm}^2"},                   // unit with exponent
    {"\\boxed{12 \\mbox{ inches}}", "12", 1, true, "12 \\mbox{ inches}"},             // \mbox unit
    {"\\boxed{\\text{(B)}}", "(B)", 1, true, "\\text{(B)}"},                          // \text unwrapped
    {"\\boxed{\\left(1, 2\\right)}", "(1,2)", 1, true, "\\left(1, 2\\right)"},        // \left( \right)
    {"\\boxed{x \\rightarrow 0}", "x\\rightarrow0", 1, true, "x \\rightarrow 0"},     // \right... kept in \rightarrow
    {"\\boxed{x \\rightarrow 0}", "x0", 0, true, "x \\rightarrow 0"},                 // ... and not stripped
    {"The answer is 27", "27", 0, false, ""},                                         // no box
    {"so \\boxed{27", "27", 0, false, ""},                                            // unbalanced
    {"\\boxed{2} at first, then \\boxed{27} finally", "27", 1, true, "27"},           // last box wins
    {"\\boxed{27} and at the end \\boxed{2", "27", 0, false, ""},                     // last box broken: no fallback
    {"\\boxed{3} then \\boxed{4}", "3", 0, true, "4"},                                // earlier box ignored
    {"\\boxed{x = 5}", "5", 1, true, "x = 5"},                                        // short x = prefix
    {"\\boxed{f(x) = 5}", "5", 0, true, "f(x) = 5"},                                  // long lhs kept
    {"\\boxed{\\$18.90}", "18.90", 1, true, "\\$18.90"},                              // dollars
    {"\\boxed{50\\%}", "50", 1, true, "50\\%"},                                       // percent
    {"\\boxed{90^\\circ}", "90", 1, true, "90^\\circ"},                               // degrees
    {"\\boxed{90^{\\circ}}", "90", 1, true, "90^{\\circ}"},                           // degrees, braced
    {"\\boxed{1,000}", "1000", 1, true, "1,000"},                                     // thousands
    {"\\boxed{1{,}000}", "1000", 1, true, "1{,}000"},                                 // thousands {,}
    {"\\boxed{1,2}", "12", 0, true, "1,2"},                                           // not thousands
    {"\\boxed{3.14159}", "3.14160", 1, true, "3.14159"},                              // rel. diff 3e-6
    {"\\boxed{3.14}", "3.1416", 0, true, "3.14"},                                     // rel. diff 2e-4
    {"\\boxed{0}", "0.0", 1, true, "0"},                                              // zero
    {"\\boxed{0}", "0.0001", 0, true, "0"},                                           // zero vs small
    {"\\boxed{1e3}", "1000", 1, true, "1e3"},                                         // exponent form
    {"\\boxed{\\sqrt3}", "\\sqrt{3}", 1, true, "\\sqrt3"},                            // \sqrt3
    {"\\boxed{2\\sqrt{2}}", "2 \\sqrt 2", 1, true, "2\\sqrt{2}"},                     // spaces
    {"\\boxed{.5}", "0.5", 1, true, ".5"},                                            // leading zero
    {"\\boxed{\\{1,2\\}}", "\\{1, 2\\}", 1, true, "\\{1,2\\}"},                       // escaped braces
    {"$\\boxed 5$ is it", "5", 1, true, "5"},                                         // \boxed 5
    {"\\boxed {7}", "7", 1, true, "7"},                                               // space before brace
    {"\\fbox{7}", "7", 1, true, "7"},                                                 // \fbox
    {"\\boxed{}", "0", 0, true, ""},                                                  // empty box
    {"\\boxed{a+b}", "\\boxed{a + b}", 1, true, "a+b"},                               // boxed reference
    {"\\boxed{\\displaystyle\\frac{1}{2}}", "1/2", 1, true, "\\displaystyle\\frac{1}{2}"},  // displaystyle
    {"\\boxed{2}\n", "2.", 1, true, "2"},                                             // trailing full stop
    {"\\boxed{\\text{cm}}", "cm", 1, true, "\\text{cm}"},                             // unit alone kept
};

}  // namespace

TEST(BoxedAnswer, RewardCases) {
  ASSERT_GE(sizeof(kCases) / sizeof(kCases[0]), 20u);
  for (const reward_case& c : kCases) {
    const auto r = ev::boxed_answer_reward(c.response, c.reference);
    EXPECT_EQ(r.reward, c.reward) << c.response << " vs " << c.reference << " -> '" << r.normalised_answer
                                  << "' / '" << r.normalised_reference << "'";
    EXPECT_EQ(r.found_box, c.found) << c.response;
    EXPECT_EQ(r.extracted, c.extracted) << c.response;
  }
}

TEST(BoxedAnswer, NumericTierIsReportedAndTunable) {
  const auto exact = ev::boxed_answer_reward("\\boxed{27}", "27");
  EXPECT_FALSE(exact.numeric_match);
  const auto numeric = ev::boxed_answer_reward("\\boxed{27.0}", "27");
  EXPECT_TRUE(numeric.numeric_match);
  EXPECT_EQ(numeric.normalised_answer, "27.0");
  EXPECT_EQ(numeric.normalised_reference, "27");
  ev::boxed_answer_params strict;
  strict.relative_tolerance = 0.0;
  EXPECT_EQ(ev::boxed_answer_reward("\\boxed{3.14159}", "3.14160", strict).reward, 0.0);
  EXPECT_EQ(ev::boxed_answer_reward("\\boxed{27.0}", "27", strict).reward, 1.0);  // equal numbers
  ev::boxed_answer_params loose;
  loose.relative_tolerance = 1e-2;
  EXPECT_EQ(ev::boxed_answer_reward("\\boxed{3.14}", "3.1416", loose).reward, 1.0);
}

TEST(BoxedAnswer, NormalisedForms) {
  EXPECT_EQ(ev::normalise_math_answer("\\dfrac12"), "\\frac{1}{2}");
  EXPECT_EQ(ev::normalise_math_answer("\\frac1{b}"), "\\frac{1}{b}");
  EXPECT_EQ(ev::normalise_math_answer("\\frac{a}2"), "\\frac{a}{2}");
  EXPECT_EQ(ev::normalise_math_answer("\\left[ 0, \\infty \\right)"), "[0,\\infty)");
  EXPECT_EQ(ev::normalise_math_answer("k = -.25"), "-0.25");
  EXPECT_EQ(ev::normalise_math_answer("-3/4"), "-\\frac{3}{4}");
  EXPECT_EQ(ev::normalise_math_answer("5\\,\\text{m/s}"), "5");
  EXPECT_EQ(ev::normalise_math_answer("\\sqrt[3]{2}"), "\\sqrt[3]{2}");
  EXPECT_EQ(ev::parse_math_number("\\frac{3}{4}").value(), 0.75);
  EXPECT_EQ(ev::parse_math_number("-1,234.5").value(), -1234.5);
  EXPECT_FALSE(ev::parse_math_number("\\frac{1}{0}").has_value());
  EXPECT_FALSE(ev::parse_math_number("12a").has_value());
  EXPECT_FALSE(ev::parse_math_number("1,23").has_value());
  EXPECT_TRUE(ev::math_answers_match("\\frac{1}{4}", "0.25"));
  EXPECT_FALSE(ev::math_answers_match("x^2-1", "(x-1)(x+1)"));  // no symbolic algebra
  EXPECT_EQ(ev::last_boxed_content("a \\boxed{b} c \\boxed{\\frac{d}{e}} f").value(), "\\frac{d}{e}");
  EXPECT_FALSE(ev::last_boxed_content("\\boxedd{1}").has_value());
}

TEST(BoxedAnswer, BadInputNamesTheArgument) {
  const auto expect_names = [](auto f, const std::string& argument) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming " << argument;
    } catch (const reco::error& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
    }
  };
  ev::boxed_answer_params negative;
  negative.relative_tolerance = -1e-4;
  expect_names([&] { ev::boxed_answer_reward("\\boxed{1}", "1", negative); }, "params.relative_tolerance");
  expect_names([] { ev::boxed_answer_reward("\\boxed{1}", "   "); }, "reference");
  expect_names([] { ev::boxed_answer_reward("\\boxed{1}", "\\boxed{1"); }, "reference");
  expect_names([] { ev::math_answers_match("1", "1", std::nan("")); }, "relative_tolerance");
}
