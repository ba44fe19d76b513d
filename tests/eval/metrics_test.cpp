// Tests of reco::eval: fixed test vectors, properties, independent naive
// references written here (exact binomials, map-based n-gram counting), and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "reco/eval/bleu.hpp"
#include "reco/eval/distinct_n.hpp"
#include "reco/eval/kde.hpp"
#include "reco/eval/pass_at_k.hpp"
#include "reco/eval/path_uniqueness.hpp"
#include "reco/eval/token_variance.hpp"

namespace ev = reco::eval;
using ev::token_ids;

namespace {

// Four short responses shared by the fixed BLEU / Distinct-n vectors.
const std::vector<std::string> kRoots = {
    "we compute the sum of the roots and get 5",
    "the sum of the roots is 5 by vieta",
    "by vieta the product of the roots is 6 so the answer is 5",
    "we factor the quadratic and the roots are 2 and 3",
};

ev::bleu_params bleu_order(int n, ev::bleu_smoothing s = ev::bleu_smoothing::method1) {
  ev::bleu_params p;
  p.max_order = n;
  p.smoothing = s;
  return p;
}

// Runs `f`, expects a reco::error naming `argument` (both in argument() and in the message).
void expect_error_names(const std::function<void()>& f, const std::string& argument) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one naming " << argument;
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// ---- independent references ------------------------------------------------------------------

// C(n, k) exactly for n <= 62 (Pascal's triangle in 64 bits).
std::uint64_t binomial(int n, int k) {
  if (k < 0 || k > n) return 0;
  std::vector<std::uint64_t> row(static_cast<std::size_t>(n) + 1, 0);
  row[0] = 1;
  for (int i = 1; i <= n; ++i)
    for (int j = i; j >= 1; --j) row[static_cast<std::size_t>(j)] += row[static_cast<std::size_t>(j) - 1];
  return row[static_cast<std::size_t>(k)];
}

using ngram = std::vector<std::int64_t>;

std::map<ngram, int> ngram_counts(const token_ids& s, int n) {
  std::map<ngram, int> out;
  for (std::size_t i = 0; i + static_cast<std::size_t>(n) <= s.size(); ++i)
    ++out[ngram(s.begin() + static_cast<std::ptrdiff_t>(i), s.begin() + static_cast<std::ptrdiff_t>(i) + n)];
  return out;
}

// Sentence BLEU written straight from the definition, pair by pair.
double naive_bleu(const std::vector<token_ids>& refs, const token_ids& hyp, int order, bool method1) {
  std::vector<double> log_p;
  long long unigram_matches = 0;
  for (int n = 1; n <= order; ++n) {
    std::map<ngram, int> max_ref;
    for (const auto& r : refs)
      for (const auto& [g, c] : ngram_counts(r, n)) max_ref[g] = std::max(max_ref[g], c);
    long long matches = 0, total = 0;
    for (const auto& [g, c] : ngram_counts(hyp, n)) {
      total += c;
      auto it = max_ref.find(g);
      matches += std::min(c, it == max_ref.end() ? 0 : it->second);
    }
    if (n == 1) unigram_matches = matches;
    const double den = static_cast<double>(std::max<long long>(1, total));
    const double p = matches > 0 ? static_cast<double>(matches) / den
                                 : (method1 ? 0.1 / den : std::numeric_limits<double>::min());
    log_p.push_back(std::log(p));
  }
  if (unigram_matches == 0) return 0.0;
  const double h = static_cast<double>(hyp.size());
  double best = -1;
  for (const auto& r : refs) {
    const double len = static_cast<double>(r.size());
    if (best < 0 || std::fabs(len - h) < std::fabs(best - h) || (std::fabs(len - h) == std::fabs(best - h) && len < best))
      best = len;
  }
  const double bp = h > best ? 1.0 : std::exp(1.0 - best / h);
  double s = 0;
  for (double l : log_p) s += l / order;
  return bp * std::exp(s);
}

std::vector<token_ids> random_responses(std::mt19937_64& rng, int k, int max_len, int vocab) {
  std::uniform_int_distribution<int> len(0, max_len), tok(1, vocab);
  std::vector<token_ids> out(static_cast<std::size_t>(k));
  for (auto& r : out) {
    r.resize(static_cast<std::size_t>(len(rng)));
    for (auto& t : r) t = tok(rng);
  }
  return out;
}

}  // namespace

// ================================ pass@k ======================================================

TEST(PassAtK, SpecVectors) {
  struct row { std::int64_t n, c, k; double expected; };
  const row rows[] = {
      {1024, 0, 1, 0.0},          {1024, 1, 1, 0.0009765625},         {1024, 1, 256, 0.25},
      {1024, 3, 256, 0.57853756936832501}, {1024, 10, 64, 0.47708364354995403}, {1024, 1000, 25, 1.0},
      {128, 5, 16, 0.49292989585979174},   {128, 1, 128, 1.0},                  {16, 2, 8, 0.76666666666666672},
      {10, 3, 1, 0.3},
  };
  for (const row& r : rows)
    EXPECT_NEAR(ev::pass_at_k(r.n, r.c, r.k), r.expected, 1e-12) << r.n << " " << r.c << " " << r.k;
}

TEST(PassAtK, ExactlyOneWhenEveryDrawHoldsACorrectSample) {
  EXPECT_EQ(ev::pass_at_k(1024, 1000, 25), 1.0);
  EXPECT_EQ(ev::pass_at_k(8, 8, 1), 1.0);
  EXPECT_EQ(ev::pass_at_k(8, 3, 6), 1.0);  // n - c = 5 < 6
  EXPECT_LT(ev::pass_at_k(8, 3, 5), 1.0);  // n - c = 5 = k: one all-wrong subset exists
}

TEST(PassAtK, PassAtOneIsTheCorrectFraction) {
  for (std::int64_t n : {1, 2, 3, 7, 10, 16, 100, 128, 1000, 1024})
    for (std::int64_t c = 0; c <= n; c += std::max<std::int64_t>(1, n / 17))
      EXPECT_NEAR(ev::pass_at_k(n, c, 1), static_cast<double>(c) / static_cast<double>(n), 1e-12) << n << " " << c;
}

TEST(PassAtK, MatchesExactBinomialRatio) {
  for (int n = 1; n <= 40; ++n)
    for (int c = 0; c <= n; ++c)
      for (int k = 1; k <= n; ++k) {
        const long double exact =
            1.0L - static_cast<long double>(binomial(n - c, k)) / static_cast<long double>(binomial(n, k));
        ASSERT_NEAR(ev::pass_at_k(n, c, k), static_cast<double>(exact), 1e-12) << n << " " << c << " " << k;
      }
}

TEST(PassAtK, MonotoneInKAndC) {
  for (std::int64_t c = 0; c <= 64; c += 4) {
    double prev = -1;
    for (std::int64_t k = 1; k <= 64; ++k) {
      const double v = ev::pass_at_k(64, c, k);
      EXPECT_GE(v, prev - 1e-15);
      prev = v;
    }
  }
  for (std::int64_t k : {1, 4, 16}) {
    double prev = -1;
    for (std::int64_t c = 0; c <= 64; ++c) {
      const double v = ev::pass_at_k(64, c, k);
      EXPECT_GE(v, prev - 1e-15);
      prev = v;
    }
  }
}

