// The 80/20 rule's selection on the CPU backend against naive references: the backend's order
// statistics (sampled selection for large n, nested nth_element for small n) against a sorted
// copy, the float selection (sampled band, radix) over float values against sorted keys, and the
// cut, kept flags and counts per response (compute_cut + mark_kept / mark_kept_counted) against a
// sort-and-count reference,
// on data with many ties (-0.0 and +0.0 among them), all-equal keys, sorted and periodic layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reco/reco.hpp"

namespace {

using reco::index_t;

enum class pattern { uniform, few_values, signed_zeros, all_equal, ascending, descending, periodic, with_inf };

std::vector<double> make_keys(pattern pat, index_t n, std::mt19937_64& rng) {
  std::vector<double> k(static_cast<std::size_t>(n));
  std::uniform_real_distribution<double> u(0, 4);
  std::uniform_int_distribution<int> small(0, 6);
  for (index_t i = 0; i < n; ++i) {
    double& x = k[static_cast<std::size_t>(i)];
    switch (pat) {
      case pattern::uniform: x = u(rng); break;
      case pattern::few_values: x = 0.25 * small(rng) - 0.5; break;
      case pattern::signed_zeros: {
        const int c = small(rng);
        x = c < 3 ? 0.0 : c < 5 ? -0.0 : (c == 5 ? 1.0 : -1.0);
        break;
      }
      case pattern::all_equal: x = 1.5; break;
      case pattern::ascending: x = static_cast<double>(i / 3); break;
      case pattern::descending: x = static_cast<double>(n - i); break;
      case pattern::periodic: x = static_cast<double>(i % 4096 == 0 ? 100 : i % 7); break;
      case pattern::with_inf: x = (i % 5 == 0) ? HUGE_VAL : u(rng); break;
    }
  }
  return k;
}

const pattern all_patterns[] = {pattern::uniform,   pattern::few_values, pattern::signed_zeros, pattern::all_equal,
                                pattern::ascending, pattern::descending, pattern::periodic,     pattern::with_inf};

TEST(Selection, OrderStatisticsMatchSortedCopy) {
  std::mt19937_64 rng(11);
  const index_t sizes[] = {1, 2, 3, 100, 16383, 16384, 50000, 300001};
  for (const index_t n : sizes) {
    for (const pattern pat : all_patterns) {
      const std::vector<double> keys = make_keys(pat, n, rng);
      std::vector<double> sorted = keys;
      std::sort(sorted.begin(), sorted.end());
      std::uniform_int_distribution<index_t> any(0, n - 1);
      const index_t r1 = any(rng), r2 = any(rng);
      const index_t p80 = static_cast<index_t>(0.8 * static_cast<double>(n - 1));
      const std::vector<std::vector<index_t>> rank_sets = {
          {0}, {n - 1}, {0, n - 1}, {n - 1, 0}, {p80, std::min(p80 + 1, n - 1)}, {p80, p80}, {r1, r2},
          {r2, -1, r1, n}, {n / 2, 0, n - 1, n / 3, n / 2}};
      for (const auto& ranks : rank_sets) {
        std::vector<double> work = keys;
        std::vector<double> out(ranks.size(), 7.0);
        reco::cpu{}.order_statistics(work.data(), n, ranks.data(), static_cast<int>(ranks.size()), out.data());
        for (std::size_t j = 0; j < ranks.size(); ++j) {
          const index_t r = ranks[j];
          const double want = (r < 0 || r >= n) ? 0.0 : sorted[static_cast<std::size_t>(r)];
          EXPECT_TRUE(out[j] == want) << "n=" << n << " pattern=" << static_cast<int>(pat) << " rank=" << r
                                      << " got " << out[j] << " want " << want;
        }
      }
    }
  }
}

// The radix selection over the valid entries of float values (the 80/20 cut's on reco::cpu)
// against a sorted copy of the generic path's keys: the valid values, +inf for masked tokens.
TEST(Selection, MaskedFloatOrderStatisticsMatchSortedKeys) {
  std::mt19937_64 rng(13);
  const index_t sizes[] = {1, 2, 3, 100, 50000, 300001};
  for (const index_t n : sizes) {
    for (const pattern pat : all_patterns) {
      const std::vector<double> d = make_keys(pat, n, rng);
      const std::vector<float> values(d.begin(), d.end());
      std::vector<std::uint8_t> mask(values.size());
      std::bernoulli_distribution drop(0.2);
      for (auto& m : mask) m = drop(rng) ? 0 : 3;  // any nonzero byte is valid
      for (const bool masked : {false, true}) {
        std::vector<double> keys(values.size());
        for (std::size_t t = 0; t < values.size(); ++t)
          keys[t] = (!masked || mask[t]) ? static_cast<double>(values[t]) : HUGE_VAL;
        std::sort(keys.begin(), keys.end());
        std::uniform_int_distribution<index_t> any(0, n - 1);
        const index_t r = any(rng), p80 = static_cast<index_t>(0.8 * static_cast<double>(n - 1));
        const std::vector<std::vector<index_t>> rank_sets = {{0, n - 1}, {p80, std::min(p80 + 1, n - 1)},
                                                             {r, r}, {-1, n}, {n - 1, 0}};
        for (const auto& ranks : rank_sets) {
          double out[2] = {7.0, 7.0}, counts[2] = {-1.0, -1.0};
          reco::cpu{}.masked_order_statistics(values.data(), masked ? mask.data() : nullptr, n, ranks.data(), 2, out,
                                              counts);
          for (int j = 0; j < 2; ++j) {
            const index_t rk = ranks[static_cast<std::size_t>(j)];
            const double want = (rk < 0 || rk >= n) ? 0.0 : keys[static_cast<std::size_t>(rk)];
            EXPECT_TRUE(out[j] == want) << "n=" << n << " pattern=" << static_cast<int>(pat) << " masked=" << masked
                                        << " rank=" << rk << " got " << out[j] << " want " << want;
          }
          // The valid values above the first rank's value and equal to it (none where it is no
          // valid value: outside [0, n) or a masked token's +inf).
          double above = 0, equal = 0;
          index_t valid = 0;
          for (std::size_t t = 0; t < values.size(); ++t) valid += !masked || mask[t];
          if (ranks[0] >= 0 && ranks[0] < valid)
            for (std::size_t t = 0; t < values.size(); ++t)
              if (!masked || mask[t]) {
                above += static_cast<double>(values[t]) > out[0];
                equal += static_cast<double>(values[t]) == out[0];
              }
          EXPECT_EQ(counts[0], above) << "n=" << n << " pattern=" << static_cast<int>(pat) << " rank=" << ranks[0];
          EXPECT_EQ(counts[1], equal) << "n=" << n << " pattern=" << static_cast<int>(pat) << " rank=" << ranks[0];
          // The histograms counted in parts (one per thread on reco::cpu) give the same.
          double out3[2] = {7.0, 7.0}, counts3[2] = {-1.0, -1.0};
          reco::detail::masked_float_order_statistics(values.data(), masked ? mask.data() : nullptr, n, ranks.data(),
                                                      2, out3, counts3, 3);
          EXPECT_TRUE(out3[0] == out[0] && out3[1] == out[1]) << "n=" << n << " in 3 parts";
          EXPECT_TRUE(counts3[0] == counts[0] && counts3[1] == counts[1]) << "n=" << n << " in 3 parts";
          // The sampled path (tried first from 2^20 values; here from 1,000), in one part and in
          // three: where it answers, the same values and counts; on spread-out values it answers.
          for (const int parts : {1, 3}) {
            double outs[2] = {7.0, 7.0}, counts_s[2] = {-1.0, -1.0};
            reco::detail::serial_for_each each;
            const bool answered = n >= 1000 && reco::detail::sampled_float_order_statistics(
                                                   values.data(), masked ? mask.data() : nullptr, n, ranks.data(), 2,
                                                   outs, counts_s, parts, each);
            const bool near = ranks[0] >= 0 && ranks[0] < n && std::abs(ranks[1] - ranks[0]) <= 1;
            if (n >= 50000 && pat == pattern::uniform && near) {
              EXPECT_TRUE(answered) << "n=" << n << " rank=" << ranks[0] << ": the sample's band missed";
            }
            if (!answered) continue;
            EXPECT_TRUE(outs[0] == out[0] && outs[1] == out[1])
                << "n=" << n << " pattern=" << static_cast<int>(pat) << " masked=" << masked << " sampled, " << parts
                << " parts: " << outs[0] << " " << outs[1] << " want " << out[0] << " " << out[1];
            EXPECT_TRUE(counts_s[0] == counts[0] && counts_s[1] == counts[1])
                << "n=" << n << " pattern=" << static_cast<int>(pat) << " sampled counts";
          }
          double outm[2] = {7.0, 7.0}, countsm[2] = {-1.0, -1.0};
          reco::detail::masked_float_order_statistics(values.data(), masked ? mask.data() : nullptr, n, ranks.data(),
                                                      2, outm, countsm, 2, reco::detail::serial_for_each{}, 1000);
          EXPECT_TRUE(outm[0] == out[0] && outm[1] == out[1]) << "n=" << n << " sampled first";
          EXPECT_TRUE(countsm[0] == counts[0] && countsm[1] == counts[1]) << "n=" << n << " sampled first";
        }
      }
    }
  }
}

// The selection among a sampled band's gathered values (select_places: from 2^16 of them a second,
// narrower band first) against a sorted copy: every place's value exact, for one place and two,
// near or far apart, at the ends, with ties, and with a place left out.
TEST(Selection, PlacesAmongGatheredValuesMatchSortedCopy) {
  std::mt19937_64 rng(29);
  for (const index_t n : {index_t(65536), index_t(200003), index_t(1000)}) {
    for (const pattern pat : all_patterns) {
      const std::vector<double> d = make_keys(pat, n, rng);
      const std::vector<float> values(d.begin(), d.end());
      std::vector<float> sorted = values;
      std::sort(sorted.begin(), sorted.end());
      std::uniform_int_distribution<index_t> any(0, n - 1);
      const index_t r = any(rng), mid = n / 2;
      const std::vector<std::vector<index_t>> place_sets = {{mid, -1}, {mid, mid + 1}, {mid + 1, mid}, {r, n - 1 - r},
                                                            {0, n - 1},  {-1, r},       {n / 5, n / 5}};
      for (const auto& places : place_sets) {
        std::vector<float> all = values;
        double out[2] = {7.0, 7.0};
        reco::detail::select_places(all, places.data(), 2, out);
        for (int j = 0; j < 2; ++j) {
          const index_t i = places[static_cast<std::size_t>(j)];
          const double want = i < 0 ? 7.0 : static_cast<double>(sorted[static_cast<std::size_t>(i)]);
          EXPECT_TRUE(out[j] == want) << "n=" << n << " pattern=" << static_cast<int>(pat) << " place=" << i
                                      << " got " << out[j] << " want " << want;
        }
      }
    }
  }
}

// Naive top-k reference: k = max(1, ceil(rho N)) of the valid tokens, the cut the k-th largest,
// kept = above the cut, or on it among the first (k - #above) such tokens in position order.
struct naive_cut {
  double value;
  index_t ties;
  std::vector<std::uint8_t> kept;
};
template <class T>
naive_cut naive_top_k(const std::vector<T>& h, const std::vector<std::uint8_t>& mask, double rho) {
  std::vector<double> valid;
  for (std::size_t t = 0; t < h.size(); ++t)
    if (mask[t]) valid.push_back(static_cast<double>(h[t]));
  std::sort(valid.begin(), valid.end(), [](double a, double b) { return a > b; });
  const auto n = static_cast<double>(valid.size());
  auto k = static_cast<index_t>(std::ceil(rho * n * (1 - 1e-12)));
  k = std::max<index_t>(k, 1);
  k = std::min<index_t>(k, static_cast<index_t>(valid.size()));
  naive_cut c;
  c.value = valid[static_cast<std::size_t>(k - 1)];
  index_t above = 0;
  for (double x : valid) above += x > c.value ? 1 : 0;
  c.ties = k - above;
  c.kept.assign(h.size(), 0);
  index_t seen = 0;
  for (std::size_t t = 0; t < h.size(); ++t) {
    if (!mask[t]) continue;
    const double x = static_cast<double>(h[t]);
    if (x > c.value) c.kept[t] = 1;
    if (x == c.value) c.kept[t] = seen++ < c.ties ? 1 : 0;
  }
  return c;
}

template <class T>
void check_cut(const std::vector<T>& h, const std::vector<std::uint8_t>& mask, double rho, const std::string& what) {
  using namespace reco::detail;
  const index_t n = static_cast<index_t>(h.size());
  reco::cpu be;
  objective_scalars s{};
  double population = 0;
  for (auto m : mask) population += m ? 1 : 0;
  std::vector<double> keys(h.size());
  std::vector<index_t> tie_rank(h.size() + 1);
  std::vector<std::uint8_t> kept(h.size(), 9);
  reco::top_entropy_selection::params_type p;
  p.rho = rho;
  compute_cut(be, h.data(), mask.data(), n, p, &population, keys.data(), &s);
  mark_kept(be, h.data(), mask.data(), n, &s, tie_rank.data(), kept.data());
  const naive_cut want = naive_top_k(h, mask, rho);
  EXPECT_TRUE(s.cut.value == want.value) << what << ": cut " << s.cut.value << " want " << want.value;
  EXPECT_EQ(s.cut.ties, want.ties) << what;
  EXPECT_TRUE(kept == want.kept) << what;

  // The same cut handed back as a given cut (no counts from compute_cut) keeps the same tokens.
  objective_scalars g{};
  reco::top_entropy_selection::params_type pg = p;
  pg.use_given = true;
  pg.given = s.cut;
  std::vector<std::uint8_t> kept_given(h.size(), 9);
  compute_cut(be, h.data(), mask.data(), n, pg, &population, keys.data(), &g);
  mark_kept(be, h.data(), mask.data(), n, &g, tie_rank.data(), kept_given.data());
  EXPECT_TRUE(kept_given == want.kept) << what << " (given cut)";

  // The host's one pass over responses (the objective's path on reco::cpu): the same flags, and
  // each response's kept count, on a packed layout of uneven responses (both cuts: counted by
  // compute_cut, and given), in one serial part and in parallel.
  std::vector<index_t> offsets{0};
  std::mt19937_64 rng(static_cast<std::uint64_t>(n));
  std::uniform_int_distribution<index_t> length(0, 700);
  while (offsets.back() < n) offsets.push_back(std::min(n, offsets.back() + length(rng)));
  reco::token_layout layout;
  layout.kind = reco::layout_kind::packed;
  layout.responses = static_cast<index_t>(offsets.size()) - 1;
  layout.offsets = reco::span<const index_t>(offsets.data(), offsets.size());
  layout.tokens = n;
  for (const bool given : {false, true}) {
    for (const bool serial : {true, false}) {
      reco::cpu host;
      host.serial = serial;
      objective_scalars c = given ? g : s;
      if (given) compute_cut(be, h.data(), mask.data(), n, pg, &population, keys.data(), &c);
      std::vector<std::uint8_t> flags(h.size(), 9);
      std::vector<index_t> counts(static_cast<std::size_t>(layout.responses), -1);
      mark_kept_counted(host, h.data(), mask.data(), layout, &c, flags.data(), counts.data());
      EXPECT_TRUE(flags == want.kept) << what << " (per response, given " << given << ")";
      for (index_t i = 0; i < layout.responses; ++i) {
        index_t k = 0;
        for (index_t t = offsets[static_cast<std::size_t>(i)]; t < offsets[static_cast<std::size_t>(i) + 1]; ++t)
          k += want.kept[static_cast<std::size_t>(t)];
        ASSERT_EQ(counts[static_cast<std::size_t>(i)], k) << what << " response " << i << " (given " << given << ")";
      }
    }
  }
}

TEST(Selection, TopKCutAndKeptMatchNaive) {
  std::mt19937_64 rng(23);
  const index_t sizes[] = {1, 2, 15, 1000, 20000, 262144 + 17};
  const double rhos[] = {0.2, 0.5, 1e-9, 1.0};
  for (const index_t n : sizes) {
    for (const pattern pat : all_patterns) {
      if (pat == pattern::with_inf) continue;  // entropies are finite
      const std::vector<double> h = make_keys(pat, n, rng);
      std::vector<std::uint8_t> mask(h.size(), 1);
      std::bernoulli_distribution drop(0.1);
      for (std::size_t t = 1; t < mask.size(); ++t) mask[t] = drop(rng) ? 0 : 1;
      for (const double rho : rhos) {
        const std::string what = "n=" + std::to_string(n) + " pattern=" + std::to_string(static_cast<int>(pat)) +
                                 " rho=" + std::to_string(rho);
        check_cut(h, mask, rho, what);
        std::vector<float> hf(h.begin(), h.end());
        check_cut(hf, mask, rho, what + " (float)");
      }
    }
  }
}

}  // namespace
