// What one call of a split step reads from its step plan (reco/step_plan.hpp): its slice of the
// step (step_slice: the final per-response values of its responses and the step's counts), and
// the steps that apply them. The generic algorithm reads the plan's host arrays directly (host-accessible
// backends); the fused CUDA path copies the slice into its scratch first (step_slice_arrays), so the
// same functions run on the device.
#pragma once

#include <cstdint>
#include <string>

#include "reco/algorithm/call_stages.hpp"
#include "reco/algorithm/partials.hpp"
#include "reco/component.hpp"
#include "reco/result.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/workspace.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

struct step_slice {
  // The part's slice (R entries each, response i of the call = response first + i of the step).
  const double* advantage = nullptr;  // final A_i (group and batch stages over the whole step)
  const double* weight = nullptr;     // final w_i (capped, normalised over the step)
  const std::uint8_t* capped = nullptr;
  const index_t* length = nullptr;    // valid tokens the summary saw (checked against the data)
  const index_t* ties = nullptr;      // tokens on the cut to keep per response (-1 all); selection only
                                      // (0 < ties < the response's tokens on the cut in one response
                                      // of the step at most)
  const index_t* kept = nullptr;      // tokens the step's cut keeps per response; selection only
  entropy_cut cut{};                  // selection: keep H > cut.value, and `ties` of H == cut.value
  aggregation_counts valid{};         // the step's counts for the KL / entropy terms
  aggregation_counts policy{};        // ... for the policy term
  double scale = 1;                   // multiplies every coefficient (data-parallel averaging)
  index_t first = 0;                  // the step index of the call's first response
  double covariance_adv = 0;          // covariance selection: the step's mean A and mean logp
  double covariance_logp = 0;
};

// The stages of a planned call: the batch stage (batch-std advantages, batch-mean weights) was
// applied over the whole step by the plan, so no finalize pass runs and a sequence ratio that
// waited for it is computed with the other per-response values.
inline objective_stages planned_stages(objective_stages st) {
  st.planned = true;
  st.finalize = false;
  st.sequence_in_finalize = false;
  return st;
}

// Response i of a planned call: the step's advantage (unless the call's advantages are its own,
// given per token), weight and cap flag replace the call's own; the call's valid-token count must
// be the plan's (else plan_length_mismatch in the response's status).
RECO_HOST_DEVICE inline void take_planned_response(const step_slice& p, const response_scratch& r, index_t i,
                                                   bool planned_advantage) {
  if (r.length[i] != p.length[i]) r.status[i] |= plan_length_mismatch;
  if (planned_advantage) r.adv[i] = p.advantage[i];
  r.weight[i] = p.weight[i];
  r.capped[i] = p.capped[i];
}

// What the kept-flag steps below read and write: the call's layout, entropies and mask, its plan,
// and the flags.
template <class T>
struct planned_kept_args {
  token_layout layout;
  const T* values;
  const std::uint8_t* mask;
  step_slice plan;  // by value: its arrays are in the backend's memory, the struct itself is not
  std::uint8_t* kept;
  RECO_HOST_DEVICE bool valid(index_t t) const { return mask == nullptr || mask[t] != 0; }
  RECO_HOST_DEVICE double value(index_t t) const { return static_cast<double>(values[t]); }
};

// Per response: the kept flags from the step's cut; ties are kept in position order.
template <class T>
struct planned_kept_fn {
  planned_kept_args<T> a;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const double cut = a.plan.cut.value;
    index_t budget = a.plan.ties[i];
    for (index_t t = a.layout.begin(i), e = a.layout.end(i); t < e; ++t) {
      std::uint8_t k = 0;
      if (a.valid(t)) {
        const double h = a.value(t);
        if (h > cut) {
          k = 1;
        } else if (h == cut) {
          if (budget < 0) {
            k = 1;
          } else if (budget > 0) {
            k = 1;
            --budget;
          }
        }
      }
      a.kept[t] = k;
    }
  }
};

// The same flags a token per thread (the fused path): every response keeps all or none of its
// tokens on the cut except where ties[i] > 0, which planned_partial_ties_fn then walks.
template <class T>
struct planned_kept_token_fn {
  planned_kept_args<T> a;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    std::uint8_t k = 0;
    if (a.valid(t)) {
      const double h = a.value(t), cut = a.plan.cut.value;
      k = h > cut || (h == cut && a.plan.ties[a.layout.response_of(t)] < 0) ? 1 : 0;
    }
    a.kept[t] = k;
  }
};