TEST(PassAtK, CurveMatchesScalarCallsAndMeans) {
  std::mt19937_64 rng(7);
  std::vector<std::int64_t> ns, cs;
  for (int i = 0; i < 50; ++i) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(64, 300)(rng);
    ns.push_back(n);
    cs.push_back(std::uniform_int_distribution<std::int64_t>(0, n)(rng));
  }
  const std::vector<std::int64_t> ks = {1, 2, 4, 8, 16, 32, 64};
  const auto curve = ev::pass_at_k_curve(ns, cs, ks);
  ASSERT_EQ(curve.ks, ks);
  ASSERT_EQ(curve.mean.size(), ks.size());
  ASSERT_EQ(curve.per_problem.size(), ks.size());
  for (std::size_t j = 0; j < ks.size(); ++j) {
    ASSERT_EQ(curve.per_problem[j].size(), ns.size());
    double sum = 0;
    for (std::size_t i = 0; i < ns.size(); ++i) {
      EXPECT_EQ(curve.per_problem[j][i], ev::pass_at_k(ns[i], cs[i], ks[j]));
      sum += ev::pass_at_k(ns[i], cs[i], ks[j]);
    }
    EXPECT_NEAR(curve.mean[j], sum / static_cast<double>(ns.size()), 1e-14);
    if (j > 0) {
      EXPECT_GE(curve.mean[j], curve.mean[j - 1]);
    }
  }
  EXPECT_NEAR(ev::pass_at_k_curve(ns, cs, {1}).mean[0], [&] {
    double s = 0;
    for (std::size_t i = 0; i < ns.size(); ++i) s += static_cast<double>(cs[i]) / static_cast<double>(ns[i]);
    return s / static_cast<double>(ns.size());
  }(), 1e-12);
}

TEST(PassAtK, CurveWithOneSampleCountForAllProblems) {
  const std::vector<std::int64_t> cs = {0, 1, 3, 10, 1000};
  const auto curve = ev::pass_at_k_curve(1024, cs, {1, 256});
  EXPECT_NEAR(curve.per_problem[1][2], 0.57853756936832501, 1e-12);
  EXPECT_NEAR(curve.mean[0], (0 + 1 + 3 + 10 + 1000) / 1024.0 / 5.0, 1e-12);
}

// ================================ BLEU / Self-BLEU =============================================

TEST(Bleu, SelfBleuSpecVectorsMethod1) {
  const double per[3][4] = {
      {0.596284794, 0.8370455349, 0.4688072309, 0.2132007164},
      {0.5108729549, 0.7102344364, 0.3321078321, 0.0796363971},
      {0.4417918227, 0.632746949, 0.2402211086, 0.0501257872},
  };
  const double mean[3] = {0.528834569057, 0.408212905121, 0.341221416869};
  for (int order = 2; order <= 4; ++order) {
    const auto p = bleu_order(order);
    const auto v = ev::self_bleu_per_response(kRoots, p);
    ASSERT_EQ(v.size(), 4u);
    // The reference values have 10 significant digits per hypothesis and 12 for the mean.
    for (int h = 0; h < 4; ++h) EXPECT_NEAR(v[static_cast<std::size_t>(h)], per[order - 2][h], 1e-9) << order;
    EXPECT_NEAR(ev::self_bleu(kRoots, p), mean[order - 2], 1e-11) << order;
  }
}

TEST(Bleu, SelfBleuSpecVectorsWithoutSmoothing) {
  EXPECT_NEAR(ev::self_bleu(kRoots, bleu_order(4, ev::bleu_smoothing::method0)), 0.32869, 5e-6);
  EXPECT_NEAR(ev::self_bleu(kRoots, bleu_order(3, ev::bleu_smoothing::method0)), 0.38830, 5e-6);
  // Bigrams all match somewhere, so smoothing changes nothing at order 2.
  EXPECT_NEAR(ev::self_bleu(kRoots, bleu_order(2, ev::bleu_smoothing::method0)), 0.528834569057, 1e-11);
}

TEST(Bleu, TokenIdsAndTextAgree) {
  const auto ids = ev::tokenise_whitespace(kRoots);
  ASSERT_EQ(ids[0].size(), 10u);
  EXPECT_EQ(ids[0][2], ids[1][0]);  // "the"
  // Shifting every id leaves BLEU unchanged: ids are only compared for equality.
  auto shifted = ids;
  for (auto& r : shifted)
    for (auto& t : r) t = t * 1000003 - 77;
  for (int order = 1; order <= 4; ++order) {
    const auto a = ev::self_bleu_per_response(kRoots, bleu_order(order));
    const auto b = ev::self_bleu_per_response(shifted, bleu_order(order));
    for (std::size_t h = 0; h < 4; ++h) EXPECT_DOUBLE_EQ(a[h], b[h]);
  }
}

TEST(Bleu, DegenerateCases) {
  const auto m1 = bleu_order(4);
  const std::vector<std::string> identical = {"the roots are 2 and 3", "the roots are 2 and 3"};
  EXPECT_DOUBLE_EQ(ev::self_bleu(identical, m1), 1.0);
  EXPECT_NEAR(ev::sentence_bleu(std::vector<std::string>{"a b c d"}, std::string("a b"), m1), 0.11633369384516798, 1e-15);
  EXPECT_EQ(ev::sentence_bleu(std::vector<std::string>{"a b c d"}, std::string("x y z"), m1), 0.0);
  EXPECT_EQ(ev::sentence_bleu(std::vector<std::string>{"a b c d"}, std::string(""), m1), 0.0);
  EXPECT_EQ(ev::sentence_bleu(std::vector<std::string>{"a b c d"}, std::string("x y z"),
                              bleu_order(4, ev::bleu_smoothing::method0)),
            0.0);
  // method0 with a missing order: NLTK's log(DBL_MIN) term, i.e. a score of about 1e-77.
  const double m0 = ev::sentence_bleu(std::vector<std::string>{"a b c d"}, std::string("a b"),
                                      bleu_order(4, ev::bleu_smoothing::method0));
  EXPECT_GT(m0, 0.0);
  EXPECT_LT(m0, 1e-70);
  // Whitespace runs, tabs and newlines all separate words.
  EXPECT_DOUBLE_EQ(ev::sentence_bleu(std::vector<std::string>{"a  b\tc\nd"}, std::string(" a b c d "), m1), 1.0);
}

TEST(Bleu, ClosestReferenceLengthPrefersTheShorterOnTies) {
  // Hypothesis of length 4, references of lengths 3 and 5: the tie goes to 3, so BP = 1.
  const std::vector<token_ids> refs = {{1, 2, 3, 4, 9}, {1, 2, 3}};
  const token_ids hyp = {1, 2, 3, 4};
  const double b = ev::sentence_bleu(refs, hyp, bleu_order(1));
  EXPECT_DOUBLE_EQ(b, 1.0);
  // Only the length-5 reference: BP = exp(1 - 5/4).
  EXPECT_NEAR(ev::sentence_bleu(std::vector<token_ids>{refs[0]}, hyp, bleu_order(1)), std::exp(1.0 - 5.0 / 4.0), 1e-15);
}

TEST(Bleu, ClippingUsesTheLargestCountInAnySingleReference) {
  // "the" appears 3 times in the hypothesis, at most 2 times in one reference: clipped to 2/4.
  const std::vector<std::string> refs = {"the cat the", "the mat"};
  EXPECT_NEAR(ev::sentence_bleu(refs, std::string("the the the cat"), bleu_order(1)), 3.0 / 4.0, 1e-15);
}

TEST(Bleu, SelfBleuMatchesPairwiseNaiveReference) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int k = 2 + trial % 7;
    const auto resp = random_responses(rng, k, 1 + trial % 25, 2 + trial % 6);
    for (int order = 1; order <= 4; ++order)
      for (bool method1 : {false, true}) {
        const auto p = bleu_order(order, method1 ? ev::bleu_smoothing::method1 : ev::bleu_smoothing::method0);
        const auto fast = ev::self_bleu_per_response(resp, p);
        for (int h = 0; h < k; ++h) {
          std::vector<token_ids> refs;
          for (int j = 0; j < k; ++j)
            if (j != h) refs.push_back(resp[static_cast<std::size_t>(j)]);
          const double naive = naive_bleu(refs, resp[static_cast<std::size_t>(h)], order, method1);
          ASSERT_NEAR(fast[static_cast<std::size_t>(h)], naive, 1e-12 * std::max(1.0, naive))
              << "trial " << trial << " order " << order << " h " << h;
          ASSERT_NEAR(ev::sentence_bleu(refs, resp[static_cast<std::size_t>(h)], p), naive, 1e-12 * std::max(1.0, naive));
        }
      }
  }
}

