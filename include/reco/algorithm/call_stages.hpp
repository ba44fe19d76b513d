// One call's stages (call_stages), derived once from the objective object: what the call reads and
// checks, which stages run, and the scratch those stages work in. The generic algorithm (run_objective.hpp),
// the fused CUDA path (reco/fused/) and the tests' host emulation of that path all take it from
// here, so a new component or slot changes one derivation. Host code; the values are run-time
// facts (a component chosen at run time answers for its chosen alternative), the passes a type
// can never need are still left out at compile time by the algorithms.
#pragma once

#include <cstdint>

#include "reco/advantage/common.hpp"
#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/component.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/objective_needs.hpp"
#include "reco/result.hpp"
#include "reco/select/covariance.hpp"
#include "reco/weight/common.hpp"
#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN

// The stages a call runs besides the per-response scan, the group pass and the token pass.
struct objective_stages {
  bool finalize = false;              // batch-stage advantages or batch-mean weights: a pass after the batch statistics
  bool old_mean = false;              // the response weight averages old_logp over each response
  bool sequence = false;              // a sequence-scope ratio: one log-ratio sum per response
  bool sequence_in_finalize = false;  // ... that waits for the final advantages (GMPO reads their sign)
  bool selection = false;             // a token selector is on: kept flags and kept counts
  bool covariance = false;            // ... ranking token covariances (CPU)
  bool kept_counts = false;           // the policy term divides by the kept tokens
  bool entropy_quantile = false;      // entropy-split clip: per-response entropy quantiles
  bool planned = false;               // a call of a split step: per-response values from the step plan
};

template <class Obj>
objective_stages stages_of(const Obj& obj) {
  objective_stages s;
  const bool batch_stage = detail::batch_stage_of(obj.advantage) != advantage_batch_stage::none;
  s.finalize = batch_stage || obj.weight.normalisation() == weight_normalisation::batch_mean;
  s.old_mean = detail::needs_old_mean(obj.weight);
  s.sequence = detail::sequence_scoped(obj.ratio);
  s.sequence_in_finalize = s.sequence && batch_stage;
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
    s.selection = s.covariance = true;
  } else {
    s.selection = detail::term_on(obj.select);
  }
  s.kept_counts = s.selection && obj.kept_denominator();
  s.entropy_quantile = detail::needs_entropy_quantile(obj.clip);
  return s;
}

namespace detail {

// The per-token inputs whose values the token pass checks (reco/algorithm/response_passes.hpp,
// scan_response_fn::deferred), so that they are read once: logp unless a sequence ratio reads it
// first, old_logp unless a sequence ratio reads it or a response weight averages it (the scan
// reads it then anyway), the entropies unless an entropy-split clip ranks them, ref_logp and the
// token weights always. A selection (the 80/20 cut, Clip-Cov / KL-Cov) reads its inputs before
// the token pass and is made safe for values that fail the checks: it then selects something,
// the token pass raises the error, and the call returns nothing. A planned call checks a
// selection's inputs first: the plan's kept counts would otherwise fail first, naming the plan.
// Where the token pass computes the response weights itself (`weighs`), it checks old_logp too.
inline token_checks token_pass_checks(const objective_stages& st, bool planned, bool weighs) {
  const bool early_logp = st.sequence || (st.covariance && planned);
  token_checks c;
  c.logp = !early_logp;
  c.old_logp = !early_logp && (!st.old_mean || weighs);
  c.entropy = !st.entropy_quantile && !(st.selection && planned);
  c.ref_logp = true;
  c.token_weights = true;
  return c;
}

// Which optional inputs a call reads and checks.
struct input_checks {
  bool ref = false;
  bool entropy = false;
  bool rewards = false;
  bool advantages = false;
  bool response_weights = false;
};

struct call_stages {
  objective_needs needs;
  objective_stages stages;
  input_checks checks;
  bool reads_rewards = false;     // the estimator reads rewards (else advantages are given)
  bool token_advantages = false;  // advantages given per token
  bool kept_denominator = false;
};

// `advantages_given` / `token_advantages_given`: whether the batch holds them (a batch without
// tokens may omit given advantages: nothing reads them).
template <class Obj>
call_stages call_stages_of(const Obj& obj, bool advantages_given, bool token_advantages_given) {
  call_stages p;
  p.needs = obj.needs();
  p.stages = stages_of(obj);
  p.reads_rewards = Obj::advantage_type::input == advantage_input::rewards;
  p.token_advantages = !p.reads_rewards && token_advantages_given;
  p.kept_denominator = obj.kept_denominator();
  p.checks.ref = p.needs.ref_logp;
  p.checks.entropy = p.needs.entropy;
  p.checks.rewards = p.reads_rewards;
  p.checks.advantages = !p.reads_rewards && advantages_given;
  p.checks.response_weights = p.needs.response_weights;
  return p;
}

// The scratch of one call, carved out of the workspace: the per-call scalars, the per-response
// arrays and the per-token arrays of the stages that run. Carved twice, over carver(nullptr) to
// measure and over the reserved buffer; a backend's path adds its own arrays after it.
struct objective_scratch {
  objective_scalars* scalars = nullptr;
  objective_result* result = nullptr;
  token_partial* tokens = nullptr;  // the merged token partial
  response_scratch r{};
  std::uint32_t* group_status = nullptr;
  std::uint8_t* group_zero_std = nullptr;
  double* keys = nullptr;           // selection / entropy-quantile keys (N)
  std::uint8_t* kept = nullptr;     // kept flags (N)
  index_t* tie_rank = nullptr;      // tie ranks of the cut (N + 1)

  void carve(carver& c, const objective_stages& st, bool token_advantages, index_t R, index_t P, index_t N) {
    scalars = c.take<objective_scalars>(1);
    result = c.take<objective_result>(1);
    tokens = c.take<token_partial>(1);
    r.carve_common(c, R);
    group_status = c.take<std::uint32_t>(P);
    group_zero_std = c.take<std::uint8_t>(P);
    if (st.selection) {
      r.kept = c.take<index_t>(R);
      kept = c.take<std::uint8_t>(N);  // 256-byte aligned (the carver's alignment): read 4 at a time
      tie_rank = c.take<index_t>(N + 1);
    } else {
      r.kept = r.length;  // every valid token is a policy token
    }
    if (st.selection || st.entropy_quantile) keys = c.take<double>(N);
    if (token_advantages) r.adv_m2 = c.take<double>(R);
    if (st.sequence) r.seq_log = c.take<double>(R);
    if (st.entropy_quantile) r.entropy_q = c.take<double>(R);
  }
};

}  // namespace detail
RECO_NAMESPACE_END
