// Host-side checks of a call's structure: sizes, required inputs, parameters and (for host
// memory) offsets. Each failure throws reco::error naming the argument.
#pragma once

#include <cfloat>
#include <cmath>
#include <string>
#include <type_traits>
#include <utility>

#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/input_rules.hpp"
#include "reco/objective_needs.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

template <class C, class = void>
struct has_validate : std::false_type {};
template <class C>
struct has_validate<C, std::void_t<decltype(std::declval<const C&>().validate(std::string()))>> : std::true_type {};

template <class C>
void validate_component(const C& c, const char* name) {
  if constexpr (has_validate<C>::value) c.validate(name);
}

// Parameter checks used by the components' validate(name) members.
inline void check_param(bool ok, const std::string& component, const char* field, const char* rule) {
  if (!ok) fail(component + ".params." + field, rule);
}
inline bool finite_param(double x) { return std::isfinite(x); }

template <class S>
void check_per_token(const S& s, index_t n, const char* name) {
  if (!s.empty() && s.size() != n)
    fail(name, "has " + std::to_string(s.size()) + " entries, expected one per token (" + std::to_string(n) + ")");
}
template <class S>
void check_per_response(const S& s, index_t r, const char* name, bool required, const char* required_by) {
  if (s.empty()) {
    if (required && r > 0) fail(name, std::string("is required by ") + required_by);
    return;
  }
  if (s.size() != r)
    fail(name, "has " + std::to_string(s.size()) + " entries, expected one per response (" + std::to_string(r) + ")");
}

// The inputs' structure (sizes, layout, required inputs: reco/input_rules.hpp), without the
// gradients.
template <class T>
void validate_inputs(const batch_view<T>& b, const objective_needs& needs) {
  auto required = [&](call_input in) { return requires_input(needs, in); };
  auto required_by = [](call_input in) { return rule_of(in).required_by; };
  const token_layout& L = b.layout;
  const index_t N = b.logp.size();
  if (L.kind == layout_kind::padded) {
    require(L.responses >= 0, "batch.layout.responses", "must be >= 0");
    require(L.max_length >= 0, "batch.layout.max_length", "must be >= 0");
    require(L.responses * L.max_length == N, "batch.logp",
            "has " + std::to_string(N) + " entries but the padded layout is " + std::to_string(L.responses) + " x " +
                std::to_string(L.max_length));
  } else {
    require(L.offsets.size() >= 1, "batch.layout.offsets", "needs R + 1 entries (at least {0})");
    require(L.responses == L.offsets.size() - 1, "batch.layout.responses", "must equal offsets.size() - 1");
  }
  require(N == 0 || b.logp.data() != nullptr, "batch.logp", "is required");
  const index_t R = L.responses;
  check_per_token(b.old_logp, N, "batch.old_logp");
  check_per_token(b.ref_logp, N, "batch.ref_logp");
  check_per_token(b.entropy, N, "batch.entropy");
  check_per_token(b.mask, N, "batch.mask");
  check_per_token(b.token_weights, N, "batch.token_weights");
  if (required(call_input::ref_logp) && b.ref_logp.empty() && N > 0)
    fail("batch.ref_logp", required_message(call_input::ref_logp));
  if (required(call_input::entropy) && b.entropy.empty() && N > 0)
    fail("batch.entropy", required_message(call_input::entropy));
  check_per_response(b.rewards, R, "batch.rewards", required(call_input::rewards), required_by(call_input::rewards));
  check_per_token(b.token_advantages, N, "batch.token_advantages");
  if (!b.token_advantages.empty()) {
    require(reads_input(needs, call_input::token_advantages), "batch.token_advantages",
            "is read only by reco::given_advantage (reco::with_given_advantages(objective)); this objective's "
            "estimator computes its own advantages");
    require(b.advantages.empty(), "batch.token_advantages",
            "give the advantages per response (batch.advantages) or per token (batch.token_advantages), not both");
  }
  // A batch without tokens reads no advantage (its per-token advantages would be empty too).
  check_per_response(b.advantages, R, "batch.advantages",
                     required(call_input::advantages) && b.token_advantages.empty() && N > 0,
                     required_by(call_input::advantages));
  check_per_response(b.response_weights, R, "batch.response_weights", required(call_input::response_weights),
                     required_by(call_input::response_weights));
  require(b.group_offsets.size() >= 1, "batch.group_offsets", "needs P + 1 entries (at least {0})");
}

template <class T>
void validate_batch(const batch_view<T>& b, const gradients<T>& g, const normalisers& n, const objective_needs& needs) {
  validate_inputs(b, needs);
  const index_t N = b.logp.size();
  require(g.logp.size() == N, "grads.logp",
          "has " + std::to_string(g.logp.size()) + " entries, expected one per token (" + std::to_string(N) + ")");
  if (requires_input(needs, call_input::grad_entropy))
    require(g.entropy.size() == N, "grads.entropy", required_message(call_input::grad_entropy) + " (one per token)");
  else
    check_per_token(g.entropy, N, "grads.entropy");
  require(n.tokens >= 0 && n.responses >= 0 && n.kept_tokens >= 0 && n.kept_responses >= 0, "normalisers",
          "counts must be >= 0 (0 = count locally)");
}