TEST(Bleu, AnyInt64TokenIdsWork) {
  // Ids at both ends of the int64 range (the counting sorts them as offsets from the minimum).
  const std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  std::mt19937_64 rng(17);
  const std::int64_t alphabet[] = {lo, hi, -1, 0, 1, lo + 1, hi - 1};
  std::vector<token_ids> resp(6);
  for (auto& r : resp)
    for (int i = 0; i < 20; ++i) r.push_back(alphabet[rng() % 7]);
  for (int order = 1; order <= 4; ++order) {
    const auto fast = ev::self_bleu_per_response(resp, bleu_order(order));
    for (std::size_t h = 0; h < resp.size(); ++h) {
      std::vector<token_ids> refs;
      for (std::size_t j = 0; j < resp.size(); ++j)
        if (j != h) refs.push_back(resp[j]);
      EXPECT_NEAR(fast[h], naive_bleu(refs, resp[h], order, true), 1e-12);
    }
  }
  EXPECT_DOUBLE_EQ(ev::distinct_n(std::vector<token_ids>{{lo, hi, lo, hi}}, 1), 0.5);
}

TEST(Bleu, SelfBleuOfIdenticalResponsesIsOne) {
  std::mt19937_64 rng(5);
  for (int k : {2, 3, 16}) {
    auto one = random_responses(rng, 1, 40, 50)[0];
    one.insert(one.end(), {7, 8, 9, 10});  // at least max_order tokens, so every order has n-grams
    const std::vector<token_ids> same(static_cast<std::size_t>(k), one);
    for (int order = 1; order <= 4; ++order) EXPECT_DOUBLE_EQ(ev::self_bleu(same, bleu_order(order)), 1.0);
  }
  // Shorter than the order: the empty orders are smoothed (method1), as in NLTK, so it is not 1.
  const std::vector<token_ids> tiny(3, token_ids{5});
  EXPECT_NEAR(ev::self_bleu(tiny, bleu_order(4)), std::pow(0.1, 0.75), 1e-15);
}

TEST(Bleu, SelfBleuAmongCorrect) {
  const auto ids = ev::tokenise_whitespace(kRoots);
  const std::vector<std::vector<token_ids>> prompts = {
      ids,                                 // 3 correct of 4
      {ids[0], ids[1]},                    // only 1 correct: skipped
      {ids[2], ids[3], ids[0], ids[1]},    // all correct
  };
  const std::vector<std::vector<bool>> correct = {{true, true, false, true}, {true, false}, {true, true, true, true}};
  const auto r = ev::self_bleu_among_correct(prompts, correct, bleu_order(4));
  EXPECT_EQ(r.prompts_used, 2);
  ASSERT_EQ(r.per_prompt.size(), 3u);
  EXPECT_TRUE(std::isnan(r.per_prompt[1]));
  const double p0 = ev::self_bleu(std::vector<token_ids>{ids[0], ids[1], ids[3]}, bleu_order(4));
  EXPECT_NEAR(r.per_prompt[0], p0, 1e-15);
  EXPECT_NEAR(r.per_prompt[2], 0.341221416869, 1e-11);  // the order of responses does not matter
  EXPECT_NEAR(r.mean, (p0 + 0.341221416869) / 2, 1e-11);
  // Text form gives the same.
  const std::vector<std::vector<std::string>> text = {kRoots, {kRoots[0], kRoots[1]}, {kRoots[2], kRoots[3], kRoots[0], kRoots[1]}};
  EXPECT_NEAR(ev::self_bleu_among_correct(text, correct, bleu_order(4)).mean, r.mean, 1e-15);
}

// ================================ Distinct-n ===================================================

TEST(DistinctN, SpecVectorsAllVariants) {
  const ev::distinct_params pooled{};
  const ev::distinct_params per_ngrams{ev::distinct_scope::per_response, ev::distinct_denominator::ngrams};
  const ev::distinct_params per_tokens{ev::distinct_scope::per_response, ev::distinct_denominator::tokens};
  const double expect[3][3] = {
      {0.477272727273, 0.848196248196, 0.848196248196},
      {0.75, 1.0, 0.906637806638},
      {0.861111111111, 1.0, 0.813275613276},
  };
  for (int n = 1; n <= 3; ++n) {
    EXPECT_NEAR(ev::distinct_n(kRoots, n, pooled), expect[n - 1][0], 1e-12) << n;
    EXPECT_NEAR(ev::distinct_n(kRoots, n, per_ngrams), expect[n - 1][1], 1e-12) << n;
    EXPECT_NEAR(ev::distinct_n(kRoots, n, per_tokens), expect[n - 1][2], 1e-12) << n;
  }
  // The default is pooled per prompt with the n-gram denominator; exact fractions 21/44, 30/40.
  EXPECT_DOUBLE_EQ(ev::distinct_n(kRoots, 1), 21.0 / 44.0);
  EXPECT_DOUBLE_EQ(ev::distinct_n(kRoots, 2), 30.0 / 40.0);
}

TEST(DistinctN, AllUniqueIsOne) {
  std::vector<token_ids> unique;
  std::int64_t next = 0;
  for (int r = 0; r < 5; ++r) {
    token_ids t;
    for (int i = 0; i < 7 + r; ++i) t.push_back(next++);
    unique.push_back(t);
  }
  for (int n = 1; n <= 4; ++n) {
    EXPECT_DOUBLE_EQ(ev::distinct_n(unique, n), 1.0);
    EXPECT_DOUBLE_EQ(ev::distinct_n(unique, n, {ev::distinct_scope::per_response, ev::distinct_denominator::ngrams}), 1.0);
  }
  EXPECT_DOUBLE_EQ(ev::distinct_n(unique, 1, {ev::distinct_scope::per_response, ev::distinct_denominator::tokens}), 1.0);
}

TEST(DistinctN, MatchesSetBasedReferenceOverPrompts) {
  std::mt19937_64 rng(23);
  std::vector<std::vector<token_ids>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(random_responses(rng, 2 + i % 5, 30, 6));
  for (int n = 1; n <= 4; ++n) {
    double pooled = 0, per = 0;
    int pooled_count = 0, per_count = 0;
    for (const auto& responses : prompts) {
      std::set<ngram> all;
      long long total = 0;
      double prompt_sum = 0;
      int prompt_count = 0;
      for (const auto& r : responses) {
        const auto c = ngram_counts(r, n);
        long long grams = 0;
        for (const auto& [g, k] : c) {
          all.insert(g);
          grams += k;
        }
        total += grams;
        if (grams > 0) {
          prompt_sum += static_cast<double>(c.size()) / static_cast<double>(grams);
          ++prompt_count;
        }
      }
      if (total > 0) {
        pooled += static_cast<double>(all.size()) / static_cast<double>(total);
        ++pooled_count;
      }
      if (prompt_count > 0) {
        per += prompt_sum / prompt_count;
        ++per_count;
      }
    }
    EXPECT_NEAR(ev::distinct_n(prompts, n), pooled / pooled_count, 1e-13) << n;
    EXPECT_NEAR(ev::distinct_n(prompts, n, {ev::distinct_scope::per_response, ev::distinct_denominator::ngrams}),
                per / per_count, 1e-13)
        << n;
  }
}

TEST(DistinctN, ShortResponsesHaveNoValueWithTheNgramDenominator) {
  const std::vector<token_ids> resp = {{1, 2, 3}, {4}};  // the second has no bigram
  const ev::distinct_params per_ngrams{ev::distinct_scope::per_response, ev::distinct_denominator::ngrams};
  const ev::distinct_params per_tokens{ev::distinct_scope::per_response, ev::distinct_denominator::tokens};
  EXPECT_DOUBLE_EQ(ev::distinct_n(resp, 2, per_ngrams), 1.0);               // only the first counts
  EXPECT_DOUBLE_EQ(ev::distinct_n(resp, 2, per_tokens), (2.0 / 3.0 + 0.0) / 2.0);  // 0 bigrams / 1 token
  EXPECT_DOUBLE_EQ(ev::distinct_n(resp, 2), 1.0);
  const std::vector<std::vector<std::string>> text = {{"a a a", "a"}, {"b c"}};
  EXPECT_DOUBLE_EQ(ev::distinct_n(text, 1), (1.0 / 4.0 + 1.0) / 2.0);
}

// ================================ Path uniqueness ===============================================

