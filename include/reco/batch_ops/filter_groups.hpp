// Group filters with on-device compaction.
//  nonzero_std (DAPO dynamic sampling): keep a group whose rewards are not all equal; groups of
//    one response are kept (keep_singletons) since they carry no within-group signal to lose.
//  mean_in_range (OpenRLHF): keep a group whose mean reward lies strictly inside (low, high).
// filter_groups writes the kept response indices and the new group offsets (backend memory) and
// returns the counts (this read synchronises a CUDA stream). gather_* then compact per-response
// and per-token arrays.
#pragma once

#include <cstdint>

#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

enum class group_filter_rule : std::uint8_t { nonzero_std, mean_in_range };

struct group_filter_params {
  group_filter_rule rule = group_filter_rule::nonzero_std;
  double low = 0.0;   // mean_in_range bounds (exclusive)
  double high = 1.0;
  bool keep_singletons = true;  // nonzero_std only
};

struct group_filter_counts {
  index_t groups = 0;
  index_t responses = 0;
};

namespace detail {

template <class T>
struct group_keep_fn {
  const T* rewards;
  const index_t* offsets;
  group_filter_params p;
  std::uint8_t* keep;
  RECO_HOST_DEVICE void operator()(index_t g) const {
    const index_t lo = offsets[g], hi = offsets[g + 1];
    bool k = false;
    if (p.rule == group_filter_rule::nonzero_std) {
      if (hi - lo == 1) k = p.keep_singletons;
      for (index_t j = lo + 1; j < hi; ++j)
        if (static_cast<double>(rewards[j]) != static_cast<double>(rewards[lo])) k = true;
    } else if (hi > lo) {
      double sum = 0;
      for (index_t j = lo; j < hi; ++j) sum += static_cast<double>(rewards[j]);
      const double mean = sum / static_cast<double>(hi - lo);
      k = mean > p.low && mean < p.high;
    }
    keep[g] = k ? 1 : 0;
  }
};
struct keep_flag_fn {
  const std::uint8_t* keep;
  RECO_HOST_DEVICE index_t operator()(index_t g) const { return keep[g]; }
};
struct kept_size_fn {
  const std::uint8_t* keep;
  const index_t* offsets;
  RECO_HOST_DEVICE index_t operator()(index_t g) const { return keep[g] ? offsets[g + 1] - offsets[g] : 0; }
};
struct scatter_groups_fn {
  const std::uint8_t* keep;
  const index_t* offsets;
  const index_t* group_rank;
  const index_t* response_pos;
  index_t groups;
  index_t* kept_responses;
  index_t* kept_offsets;
  RECO_HOST_DEVICE void operator()(index_t g) const {
    if (g == groups - 1) kept_offsets[group_rank[groups]] = response_pos[groups];
    if (!keep[g]) return;
    kept_offsets[group_rank[g]] = response_pos[g];
    for (index_t j = offsets[g]; j < offsets[g + 1]; ++j) kept_responses[response_pos[g] + j - offsets[g]] = j;
  }
};
struct set_index_fn {
  index_t* at;
  index_t value;
  RECO_HOST_DEVICE void operator()(index_t) const { *at = value; }
};
template <class T>
struct gather_fn {
  const T* in;
  const index_t* index;
  T* out;
  RECO_HOST_DEVICE void operator()(index_t j) const { out[j] = in[index[j]]; }
};
struct kept_length_fn {
  const index_t* offsets;
  const index_t* kept;
  RECO_HOST_DEVICE index_t operator()(index_t j) const { return offsets[kept[j] + 1] - offsets[kept[j]]; }
};
template <class T>
struct gather_segments_fn {
  const T* in;
  const index_t* offsets;
  const index_t* new_offsets;
  const index_t* kept;
  T* out;
  RECO_HOST_DEVICE void operator()(index_t j) const {
    const index_t src = offsets[kept[j]], n = offsets[kept[j] + 1] - src, dst = new_offsets[j];
    for (index_t t = 0; t < n; ++t) out[dst + t] = in[src + t];
  }
};
template <class T>
struct gather_rows_fn {
  const T* in;
  const index_t* kept;
  index_t width;
  T* out;
  RECO_HOST_DEVICE void operator()(index_t k) const {
    const index_t j = k / width, t = k % width;
    out[k] = in[kept[j] * width + t];
  }
};

}  // namespace detail

