// Token selection for the 80/20 rule, written once over a backend: the cut (threshold and tie
// budget) over a population of entropies, then the per-token kept flags.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "reco/algorithm/partials.hpp"
#include "reco/detail/math.hpp"
#include "reco/select/top_entropy.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// keys[t] = H_t for valid tokens, +inf otherwise (so that valid tokens sort first). A NaN entropy
// (a call whose token pass then raises the error) also keys +inf: the selections order keys with
// <, which a NaN would leave without an order.
template <class T>
struct fill_keys_fn {
  const T* values;
  const std::uint8_t* mask;
  double* keys;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    const double h = static_cast<double>(values[t]);
    keys[t] = (mask == nullptr || mask[t] != 0) && h == h ? h : HUGE_VAL;
  }
  // Host form for reco::cpu: the same keys over [b, e), a loop without branches.
  void run_range(index_t b, index_t e) const {
    const T* const v = values;
    const std::uint8_t* const m = mask;
    double* const out = keys;
    if (m == nullptr) {
      for (index_t t = b; t < e; ++t) out[t] = v[t] == v[t] ? static_cast<double>(v[t]) : HUGE_VAL;
    } else {
      for (index_t t = b; t < e; ++t) out[t] = m[t] != 0 && v[t] == v[t] ? static_cast<double>(v[t]) : HUGE_VAL;
    }
  }
};

struct count_valid_fn {
  const std::uint8_t* mask;
  RECO_HOST_DEVICE double operator()(index_t t) const { return (mask == nullptr || mask[t] != 0) ? 1.0 : 0.0; }
};
template <class T>
struct count_nonfinite_fn {
  const T* values;
  const std::uint8_t* mask;
  RECO_HOST_DEVICE double operator()(index_t t) const {
    return (mask == nullptr || mask[t] != 0) && !finite(static_cast<double>(values[t])) ? 1.0 : 0.0;
  }
};
struct sum_fn {
  RECO_HOST_DEVICE double operator()(double a, double b) const { return a + b; }
};

// k = max(1, ceil(rho N)) with a relative tolerance, so 0.2 * 15 keeps 3 tokens, not 4.
RECO_HOST_DEVICE inline index_t top_k_count(double rho, index_t n) {
  if (n <= 0) return 0;
  index_t k = static_cast<index_t>(::ceil(rho * static_cast<double>(n) * (1.0 - 1e-12)));
  if (k < 1) k = 1;
  return k > n ? n : k;
}

// Single-thread step: which order statistics the cut needs, from the population size.
struct cut_ranks_fn {
  objective_scalars* s;
  const double* population;
  top_entropy_selection::params_type p;
  RECO_HOST_DEVICE void operator()(index_t) const {
    const index_t n = static_cast<index_t>(*population);
    if (p.rule == selection_rule::top_k) {
      s->select_k = top_k_count(p.rho, n);
      s->select_ranks[0] = s->select_ranks[1] = n - s->select_k;  // ascending rank of the k-th largest
    } else {
      const double pos = (1.0 - p.rho) * static_cast<double>(n > 0 ? n - 1 : 0);
      const index_t lo = static_cast<index_t>(pos);
      s->select_ranks[0] = lo;
      s->select_ranks[1] = lo + 1 < n ? lo + 1 : lo;
    }
  }
};

// Single-thread step: the cut value from the order statistics.
struct cut_value_fn {
  objective_scalars* s;
  const double* population;
  const double* values;  // the order statistics at select_ranks
  top_entropy_selection::params_type p;
  RECO_HOST_DEVICE void operator()(index_t) const {
    s->cut_counted = 0;  // until cut_ties_fn counts the tokens on this cut
    if (p.rule == selection_rule::top_k) {
      s->cut.value = values[0];
    } else {
      const index_t n = static_cast<index_t>(*population);
      const double pos = (1.0 - p.rho) * static_cast<double>(n > 0 ? n - 1 : 0);
      const double frac = pos - static_cast<double>(s->select_ranks[0]);
      s->cut.value = values[0] + frac * (values[1] - values[0]);
      s->cut.ties = -1;
    }
    if (*population <= 0) s->cut.value = HUGE_VAL;  // nothing to keep
  }
};