TEST(PathUniqueness, DistinctPrefixesOverRollouts) {
  const std::string common(300, 'x');
  const std::vector<std::string> one = {common + "a", common + "b", "different start", "different start"};
  EXPECT_DOUBLE_EQ(ev::path_uniqueness(one), 2.0 / 4.0);     // 300 x's collapse; 2 distinct
  EXPECT_DOUBLE_EQ(ev::path_uniqueness(one, 301), 3.0 / 4.0);
  const std::vector<std::vector<std::string>> prompts = {one, {"a", "b", "c"}, {"same", "same"}};
  EXPECT_DOUBLE_EQ(ev::path_uniqueness(prompts), (0.5 + 1.0 + 0.5) / 3.0);
}

TEST(PathUniqueness, CountsCodePointsNotBytes) {
  // "é" is 2 bytes, "€" 3, "😀" 4: prefixes of 3 code points.
  const std::vector<std::string> r = {"h\xC3\xA9llo", "h\xC3\xA9lp", "h\xC3\xA9" "e", "\xE2\x82\xAC\xF0\x9F\x98\x80" "ab",
                                      "\xE2\x82\xAC\xF0\x9F\x98\x80" "ac"};
  // Prefixes: "hél", "hél", "hée", "€😀a", "€😀a" -> 3 distinct of 5.
  EXPECT_DOUBLE_EQ(ev::path_uniqueness(r, 3), 3.0 / 5.0);
  EXPECT_EQ(ev::utf8_prefix_bytes("\xE2\x82\xAC\xF0\x9F\x98\x80" "ab", 2), 7u);
  EXPECT_EQ(ev::utf8_prefix_bytes("h\xC3\xA9llo", 2), 3u);
  EXPECT_EQ(ev::utf8_prefix_bytes("abc", 10), 3u);
  EXPECT_EQ(ev::utf8_prefix_bytes("", 10), 0u);
  EXPECT_EQ(ev::utf8_prefix_bytes("abc", 0), 0u);
  // Boundary code points: U+0800, U+FFFF, U+10000, U+10FFFF are all valid.
  EXPECT_EQ(ev::utf8_prefix_bytes("\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF\xBF", 4), 14u);
}

TEST(PathUniqueness, RejectsMalformedUtf8) {
  const char* bad[] = {
      "ok \xC3\x28",          // bad continuation
      "\xC0\xAF",             // overlong '/'
      "\xE0\x80\xAF",         // overlong, 3 bytes
      "\xED\xA0\x80",         // UTF-16 surrogate
      "\xF4\x90\x80\x80",     // above U+10FFFF
      "\xE2\x82",             // truncated
      "\x80",                 // lone continuation
      "\xFF",                 // never valid
  };
  for (const char* b : bad) {
    expect_error_names([&] { ev::utf8_prefix_bytes(b, 300); }, "text");
    expect_error_names([&] { ev::path_uniqueness(std::vector<std::string>{"fine", b}); }, "rollouts");
  }
}

// ================================ Token variance, entropy, |KL| =================================

TEST(TokenVariance, HandComputedThirds) {
  // Lengths 3, 6 and 1. Thirds by floor(3t/L): L=3 -> 0,1,2; L=6 -> 0,0,1,1,2,2; L=1 -> 0.
  const std::vector<double> p = {0.5, 0.9, 0.1, /**/ 1.0, 0.0, 0.2, 0.8, 0.5, 0.5, /**/ 0.3};
  const std::vector<reco::index_t> offsets = {0, 3, 9, 10};
  const auto r = ev::token_variance_by_position(p, offsets);
  const auto v = [](double q) { return q * (1 - q); };
  EXPECT_EQ(r.tokens[ev::early], 4);
  EXPECT_EQ(r.tokens[ev::middle], 3);
  EXPECT_EQ(r.tokens[ev::late], 3);
  EXPECT_EQ(r.responses[ev::early], 3);
  EXPECT_EQ(r.responses[ev::middle], 2);
  EXPECT_EQ(r.responses[ev::late], 2);
  EXPECT_NEAR(r.mean[ev::early], (v(0.5) + v(1.0) + v(0.0) + v(0.3)) / 4, 1e-15);
  EXPECT_NEAR(r.mean[ev::middle], (v(0.9) + v(0.2) + v(0.8)) / 3, 1e-15);
  EXPECT_NEAR(r.mean[ev::late], (v(0.1) + v(0.5) + v(0.5)) / 3, 1e-15);
  // Early: per-response means 0.25, 0, 0.21 -> sample std / sqrt(3).
  const double m[3] = {0.25, 0.0, 0.21};
  const double mu = (m[0] + m[1] + m[2]) / 3;
  const double sd = std::sqrt(((m[0] - mu) * (m[0] - mu) + (m[1] - mu) * (m[1] - mu) + (m[2] - mu) * (m[2] - mu)) / 2);
  EXPECT_NEAR(r.standard_error[ev::early], sd / std::sqrt(3.0), 1e-15);
  // Middle: responses give 0.09 and mean(0.16, 0.16) = 0.16.
  EXPECT_NEAR(r.standard_error[ev::middle], std::fabs(0.16 - 0.09) / std::sqrt(2.0) / std::sqrt(2.0), 1e-15);
  // Log-probabilities give the same result.
  std::vector<double> logp;
  for (double q : p) logp.push_back(std::log(q));
  const auto rl = ev::token_variance_by_position(logp, offsets, ev::probability_input::log_probability);
  for (int b = 0; b < 3; ++b) {
    EXPECT_NEAR(rl.mean[b], r.mean[b], 1e-15);
    EXPECT_NEAR(rl.standard_error[b], r.standard_error[b], 1e-15);
  }
}

TEST(TokenVariance, MatchesFloatingPositionReferenceAndNestedInput) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<double>> nested;
  for (int r = 0; r < 40; ++r) nested.emplace_back(static_cast<std::size_t>(1 + r * 7 % 23));
  for (auto& resp : nested)
    for (double& q : resp) q = u(rng);
  const auto got = ev::token_variance_by_position(nested);
  double sum[3] = {0, 0, 0};
  long long count[3] = {0, 0, 0};
  std::vector<double> means[3];
  for (const auto& resp : nested) {
    double s[3] = {0, 0, 0};
    int c[3] = {0, 0, 0};
    const double len = static_cast<double>(resp.size());
    for (std::size_t t = 0; t < resp.size(); ++t) {
      const double rel = static_cast<double>(t) / len;
      const int b = rel < 1.0 / 3.0 ? 0 : (rel < 2.0 / 3.0 ? 1 : 2);
      s[b] += resp[t] * (1 - resp[t]);
      ++c[b];
    }
    for (int b = 0; b < 3; ++b)
      if (c[b] > 0) {
        sum[b] += s[b];
        count[b] += c[b];
        means[b].push_back(s[b] / c[b]);
      }
  }
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(got.tokens[b], count[b]);
    EXPECT_NEAR(got.mean[b], sum[b] / static_cast<double>(count[b]), 1e-14);
    double mu = 0;
    for (double x : means[b]) mu += x;
    mu /= static_cast<double>(means[b].size());
    double ss = 0;
    for (double x : means[b]) ss += (x - mu) * (x - mu);
    const double n = static_cast<double>(means[b].size());
    EXPECT_NEAR(got.standard_error[b], std::sqrt(ss / (n - 1)) / std::sqrt(n), 1e-14);
  }
}

TEST(TokenVariance, UndefinedThirdsAreNaN) {
  // One response of 2 tokens: thirds 0 and 1, nothing late; every third has < 2 responses.
  const auto r = ev::token_variance_by_position(std::vector<std::vector<double>>{{0.5, 0.5}, {}});
  EXPECT_EQ(r.tokens[ev::late], 0);
  EXPECT_TRUE(std::isnan(r.mean[ev::late]));
  EXPECT_TRUE(std::isnan(r.standard_error[ev::early]));
  EXPECT_DOUBLE_EQ(r.mean[ev::early], 0.25);
}