// Per response, after planned_kept_token_fn: the first ties[i] tokens on the cut, in position
// order, of the response (at most one in the step) that keeps some of them but not all.
template <class T>
struct planned_partial_ties_fn {
  planned_kept_args<T> a;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    index_t budget = a.plan.ties[i];
    for (index_t t = a.layout.begin(i), e = a.layout.end(i); budget > 0 && t < e; ++t)
      if (a.valid(t) && a.value(t) == a.plan.cut.value) {
        a.kept[t] = 1;
        --budget;
      }
  }
};

// Host path, after the kept counts: the call selects, response by response, the tokens the plan
// counted; else its `inputs` differ from those the plan was built with (error naming `plan`).
inline void require_planned_kept(const step_slice& p, const index_t* kept, index_t R, const char* inputs) {
  for (index_t i = 0; i < R; ++i)
    if (kept[i] != p.kept[i])
      fail("plan", "selects " + std::to_string(p.kept[i]) + " tokens of response " + std::to_string(i) +
                       " but this call's data select " + std::to_string(kept[i]) + ": " + inputs +
                       " differ from those the plan was built with");
}

// Host path, with the counts: a planned call normalises by the step's counts (no-op without a plan).
inline void take_step_counts(const step_slice* p, objective_scalars* s) {
  if (p == nullptr) return;
  s->valid = p->valid;
  s->policy = p->policy;
}
// Host path, after the coefficients: the plan's scale multiplies them (data-parallel averaging).
inline void scale_coefficients(const step_slice* p, const response_scratch& r, index_t R) {
  if (p == nullptr || p->scale == 1.0) return;
  for (index_t i = 0; i < R; ++i) {
    r.coef_valid[i] *= p->scale;
    r.coef_policy[i] *= p->scale;
  }
}

// Sets `bit` in a status word that several threads may set at once.
RECO_HOST_DEVICE inline void set_status_bit(std::uint32_t* word, std::uint32_t bit) {
#if defined(__CUDA_ARCH__)
  atomicOr(word, bit);
#else
  __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
#endif
}

// Per response, after the kept counts: the call keeps what the plan counted (device-side check;
// the host path names the response instead).
struct planned_kept_check_fn {
  const index_t* kept;
  step_slice plan;
  std::uint32_t* status;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    if (kept[i] != plan.kept[i]) set_status_bit(status, plan_kept_mismatch);
  }
};

// Single-thread step after the counts: the step's counts replace the call's own.
struct planned_counts_fn {
  objective_scalars* s;
  aggregation_counts valid, policy;
  RECO_HOST_DEVICE void operator()(index_t) const {
    s->valid = valid;
    s->policy = policy;
  }
};

// The per-response arrays of a step_slice in a call's scratch, for backends whose memory the host
// cannot address: carved with the call's other arrays, then filled from the host plan.
struct step_slice_arrays {
  double* advantage = nullptr;
  double* weight = nullptr;
  index_t* length = nullptr;
  index_t* ties = nullptr;
  index_t* kept = nullptr;
  std::uint8_t* capped = nullptr;

  void carve(carver& c, index_t R, bool selection) {
    advantage = c.take<double>(R);
    weight = c.take<double>(R);
    length = c.take<index_t>(R);
    if (selection) {
      ties = c.take<index_t>(R);
      kept = c.take<index_t>(R);
    }
    capped = c.take<std::uint8_t>(R);
  }

  // Enqueues the copies of the host plan's slice (R responses) and returns the call's plan on
  // these arrays. The host arrays may be released once this returns (the backend stages them).
  template <class Backend>
  step_slice fill(const Backend& be, const step_slice& host, index_t R) const {
    step_slice d = host;
    be.copy_to_device(advantage, host.advantage, R);
    be.copy_to_device(weight, host.weight, R);
    be.copy_to_device(length, host.length, R);
    be.copy_to_device(capped, host.capped, R);
    d.advantage = advantage;
    d.weight = weight;
    d.length = length;
    d.capped = capped;
    if (host.ties != nullptr && ties != nullptr) {
      be.copy_to_device(ties, host.ties, R);
      be.copy_to_device(kept, host.kept, R);
      d.ties = ties;
      d.kept = kept;
    }
    return d;
  }
};

}  // namespace detail
RECO_NAMESPACE_END