template <class T>
struct cut_count_fn {
  const T* values;
  const std::uint8_t* mask;
  const objective_scalars* s;
  RECO_HOST_DEVICE cut_partial operator()(index_t t) const {
    cut_partial c;
    if (mask != nullptr && mask[t] == 0) return c;
    const double h = static_cast<double>(values[t]);
    c.greater = h > s->cut.value ? 1 : 0;
    c.equal = h == s->cut.value ? 1 : 0;
    return c;
  }
  // Host form for reco::cpu's reduce: the same counts over [b, e) in integers (exact, so the
  // same bits as adding the 0/1 partials one by one), a loop the compiler vectorises.
  void reduce_range(cut_partial& acc, index_t b, index_t e) const {
    const double cut = s->cut.value;
    std::int64_t greater = 0, equal = 0;
    if (mask == nullptr) {
      for (index_t t = b; t < e; ++t) {
        const double h = static_cast<double>(values[t]);
        greater += h > cut ? 1 : 0;
        equal += h == cut ? 1 : 0;
      }
    } else {
      for (index_t t = b; t < e; ++t) {
        const double h = static_cast<double>(values[t]);
        const bool valid = mask[t] != 0;
        greater += (valid & (h > cut)) ? 1 : 0;
        equal += (valid & (h == cut)) ? 1 : 0;
      }
    }
    acc.greater += static_cast<double>(greater);
    acc.equal += static_cast<double>(equal);
  }
};

struct cut_ties_fn {
  objective_scalars* s;
  RECO_HOST_DEVICE void operator()(index_t) const {
    s->cut.ties = s->select_k - static_cast<index_t>(s->cut_counts.greater);
    s->cut_counted = 1;
  }
};

// flags[t] = 1 for valid tokens exactly on the cut (their position order breaks ties).
template <class T>
struct tie_flags_fn {
  const T* values;
  const std::uint8_t* mask;
  const objective_scalars* s;
  std::uint8_t* flags;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    flags[t] = (mask == nullptr || mask[t] != 0) && static_cast<double>(values[t]) == s->cut.value;
  }
};

struct flag_value_fn {
  const std::uint8_t* flags;
  RECO_HOST_DEVICE index_t operator()(index_t t) const { return flags[t] != 0 ? 1 : 0; }
};

template <class T>
struct kept_fn {
  const T* values;
  const std::uint8_t* mask;
  const objective_scalars* s;
  const index_t* tie_rank;  // null: every tie fits the budget (or, above_only, none is marked)
  std::uint8_t* kept;
  bool above_only = false;  // host: the tokens on the cut are left to keep_first_ties
  RECO_HOST_DEVICE void operator()(index_t t) const {
    if (mask != nullptr && mask[t] == 0) {
      kept[t] = 0;
      return;
    }
    const double h = static_cast<double>(values[t]);
    const entropy_cut& c = s->cut;
    bool keep = h > c.value;
    if (h == c.value) keep = !above_only && (c.ties < 0 || tie_rank == nullptr || tie_rank[t] < c.ties);
    kept[t] = keep ? 1 : 0;
  }
  // Host form for reco::cpu: the same flags over [b, e); where every tie is kept (or none), a
  // loop without branches.
  void run_range(index_t b, index_t e) const {
    const entropy_cut& c = s->cut;
    if (c.ties >= 0 && tie_rank != nullptr && !above_only) {
      for (index_t t = b; t < e; ++t) (*this)(t);
      return;
    }
    const double cut = c.value;
    if constexpr (std::is_same_v<T, float>) {
      // A cut a float holds (top_k's is a token's value) compares the same in float: a loop of
      // one width.
      const float cut_f = static_cast<float>(cut);
      if (static_cast<double>(cut_f) == cut) {
        mark(values, cut_f, b, e);
        return;
      }
    }
    mark(values, cut, b, e);
  }
  template <class U, class C>
  void mark(const U* v, C cut, index_t b, index_t e) const {
    // Locals: a store through a byte pointer may alias this object's members, which the loop
    // would then reload per token instead of vectorising.
    const std::uint8_t* const m = mask;
    std::uint8_t* const out = kept;
    if (above_only) {
      if (m == nullptr) {
        for (index_t t = b; t < e; ++t) out[t] = static_cast<C>(v[t]) > cut;
      } else {
        for (index_t t = b; t < e; ++t) out[t] = (m[t] != 0) & (static_cast<C>(v[t]) > cut);
      }
    } else if (m == nullptr) {
      for (index_t t = b; t < e; ++t) out[t] = static_cast<C>(v[t]) >= cut;
    } else {
      for (index_t t = b; t < e; ++t) out[t] = (m[t] != 0) & (static_cast<C>(v[t]) >= cut);
    }
  }
};