TEST(TokenSummaries, EntropyAndAbsKlAggregations) {
  const std::vector<double> h = {1.0, 2.0, 3.0, /**/ 10.0};
  const std::vector<reco::index_t> offsets = {0, 3, 3, 4};  // the middle response is empty
  const auto e = ev::mean_token_entropy(h, offsets);
  EXPECT_DOUBLE_EQ(e.token_mean, 16.0 / 4.0);
  EXPECT_DOUBLE_EQ(e.response_mean, (2.0 + 10.0) / 2.0);
  EXPECT_EQ(e.tokens, 4);
  EXPECT_EQ(e.responses, 2);
  const std::vector<double> logp = {-0.1, -2.0, -0.5, -1.0};
  const std::vector<double> ref = {-0.3, -1.0, -0.5, -4.0};
  const auto kl = ev::mean_abs_kl(logp, ref, offsets);
  EXPECT_NEAR(kl.token_mean, (0.2 + 1.0 + 0.0 + 3.0) / 4.0, 1e-15);
  EXPECT_NEAR(kl.response_mean, ((0.2 + 1.0) / 3.0 + 3.0) / 2.0, 1e-15);
}

// ================================ KDE ==========================================================

TEST(Kde, MatchesScipyGaussianKde) {
  // scipy.stats.gaussian_kde(x, bw_method=...) on these values: factor, kernel std and density
  // at -1.0, -0.6, 0.0; grid point 57 of seaborn's 200-point grid (cut = 3).
  const std::vector<double> x = {-1.2, -0.8, -0.75, -0.5, -0.3, -0.31, -0.9, -1.05};
  const std::vector<double> points = {-1.0, -0.6, 0.0};
  struct expected { ev::kde_bandwidth_rule rule; double factor, h, d0, d1, d2, g57, y57; };
  const expected rows[] = {
      {ev::kde_bandwidth_rule::scott, 0.6597539553864471, 0.21904108107144263, 0.8655451695478008,
       0.8412136344017871, 0.190555239000792, -1.2228918375538584, 0.5284673136688331},
      {ev::kde_bandwidth_rule::silverman, 0.6988271187715792, 0.23201353523997773, 0.8485453983476384,
       0.8436014094733201, 0.204120178650649, -1.2395148315889162, 0.4998893757922176},
  };
  for (const expected& e : rows) {
    ev::kde_params p;
    p.rule = e.rule;
    const auto k = ev::gaussian_kde(x, p);
    EXPECT_NEAR(k.factor, e.factor, 1e-14);
    EXPECT_NEAR(k.bandwidth, e.h, 1e-14);
    ASSERT_EQ(k.grid.size(), 200u);
    EXPECT_NEAR(k.grid[57], e.g57, 1e-14);
    EXPECT_NEAR(k.density[57], e.y57, 1e-13);
    const auto d = ev::gaussian_kde_evaluate(x, k.bandwidth, points);
    EXPECT_NEAR(d[0], e.d0, 1e-13);
    EXPECT_NEAR(d[1], e.d1, 1e-13);
    EXPECT_NEAR(d[2], e.d2, 1e-13);
  }
}

TEST(Kde, GridSpansCutBandwidthsAndIntegratesToOne) {
  std::mt19937_64 rng(99);
  std::normal_distribution<double> a(-0.8, 0.15), b(-0.3, 0.05);
  std::vector<double> x;
  for (int i = 0; i < 400; ++i) x.push_back(i % 3 == 0 ? b(rng) : a(rng));  // bimodal
  for (auto rule : {ev::kde_bandwidth_rule::scott, ev::kde_bandwidth_rule::silverman}) {
    ev::kde_params p;
    p.rule = rule;
    const auto k = ev::gaussian_kde(x, p);
    const double lo = *std::min_element(x.begin(), x.end()), hi = *std::max_element(x.begin(), x.end());
    EXPECT_NEAR(k.grid.front(), lo - 3 * k.bandwidth, 1e-12);
    EXPECT_DOUBLE_EQ(k.grid.back(), hi + 3 * k.bandwidth);
    double integral = 0;
    for (std::size_t i = 1; i < k.grid.size(); ++i)
      integral += 0.5 * (k.density[i] + k.density[i - 1]) * (k.grid[i] - k.grid[i - 1]);
    EXPECT_NEAR(integral, 1.0, 1e-3);
    for (double y : k.density) EXPECT_GE(y, 0.0);
    // Bandwidth = factor * sample std (ddof = 1).
    double mean = 0;
    for (double v : x) mean += v;
    mean /= static_cast<double>(x.size());
    double ss = 0;
    for (double v : x) ss += (v - mean) * (v - mean);
    const double sd = std::sqrt(ss / static_cast<double>(x.size() - 1));
    const double n = static_cast<double>(x.size());
    const double factor = rule == ev::kde_bandwidth_rule::scott ? std::pow(n, -0.2) : std::pow(n * 0.75, -0.2);
    EXPECT_NEAR(k.bandwidth, factor * sd, 1e-14);
  }
  ev::kde_params wide;
  wide.adjust = 2.0;
  EXPECT_NEAR(ev::gaussian_kde(x, wide).bandwidth, 2.0 * ev::gaussian_kde(x).bandwidth, 1e-15);
}

TEST(Kde, MeanLogLikelihoodPerResponse) {
  const std::vector<double> logp = {-1.0, -2.0, -3.0, -0.5};
  const std::vector<reco::index_t> offsets = {0, 3, 4};
  const auto m = ev::mean_log_likelihood_per_response(logp, offsets);
  ASSERT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m[0], -2.0);
  EXPECT_DOUBLE_EQ(m[1], -0.5);
}

// ================================ bad input ====================================================

