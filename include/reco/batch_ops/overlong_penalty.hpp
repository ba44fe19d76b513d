// DAPO's overlong reward shaping: with maximum length L_max and buffer b, a response of length L
// gets  min(-(L - (L_max - b)) / b * factor, 0)  added to its reward (0 up to L_max - b, falling
// linearly to -factor at L_max). Defaults are the DAPO recipe's (20,480 / 4,096 / 1.0).
#pragma once

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

struct overlong_params {
  double max_length = 20480;
  double buffer = 4096;
  double factor = 1.0;
};

namespace detail {
template <class T>
struct overlong_fn {
  const index_t* lengths;
  overlong_params p;
  T* rewards;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const double excess = static_cast<double>(lengths[i]) - (p.max_length - p.buffer);
    const double pen = -excess / p.buffer * p.factor;
    rewards[i] = static_cast<T>(static_cast<double>(rewards[i]) + (pen < 0 ? pen : 0.0));
  }
};
struct valid_length_fn {
  token_layout layout;
  const std::uint8_t* mask;
  index_t* out;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    index_t n = 0;
    for (index_t t = layout.begin(i); t < layout.end(i); ++t) n += (mask == nullptr || mask[t] != 0) ? 1 : 0;
    out[i] = n;
  }
};
}  // namespace detail

// Adds the overlong penalty to rewards in place (lengths: one per response).
template <class Backend, class T>
void add_overlong_penalty(const Backend& be, span<const index_t> lengths, const overlong_params& p, span<T> rewards) {
  detail::require(p.buffer > 0, "params.buffer", "must be > 0");
  detail::require(p.max_length >= p.buffer, "params.max_length", "must be >= params.buffer");
  detail::require(lengths.size() == rewards.size(), "lengths", "needs one entry per reward");
  be.for_each(rewards.size(), detail::overlong_fn<T>{lengths.data(), p, rewards.data()});
}

// Valid tokens per response (mask may be empty): the lengths the penalty reads.
template <class Backend>
void response_lengths(const Backend& be, const token_layout& layout, span<const std::uint8_t> mask,
                      span<index_t> out) {
  detail::require(out.size() == layout.responses, "out", "needs one entry per response");
  be.for_each(layout.responses,
              detail::valid_length_fn{layout, mask.empty() ? nullptr : mask.data(), out.data()});
}

RECO_NAMESPACE_END