// Host: keeps the first `ties` valid tokens on the cut, in position order (kept holds the tokens
// above it). A walk that stops at the last one kept, testing blocks of tokens for a value on the
// cut before looking at their tokens one by one.
template <class T>
void keep_first_ties(const T* values, const std::uint8_t* mask, index_t n, double cut, index_t ties,
                     std::uint8_t* kept) {
  constexpr index_t block = 64;
  for (index_t t0 = 0; t0 < n && ties > 0; t0 += block) {
    const index_t e = t0 + block < n ? t0 + block : n;
    bool any = false;
    for (index_t t = t0; t < e; ++t) any |= static_cast<double>(values[t]) == cut;
    if (!any) continue;
    for (index_t t = t0; t < e && ties > 0; ++t)
      if ((mask == nullptr || mask[t] != 0) && static_cast<double>(values[t]) == cut) {
        kept[t] = 1;
        --ties;
      }
  }
}

struct set_cut_fn {
  objective_scalars* s;
  entropy_cut cut;
  RECO_HOST_DEVICE void operator()(index_t) const {
    s->cut = cut;
    s->cut_counted = 0;
  }
};

// Per response: how many of its tokens were kept.
struct kept_count_fn {
  token_layout layout;
  const std::uint8_t* kept;
  index_t* out;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    index_t n = 0;
    const index_t e = layout.end(i);
    for (index_t t = layout.begin(i); t < e; ++t) n += kept[t];
    out[i] = n;
  }
};

// Whether backend B selects among the valid entries of float values directly (reco::cpu), so that
// the cut needs no key per token.
template <class B, class = void>
struct has_masked_order_statistics : std::false_type {};
template <class B>
struct has_masked_order_statistics<
    B, std::void_t<decltype(std::declval<const B&>().masked_order_statistics(
           std::declval<const float*>(), std::declval<const std::uint8_t*>(), index_t{}, std::declval<const index_t*>(),
           int{}, std::declval<double*>(), std::declval<double*>()))>> : std::true_type {};

// The cut over a population of n entropies (mask may be null) into s->cut.
// Scratch: keys (n doubles). population: the number of valid entries, in backend memory.
template <class Backend, class T>
void compute_cut(const Backend& be, const T* values, const std::uint8_t* mask, index_t n,
                 const top_entropy_selection::params_type& p, const double* population, double* keys,
                 objective_scalars* s) {
  if (p.use_given) {
    // The quantile rule keeps every tie, whatever tie budget the given cut carries.
    entropy_cut given = p.given;
    if (p.rule == selection_rule::quantile) given.ties = -1;
    be.for_each(1, set_cut_fn{s, given});
    return;
  }
  // The radix selection (host memory) counts the tokens above and on the top_k cut, its first
  // rank's value, on the way: no pass of its own.
  bool counted = false;
  if constexpr (std::is_same_v<T, float> && has_masked_order_statistics<Backend>::value) {
    be.for_each(1, cut_ranks_fn{s, population, p});
    double counts[2];
    be.masked_order_statistics(values, mask, n, s->select_ranks, 2, s->select_values, counts);
    s->cut_counts.greater = counts[0];
    s->cut_counts.equal = counts[1];
    counted = true;
  } else {
    be.for_each(n, fill_keys_fn<T>{values, mask, keys});
    be.for_each(1, cut_ranks_fn{s, population, p});
    be.order_statistics(keys, n, s->select_ranks, 2, s->select_values);
  }
  be.for_each(1, cut_value_fn{s, population, s->select_values, p});
  if (p.rule == selection_rule::top_k) {
    if (!counted) be.reduce(n, cut_count_fn<T>{values, mask, s}, merge_fn<cut_partial>{}, &s->cut_counts);
    be.for_each(1, cut_ties_fn{s});
  }
}

// Host: response i's kept flags and its kept count in one loop (the flags are not read back to
// count them); with `on_cut`, the tokens on the cut are left unkept and counted there instead
// (the tie budget drops some: keep_first_ties_by_response decides which).
template <class T>
struct kept_response_fn {
  token_layout layout;
  const T* values;
  const std::uint8_t* mask;
  double cut;
  std::uint8_t* kept;
  index_t* count;
  index_t* on_cut;  // null: every token on the cut is kept
  // reco::cpu runs the same loops vectorised (reco/backend/cpu/packed_kept.hpp).
  void operator()(index_t i) const {
    index_t k = 0, equal = 0;
    for (index_t t = layout.begin(i); t < layout.end(i); ++t) {
      if (mask != nullptr && mask[t] == 0) {
        kept[t] = 0;
        continue;
      }
      const double h = static_cast<double>(values[t]);
      kept[t] = on_cut == nullptr ? h >= cut : h > cut;
      k += kept[t];
      equal += h == cut;
    }
    count[i] = k;
    if (on_cut != nullptr) on_cut[i] = equal;
  }
};