TEST(EvalErrors, NameTheArgument) {
  const std::vector<std::int64_t> ns = {10, 10}, cs = {1, 2}, short_cs = {1};
  expect_error_names([] { ev::pass_at_k(10, 3, 0); }, "k");
  expect_error_names([] { ev::pass_at_k(10, 3, 11); }, "k");
  expect_error_names([] { ev::pass_at_k(10, 11, 1); }, "c");
  expect_error_names([] { ev::pass_at_k(10, -1, 1); }, "c");
  expect_error_names([] { ev::pass_at_k(-5, 0, 1); }, "n");
  expect_error_names([] { ev::pass_at_k(0, 0, 1); }, "n");
  expect_error_names([&] { ev::pass_at_k_curve(ns, short_cs, {1}); }, "cs");
  expect_error_names([&] { ev::pass_at_k_curve(ns, cs, {1, 11}); }, "ks");
  expect_error_names([&] { ev::pass_at_k_curve(ns, cs, {}); }, "ks");
  expect_error_names([&] { ev::pass_at_k_curve(std::vector<std::int64_t>{}, std::vector<std::int64_t>{}, {1}); }, "ns");

  const std::vector<token_ids> one = {{1, 2, 3}};
  expect_error_names([&] { ev::self_bleu(one); }, "responses");
  expect_error_names([&] { ev::sentence_bleu(std::vector<token_ids>{}, token_ids{1}); }, "references");
  ev::bleu_params bad_order;
  bad_order.max_order = 0;
  expect_error_names([&] { ev::self_bleu(kRoots, bad_order); }, "params.max_order");
  ev::bleu_params bad_eps;
  bad_eps.epsilon = 0.0;
  expect_error_names([&] { ev::self_bleu(kRoots, bad_eps); }, "params.epsilon");
  bad_eps.epsilon = std::nan("");
  expect_error_names([&] { ev::self_bleu(kRoots, bad_eps); }, "params.epsilon");
  const std::vector<std::vector<token_ids>> prompts = {{{1}, {2}}};
  expect_error_names([&] { ev::self_bleu_among_correct(prompts, {}); }, "correct");
  expect_error_names([&] { ev::self_bleu_among_correct(prompts, {{true}}); }, "correct");
  expect_error_names([&] { ev::self_bleu_among_correct(prompts, {{true, false}}); }, "correct");  // none usable

  expect_error_names([] { ev::distinct_n(kRoots, 0); }, "n");
  expect_error_names([] { ev::distinct_n(std::vector<token_ids>{{}, {}}, 1); }, "responses");
  expect_error_names([] { ev::distinct_n(std::vector<std::vector<token_ids>>{}, 1); }, "responses");

  expect_error_names([] { ev::path_uniqueness(std::vector<std::string>{"a"}, 0); }, "prefix_code_points");
  expect_error_names([] { ev::path_uniqueness(std::vector<std::string>{}); }, "rollouts");
  expect_error_names([] { ev::path_uniqueness(std::vector<std::vector<std::string>>{{"a"}, {}}); }, "rollouts");

  const std::vector<double> p = {0.5, 1.5};
  const std::vector<reco::index_t> offsets = {0, 2}, bad_offsets = {0, 3}, reversed = {0, 2, 1, 2};
  expect_error_names([&] { ev::token_variance_by_position(p, offsets); }, "probabilities");
  const std::vector<double> nan_p = {0.5, std::nan("")};
  expect_error_names([&] { ev::token_variance_by_position(nan_p, offsets); }, "probabilities");
  const std::vector<double> pos_logp = {-0.5, 0.1};
  expect_error_names(
      [&] { ev::token_variance_by_position(pos_logp, offsets, ev::probability_input::log_probability); },
      "probabilities");
  const std::vector<double> good = {0.5, 0.5};
  expect_error_names([&] { ev::token_variance_by_position(good, bad_offsets); }, "offsets");
  expect_error_names([&] { ev::token_variance_by_position(good, reversed); }, "offsets");
  expect_error_names([&] { ev::mean_token_entropy(good, std::vector<reco::index_t>{0}); }, "offsets");
  const std::vector<double> empty;
  expect_error_names([&] { ev::mean_token_entropy(empty, std::vector<reco::index_t>{0, 0}); }, "entropy");
  expect_error_names([&] { ev::mean_abs_kl(good, std::vector<double>{-1.0}, offsets); }, "ref_logp");
  const std::vector<double> inf_logp = {-1.0, -INFINITY};
  expect_error_names([&] { ev::mean_abs_kl(inf_logp, good, offsets); }, "logp");

  const std::vector<double> x = {1.0, 2.0, std::nan("")};
  expect_error_names([&] { ev::gaussian_kde(x); }, "samples");
  expect_error_names([] { ev::gaussian_kde(std::vector<double>{1.0}); }, "samples");
  expect_error_names([] { ev::gaussian_kde(std::vector<double>{2.0, 2.0, 2.0}); }, "samples");
  expect_error_names([] { ev::gaussian_kde(std::vector<double>{1.0, 2.0}, [] { ev::kde_params q; q.grid_size = 1; return q; }()); },
                     "params.grid_size");
  expect_error_names([] { ev::gaussian_kde(std::vector<double>{1.0, 2.0}, [] { ev::kde_params q; q.cut = -1; return q; }()); },
                     "params.cut");
  expect_error_names([] { ev::gaussian_kde_evaluate(std::vector<double>{1.0}, 0.0, std::vector<double>{0.0}); }, "bandwidth");
  expect_error_names([] { ev::mean_log_likelihood_per_response(std::vector<double>{-1.0}, std::vector<reco::index_t>{0, 0, 1}); },
                     "offsets");
}

// ================================ extreme inputs ===============================================
// Inputs at the edge of the documented ranges: huge sample counts and orders, magnitudes near
// the largest double and subnormal values, exceptions inside the parallel loops.

namespace {

// Runs f on its own thread and fails the test if it has not finished after `seconds` (a hang
// then costs the deadline, not the whole suite; the thread is left to the process's exit).
void expect_finishes_within(double seconds, std::function<void()> f, const std::string& what) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(f));
  std::future<void> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << what << ": still running after " << seconds << " s";
    return;
  }
  done.get();  // rethrows a failure of f
}

// 1 - C(n - c, k) / C(n, k) as a long double product of (n - c - j) / (n - j), j < k; with
// C(n - c, k) / C(n, k) = C(n - k, c) / C(n, c) the shorter of the two products is used.
long double pass_at_k_product(std::int64_t n, std::int64_t c, std::int64_t k) {
  if (n - c < k) return 1.0L;
  const std::int64_t terms = std::min(c, k), other = std::max(c, k);
  long double ratio = 1.0L;
  for (std::int64_t j = 0; j < terms; ++j)
    ratio *= static_cast<long double>(n - other - j) / static_cast<long double>(n - j);
  return 1.0L - ratio;
}

// For n far above c and k: log C(n - c, k) / C(n, k) = sum_{j < m} log(1 - a / (n - j)) expanded
// in a / n and m / n to third order (what is left is below 1e-20 for the cases used).
long double pass_at_k_asymptotic(std::int64_t n_, std::int64_t c, std::int64_t k) {
  const long double n = static_cast<long double>(n_), a = static_cast<long double>(std::max(c, k)),
                    m = static_cast<long double>(std::min(c, k));
  const long double harmonic1 = m / n + m * (m - 1) / (2 * n * n);  // sum_j 1 / (n - j)
  const long double harmonic2 = m / (n * n), harmonic3 = m / (n * n * n);
  return -std::expm1(-(a * harmonic1 + a * a * harmonic2 / 2 + a * a * a * harmonic3 / 3));
}

// Gaussian KDE straight from the definition on moderate values: ddof-1 std, Scott's factor.
struct naive_kde {
  std::vector<double> x;
  double h;
  explicit naive_kde(std::vector<double> v) : x(std::move(v)) {
    double mean = 0;
    for (double t : x) mean += t;
    mean /= static_cast<double>(x.size());
    double ss = 0;
    for (double t : x) ss += (t - mean) * (t - mean);
    h = std::pow(static_cast<double>(x.size()), -0.2) * std::sqrt(ss / static_cast<double>(x.size() - 1));
  }
  double at(double p) const {
    double s = 0;
    for (double t : x) s += std::exp(-0.5 * ((p - t) / h) * ((p - t) / h)) / (h * std::sqrt(2 * M_PI));
    return s / static_cast<double>(x.size());
  }
};

}  // namespace

TEST(PassAtK, HugeSampleCountsReturnPromptly) {
  const std::int64_t big = std::int64_t{1} << 40, top = INT64_MAX;
  expect_finishes_within(20.0, [=] {
    // Known limits at the largest n.
    EXPECT_EQ(ev::pass_at_k(top, 0, top), 0.0);
    EXPECT_EQ(ev::pass_at_k(top, 10, top - 5), 1.0);             // n - c < k
    EXPECT_EQ(ev::pass_at_k(top, top / 2, top / 2), 1.0);        // all-wrong ratio far below 2^-54
    EXPECT_EQ(ev::pass_at_k(big, big - 5, 2), 1.0);              // ratio 20 / (2^40 (2^40 - 1))
    EXPECT_NEAR(ev::pass_at_k(big, big / 2, 1), 0.5, 1e-16);     // pass@1 = c / n
    EXPECT_NEAR(ev::pass_at_k(top, 1, std::int64_t{1} << 62),
                static_cast<double>(static_cast<long double>(std::int64_t{1} << 62) / static_cast<long double>(top)), 1e-16);
    // c = 1: pass@k = k / n exactly, kept to full relative precision for a tiny value.
    const double tiny = ev::pass_at_k(top, 1, 3);
    EXPECT_NEAR(tiny / (3.0L / static_cast<long double>(top)), 1.0, 1e-15);
    // Far above c and k: the third-order expansion is exact to double precision.
    for (std::int64_t m : {std::int64_t{1} << 31, std::int64_t{3000000000}, std::int64_t{1} << 20}) {
      const std::int64_t a = m == (std::int64_t{1} << 20) ? big : m;
      const double got = ev::pass_at_k(top, m, a);
      const double want = static_cast<double>(pass_at_k_asymptotic(top, m, a));
      EXPECT_NEAR(got, want, 2e-15 * want) << m << " " << a;
    }
    // n = 2^40 with a million correct samples and draws (the closed-form path) against the product.
    const double want = static_cast<double>(pass_at_k_product(big, 1000000, 1000000));
    EXPECT_NEAR(ev::pass_at_k(big, 1000000, 1000000), want, 1e-13);
    EXPECT_NEAR(ev::pass_at_k(big, 3, big / 2), static_cast<double>(pass_at_k_product(big, 3, big / 2)), 1e-14);
    // The batch form goes through the same code.
    const std::vector<std::int64_t> ns = {top, big, big}, cs = {top / 2, big / 2, 1000000};
    const auto curve = ev::pass_at_k_curve(ns, cs, {1, 1000000});
    EXPECT_EQ(curve.per_problem[1][0], 1.0);
    EXPECT_NEAR(curve.per_problem[0][1], 0.5, 1e-16);
  }, "pass@k with n up to INT64_MAX");
}