// Host values of a per-token input (offsets already checked): `ok` holds at every valid token, or
// the error names the first one that fails.
template <class T, class Ok>
void check_valid_token_values(const batch_view<T>& b, const span<const T>& values, const char* name, Ok ok,
                              const char* rule) {
  token_layout L = b.layout;
  L.tokens = b.logp.size();  // the accessors clamp into [0, tokens)
  for (index_t i = 0; i < L.responses; ++i)
    for (index_t t = L.begin(i); t < L.end(i); ++t) {
      if (!b.mask.empty() && b.mask[t] == 0) continue;
      const double x = static_cast<double>(values[t]);
      if (!ok(x))
        fail(name, "token " + std::to_string(t) + " (response " + std::to_string(i) + ", position " +
                       std::to_string(t - L.begin(i)) + ") is " + std::to_string(x) + "; " + rule);
    }
}

// batch.rollout_logp against the weight's switch (weight.sampling = rollout): given exactly when
// the weight reads it, one entry per token, and (host_values: the data is readable here, after
// the offsets were checked) finite and <= 0 at the valid tokens. The CUDA objectives do not read
// it: there the switch is an error.
template <class T>
void validate_rollout_logp(const batch_view<T>& b, bool weight_reads, bool host_values, bool values = true) {
  const index_t N = b.logp.size();
  check_per_token(b.rollout_logp, N, "batch.rollout_logp");
  if (!weight_reads) {
    require(b.rollout_logp.empty(), "batch.rollout_logp",
            "is given but the response weight does not read it (weight.sampling = rollout makes the expected-count "
            "weight average it; per-token rollout importance weights go in batch.token_weights)");
    return;
  }
  if (N == 0) return;
  require(!b.rollout_logp.empty(), "batch.rollout_logp", "is required by weight.sampling = rollout");
  if (!values) return;  // a step plan's summary flags them (reco/step_plan/summarize.hpp)
  require(host_values, "batch.rollout_logp",
          "weight.sampling = rollout runs on the CPU backend only (the CUDA objectives do not read rollout "
          "log-probs yet)");
  check_valid_token_values(b, b.rollout_logp, "batch.rollout_logp", [](double x) { return x <= 0 && x >= -DBL_MAX; },
                           "a valid token must be finite and <= 0");
}

// batch.token_advantages (sizes and who reads them: validate_inputs): finite at the valid tokens.
// The CUDA objectives do not read them: there they are an error.
template <class T>
void validate_token_advantages(const batch_view<T>& b, bool host_values, bool values = true) {
  if (b.token_advantages.empty()) return;
  require(host_values, "batch.token_advantages",
          "advantages per token run on the CPU backend only (the CUDA objectives read one advantage per "
          "response)");
  if (!values) return;  // a step plan's summary flags them
  check_valid_token_values(b, b.token_advantages, "batch.token_advantages",
                           [](double x) { return x - x == 0; }, "a valid token's advantage must be finite");
}

// Offsets in host memory: checked eagerly with the position of the first bad entry.
template <class T>
void validate_offsets_host(const batch_view<T>& b) {
  const index_t N = b.logp.size();
  if (b.layout.kind == layout_kind::packed) {
    const auto& o = b.layout.offsets;
    require(o[0] == 0, "batch.layout.offsets", "offsets[0] must be 0, got " + std::to_string(o[0]));
    for (index_t i = 1; i < o.size(); ++i)
      if (o[i] < o[i - 1])
        fail("batch.layout.offsets", "offsets must not decrease: offsets[" + std::to_string(i) + "] = " +
                                         std::to_string(o[i]) + " < offsets[" + std::to_string(i - 1) +
                                         "] = " + std::to_string(o[i - 1]));
    require(o[o.size() - 1] == N, "batch.layout.offsets",
            "the last offset must equal the number of tokens (" + std::to_string(N) + "), got " +
                std::to_string(o[o.size() - 1]));
  }
  const auto& go = b.group_offsets;
  const index_t R = b.layout.responses;
  require(go[0] == 0, "batch.group_offsets", "group_offsets[0] must be 0, got " + std::to_string(go[0]));
  for (index_t g = 1; g < go.size(); ++g)
    if (go[g] < go[g - 1])
      fail("batch.group_offsets", "offsets must not decrease: group_offsets[" + std::to_string(g) + "] = " +
                                      std::to_string(go[g]) + " < group_offsets[" + std::to_string(g - 1) +
                                      "] = " + std::to_string(go[g - 1]));
  require(go[go.size() - 1] == R, "batch.group_offsets",
          "the last offset must equal the number of responses (" + std::to_string(R) + "), got " +
              std::to_string(go[go.size() - 1]));
}

}  // namespace detail
RECO_NAMESPACE_END
