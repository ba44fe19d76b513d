// Host-side checks of the raw adapter's argument structs, before anything touches the device:
// dtypes, sizes, required pointers and their alignment. Each failure throws reco::error naming
// the field ("args.old_logp", "args.group_offsets", ...). Then the conversion of the C structs to
// the core's batch view, gradients and normalisers. Host code; no CUDA call is made here.
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "reco/batch.hpp"
#include "reco/objective_needs.hpp"
#include "reco/config.hpp"
#include "reco/input_rules.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

// What an objective reads and writes (reco/objective_needs.hpp).
using reco::needs_of;
using reco::objective_needs;

namespace detail {

inline std::string field(const char* name) { return std::string("args.") + name; }

inline bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

inline std::size_t value_size(reco_cuda_dtype t) {
  switch (t) {
    case RECO_CUDA_FLOAT32: return 4;
    case RECO_CUDA_FLOAT64: return 8;
    case RECO_CUDA_BFLOAT16:
    case RECO_CUDA_FLOAT16: return 2;
  }
  return 0;
}

// A pointer that must be there when `required`, and aligned to `alignment` when it is.
inline void check_pointer(const void* p, bool required, std::size_t alignment, const char* name,
                          const std::string& why) {
  if (p == nullptr) {
    if (required) ::reco::detail::fail(field(name), "is null but " + why);
    return;
  }
  if (!aligned(p, alignment))
    ::reco::detail::fail(field(name), "is not aligned to its element size (" + std::to_string(alignment) +
                                          " bytes): pass the start of a properly typed array");
}

// An input of reco/input_rules.hpp: there when the objective requires it and the batch has
// `present` entries of it.
inline void check_input(const void* p, const objective_needs& needs, call_input in, bool present, std::size_t alignment) {
  const input_rule& r = rule_of(in);
  check_pointer(p, requires_input(needs, in) && present, alignment, r.name, "it " + required_message(in));
}

inline void check_count(std::int64_t v, const char* name) {
  if (v < 0) ::reco::detail::fail(field(name), "must be >= 0, got " + std::to_string(v));
}

}  // namespace detail

inline void validate(const reco_cuda_objective_args& a, const objective_needs& needs) {
  using detail::check_count;
  using detail::check_pointer;
  using detail::field;
  using ::reco::detail::fail;
  if (a.dtype != RECO_CUDA_FLOAT32 && a.dtype != RECO_CUDA_FLOAT64)
    fail(field("dtype"), "must be RECO_CUDA_FLOAT32 or RECO_CUDA_FLOAT64 for the objective, got " +
                             std::to_string(static_cast<int>(a.dtype)));
  const std::size_t v = detail::value_size(a.dtype);
  check_count(a.responses, "responses");
  check_count(a.tokens, "tokens");
  check_count(a.groups, "groups");
  const std::int64_t R = a.responses, N = a.tokens;
  if (a.offsets == nullptr) {
    check_count(a.max_length, "max_length");
    const std::int64_t T = a.max_length;
    // R * T == N, without overflowing.
    const bool ok = T == 0 ? N == 0 : (N % T == 0 && N / T == R);
    if (!ok)
      fail(field("tokens"), std::to_string(N) + " tokens do not fill the padded layout [responses, max_length] = [" +
                                std::to_string(R) + ", " + std::to_string(T) + "] (or pass args.offsets)");
  } else {
    check_pointer(a.offsets, true, alignof(std::int64_t), "offsets", "");
    if (R == 0 && N > 0)
      fail(field("offsets"), "describes no response (responses = 0) but there are " + std::to_string(N) + " tokens");
  }
  check_pointer(a.group_offsets, true, alignof(std::int64_t), "group_offsets",
                "it is required (groups + 1 response offsets, {0, R} for one group)");
  if (a.groups == 0 && R > 0)
    fail(field("groups"), "is 0 but there are " + std::to_string(R) + " responses (every response belongs to a group)");
  const bool any_token = N > 0, any_response = R > 0;
  check_pointer(a.logp, any_token, v, "logp", "it is required");
  check_pointer(a.old_logp, false, v, "old_logp", "");
  detail::check_input(a.ref_logp, needs, call_input::ref_logp, any_token, v);
  detail::check_input(a.entropy, needs, call_input::entropy, any_token, v);
  check_pointer(a.mask, false, 1, "mask", "");
  check_pointer(a.token_weights, false, v, "token_weights", "");
  detail::check_input(a.rewards, needs, call_input::rewards, any_response, v);
  // The table's rule; its alternative (advantages per token) is not an argument of this adapter.
  check_pointer(a.advantages, requires_input(needs, call_input::advantages) && any_response, v, "advantages",
                "it is required by reco::given_advantage (one advantage per response)");
  detail::check_input(a.response_weights, needs, call_input::response_weights, any_response, v);
  check_pointer(a.grad_logp, any_token, v, "grad_logp", "it is required (one gradient per token)");
  detail::check_input(a.grad_entropy, needs, call_input::grad_entropy, any_token, v);
  check_count(a.global_tokens, "global_tokens");
  check_count(a.global_responses, "global_responses");
  check_count(a.global_kept_tokens, "global_kept_tokens");
  check_count(a.global_kept_responses, "global_kept_responses");
}