TEST(PassAtK, MatchesTheProductAcrossSizes) {
  // Both the term-by-term path (up to 2^14 factors) and the closed-form path beyond it, with
  // results spread over (0, 1), against a long double product of the binomial ratio.
  std::mt19937_64 rng(2024);
  int compared = 0;
  for (int it = 0; it < 400; ++it) {
    const double log_n = std::uniform_real_distribution<double>(std::log(2.0), std::log(1e13))(rng);
    const std::int64_t n = static_cast<std::int64_t>(std::exp(log_n));
    const double log_m = std::uniform_real_distribution<double>(0.0, std::log(3e5))(rng);
    const std::int64_t m = std::min<std::int64_t>(n / 2, static_cast<std::int64_t>(std::exp(log_m)));
    if (m < 1) continue;
    // a near n / m keeps the result away from 0 and 1 in most draws.
    const std::int64_t a = std::clamp<std::int64_t>(
        static_cast<std::int64_t>(static_cast<double>(n) / static_cast<double>(m) *
                                  std::uniform_real_distribution<double>(0.05, 4.0)(rng)),
        m, n - m);
    const bool c_is_small = it % 2 == 0;
    const std::int64_t c = c_is_small ? m : a, k = c_is_small ? a : m;
    const double want = static_cast<double>(pass_at_k_product(n, c, k));
    ASSERT_NEAR(ev::pass_at_k(n, c, k), want, 1e-13) << n << " " << c << " " << k;
    ++compared;
  }
  EXPECT_GT(compared, 300);
  // Around the switch between the two paths.
  for (std::int64_t m : {16383, 16384, 16385, 20000})
    EXPECT_NEAR(ev::pass_at_k(100000000, m, m), static_cast<double>(pass_at_k_product(100000000, m, m)), 1e-13) << m;
}