// kept_responses: R entries; kept_group_offsets: P + 1 entries (both backend memory).
template <class Backend, class T>
group_filter_counts filter_groups(const Backend& backend, span<const T> rewards, span<const index_t> group_offsets,
                                  const group_filter_params& p, span<index_t> kept_responses,
                                  span<index_t> kept_group_offsets, workspace<Backend>& ws) {
  const index_t P = group_offsets.size() - 1;
  detail::require(group_offsets.size() >= 1, "group_offsets", "needs P + 1 entries (at least {0})");
  detail::require(kept_responses.size() >= rewards.size(), "kept_responses", "needs one entry per response");
  detail::require(kept_group_offsets.size() >= group_offsets.size(), "kept_group_offsets", "needs P + 1 entries");
  detail::require(p.rule != group_filter_rule::mean_in_range || p.low < p.high, "params.low",
                  "must be below params.high");
  const Backend be = ws.bind(backend);
  detail::carver measure(nullptr);
  auto carve = [&](detail::carver& c, std::uint8_t*& keep, index_t*& grank, index_t*& rpos) {
    keep = c.take<std::uint8_t>(P);
    grank = c.take<index_t>(P + 1);
    rpos = c.take<index_t>(P + 1);
  };
  std::uint8_t* keep;
  index_t *grank, *rpos;
  carve(measure, keep, grank, rpos);
  detail::carver cut(ws.reserve(be, measure.used()));
  carve(cut, keep, grank, rpos);

  be.for_each(P, detail::group_keep_fn<T>{rewards.data(), group_offsets.data(), p, keep});
  be.exclusive_scan(P, detail::keep_flag_fn{keep}, grank);
  be.exclusive_scan(P, detail::kept_size_fn{keep, group_offsets.data()}, rpos);
  if (P > 0)
    be.for_each(P, detail::scatter_groups_fn{keep, group_offsets.data(), grank, rpos, P, kept_responses.data(),
                                             kept_group_offsets.data()});
  else
    be.for_each(1, detail::set_index_fn{kept_group_offsets.data(), 0});
  group_filter_counts c;
  c.groups = be.read(grank + P);
  c.responses = be.read(rpos + P);
  return c;
}

// out[j] = in[kept[j]] for j < count (per-response arrays).
template <class Backend, class T>
void gather_responses(const Backend& be, span<const T> in, span<const index_t> kept, index_t count, span<T> out) {
  detail::require(out.size() >= count, "out", "needs at least count entries");
  be.for_each(count, detail::gather_fn<T>{in.data(), kept.data(), out.data()});
}

// Token offsets of the kept responses of a packed batch (count + 1 entries); returns the new
// number of tokens (synchronises a CUDA stream).
template <class Backend>
index_t compact_token_offsets(const Backend& backend, span<const index_t> offsets, span<const index_t> kept,
                              index_t count, span<index_t> new_offsets, workspace<Backend>& ws) {
  detail::require(new_offsets.size() >= count + 1, "new_offsets", "needs count + 1 entries");
  const Backend be = ws.bind(backend);
  be.exclusive_scan(count, detail::kept_length_fn{offsets.data(), kept.data()}, new_offsets.data());
  return be.read(new_offsets.data() + count);
}

// Per-token arrays of a packed batch, compacted to the kept responses.
template <class Backend, class T>
void gather_tokens(const Backend& be, span<const T> in, span<const index_t> offsets, span<const index_t> new_offsets,
                   span<const index_t> kept, index_t count, span<T> out) {
  be.for_each(count, detail::gather_segments_fn<T>{in.data(), offsets.data(), new_offsets.data(), kept.data(),
                                                   out.data()});
}

// Rows of a padded [R, T] array, compacted to [count, T].
template <class Backend, class T>
void gather_rows(const Backend& be, span<const T> in, index_t width, span<const index_t> kept, index_t count,
                 span<T> out) {
  detail::require(out.size() >= count * width, "out", "needs count x width entries");
  be.for_each(count * width, detail::gather_rows_fn<T>{in.data(), kept.data(), width, out.data()});
}

RECO_NAMESPACE_END
