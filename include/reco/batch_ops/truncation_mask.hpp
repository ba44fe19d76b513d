// Truncated-completion masking (TRL's mask_truncated_completions): a response with no EOS
// token among its valid tokens drops out of the loss and of every count, by zeroing its mask.
#pragma once

#include <cstdint>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
template <class Tok>
struct truncation_fn {
  token_layout layout;
  const Tok* tokens;
  const std::uint8_t* mask_in;
  Tok eos;
  std::uint8_t* mask_out;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    bool ended = false;
    for (index_t t = layout.begin(i); t < layout.end(i); ++t)
      if ((mask_in == nullptr || mask_in[t] != 0) && tokens[t] == eos) ended = true;
    for (index_t t = layout.begin(i); t < layout.end(i); ++t)
      mask_out[t] = ended && (mask_in == nullptr || mask_in[t] != 0) ? 1 : 0;
  }
};
}  // namespace detail

// mask_out (one per token) = mask_in for responses that contain eos_token, 0 for the others.
// mask_in may be empty (every token in range valid) and may alias mask_out.
template <class Backend, class Tok>
void mask_truncated(const Backend& be, const token_layout& layout, span<const Tok> tokens,
                    span<const std::uint8_t> mask_in, Tok eos_token, span<std::uint8_t> mask_out) {
  detail::require(tokens.size() == layout.tokens, "tokens", "needs one entry per token");
  detail::require(mask_in.empty() || mask_in.size() == layout.tokens, "mask_in", "needs one entry per token");
  detail::require(mask_out.size() == layout.tokens, "mask_out", "needs one entry per token");
  be.for_each(layout.responses, detail::truncation_fn<Tok>{layout, tokens.data(),
                                                           mask_in.empty() ? nullptr : mask_in.data(), eos_token,
                                                           mask_out.data()});
}

RECO_NAMESPACE_END