TEST(EvalParallel, ExceptionsLeaveTheLoopLowestIndexFirst) {
  // Throwing inside an OpenMP region would terminate the process; the loop must instead rethrow
  // the lowest failing iteration's exception, after running every iteration below it.
  for (auto schedule : {ev::detail::loop_schedule::dynamic, ev::detail::loop_schedule::blocks}) {
    std::vector<std::atomic<int>> ran(1000);
    try {
      ev::detail::parallel_for(1000, schedule, [&](std::int64_t i) {
        ran[static_cast<std::size_t>(i)] = 1;
        if (i % 97 == 50) throw std::runtime_error("iteration " + std::to_string(i));
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "iteration 50");
    }
    for (int i = 0; i <= 50; ++i) EXPECT_EQ(ran[static_cast<std::size_t>(i)].load(), 1) << i;
    EXPECT_THROW(ev::detail::parallel_for(64, schedule, [](std::int64_t i) { if (i == 63) throw std::bad_alloc(); }),
                 std::bad_alloc);
    int sum = 0;
    ev::detail::parallel_for(0, schedule, [&](std::int64_t) { ++sum; });
    EXPECT_EQ(sum, 0);
  }
}

TEST(EvalParallel, AllocationFailureBecomesAnErrorNamingTheArgument) {
  expect_error_names([] {
    ev::detail::guard_allocation("responses", [] { return std::string("counting"); },
                                 []() -> int { throw std::bad_alloc(); });
  }, "responses");
  EXPECT_EQ(ev::detail::guard_allocation("responses", [] { return std::string("x"); }, [] { return 7; }), 7);
}

TEST(DistinctN, OrderLongerThanEveryResponseMeansNoNgrams) {
  const std::vector<std::vector<token_ids>> prompts = {{{1, 2, 3, 4, 5}, {1, 2}}, {{7, 8}, {9}}};
  const ev::distinct_params pooled_tokens{ev::distinct_scope::pooled_per_prompt, ev::distinct_denominator::tokens};
  const ev::distinct_params per_tokens{ev::distinct_scope::per_response, ev::distinct_denominator::tokens};
  // Order 3: the second prompt has no trigram. Under the ngrams denominator it has no value (left
  // out); under tokens it counts 0.
  EXPECT_DOUBLE_EQ(ev::distinct_n(prompts, 3), 1.0);
  EXPECT_DOUBLE_EQ(ev::distinct_n(prompts, 3, pooled_tokens), (3.0 / 7.0 + 0.0) / 2.0);
  EXPECT_DOUBLE_EQ(ev::distinct_n(prompts, 3, per_tokens), ((3.0 / 5.0 + 0.0) / 2.0 + 0.0) / 2.0);
  expect_finishes_within(20.0, [=] {
    // Orders far beyond every response: no n-gram anywhere, without counting order by order.
    for (int n : {6, 1000, INT_MAX}) {
      expect_error_names([&] { ev::distinct_n(prompts, n); }, "responses");
      EXPECT_EQ(ev::distinct_n(prompts, n, pooled_tokens), 0.0) << n;
      EXPECT_EQ(ev::distinct_n(prompts, n, per_tokens), 0.0) << n;
      EXPECT_EQ(ev::distinct_n(std::vector<std::string>{"a b", "c"}, n, per_tokens), 0.0) << n;
    }
  }, "distinct_n with a huge n");
}

TEST(DistinctN, HighOrdersMatchTheSetBasedReference) {
  // Orders from 1 to past the longest response, on data whose n-grams become unique after a few
  // orders (the counts then follow from the lengths) and on data with long repeats (they never do
  // before the end): both against a set-based count, under both denominators.
  std::mt19937_64 rng(77);
  std::vector<std::vector<token_ids>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(random_responses(rng, 2 + i % 3, 40, 50));
  prompts.push_back({token_ids(25, 7), token_ids(10, 7), {1, 2, 1, 2, 1, 2, 1, 2}});  // repeats
  const token_ids shared = {3, 1, 4, 1, 5, 9, 2, 6};
  prompts.push_back({shared, shared, token_ids(shared.begin(), shared.begin() + 5)});  // shared across responses
  for (int n = 1; n <= 45; ++n)
    for (auto denominator : {ev::distinct_denominator::ngrams, ev::distinct_denominator::tokens}) {
      double pooled = 0, per = 0;
      int pooled_count = 0, per_count = 0;
      for (const auto& responses : prompts) {
        std::set<ngram> all;
        long long den_total = 0;
        double prompt_sum = 0;
        int prompt_count = 0;
        for (const auto& r : responses) {
          const auto c = ngram_counts(r, n);
          long long grams = 0;
          for (const auto& [g, k] : c) {
            all.insert(g);
            grams += k;
          }
          const long long den = denominator == ev::distinct_denominator::ngrams ? grams : static_cast<long long>(r.size());
          den_total += den;
          if (den > 0) {
            prompt_sum += static_cast<double>(c.size()) / static_cast<double>(den);
            ++prompt_count;
          }
        }
        if (den_total > 0) {
          pooled += static_cast<double>(all.size()) / static_cast<double>(den_total);
          ++pooled_count;
        }
        if (prompt_count > 0) {
          per += prompt_sum / prompt_count;
          ++per_count;
        }
      }
      const ev::distinct_params pooled_p{ev::distinct_scope::pooled_per_prompt, denominator};
      const ev::distinct_params per_p{ev::distinct_scope::per_response, denominator};
      if (pooled_count == 0) {
        expect_error_names([&] { ev::distinct_n(prompts, n, pooled_p); }, "responses");
        continue;
      }
      EXPECT_NEAR(ev::distinct_n(prompts, n, pooled_p), pooled / pooled_count, 1e-13) << n;
      EXPECT_NEAR(ev::distinct_n(prompts, n, per_p), per / per_count, 1e-13) << n;
    }
}

TEST(Bleu, MaxOrderIsBoundedAndWorksUpToTheLimit) {
  ev::bleu_params huge;
  huge.max_order = INT_MAX;
  expect_error_names([&] { ev::self_bleu(kRoots, huge); }, "params.max_order");
  expect_error_names([&] { ev::sentence_bleu(std::vector<token_ids>{{1, 2}}, token_ids{1, 2}, huge); },
                     "params.max_order");
  huge.max_order = ev::bleu_max_order_limit + 1;
  expect_error_names([&] { ev::self_bleu(kRoots, huge); }, "params.max_order");
  // At the limit, orders past every response only add smoothed empty precisions.
  const auto ids = ev::tokenise_whitespace(kRoots);
  const int order = ev::bleu_max_order_limit;
  const auto per = ev::self_bleu_per_response(ids, bleu_order(order));
  for (std::size_t h = 0; h < ids.size(); ++h) {
    std::vector<token_ids> refs;
    for (std::size_t r = 0; r < ids.size(); ++r)
      if (r != h) refs.push_back(ids[r]);
    EXPECT_NEAR(per[h], naive_bleu(refs, ids[h], order, true), 1e-14) << h;
  }
}

TEST(Kde, GridSizeIsBounded) {
  ev::kde_params p;
  p.grid_size = std::int64_t{1} << 50;
  expect_error_names([&] { ev::gaussian_kde(std::vector<double>{1.0, 2.0}, p); }, "params.grid_size");
  p.grid_size = ev::kde_max_grid_size + 1;
  expect_error_names([&] { ev::gaussian_kde(std::vector<double>{1.0, 2.0}, p); }, "params.grid_size");
}

TEST(Kde, ExtremeMagnitudesMatchTheScaledDefinition) {
  // x = scale · u: the bandwidth and grid scale with it and the density by 1 / scale. The
  // reference works on u, where nothing overflows or underflows.
  const std::vector<double> u = {-1.0, -0.3, 0.2, 0.25, 1.0};
  const naive_kde ref(u);
  for (double scale : {1e200, 1e-200, 1e-305, 1e300}) {
    std::vector<double> x;
    for (double v : u) x.push_back(v * scale);
    const auto k = ev::gaussian_kde(x);
    EXPECT_NEAR(k.bandwidth / scale, ref.h, 1e-13 * ref.h) << scale;
    for (std::size_t g = 0; g < k.grid.size(); g += 37) {
      ASSERT_TRUE(std::isfinite(k.density[g])) << scale << " " << g;
      const double at_u = ref.at(k.grid[g] / scale);
      EXPECT_NEAR(k.density[g] * scale, at_u, 1e-12 * at_u + 1e-300) << scale << " " << g;
    }
    // gaussian_kde_evaluate in the samples' own units.
    const std::vector<double> points = {-0.5 * scale, 0.0, 0.9 * scale};
    const auto d = ev::gaussian_kde_evaluate(x, k.bandwidth, points);
    for (std::size_t j = 0; j < points.size(); ++j) {
      const double at_u = ref.at(points[j] / scale);
      EXPECT_NEAR(d[j] * scale, at_u, 1e-12 * at_u) << scale << " " << j;
    }
  }
  // Near the largest double: the differences between samples overflow, the result does not.
  std::vector<double> x;
  for (double v : u) x.push_back(v * 1.5e308);
  ev::kde_params no_cut;
  no_cut.cut = 0.0;
  const auto k = ev::gaussian_kde(x, no_cut);
  EXPECT_NEAR(k.bandwidth / 1.5e308, ref.h, 1e-13 * ref.h);
  EXPECT_EQ(k.grid.front(), x.front());
  EXPECT_EQ(k.grid.back(), x.back());
  for (std::size_t g = 0; g < k.grid.size(); g += 23) {
    const double at_u = ref.at(k.grid[g] / 1.5e308);
    EXPECT_NEAR(k.density[g] * 1.5e308 / at_u, 1.0, 1e-9) << g;  // densities ~1e-309 are subnormal
  }
  const auto d = ev::gaussian_kde_evaluate(x, k.bandwidth, std::vector<double>{x.front()});
  EXPECT_NEAR(d[0] * 1.5e308 / ref.at(-1.0), 1.0, 1e-9);
  // With the default cut the grid would end beyond the largest double.
  expect_error_names([&] { ev::gaussian_kde(x); }, "samples");
}

TEST(Kde, SubnormalValuesAreNotEqualButTheirDensityDoesNotFit) {
  // Distinct subnormal values have a spread; their density (~1e323) exceeds the largest double.
  const std::vector<double> x = {5e-324, 1e-323, 1.5e-323, 2.5e-323};
  try {
    ev::gaussian_kde(x);
    ADD_FAILURE() << "no error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "samples");
    EXPECT_EQ(std::string(e.what()).find("equal"), std::string::npos) << e.what();
  }
  expect_error_names([] { ev::gaussian_kde(std::vector<double>{5e-324, 5e-324}); }, "samples");  // really equal
  expect_error_names([] { ev::gaussian_kde_evaluate(std::vector<double>{0.0, 1e-320}, 1e-320, std::vector<double>{0.0}); },
                     "bandwidth");
  // Far from every sample the density is 0, even for a subnormal bandwidth.
  EXPECT_EQ(ev::gaussian_kde_evaluate(std::vector<double>{0.0}, 1e-320, std::vector<double>{1.0})[0], 0.0);
}

TEST(Kde, MeanLogLikelihoodOfHugeLogProbabilities) {
  const std::vector<double> logp = {-1.7e308, -1.6e308, -1.0, /**/ -1.0e308};
  const auto m = ev::mean_log_likelihood_per_response(logp, std::vector<reco::index_t>{0, 3, 4});
  EXPECT_NEAR(m[0] / (-1.7e308 / 3 - 1.6e308 / 3 - 1.0 / 3), 1.0, 1e-15);
  EXPECT_EQ(m[1], -1.0e308);
}

TEST(TokenSummaries, HugeValuesDoNotOverflowTheMeans) {
  // |logp - ref_logp| and their sums beyond the largest double: reference means taken as sums of
  // value / count, which stay finite.
  const std::vector<double> logp = {-1.7e308, -1.7e308, -1.6e308, -1.0e308, 0.5};
  const std::vector<double> ref = {0.0, -1e-3, 0.0, 1.0e308, 0.25};
  const std::vector<reco::index_t> offsets = {0, 2, 3, 5};
  std::vector<double> d;
  for (std::size_t t = 0; t < logp.size(); ++t) d.push_back(0.5 * std::fabs(logp[t]) + 0.5 * std::fabs(ref[t]));
  // (logp and ref have opposite signs or ref = 0 here, so |logp - ref| / 2 = (|logp| + |ref|) / 2.)
  d[4] = 0.25 / 2;
  double token_mean = 0;
  for (double v : d) token_mean += v / 5.0 * 2;
  const double r0 = d[0] + d[1], r1 = 2 * d[2], r2 = d[3] + d[4];  // response means
  const double response_mean = r0 / 3 + r1 / 3 + r2 / 3;
  const auto kl = ev::mean_abs_kl(logp, ref, offsets);
  EXPECT_NEAR(kl.token_mean / token_mean, 1.0, 1e-15);
  EXPECT_NEAR(kl.response_mean / response_mean, 1.0, 1e-15);
  const std::vector<double> h = {1.7e308, 1.7e308, 1.6e308};
  const auto e = ev::mean_token_entropy(h, std::vector<reco::index_t>{0, 2, 3});
  EXPECT_NEAR(e.token_mean / (1.7e308 / 3 * 2 + 1.6e308 / 3), 1.0, 1e-15);
  EXPECT_NEAR(e.response_mean / (1.7e308 / 2 + 1.6e308 / 2), 1.0, 1e-15);
  // A mean that genuinely exceeds the largest double.
  expect_error_names([] {
    ev::mean_abs_kl(std::vector<double>{-1.7e308}, std::vector<double>{1.7e308}, std::vector<reco::index_t>{0, 1});
  }, "logp");
}