// Host: keeps the first `ties` valid tokens on the cut in position order, walking only the
// responses that hold some (on_cut[i] of them in response i) until the budget is spent.
template <class T>
void keep_first_ties_by_response(const token_layout& layout, const T* values, const std::uint8_t* mask, double cut,
                                 index_t ties, const index_t* on_cut, std::uint8_t* kept, index_t* count) {
  for (index_t i = 0; i < layout.responses && ties > 0; ++i) {
    if (on_cut[i] == 0) continue;
    const index_t e = layout.end(i);
    for (index_t t = layout.begin(i); t < e && ties > 0; ++t)
      if ((mask == nullptr || mask[t] != 0) && static_cast<double>(values[t]) == cut) {
        kept[t] = 1;
        ++count[i];
        --ties;
      }
  }
}

// Whether the tie budget of the cut in s drops some of the valid tokens on it (host memory).
template <class Backend, class T>
bool cut_drops_ties(const Backend& be, const T* values, const std::uint8_t* mask, index_t n, objective_scalars* s) {
  if (s->cut.ties < 0) return false;
  // compute_cut counted the tokens on this cut already (top_k rule); a given cut has no counts.
  cut_partial c = s->cut_counts;
  if (s->cut_counted == 0) be.reduce(n, cut_count_fn<T>{values, mask, s}, merge_fn<cut_partial>{}, &c);
  return static_cast<double>(s->cut.ties) < c.equal;
}

// Host: the kept flags from the cut in s and each response's kept count, one pass over the
// tokens (plus, where the tie budget drops tokens on the cut, a walk of the responses holding
// the first of them).
template <class Backend, class T>
void mark_kept_counted(const Backend& be, const T* values, const std::uint8_t* mask, const token_layout& layout,
                       objective_scalars* s, std::uint8_t* kept, index_t* count) {
  const index_t R = layout.responses;
  const bool drops = cut_drops_ties(be, values, mask, layout.tokens, s);
  std::vector<index_t> on_cut(drops ? static_cast<std::size_t>(R) : 0);
  be.for_each(R, kept_response_fn<T>{layout, values, mask, s->cut.value, kept, count, drops ? on_cut.data() : nullptr});
  if (drops) keep_first_ties_by_response(layout, values, mask, s->cut.value, s->cut.ties, on_cut.data(), kept, count);
}

// Kept flags for every token from the cut in s (tie_rank: n index_t of scratch). values, mask and
// n must be those compute_cut saw: its counts on the cut (s->cut_counted) are reused.
template <class Backend, class T>
void mark_kept(const Backend& be, const T* values, const std::uint8_t* mask, index_t n,
               objective_scalars* s, index_t* tie_rank, std::uint8_t* kept) {
  bool need_ranks = true;
  // The tie budget only matters when some tokens on the cut must be dropped.
  if constexpr (Backend::host_accessible) {
    need_ranks = cut_drops_ties(be, values, mask, n, s);
    // The tokens above the cut, then the first of those on it: no rank per token.
    if (need_ranks) {
      be.for_each(n, kept_fn<T>{values, mask, s, nullptr, kept, true});
      keep_first_ties(values, mask, n, s->cut.value, s->cut.ties, kept);
      return;
    }
  }
  if (need_ranks) {
    be.for_each(n, tie_flags_fn<T>{values, mask, s, kept});
    be.exclusive_scan(n, flag_value_fn{kept}, tie_rank);
  }
  be.for_each(n, kept_fn<T>{values, mask, s, need_ranks ? tie_rank : nullptr, kept});
}

// The selection stage: the cut over the n tokens and their kept flags (keys: n doubles,
// tie_rank: n + 1). One stage for the generic algorithm and the fused CUDA call.
template <class Backend, class T>
void select_tokens(const Backend& be, const T* values, const std::uint8_t* mask, index_t n,
                   const top_entropy_selection::params_type& p, objective_scalars* s, double* keys,
                   index_t* tie_rank, std::uint8_t* kept) {
  compute_cut(be, values, mask, n, p, &s->batch.tokens, keys, s);
  mark_kept(be, values, mask, n, s, tie_rank, kept);
}

}  // namespace detail
RECO_NAMESPACE_END