// The core's view of the arguments (device pointers; spans of the sizes given).
template <class T>
batch_view<T> batch_of(const reco_cuda_objective_args& a) {
  const auto per_token = [&](const void* p) {
    return p ? span<const T>(static_cast<const T*>(p), a.tokens) : span<const T>();
  };
  const auto per_response = [&](const void* p) {
    return p ? span<const T>(static_cast<const T*>(p), a.responses) : span<const T>();
  };
  batch_view<T> b;
  b.layout = a.offsets ? packed(span<const index_t>(a.offsets, a.responses + 1)) : padded(a.responses, a.max_length);
  b.group_offsets = span<const index_t>(a.group_offsets, a.groups + 1);
  b.logp = span<const T>(static_cast<const T*>(a.logp), a.tokens);
  b.old_logp = per_token(a.old_logp);
  b.ref_logp = per_token(a.ref_logp);
  b.entropy = per_token(a.entropy);
  b.mask = a.mask ? span<const std::uint8_t>(a.mask, a.tokens) : span<const std::uint8_t>();
  b.token_weights = per_token(a.token_weights);
  b.rewards = per_response(a.rewards);
  b.advantages = per_response(a.advantages);
  b.response_weights = per_response(a.response_weights);
  return b;
}

template <class T>
gradients<T> gradients_of(const reco_cuda_objective_args& a) {
  gradients<T> g;
  g.logp = span<T>(static_cast<T*>(a.grad_logp), a.tokens);
  if (a.grad_entropy) g.entropy = span<T>(static_cast<T*>(a.grad_entropy), a.tokens);
  return g;
}

inline normalisers normalisers_of(const reco_cuda_objective_args& a) {
  normalisers n;
  n.tokens = a.global_tokens;
  n.responses = a.global_responses;
  n.kept_tokens = a.global_kept_tokens;
  n.kept_responses = a.global_kept_responses;
  return n;
}

// The logits op's arguments (forward when `backward` is false).
inline void validate(const reco_cuda_logits_args& a, bool backward) {
  using detail::check_count;
  using detail::check_pointer;
  using detail::field;
  using ::reco::detail::fail;
  const std::size_t v = detail::value_size(a.dtype);
  if (v == 0) fail(field("dtype"), "must be one of RECO_CUDA_BFLOAT16, _FLOAT16, _FLOAT32, _FLOAT64");
  const std::size_t acc = a.dtype == RECO_CUDA_FLOAT64 ? 8 : 4;  // per-row values: float, double for f64
  check_count(a.rows, "rows");
  if (a.vocab < 1) fail(field("vocab"), "must be >= 1, got " + std::to_string(a.vocab));
  if (a.vocab > INT_MAX) fail(field("vocab"), "must be <= 2^31 - 1 on the device, got " + std::to_string(a.vocab));
  if (a.row_stride < a.vocab)
    fail(field("row_stride"), "must be >= vocab (" + std::to_string(a.vocab) + "), got " + std::to_string(a.row_stride));
  if (!(a.temperature > 0) || !std::isfinite(a.temperature))
    fail(field("temperature"), "must be finite and > 0, got " + std::to_string(a.temperature));
  const bool rows = a.rows > 0;
  check_pointer(a.logits, rows, v, "logits", "it is required");
  check_pointer(a.row_mask, false, 1, "row_mask", "");
  check_pointer(a.error_flags, false, alignof(int), "error_flags", "");
  if (!backward) {
    check_pointer(a.tokens, rows && a.logp != nullptr, alignof(std::int64_t), "tokens", "logp is requested");
    check_pointer(a.logp, false, acc, "logp", "");
    check_pointer(a.entropy, false, acc, "entropy", "");
    check_pointer(a.lse, false, acc, "lse", "");
    check_pointer(a.sum_p_squared, false, acc, "sum_p_squared", "");
    if (rows && !a.logp && !a.entropy && !a.lse && !a.sum_p_squared)
      fail(field("logp"), "no output requested (logp, entropy, lse and sum_p_squared are all null)");
    return;
  }
  check_pointer(a.tokens, rows && a.grad_logp != nullptr, alignof(std::int64_t), "tokens", "grad_logp is given");
  check_pointer(a.grad_logp, false, acc, "grad_logp", "");
  check_pointer(a.grad_entropy, false, acc, "grad_entropy", "");
  check_pointer(a.saved_lse, rows, acc, "saved_lse", "backward needs the lse of forward");
  check_pointer(a.saved_entropy, rows && a.grad_entropy != nullptr, acc, "saved_entropy",
                "grad_entropy is given (pass the entropy of forward)");
  check_pointer(a.dlogits, rows, v, "dlogits", "it is required (it may be args.logits: in place)");
}

}  // namespace cuda_adapter
RECO_NAMESPACE_END
