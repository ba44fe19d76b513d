// The step plan: one optimizer step split into parts (micro-batches of gradient accumulation,
// data-parallel ranks, or both) with the loss and gradient of the step independent of the split.
//
// The objective is defined over the whole step: token and response counts, Dr.GRPO's constant,
// group statistics of the advantage, weight normalisations and the 80/20 cut are the step's. Each
// part computes a summary of its own data with no communication; summaries combine by element-wise
// addition (an all-reduce SUM, or `+=` in one process); finish_plan turns the sum into a plan, and
// every part's call with that plan contributes its share, so that the parts' losses and gradients
// add up to one call on the whole step.
//
//   reco::step_info step{step_number, R_step};            // the same on every part
//   reco::step_part part{step, first_response, first_group};
//   reco::part_rounds state;                                       // optional: the cut's candidates
//   reco::step_summary s = reco::summarize(obj, batch, part, state);  // + all-reduce SUM over parts
//   reco::step_plan plan = reco::finish_plan(obj, step, s);
//   reco::recycle(std::move(s));                                   // optional: reuse its memory
//   while (!plan.complete()) {                                     // 80/20 cut: a few rounds
//     reco::step_summary r = reco::plan_round(obj, plan, batch, part, &state);  // + all-reduce SUM
//     plan.advance(r);
//     reco::recycle(std::move(r));
//   }
//   obj(reco::cpu{}, batch, grads, ws, plan, part);                // this part's share
//
// A caller that learns where its parts lie only from a collective (the ranks' response counts)
// can summarise them first as a step of their own and move the sum into place afterwards
// (place_summary), so that the layout's exchange overlaps the summaries' pass.
//
// A part is a contiguous range of the step's responses: response i of the call is response
// first_response + i of the step, local group j is group first_group + j of the step (a group may
// span parts: the last group of one part and the first of the next share an id). Group ids must
// not decrease along the step's responses.
//
// The exact cut: k = max(1, ceil(rho N_step)) tokens over the whole step; the k-th largest entropy
// is found by a radix selection over order-preserving integer keys of the values (16 bits a round:
// 2 rounds for float, 4 for double, each a sum of 2^16-bucket histograms; the first rides with the
// stage-0 summaries, which need nothing from other parts either); tokens on the cut are
// kept in step order (response index in the step, then position in the response), which one more
// summed round of per-response counts settles. Nothing depends on the number of parts. The first
// round after the summaries gathers the part's candidates (its tokens under the targets' first
// digit, a few per thousand on spread entropies) into a part_rounds when given one; the later
// rounds and the counts then read those instead of the part's data (the same summaries). A part
// may gather them earlier, right after its own summary (early_window, gather_early), for the
// digits around its own targets; the first round takes them if the step's cut falls inside.
// A large part summarised with a state on the host reads its entropies once instead: it counts
// only the first digits around a quantile of a sample of its own, gathering them as candidates
// (window_sampling); the first round confirms that those windows held the step's targets, or the
// plan counts every first digit in one more round.
//
// Clip-Cov / KL-Cov (covariance_selection): the summaries carry per-response sums of logp (and of
// A_t, given per token) for the step's means; k = max(1, floor(ratio N_step)). The first round
// reads each part's logp once, with the step's means, for its candidates: its tokens whose
// selection value is at least a sampled threshold that leaves k or more of them (or all) above
// (covariance_candidates: every token left out lies below the step's cut). The rounds rank the
// candidates' values. Each part sends its first k candidates in the step's order (value
// descending, then response) as (value, response) pairs in slots of its own, and whether it sent
// fewer than all its selectable tokens: one round of P(2k + 1) + 1 values (P: the step's
// non-empty parts, which the summaries mark). The step's selection is the first k of that table,
// so every part then knows the cut and each response's kept tokens and ties, and the plan is
// complete. When the table would be larger than two histograms (many parts, a large k), radix
// rounds on doubles rank the candidates as the cut ranks entropies, and a round of counts per
// response follows; their first round also counts the candidates and the parts that left tokens
// out, which sets the rank. Both take all candidates when they are k or fewer and no part left a
// token out.
//
// Scaling: the plan's scale (step_info::scale, default 1) multiplies every part's loss and
// gradient. Data-parallel wrappers that average gradients over W ranks (DDP, FSDP) need scale = W
// so that the average of the ranks' gradients is the step's gradient.
//
// Plans are host objects. Planned calls run on host-accessible backends (reco::cpu) and on
// reco::cuda_fused, which copies the call's slice of the plan to the device with the call. The
// plan's passes over a part's tokens run on the host; a part whose tokens live elsewhere (a GPU)
// passes a part_token_source that runs the same reductions where they are, so that only
// per-response values, histograms and cut candidates reach the host.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/algorithm/plan_call.hpp"
#include "reco/backend/cpu/plan_scan.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/detail/slot_traits.hpp"
#include "reco/select/covariance.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN

// What every part of a step agrees on.
struct step_info {
  std::uint64_t id = 0;     // the step (a counter); a plan is only valid for its step
  index_t responses = 0;    // R of the whole step
  double scale = 1.0;       // multiplies each part's loss and gradient (W under DDP/FSDP averaging)
  std::uint64_t config = 0; // optional digest of the caller's configuration, compared across parts
};

// One part: where its responses and groups sit in the step.
struct step_part {
  step_info step{};
  index_t first_response = 0;  // the step index of the part's first response
  index_t first_group = 0;     // the step's id of the part's first group
};

// What a part may keep between the rounds of its plan: the tokens a cut inside the current
// prefixes may still split (cut_candidates), gathered by its windowed summary (summarize with a
// state), by the first round after the summaries, or by gather_early while the summaries are
// being summed. With it, the later rounds and the cut counts read those few tokens instead of the
// part's data again; without it (stateless bindings), every round reads the data. All give the
// same summaries. A state belongs to one part, one batch (its entropies' address) and one plan
// (it is bound to the plan's serial, so a state kept across steps is gathered again): pass the
// same batch every round.
struct part_rounds {
  std::uint64_t plan = 0;     // the serial of the plan it was gathered for (0: nothing gathered)
  std::uint64_t pending = 0;  // gathered before the plan (summarize, gather_early) from values of this width
  std::uint64_t window = 0;   // the id of the windowed summary it was gathered by (0: none)
  index_t first_response = -1, responses = -1;
  const void* entropy = nullptr;  // the entropies (a covariance selection: logp) it was gathered from
  detail::cut_candidates candidates;
  bool left_out = false;  // a covariance selection's part left selectable tokens below its candidates
};

namespace detail {
// Marks a state's candidates as gathered before the plan (summarize, gather_early) from a batch
// of R responses with these entropies of this width: the first round of the next plan takes them.
inline void hold_before_plan(part_rounds& state, index_t R, const void* entropy, std::size_t width) {
  state.pending = width;
  state.responses = R;
  state.entropy = entropy;
}
}  // namespace detail

// A range of first digits [lo, hi] of the entropies' keys (empty when lo > hi).
struct digit_window {
  std::uint64_t lo = 1, hi = 0;
};

// The windowed stage 0 of an 80/20 cut (summarize with a part_rounds). Instead of counting every
// valid token's first digit, a part samples its entropies (the tokens of one chunk of 64 slots in
// `stride`), takes the first digits around its own quantile ± `margin` standard deviations of the
// sample's quantile and `slack` of its tokens, and reads its tokens once: the valid counts, the
// tokens inside that window (its cut candidates, kept in the state) and the counts above and
// below it. Its summary's histogram is exact inside the window, the tokens outside it counted on
// the digits next to it. The first round confirms that every windowed part's window holds the
// step's target digits; if one does not (a part whose values differ from the step's), the plan
// counts every first digit in one more round. So these settings change the cost, never the plan.
// A part with fewer than `min_samples` sampled tokens, or whose window would hold more than
// `max_fraction` of them, counts every first digit.
struct window_sampling {
  index_t stride = 17;
  double min_samples = 2048;
  double margin = 4;
  double slack = 0.0025;
  double max_fraction = 0.25;
};

// A part's summary of a stage of the plan; summaries of the same stage combine by addition.
struct step_summary {
  std::vector<double> values;

  step_summary& operator+=(const step_summary& o) {
    if (values.empty()) {
      values = o.values;
      return *this;
    }
    detail::require(o.values.size() == values.size(), "plan",
                    "summaries of different sizes (" + std::to_string(values.size()) + " and " +
                        std::to_string(o.values.size()) +
                        "): the parts disagree on the step, its stage or its number of responses");
    for (std::size_t i = 0; i < values.size(); ++i) values[i] += o.values[i];
    return *this;
  }
  // Adds o and takes its storage (for this thread's next summaries, as reco::recycle).
  step_summary& operator+=(step_summary&& o);
  double* data() { return values.data(); }
  std::size_t size() const { return values.size(); }
};

namespace detail {
// The storage of summaries given back (reco::recycle, detail::recycle_taken), reused by this
// thread's next summaries: a fresh 0.5 MiB vector costs its page faults (and the kernel's zeroing)
// on every round, a fifth of an 80/20 plan's time at 1M tokens. At most 4 buffers are kept; a
// clean one holds only zeros (its size() values), so that it needs no fill.
struct spare_summary {
  std::vector<double> values;
  bool clean = false;
};
// Smaller summaries are neither kept nor served from the pool (a new vector costs them little).
inline constexpr std::size_t pooled_summary_min = 4096;
inline std::vector<spare_summary>& spare_summaries() {
  thread_local std::vector<spare_summary> spare;
  return spare;
}
inline void keep_spare(std::vector<double>&& values, bool clean) {
  std::vector<spare_summary>& spare = spare_summaries();
  if (values.capacity() >= pooled_summary_min && spare.size() < 4) spare.push_back(spare_summary{std::move(values), clean});
  values = std::vector<double>();
}
// n zeros, in the spare buffer that needs the fewest of them written (a clean one at least n long
// needs none; then the smallest), or a new vector if none holds n. Summaries of fewer than 4096
// values (a cut-count round of a small step) take a new vector: they would take a large clean
// buffer's zeros away from the next histogram.
inline std::vector<double> summary_storage(std::size_t n) {
  std::vector<spare_summary>& spare = spare_summaries();
  std::size_t best = spare.size(), best_writes = n;
  auto writes = [n](const spare_summary& b) {
    return b.clean ? (b.values.size() >= n ? 0 : n - b.values.size()) : n;
  };
  for (std::size_t i = 0; i < spare.size() && n >= pooled_summary_min; ++i) {
    if (spare[i].values.capacity() < n) continue;
    const std::size_t w = writes(spare[i]);
    if (best == spare.size() || w < best_writes ||
        (w == best_writes && spare[i].values.capacity() < spare[best].values.capacity())) {
      best = i;
      best_writes = w;
    }
  }
  std::vector<double> v;
  bool clean = false;
  if (best < spare.size()) {
    v = std::move(spare[best].values);
    clean = spare[best].clean;
    spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
  }
  if (clean) v.resize(n);  // its values are zeros; those it grows by are value-initialised
  else v.assign(n, 0.0);
  return v;
}
}  // namespace detail

// Gives a used summary's storage (after finish_plan or step_plan::advance) to this thread's next
// summaries. Optional: it saves the allocation, nothing else.
inline void recycle(step_summary&& s) { detail::keep_spare(std::move(s.values), false); }

inline step_summary& step_summary::operator+=(step_summary&& o) {
  if (values.empty()) {
    values = std::move(o.values);
    return *this;
  }
  *this += static_cast<const step_summary&>(o);
  recycle(std::move(o));
  return *this;
}

// What the plan's passes find in a part's tokens, computed by the caller where the tokens are (a
// part_token_source): per response of the part, its valid tokens and the sum over them of what
// the weight averages (asked for when the plan reads it: old_logp, logp when on-policy); the
// input_error bits of the values read (bad_old_logp or bad_logp for the averaged values,
// bad_entropy for a non-finite valid entropy of a selection); the first-digit histogram of the
// valid entropies' order-preserving keys (asked for with a cut to find: digit_histogram_size
// counts, digit 0 empty, then the sums of each run of 256 digits).
struct part_token_sums {
  std::vector<index_t> valid;
  std::vector<double> old_sum;
  std::uint32_t status = 0;
  std::vector<double> histogram;
};

// A part's token passes run by the caller instead of on the host's copy of its data: every step
// of the plan that reads tokens (summarize, gather_early, plan_round) takes one and then reads no
// per-token pointer of the batch (its per-response inputs and layout still come from the batch).
// Each function must return what the host pass of the same name does on the same data (the
// reductions may round differently: old_sum in another order).
struct part_token_source {
  // old_mean: the sums of the averaged values are wanted; entropy: the selection's entropies are
  // checked; histogram: the first-digit histogram is wanted.
  std::function<void(bool old_mean, bool entropy, bool histogram, part_token_sums&)> sums;
  // detail::gather_candidates: the candidates under the key prefixes [lo, hi] of `done` bits.
  std::function<void(int done, std::uint64_t lo, std::uint64_t hi, detail::cut_candidates&)> gather;
  // detail::count_cut: per response, the valid tokens above and on the cut.
  std::function<void(double cut, std::int64_t* above, std::int64_t* on)> count_cut;
};

namespace detail {

// Header of every summary (all fields are sums over parts).
enum : std::size_t {
  plan_h_parts = 0,        // 1 per part
  plan_h_stage = 1,        // the stage index, per part
  plan_h_width = 2,        // sizeof(T) of the part's values
  plan_h_fp = 3,           // 8 chunks of 8 bits of the fingerprint
  plan_h_fp_sq = 11,       // their squares: all parts agree iff parts * sum(x^2) == sum(x)^2
  plan_h_status = 19,      // 16 counters, one per input_error bit
  plan_h_windows = 35,     // stage 0: 1 per windowed part; its first round: 1 per part that confirms
  plan_h_window_ids = 36,  // ... and the ids of those windows (a part_rounds' window)
  plan_header = 37,
};
// Per-response fields of the first stage.
enum : std::size_t {
  plan_f_claimed = 0,
  plan_f_group = 1,  // group id + 1
  plan_f_length = 2,
  plan_f_span = 3,
  plan_f_old_mean = 4,
  plan_f_input = 5,
  plan_f_weight = 6,
  plan_fields = 7,
};
inline constexpr int plan_digit_bits = key_digit_bits;
inline constexpr std::size_t plan_buckets = key_digits;
inline constexpr std::size_t plan_histogram = digit_histogram_size;  // the buckets, then their groups

// Gives a summed summary that a plan has taken (finish_plan, step_plan::advance) back to this
// thread's next summaries, set to zero by writing only what can be nonzero: the header, the
// values after its `histograms` digit histograms (the per-response fields or counts), and in each
// histogram the runs of 256 digits whose group count is not zero (a group holds the sum of its
// digits' counts, all >= 0: a zero group has only zero digits). The next summary then needs no
// fill of a histogram's 2^16 counts, of which a step reaches a few thousand (0.04 ms per 0.5 MiB
// summary on the 2-vCPU guest, 7 % of the 80/20 plan at 1M tokens). For summaries this library
// summed from its own (internal: a histogram of other values would leave nonzero digits behind);
// histograms beyond the summary's size are a caller's error and give a plain recycle.
inline void recycle_taken(step_summary&& s, std::size_t histograms) {
  std::vector<double>& v = s.values;
  const std::size_t end = plan_header + histograms * plan_histogram;
  if (v.size() < end) return recycle(std::move(s));
  std::fill(v.begin(), v.begin() + plan_header, 0.0);
  for (double* h = v.data() + plan_header; h < v.data() + end; h += plan_histogram) {
    double* groups = h + key_digits;
    for (std::size_t g = 0; g < digit_groups; ++g) {
      if (groups[g] == 0) continue;  // a NaN count is cleared with the others
      std::fill(h + (g << digit_group_bits), h + ((g + 1) << digit_group_bits), 0.0);
      groups[g] = 0;
    }
  }
  std::fill(v.begin() + static_cast<std::ptrdiff_t>(end), v.end(), 0.0);
  keep_spare(std::move(v), true);
}

inline std::uint64_t fnv(std::uint64_t h, const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}
// Parameters are hashed field by field: hashing a struct's bytes would read its padding (and the
// indeterminate byte of an empty struct), which copies need not preserve. A parameter struct is an
// aggregate of scalars (and of aggregates of scalars); its fields are counted by trying brace
// initialisers of 1, 2, ... values that convert to anything, and read with a structured binding.
// (Each such value has a type of its own: nvcc 13.0's device front end crashes on the variadic
// form that appends one shared type, once two parameter types are counted in a translation unit.)
template <std::size_t>
struct any_field {
  template <class T>
  operator T() const;
};
template <class P, std::size_t... I>
constexpr auto brace_initialisable(std::index_sequence<I...>, int) -> decltype(P{any_field<I>{}...}, true) {
  return true;
}
template <class P, std::size_t... I>
constexpr bool brace_initialisable(std::index_sequence<I...>, long) {
  return false;
}
template <class P, std::size_t N = 0>
constexpr std::size_t field_count() {
  if constexpr (N > 12 || !brace_initialisable<P>(std::make_index_sequence<N + 1>{}, 0))
    return N;
  else
    return field_count<P, N + 1>();
}

template <class P>
std::uint64_t hash_value(std::uint64_t h, const P& p);

template <class... F>
std::uint64_t hash_fields(std::uint64_t h, const F&... f) {
  ((h = hash_value(h, f)), ...);
  return h;
}

template <class P>
std::uint64_t hash_value(std::uint64_t h, const P& p) {
  if constexpr (std::is_scalar_v<P>) {
    return fnv(h, &p, sizeof(P));
  } else if constexpr (std::is_aggregate_v<P>) {
    constexpr std::size_t n = field_count<P>();
    static_assert(n <= 12, "reco::step_plan: parameter structs of more than 12 fields are not hashed");
    if constexpr (n == 0) {
      return h;
    } else if constexpr (n == 1) {
      const auto& [a] = p;
      return hash_fields(h, a);
    } else if constexpr (n == 2) {
      const auto& [a, b] = p;
      return hash_fields(h, a, b);
    } else if constexpr (n == 3) {
      const auto& [a, b, c] = p;
      return hash_fields(h, a, b, c);
    } else if constexpr (n == 4) {
      const auto& [a, b, c, d] = p;
      return hash_fields(h, a, b, c, d);
    } else if constexpr (n == 5) {
      const auto& [a, b, c, d, e] = p;
      return hash_fields(h, a, b, c, d, e);
    } else if constexpr (n == 6) {
      const auto& [a, b, c, d, e, f] = p;
      return hash_fields(h, a, b, c, d, e, f);
    } else if constexpr (n == 7) {
      const auto& [a, b, c, d, e, f, g] = p;
      return hash_fields(h, a, b, c, d, e, f, g);
    } else if constexpr (n == 8) {
      const auto& [a, b, c, d, e, f, g, i] = p;
      return hash_fields(h, a, b, c, d, e, f, g, i);
    } else if constexpr (n == 9) {
      const auto& [a, b, c, d, e, f, g, i, j] = p;
      return hash_fields(h, a, b, c, d, e, f, g, i, j);
    } else if constexpr (n == 10) {
      const auto& [a, b, c, d, e, f, g, i, j, k] = p;
      return hash_fields(h, a, b, c, d, e, f, g, i, j, k);
    } else if constexpr (n == 11) {
      const auto& [a, b, c, d, e, f, g, i, j, k, l] = p;
      return hash_fields(h, a, b, c, d, e, f, g, i, j, k, l);
    } else {
      const auto& [a, b, c, d, e, f, g, i, j, k, l, m] = p;
      return hash_fields(h, a, b, c, d, e, f, g, i, j, k, l, m);
    }
  } else {
    return h;  // not an aggregate: not part of the fingerprint
  }
}

template <class C, class = void>
struct has_params : std::false_type {};
template <class C>
struct has_params<C, std::void_t<decltype(std::declval<const C&>().params)>> : std::true_type {};
template <class C>
std::uint64_t hash_params(std::uint64_t h, const C& c) {
  if constexpr (has_params<C>::value) h = hash_value(h, c.params);
  return h;
}

// The fingerprint of (objective type and parameters, step, value width): every part of a step and
// every call with its plan must agree on it.
template <class Obj>
std::uint64_t plan_fingerprint(const Obj& obj, const step_info& step, std::size_t width) {
  std::uint64_t h = 1469598103934665603ull;
  // The objective type itself (a preset derives from it and is the same objective).
  using base = std::decay_t<decltype(obj.prepared())>;
  const char* name = typeid(base).name();
  h = fnv(h, name, std::strlen(name));
  h = fnv(h, &step.id, sizeof(step.id));
  h = fnv(h, &step.responses, sizeof(step.responses));
  h = fnv(h, &step.scale, sizeof(step.scale));
  h = fnv(h, &step.config, sizeof(step.config));
  h = fnv(h, &width, sizeof(width));
  h = hash_params(h, obj.advantage);
  h = hash_params(h, obj.ratio);
  h = hash_params(h, obj.clip);
  h = hash_params(h, obj.weight);
  h = hash_params(h, obj.aggregate);
  h = hash_params(h, obj.select);
  h = hash_params(h, obj.kl);
  h = hash_params(h, obj.entropy);
  return h;
}

// One counter for every plan of the process, whatever its objective type.
inline std::uint64_t next_plan_serial() {
  static std::atomic<std::uint64_t> serials{1};
  return serials.fetch_add(1, std::memory_order_relaxed);
}

// Writes a fingerprint into a summary's header as `parts` parts that agree on it sum it: 8 chunks of
// 8 bits and their squares.
inline void write_fingerprint(step_summary& s, std::uint64_t fp, double parts) {
  for (int c = 0; c < 8; ++c) {
    const double x = static_cast<double>((fp >> (8 * c)) & 0xffu);
    s.values[plan_h_fp + c] = parts * x;
    s.values[plan_h_fp_sq + c] = parts * x * x;
  }
}

inline step_summary plan_summary(std::size_t body, int stage, std::size_t width, std::uint64_t fp) {
  step_summary s;
  s.values = summary_storage(plan_header + body);
  s.values[plan_h_parts] = 1;
  s.values[plan_h_stage] = stage;
  s.values[plan_h_width] = static_cast<double>(width);
  write_fingerprint(s, fp, 1);
  return s;
}

// Checks a summed header: every part agrees with the others and with `fp` (when fp_known).
inline void check_plan_header(const step_summary& s, int stage, std::uint64_t& fp, bool fp_known) {
  require(s.values.size() >= plan_header, "plan", "summary too short");
  const double parts = s.values[plan_h_parts];
  require(parts >= 1 && parts == std::floor(parts), "plan", "summary without parts (parts = " +
                                                             std::to_string(parts) + ")");
  std::uint64_t common = 0;
  for (int c = 0; c < 8; ++c) {
    const double sum = s.values[plan_h_fp + c], sq = s.values[plan_h_fp_sq + c];
    if (parts * sq != sum * sum)
      fail("plan", "the parts disagree on the step or the objective (step id, number of responses, scale, "
                   "configuration digest, value type, preset or parameters differ between parts)");
    common |= static_cast<std::uint64_t>(sum / parts) << (8 * c);
  }
  if (fp_known && common != fp)
    fail("plan", "the summaries were made for another step or objective than this one");
  fp = common;
  if (s.values[plan_h_stage] != parts * stage)
    fail("plan", "the parts' summaries are from different stages of the plan (expected stage " +
                     std::to_string(stage) + ")");
}


// Whether a stage-0 summary carries the first histogram round of an 80/20 cut (a selector that
// finds its cut; the first digit needs nothing from the other parts, so it rides with the
// summaries instead of costing a round of its own).
template <class Obj>
bool summary_has_histogram(const Obj& obj) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) return false;
  else if constexpr (Obj::selector_type::active) return term_on(obj.select) && !term_of(obj.select).params.use_given;
  else return false;
}

// The block of a stage-0 summary before the per-response fields: the first histogram round of a
// cut, or for a covariance selection three values per response of the step (the sum of logp over
// its valid tokens; the sum of A_t; flags: +1 when its advantages are given per token, +2 when it
// is the first response of a part), from which the plan takes the step's means and its parts.
inline constexpr std::size_t covariance_slots = 3;
inline constexpr int covariance_token_advantages = 1, covariance_part_start = 2;
// The largest table of the parts' top values (P(2k + 1) + 1) a covariance plan sums in one round;
// beyond it, the radix rounds (each a 2^16-bucket histogram, four for doubles) and the counts
// cost less.
inline constexpr std::size_t covariance_table_limit = 2 * plan_histogram;
// The step's order of a covariance selection's tokens, as far as the table needs it: value (its
// order key) descending, then response. The parts and the plan must rank alike.
inline bool before_in_step(std::uint64_t key_a, index_t response_a, std::uint64_t key_b, index_t response_b) {
  return key_a != key_b ? key_a > key_b : response_a < response_b;
}
// A covariance selection's plan reads each part's logp on the host: no part_token_source.
inline void refuse_token_source(const part_token_source* tokens) {
  if (tokens) fail("tokens", "a covariance selection's plan reads the part's logp on the host (CPU tensors)");
}
template <class Obj>
std::size_t stage0_block(const Obj& obj, index_t responses) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>)
    return covariance_slots * static_cast<std::size_t>(responses);
  else return summary_has_histogram(obj) ? plan_histogram : 0;
}

}  // namespace detail

// The step's plan: what every call of a split step needs from the rest of the step.
class step_plan {
 public:
  // top_values: a covariance selection's round of each part's first k candidates.
  enum class stage_kind : std::uint8_t { histogram, cut_counts, complete, top_values };

  bool complete() const { return stage_ == stage_kind::complete; }
  stage_kind stage() const { return stage_; }
  int stage_index() const { return stage_index_; }
  std::uint64_t fingerprint() const { return fingerprint_; }
  // A number no other plan of this process has (copies share it): what a part_rounds is bound to.
  std::uint64_t serial() const { return serial_; }
  const step_info& step() const { return step_; }

  // The step's counts (valid tokens, non-empty responses, R, L_max) and the policy term's (kept
  // tokens and responses with a kept-denominator selector).
  const aggregation_counts& valid_counts() const { return valid_; }
  const aggregation_counts& policy_counts() const { return policy_; }
  // The step's cut (selection only) and the final per-response values of the step.
  const entropy_cut& cut() const { return cut_; }
  const std::vector<double>& advantages() const { return adv_; }
  const std::vector<double>& weights() const { return weight_; }
  const std::vector<index_t>& kept() const { return kept_; }

  // Combines the summed summaries of the current round (see plan_round).
  void advance(const step_summary& total) {
    detail::require(!complete(), "plan", "is complete; no round is pending");
    std::uint64_t fp = fingerprint_;
    detail::check_plan_header(total, stage_index_, fp, true);
    const double* v = total.values.data() + detail::plan_header;
    if (stage_ == stage_kind::top_values) {
      detail::require(total.values.size() == detail::plan_header + round_body(), "plan",
                      "top-value summary of the wrong size");
      take_top_values(v);
      return;
    }
    if (stage_ == stage_kind::histogram) {
      detail::require(total.values.size() == detail::plan_header + round_body(), "plan",
                      "histogram summary of the wrong size");
      ++stage_index_;
      if (covariance_ && round_ == 0) {
        // The k largest values among the parts' candidates (covariance_candidates), whose number
        // the first histogram gives: all of them when there are k or fewer and no part left a
        // selectable token out; else the k-th largest (the least, when there are k or fewer).
        double candidates = 0;
        for (std::size_t g = 0; g < detail::digit_groups; ++g) candidates += v[detail::key_digits + g];
        const auto n = static_cast<index_t>(candidates);
        if (n <= select_k_ && v[detail::plan_histogram] == 0) {
          cut_ = entropy_cut{-HUGE_VAL, -1};
          stage_ = stage_kind::cut_counts;
          return;
        }
        ranks_[0] = ranks_[1] = rank_[0] = rank_[1] = n > select_k_ ? n - select_k_ : 0;
      }
      if (windows_ > 0) {
        // The first round after a windowed stage 0: unless every windowed part confirmed that its
        // window holds the target digits, they may be wrong; count every first digit again.
        const bool confirmed = total.values[detail::plan_h_windows] == windows_ &&
                               total.values[detail::plan_h_window_ids] == window_ids_;
        windows_ = window_ids_ = 0;
        if (!confirmed) {
          round_ = 0;
          for (int j = 0; j < 2; ++j) {
            rank_[j] = ranks_[j];
            prefix_[j] = 0;
          }
          return;
        }
      }
      take_histogram(v, round_ == 0 ? 0 : detail::plan_histogram);
      return;
    }
    // Cut counts: per response, tokens above and on the cut.
    const index_t R = step_.responses;
    detail::require(total.values.size() == detail::plan_header + 2 * static_cast<std::size_t>(R), "plan",
                    "cut-count summary of the wrong size");
    double greater = 0;
    for (index_t i = 0; i < R; ++i) greater += v[2 * i];
    index_t budget = -1;  // ties to keep in step order (-1: all)
    if (cut_.ties >= 0) {
      budget = select_.use_given ? cut_.ties : select_k_ - static_cast<index_t>(greater);
      if (budget < 0) detail::fail("plan", "more tokens above the cut than the selection keeps (inconsistent parts)");
    }
    ties_.assign(R, 0);
    kept_.assign(R, 0);
    for (index_t i = 0; i < R; ++i) {
      const auto above = static_cast<index_t>(v[2 * i]), on = static_cast<index_t>(v[2 * i + 1]);
      index_t take = on;
      if (budget >= 0) {
        take = on < budget ? on : budget;
        budget -= take;
      }
      // -1 where the response keeps every token on the cut (all but the one response of the step
      // the budget runs out in): its kept flags then need no walk in position order.
      ties_[i] = budget < 0 || take == on ? -1 : take;
      kept_[i] = above + take;
    }
    finish_kept();
  }

  // The slice of the plan a call of `responses` responses starting at `first` reads.
  detail::plan_call call_for(index_t first, index_t responses) const {
    detail::require(complete(), "plan", "is not complete: run its rounds (plan_round / advance) first");
    detail::require(first >= 0 && responses >= 0 && first + responses <= step_.responses, "plan",
                    "part [" + std::to_string(first) + ", " + std::to_string(first + responses) +
                        ") lies outside the step's " + std::to_string(step_.responses) + " responses");
    detail::plan_call c;
    c.advantage = adv_.data() + first;
    c.weight = weight_.data() + first;
    c.capped = capped_.data() + first;
    c.length = length_.data() + first;
    c.ties = has_selection_ ? ties_.data() + first : nullptr;
    c.kept = has_selection_ ? kept_.data() + first : nullptr;
    c.cut = cut_;
    c.valid = valid_;
    c.policy = policy_;
    c.scale = step_.scale;
    c.first = first;
    c.covariance_adv = covariance_means_[0];
    c.covariance_logp = covariance_means_[1];
    return c;
  }

  // The size of the pending round's summary body: its digit histograms (and after them, in a
  // covariance selection's first round, the parts that left selectable tokens out), or per
  // response the tokens above and on the cut.
  std::size_t round_body() const {
    if (stage_ == stage_kind::top_values) return part_starts_.size() * part_top_values() + 1;
    if (stage_ != stage_kind::histogram) return 2 * static_cast<std::size_t>(step_.responses);
    return static_cast<std::size_t>(histograms()) * detail::plan_histogram + (covariance_ && round_ == 0 ? 1 : 0);
  }
  // The tokens a top-k or covariance selection keeps over the step (k).
  index_t selected_count() const { return select_k_; }
  // Response i's valid tokens, as the summaries counted them.
  index_t valid_tokens(index_t i) const { return length_[static_cast<std::size_t>(i)]; }
  // Covariance selection (Clip-Cov / KL-Cov): the step's mean A and mean logp.
  bool covariance() const { return covariance_; }
  double covariance_adv_mean() const { return covariance_means_[0]; }
  double covariance_logp_mean() const { return covariance_means_[1]; }
  // A covariance selection's top-value round: each part's slots (a count, then k (value, response)
  // pairs), and the index of the part that starts at response `first` among the step's non-empty
  // parts (its slots from index · part_top_values()), or -1 when no part starts there.
  std::size_t part_top_values() const { return 2 * static_cast<std::size_t>(select_k_) + 1; }
  index_t part_slot(index_t first) const {
    const auto it = std::lower_bound(part_starts_.begin(), part_starts_.end(), first);
    return it != part_starts_.end() && *it == first ? static_cast<index_t>(it - part_starts_.begin()) : -1;
  }
  // The digit histograms the stage-0 summary carried (0 or 1): what recycle_taken clears of it.
  std::size_t summary_histograms() const { return summary_histograms_; }

  // Where a part's histogram round looks (used by plan_round). Round 0 (after a windowed stage 0
  // that a part's window missed) counts every first digit, in one histogram for every target.
  int targets() const { return targets_; }
  int round() const { return round_; }
  int histograms() const { return round_ == 0 ? 1 : targets_; }
  // The windowed parts whose confirmation the pending round carries (0: none awaited).
  double windows() const { return windows_; }
  int rounds() const { return static_cast<int>(width_ * 8 / detail::plan_digit_bits); }
  std::uint64_t prefix(int j) const { return prefix_[j]; }
  std::size_t width() const { return width_; }

 private:
  // The top-value round. The step selects its first k selectable tokens in the order value
  // descending, then step position; a part's first k in that order hold every token of it the step
  // selects, so the step's selection is the first k of the table. Equal (value, response) pairs
  // are interchangeable: a response keeps its first tokens on the cut in position order, and only
  // their number matters here. When the table holds k or fewer and every part sent all its
  // selectable tokens, all are taken; a part that sent fewer sent k, so the table then holds k or
  // more. Values are ranked by their order keys, as the radix rounds rank them.
  void take_top_values(const double* v) {
    const auto K = static_cast<std::size_t>(select_k_);
    const std::size_t P = part_starts_.size(), slots = part_top_values();
    const index_t R = step_.responses;
    struct entry {
      std::uint64_t key;
      index_t response;
    };
    std::vector<entry> table;
    for (std::size_t p = 0; p < P; ++p) {
      const double* slot = v + p * slots;
      const double n = slot[0];
      if (!(n >= 0 && n <= static_cast<double>(K) && n == std::floor(n)))
        detail::fail("plan", "a part sent " + std::to_string(n) + " top values for a selection of " +
                                 std::to_string(K) + " (inconsistent parts)");
      for (std::size_t j = 0; j < static_cast<std::size_t>(n); ++j) {
        const double i = slot[2 + 2 * j];
        if (!(i >= 0 && i < static_cast<double>(R) && i == std::floor(i)))
          detail::fail("plan", "a part sent a top value of response " + std::to_string(i) + ", outside the step's " +
                                   std::to_string(R) + " (inconsistent parts)");
        table.push_back(entry{detail::order_key_bits(slot[1 + 2 * j]), static_cast<index_t>(i)});
      }
    }
    const double partial = v[P * slots];  // the parts that sent fewer than all their selectable tokens
    kept_.assign(R, 0);
    if (table.size() <= K && partial == 0) {
      cut_ = entropy_cut{-HUGE_VAL, -1};  // every selectable token of the step
      for (const entry& e : table) ++kept_[e.response];
      ties_.assign(R, -1);
    } else {
      ties_.assign(R, 0);
      if (table.size() < K)
        detail::fail("plan", "parts sent " + std::to_string(table.size()) + " top values, fewer than the " +
                                 std::to_string(K) + " selected, yet left tokens out (inconsistent parts)");
      std::nth_element(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(K - 1), table.end(),
                       [](const entry& a, const entry& b) { return detail::before_in_step(a.key, a.response, b.key, b.response); });
      const std::uint64_t cut = table[K - 1].key;
      cut_ = entropy_cut{detail::key_value(cut, sizeof(double)), 0};
      // ties_[i]: the response's tokens on the cut that it keeps (the first ones in position order).
      for (std::size_t j = 0; j < K; ++j) {
        ++kept_[table[j].response];
        ties_[table[j].response] += table[j].key == cut;
      }
    }
    finish_kept();
  }

  // After the cut counts or the top values: the kept counts (kept-denominator selectors), and the
  // plan is complete.
  void finish_kept() {
    double kept_tokens = 0, kept_responses = 0;
    for (const index_t k : kept_) {
      kept_tokens += static_cast<double>(k);
      kept_responses += k > 0 ? 1 : 0;
    }
    if (kept_denominator_) {
      policy_.tokens = kept_tokens;
      policy_.responses = kept_responses;
    }
    ++stage_index_;
    stage_ = stage_kind::complete;
  }

  // One histogram round: per target j, the summed histogram at v + j * stride (stride 0: one
  // histogram for every target, as in the first round) narrows its prefix by a digit.
  void take_histogram(const double* v, std::size_t stride) {
    for (int j = 0; j < targets_; ++j) {
      double below = 0;
      const std::size_t b = detail::digit_at_rank(v + j * stride, static_cast<double>(rank_[j]), below);
      if (b == detail::plan_buckets)
        detail::fail("plan", "the parts' histograms hold fewer valid tokens than their summaries counted "
                             "(inconsistent parts)");
      rank_[j] -= static_cast<index_t>(below);
      prefix_[j] = (prefix_[j] << detail::plan_digit_bits) | b;
    }
    ++round_;
    if (round_ < rounds()) return;
    const double v0 = detail::key_value(prefix_[0], width_);
    if (select_.rule == selection_rule::top_k) {
      cut_.value = v0;
      cut_.ties = 0;  // set from the counts
    } else {
      const double v1 = detail::key_value(prefix_[1], width_);
      const double n = valid_.tokens;
      const double pos = (1.0 - select_.rho) * (n > 0 ? n - 1 : 0);
      const double frac = pos - static_cast<double>(ranks_[0]);
      cut_.value = v0 + frac * (v1 - v0);
      cut_.ties = -1;
    }
    stage_ = stage_kind::cut_counts;
  }

  template <class Obj>
  friend step_plan finish_plan(const Obj& obj, const step_info& step, const step_summary& total);

  stage_kind stage_ = stage_kind::complete;
  int stage_index_ = 0;
  std::uint64_t fingerprint_ = 0, serial_ = 0;
  step_info step_{};
  std::size_t width_ = 8;
  aggregation_counts valid_{}, policy_{};
  std::vector<double> adv_, weight_;
  std::vector<std::uint8_t> capped_;
  std::vector<index_t> length_, ties_, kept_;
  bool has_selection_ = false, kept_denominator_ = false;
  top_entropy_selection::params_type select_{};
  index_t select_k_ = 0;
  index_t ranks_[2] = {0, 0};  // ascending ranks of the cut's order statistics among valid tokens
  index_t rank_[2] = {0, 0};   // ... within the current prefix
  std::uint64_t prefix_[2] = {0, 0};
  int targets_ = 0, round_ = 0;
  double windows_ = 0, window_ids_ = 0;  // the windowed parts of stage 0 and the sum of their ids
  entropy_cut cut_{HUGE_VAL, -1};
  bool covariance_ = false;
  double covariance_means_[2] = {0, 0};
  std::vector<index_t> part_starts_;  // a covariance selection's non-empty parts: their first responses
  std::size_t summary_histograms_ = 0;
};

namespace detail {
// The digit histograms of a summed summary (for recycle_taken): a stage-0 summary holds
// plan.summary_histograms(); a round that `plan` is about to take (before advance) holds
// plan.targets() of them in a histogram round, none in the cut counts.
inline std::size_t round_histograms(const step_plan& plan) {
  return plan.stage() == step_plan::stage_kind::histogram ? static_cast<std::size_t>(plan.histograms()) : 0;
}
}  // namespace detail

namespace detail {
// A windowed part's id (part_rounds::window): in [1, 2^20], so that the sum over up to 2^33 parts
// is exact in a double. Random per thread: a state that did not make the summary a plan summed
// (summarised again, another part's) confirms with another id and the plan counts every digit.
inline std::uint64_t next_window_id() {
  thread_local std::uint64_t x = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^
                                 static_cast<std::uint64_t>(std::random_device{}()) ^
                                 reinterpret_cast<std::uintptr_t>(&x);
  x += 0x9e3779b97f4a7c15ull;  // splitmix64
  std::uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (z >> 44) + 1;
}

// The first digits a part's windowed stage 0 counts one by one (window_sampling) for a cut that
// keeps the top fraction rho, or an empty window (lo > hi) when it should count every digit.
template <class T>
digit_window sampled_window(const batch_pointers<T>& b, double rho, const window_sampling& ws) {
  digit_window w;
  if (ws.stride < 1) return w;
  thread_local std::vector<std::uint32_t> h(digit_histogram_size, 0);  // all zero between calls
  std::uint64_t range[2];
  const double n = sample_first_digits(b, ws.stride, h.data(), range);
  if (n >= ws.min_samples && n >= 1) {
    // The sample's ranks of the part's own target, widened (ascending ranks; clamped: the ends).
    const double q = std::min(std::max(rho, 0.0), 1.0);
    const double centre = (1.0 - q) * (n - 1), half = ws.margin * std::sqrt(q * (1.0 - q) * n) + ws.slack * n + 1;
    double below_lo = 0, below_hi = n;
    std::uint64_t lo = 1, hi = key_digits - 1;
    if (centre - half > 0) lo = std::max<std::uint64_t>(digit_at_rank(h.data(), std::floor(centre - half), below_lo), 1);
    if (centre + half < n - 1) {
      hi = digit_at_rank(h.data(), std::ceil(centre + half), below_hi);
      below_hi += h[hi];
    }
    if (lo <= hi && below_hi - below_lo <= ws.max_fraction * n) w = digit_window{lo, hi};
  }
  if (range[0] <= range[1]) {
    for (std::uint64_t d = range[0]; d <= range[1]; ++d) h[d] = 0;
    for (std::uint64_t g = range[0] >> digit_group_bits; g <= range[1] >> digit_group_bits; ++g) h[key_digits + g] = 0;
  }
  return w;
}
template <class Obj, class T>
digit_window sampled_window(const Obj& obj, const batch_pointers<T>& b, const window_sampling& ws) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type> || !Obj::selector_type::active) return {};
  else return sampled_window(b, term_of(obj.select).params.rho, ws);
}

template <class Obj, class T>
step_summary summarize_part(const Obj& obj, const batch_view<T>& batch, const step_part& part,
                            const part_token_source* tokens, part_rounds* state, const window_sampling& ws) {
  obj.validate();
  constexpr bool covariance = is_covariance_selection_v<typename Obj::selector_type>;
  if (covariance) refuse_token_source(tokens);
  const objective_needs needs = obj.needs();
  validate_inputs(batch, needs.rewards, needs.advantages, needs.ref_logp, needs.entropy, needs.response_weights);
  validate_offsets_host(batch);
  validate_rollout_logp(batch, weight_reads_rollout_logp(obj.weight), true);
  validate_token_advantages(batch, true);
  const step_info& st = part.step;
  require(st.responses >= 0, "part.step.responses", "must be >= 0");
  require(std::isfinite(st.scale) && st.scale > 0, "part.step.scale", "must be finite and > 0");
  const index_t R = batch.layout.responses;
  require(part.first_response >= 0 && part.first_response + R <= st.responses, "part.first_response",
          "the part's responses [" + std::to_string(part.first_response) + ", " +
              std::to_string(part.first_response + R) + ") must lie in the step's " + std::to_string(st.responses));
  require(part.first_group >= 0, "part.first_group", "must be >= 0");

  const std::uint64_t fp = plan_fingerprint(obj, st, sizeof(T));
  const bool histogram = summary_has_histogram(obj);
  const std::size_t fields = plan_fields * static_cast<std::size_t>(st.responses);
  const std::size_t hist = stage0_block(obj, st.responses);  // the body: the block, then the fields
  step_summary s = plan_summary(hist + fields, 0, sizeof(T), fp);

  const batch_pointers<T> b = pointers_of(batch);
  plan_reads reads;
  reads.old_mean = needs_old_mean(obj.weight);
  // The entropies of an 80/20 cut (else checked by the histogram pass; a covariance selection reads none).
  reads.entropy = !covariance && term_on(obj.select) && !histogram;
  const plan_scan_fn<T> scan{b, reads};
  std::uint32_t bits = 0;
  double* body = s.values.data() + plan_header;
  // The selection's first histogram round; when the scan would only count the mask, the pass's
  // per-response counts serve instead (one read of the mask, not two).
  std::vector<index_t> counted;
  part_token_sums sums;
  digit_window window;  // the windowed stage 0's first digits (empty: every digit counted)
  if (tokens) {
    tokens->sums(reads.old_mean, term_on(obj.select), histogram, sums);
    require(sums.valid.size() == static_cast<std::size_t>(R) &&
                (!reads.old_mean || sums.old_sum.size() == static_cast<std::size_t>(R)) &&
                (!histogram || sums.histogram.size() == plan_histogram),
            "tokens", "returned token sums of the wrong size for the part's " + std::to_string(R) + " responses");
    bits |= sums.status;
    if (histogram) std::copy(sums.histogram.begin(), sums.histogram.end(), body);
  } else if (histogram) {
    if (!reads.old_mean) counted.resize(static_cast<std::size_t>(R));
    bool nonfinite = false;
    if (state) window = sampled_window(obj, b, ws);
    if (window.lo <= window.hi) {
      *state = part_rounds{};
      gather_window(b, window.lo, window.hi, state->candidates, counted.empty() ? nullptr : counted.data(),
                    &nonfinite);
    } else {
      first_digit_histogram(b, body, &nonfinite, counted.empty() ? nullptr : counted.data());
    }
    if (nonfinite) bits |= bad_entropy;
  }
  const T* input = Obj::needs_rewards ? b.rewards : (Obj::needs_advantages ? b.advantages : nullptr);
  const std::uint32_t input_bit = Obj::needs_rewards ? bad_rewards : bad_advantages;
  const T* given = needs.response_weights ? b.response_weights : nullptr;
  double valid_tokens = 0;
  for (index_t g = 0; g < b.groups; ++g) {
    for (index_t i = batch.group_offsets[g]; i < batch.group_offsets[g + 1]; ++i) {
      token_scan t;
      covariance_sums cs;  // a covariance selection's sums: they count the valid tokens in the same read
      if constexpr (covariance) cs = response_covariance_sums(b, i);
      if (tokens) {
        t.n = sums.valid[static_cast<std::size_t>(i)];
        if (reads.old_mean) t.old_sum = sums.old_sum[static_cast<std::size_t>(i)];
      } else if (covariance && !reads.old_mean) {
        t.n = static_cast<index_t>(cs.n);
      } else if (counted.empty()) {
        t = scan(i);
      } else {
        t.n = counted[static_cast<std::size_t>(i)];
      }
      bits |= t.status;
      valid_tokens += static_cast<double>(t.n);
      double x = input ? static_cast<double>(input[i]) : 0.0;
      if (input && !finite(x)) bits |= input_bit;
      double m2 = 0;  // their mean (diagnostics): each call reads its own A_t
      if (b.token_advantages) x = token_advantage_mean(b, i, &m2);
      const double w = given ? static_cast<double>(given[i]) : 1.0;
      if (given && !(finite(w) && w >= 0)) bits |= bad_response_weights;
      double* f = body + hist + plan_fields * static_cast<std::size_t>(part.first_response + i);
      f[plan_f_claimed] = 1;
      f[plan_f_group] = static_cast<double>(part.first_group + g + 1);
      f[plan_f_length] = static_cast<double>(t.n);
      f[plan_f_span] = static_cast<double>(b.layout.end(i) - b.layout.begin(i));
      f[plan_f_old_mean] = t.n > 0 ? t.old_sum / static_cast<double>(t.n) : 0.0;
      f[plan_f_input] = x;
      f[plan_f_weight] = w;
      if constexpr (covariance) {
        if (!finite(cs.logp)) bits |= bad_logp;  // the step's mean logp would be NaN on every part
        double* cv = body + covariance_slots * static_cast<std::size_t>(part.first_response + i);
        cv[0] = cs.logp;
        cv[1] = cs.adv;
        cv[2] = (b.token_advantages ? covariance_token_advantages : 0) + (i == 0 ? covariance_part_start : 0);
      }
    }
  }
  for (int k = 0; k < 16; ++k)
    if (bits & (1u << k)) s.values[plan_h_status + k] = 1;
  if (window.lo <= window.hi) {
    // The histogram of a windowed part: its candidates digit by digit, the tokens above the window
    // on the digit after it and those below on the digit before it (see window_sampling).
    const cut_candidates& c = state->candidates;
    constexpr int shift = static_cast<int>(sizeof(T) * 8) - plan_digit_bits;
    std::vector<std::uint32_t> counts(window.hi - window.lo + 1, 0);
    for (const std::uint64_t k : c.keys) ++counts[(k >> shift) - window.lo];
    for (std::size_t d = 0; d < counts.size(); ++d)
      if (counts[d]) histogram_add(body, window.lo + d, counts[d]);
    double above = 0;
    for (const std::int64_t a : c.above) above += static_cast<double>(a);
    const double below = valid_tokens - above - static_cast<double>(c.keys.size());
    if (above > 0 && window.hi + 1 < plan_buckets) histogram_add(body, window.hi + 1, above);
    if (below > 0) histogram_add(body, window.lo - 1, below);
    state->window = next_window_id();
    hold_before_plan(*state, R, b.entropy, sizeof(T));
    s.values[plan_h_windows] = 1;
    s.values[plan_h_window_ids] = static_cast<double>(state->window);
  } else if (state) {
    *state = part_rounds{};
  }
  return s;
}
}  // namespace detail

// Stage 0: a part's summary (host memory). Structural errors of the part's batch throw here;
// errors in the values the plan reads (rewards or given advantages and weights, old_logp for a
// weight that averages it, the entropies of a selection) are carried in the summary and thrown by
// finish_plan on every part alike. The other per-token values are checked by the part's call.
// `tokens` (optional): the part's token passes run where its tokens are.
template <class Obj, class T>
step_summary summarize(const Obj& obj, const batch_view<T>& batch, const step_part& part,
                       const part_token_source* tokens = nullptr) {
  return detail::summarize_part(obj, batch, part, tokens, nullptr, window_sampling{});
}
// The same with the part's state for the rounds: with an 80/20 cut to find on the host, a large
// part's summary is windowed (window_sampling) and its cut candidates stay in `state` for the
// plan's rounds (pass the same state and batch to plan_round); otherwise the state is emptied.
template <class Obj, class T>
step_summary summarize(const Obj& obj, const batch_view<T>& batch, const step_part& part, part_rounds& state,
                       const window_sampling& sampling = {}, const part_token_source* tokens = nullptr) {
  return detail::summarize_part(obj, batch, part, tokens, &state, sampling);
}

namespace detail {
// The header of a summed stage-0 summary whose parts agree: their number, value width and
// fingerprint, which must be that of `step` and the objective (else fails naming `argument`).
struct summed_head {
  double parts = 0;
  std::size_t width = 0;
  std::uint64_t fp = 0;
};
template <class Obj>
summed_head stage0_head(const Obj& obj, const step_summary& s, const step_info& step, const char* argument,
                        const char* mismatch) {
  summed_head h;
  check_plan_header(s, 0, h.fp, false);
  h.parts = s.values[plan_h_parts];
  h.width = static_cast<std::size_t>(s.values[plan_h_width] / h.parts);
  if (plan_fingerprint(obj, step, h.width) != h.fp) fail(argument, mismatch);
  return h;
}
}  // namespace detail

// Moves a stage-0 summary made with a provisional place in the step to its real place: the
// summary of parts that were summarised as a step of their own (`provisional`: the same id, scale
// and configuration, their own number of responses; the first part at response 0 and group 0)
// becomes the summary of the same parts starting at response `first_response` and group
// `first_group` of `step`. A rank can so summarise its micro-batches while the ranks' layout (where
// each rank starts) is still being exchanged, and place them once it is known: the result equals
// summarising with the real parts. The fields move, their group ids shift, and the header takes
// the step's fingerprint.
template <class Obj>
void place_summary(const Obj& obj, step_summary& s, const step_info& provisional, const step_info& step,
                   index_t first_response, index_t first_group) {
  using namespace detail;
  const summed_head head = stage0_head(obj, s, provisional, "summary",
                                       "was not made for the provisional step (its id, scale, configuration and "
                                       "responses) or objective");
  const double parts = head.parts;
  const std::size_t width = head.width;
  require(step.id == provisional.id && step.scale == provisional.scale && step.config == provisional.config,
          "step", "must differ from the provisional step in its number of responses only");
  const std::size_t hist = stage0_block(obj, provisional.responses);
  const auto R = static_cast<std::size_t>(provisional.responses);
  require(s.values.size() == plan_header + hist + plan_fields * R, "summary",
          "has the wrong size for the provisional step's " + std::to_string(R) + " responses");
  require(first_group >= 0, "first_group", "must be >= 0");
  require(first_response >= 0 && provisional.responses + first_response <= step.responses, "first_response", "the parts' responses [" + std::to_string(first_response) + ", " +
                                std::to_string(first_response + provisional.responses) + ") must lie in the step's " +
                                std::to_string(step.responses));
  const auto first = static_cast<std::size_t>(first_response);
  const std::size_t shift = plan_fields * first;
  double* f = nullptr;
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
    // The covariance block is per response too: both move.
    const std::size_t slots = covariance_slots * static_cast<std::size_t>(step.responses);
    std::vector<double> v(plan_header + slots + plan_fields * static_cast<std::size_t>(step.responses), 0.0);
    std::copy(s.values.begin(), s.values.begin() + plan_header, v.begin());
    const double* old = s.values.data() + plan_header;
    std::copy(old, old + hist, v.data() + plan_header + covariance_slots * first);
    std::copy(old + hist, old + hist + plan_fields * R, v.data() + plan_header + slots + shift);
    s.values = std::move(v);
    f = s.values.data() + plan_header + slots;
  } else {
    const std::size_t body = plan_header + hist;
    s.values.resize(body + plan_fields * static_cast<std::size_t>(step.responses), 0.0);
    f = s.values.data() + body;
    if (shift > 0) {
      std::memmove(f + shift, f, plan_fields * R * sizeof(double));
      std::fill(f, f + shift, 0.0);
    }
  }
  for (std::size_t i = 0; i < R; ++i) {
    double& g = f[shift + plan_fields * i + plan_f_group];
    if (g != 0) g += static_cast<double>(first_group);  // 0: a response no part claimed
  }
  write_fingerprint(s, plan_fingerprint(obj, step, width), parts);
}

namespace detail {
// finish_plan's per-response arrays, kept by the thread for its next plans: fresh ones for a step
// of 16K responses cost their page faults and the kernel's zeroing on every plan.
struct finish_scratch {
  std::vector<index_t> group_offsets, token_offsets;
  std::vector<double> old_mean, input, given, log_weight;
  std::vector<std::uint32_t> response_status, group_status;
  std::vector<std::uint8_t> group_zero;
};
inline finish_scratch& thread_finish_scratch() {
  thread_local finish_scratch s;
  return s;
}
}  // namespace detail

// The plan from the sum of every part's summary (the same on every part).
template <class Obj>
step_plan finish_plan(const Obj& obj_in, const step_info& step, const step_summary& total) {
  using namespace detail;
  obj_in.validate();
  const summed_head head =
      stage0_head(obj_in, total, step, "plan", "the summaries were made for another step or objective than this one");
  const std::uint64_t fp = head.fp;
  const std::size_t width = head.width;
  std::uint32_t bits = 0;
  for (int k = 0; k < 16; ++k)
    if (total.values[plan_h_status + k] > 0) bits |= 1u << k;
  throw_if_error(bits);

  const index_t R = step.responses;
  const std::size_t fields = plan_fields * static_cast<std::size_t>(R);
  const std::size_t hist = stage0_block(obj_in, R);
  require(total.values.size() == plan_header + hist + fields, "plan",
          "summary of the wrong size for the step's " + std::to_string(R) + " responses");
  const double* body = total.values.data() + plan_header;
  auto field = [&](index_t i, std::size_t f) { return body[hist + plan_fields * static_cast<std::size_t>(i) + f]; };

  // Every response of the step comes from exactly one part; group ids never decrease.
  finish_scratch& sc = thread_finish_scratch();
  std::vector<index_t>& group_offsets = sc.group_offsets;
  std::vector<index_t>& token_offsets = sc.token_offsets;
  std::vector<double>& old_mean = sc.old_mean;
  std::vector<double>& input = sc.input;
  std::vector<double>& given = sc.given;
  group_offsets.assign(1, 0);
  token_offsets.assign(1, 0);
  token_offsets.reserve(static_cast<std::size_t>(R) + 1);
  old_mean.resize(R);  // every one written below
  input.resize(R);
  given.resize(R);
  std::vector<index_t> length(R);  // becomes the plan's
  for (index_t i = 0; i < R; ++i) {
    const double c = field(i, plan_f_claimed);
    if (c != 1)
      fail("plan", "response " + std::to_string(i) + " of the step is in " + std::to_string(static_cast<long long>(c)) +
                       " parts (each response must be in exactly one part)");
    const double g = field(i, plan_f_group);
    if (i > 0) {
      const double prev = field(i - 1, plan_f_group);
      if (g < prev)
        fail("plan", "group ids decrease at response " + std::to_string(i) +
                         " of the step (a part's first_group is wrong)");
      if (g != prev) group_offsets.push_back(i);
    }
    length[i] = static_cast<index_t>(field(i, plan_f_length));
    token_offsets.push_back(token_offsets.back() + static_cast<index_t>(field(i, plan_f_span)));
    old_mean[i] = field(i, plan_f_old_mean);
    input[i] = field(i, plan_f_input);
    given[i] = field(i, plan_f_weight);
  }
  if (R > 0) group_offsets.push_back(R);

  // The group and batch stages of the whole step, with the call's own passes (in double).
  const auto obj = obj_in.prepared();
  using O = std::decay_t<decltype(obj)>;
  using adv_t = typename O::advantage_type;
  constexpr bool reads_rewards = adv_t::input == advantage_input::rewards;
  batch_pointers<double> b;
  b.layout = packed(span<const index_t>(token_offsets));
  b.layout.tokens = token_offsets.back();
  b.group_offsets = group_offsets.data();
  b.groups = static_cast<index_t>(group_offsets.size()) - 1;
  if (reads_rewards) b.rewards = input.data(); else b.advantages = input.data();
  b.response_weights = given.data();

  step_plan plan;
  plan.fingerprint_ = fp;
  plan.serial_ = next_plan_serial();
  plan.step_ = step;
  plan.width_ = width;
  plan.adv_.assign(R, 0.0);
  plan.weight_.assign(R, 0.0);
  plan.capped_.assign(R, 0);
  plan.length_ = std::move(length);
  std::vector<double>& log_weight = sc.log_weight;
  std::vector<std::uint32_t>& response_status = sc.response_status;
  log_weight.assign(R, 0.0);
  response_status.assign(R, 0);  // the inputs were checked by summarize
  response_scratch r;
  r.status = response_status.data();
  r.length = plan.length_.data();
  r.old_mean = old_mean.data();
  r.log_weight = log_weight.data();
  r.adv = plan.adv_.data();
  r.weight = plan.weight_.data();
  r.capped = plan.capped_.data();
  std::vector<std::uint32_t>& group_status = sc.group_status;
  std::vector<std::uint8_t>& group_zero = sc.group_zero;
  group_status.assign(b.groups > 0 ? b.groups : 1, 0);
  group_zero.assign(b.groups > 0 ? b.groups : 1, 0);
  group_fn<O, double> gf{obj, b, r, group_status.data(), group_zero.data()};
  std::uint32_t gbits = 0;
  for (index_t g = 0; g < b.groups; ++g) {
    gf(g);
    gbits |= group_status[g];
  }
  if ((gbits & weight_overflow) && (gbits & (weight_overflow - 1)) == 0 && weight_reads_rollout_logp(obj.weight))
    fail("batch.rollout_logp", rollout_weight_overflow);
  throw_if_error(gbits);
  objective_scalars s{};
  batch_partial_fn<double> bp{b, r, reads_rewards};
  s.batch = batch_partial::reduce(R, bp);  // two passes: no chain of divisions over the step's responses
  batch_stats_fn<O>{&s, obj}(0);
  if (batch_stage_of(obj.advantage) != advantage_batch_stage::none ||
      obj.weight.normalisation() == weight_normalisation::batch_mean) {
    finalize_response_fn<O> fin{obj, r, &s};
    for (index_t i = 0; i < R; ++i) fin(i);
  }

  aggregation_counts v;
  v.tokens = s.batch.tokens;
  v.responses = s.batch.nonempty;
  v.all_responses = static_cast<double>(R);
  v.max_length = s.batch.longest;
  plan.valid_ = v;
  plan.policy_ = v;
  plan.stage_ = step_plan::stage_kind::complete;
  plan.stage_index_ = 1;
  plan.summary_histograms_ = summary_has_histogram(obj_in) ? 1 : 0;
  if constexpr (is_covariance_selection_v<typename O::selector_type>) {
    // Clip-Cov / KL-Cov over the step: the means from the per-response sums added in response
    // order (as one call adds them), then the k largest selection values (covariance_values: the
    // covariances, or the candidates' negated keys) by the radix rounds on doubles.
    const auto& p = obj.select.params;
    covariance_means m;
    for (index_t i = 0; i < R; ++i) {
      const double* cv = body + covariance_slots * static_cast<std::size_t>(i);
      covariance_sums c;
      c.n = static_cast<double>(plan.length_[i]);
      c.logp = cv[0];
      c.adv = cv[1];
      const int flags = static_cast<int>(cv[2]);
      covariance_add(m, c, plan.adv_[i], (flags & covariance_token_advantages) != 0);
      if (flags & covariance_part_start) plan.part_starts_.push_back(i);
    }
    const index_t k = covariance_count(p.ratio, m.n);
    covariance_finish(m);
    plan.covariance_ = true;
    plan.covariance_means_[0] = m.adv;
    plan.covariance_means_[1] = m.logp;
    plan.has_selection_ = true;
    plan.select_ = top_entropy_selection::params_type{};
    plan.select_.rule = selection_rule::top_k;
    plan.select_k_ = k;
    plan.width_ = sizeof(double);
    if (k == 0) {
      plan.cut_ = entropy_cut{HUGE_VAL, -1};
      plan.stage_ = step_plan::stage_kind::cut_counts;
    } else {
      plan.stage_ = step_plan::stage_kind::top_values;
      if (plan.round_body() > covariance_table_limit) {
        // Radix rounds: the rank waits for the parts' candidates to be counted (advance).
        plan.targets_ = 1;
        plan.stage_ = step_plan::stage_kind::histogram;
      }
    }
  } else if constexpr (O::selector_type::active) {
    if (!term_on(obj.select)) return plan;  // a selectable selector that is off
    const auto& p = term_of(obj.select).params;
    plan.has_selection_ = true;
    plan.kept_denominator_ = obj.kept_denominator();
    plan.select_ = p;
    const auto n = static_cast<index_t>(v.tokens);
    if (n == 0) {
      // Nothing to keep: every part keeps nothing, with or without a given cut.
      plan.cut_ = entropy_cut{HUGE_VAL, -1};
      plan.stage_ = step_plan::stage_kind::cut_counts;
    } else if (p.use_given) {
      plan.cut_ = p.given;
      if (p.rule == selection_rule::quantile) plan.cut_.ties = -1;
      plan.stage_ = step_plan::stage_kind::cut_counts;
    } else if (p.rule == selection_rule::top_k) {
      plan.select_k_ = top_k_count(p.rho, n);
      plan.ranks_[0] = plan.ranks_[1] = n - plan.select_k_;
      plan.targets_ = 1;
      plan.stage_ = step_plan::stage_kind::histogram;
    } else {
      const double pos = (1.0 - p.rho) * static_cast<double>(n - 1);
      const auto lo = static_cast<index_t>(pos);
      plan.ranks_[0] = lo;
      plan.ranks_[1] = lo + 1 < n ? lo + 1 : lo;
      plan.targets_ = 2;
      plan.stage_ = step_plan::stage_kind::histogram;
    }
    plan.rank_[0] = plan.ranks_[0];
    plan.rank_[1] = plan.ranks_[1];
    // The first digit's histogram came with the summaries (exact inside the windows of windowed
    // parts: the first round confirms them).
    if (plan.stage_ == step_plan::stage_kind::histogram) {
      plan.windows_ = total.values[plan_h_windows];
      plan.window_ids_ = total.values[plan_h_window_ids];
      plan.take_histogram(body, 0);
    }
  }
  return plan;
}

namespace detail {
// The host passes over a part's tokens, or the caller's where the tokens are.
template <class T>
void gather_part(const batch_pointers<T>& b, int done, std::uint64_t lo, std::uint64_t hi, cut_candidates& out,
                 const part_token_source* tokens) {
  if (!tokens) return gather_candidates(b, done, lo, hi, out);
  out.reset(done, lo, hi, b.layout.responses);
  tokens->gather(done, lo, hi, out);
  require(out.above.size() == static_cast<std::size_t>(b.layout.responses) && out.keys.size() == out.responses.size(),
          "tokens", "gathered cut candidates of the wrong size");
}
}  // namespace detail

// The first digits a part's cut candidates may be gathered for before the summaries are summed
// (gather_early): those that hold the targets' ranks in a histogram of the part's (or its rank's)
// own summaries, widened to the ranks `margin` standard deviations of a quantile of n
// independent draws (0.4 sqrt(n)) away, and 64 more. Parts of one step whose values come from the
// same distribution then find the step's cut inside; a part whose values differ gathers again in
// the first round. Empty (lo > hi) without a cut to find.
template <class Obj>
digit_window early_window(const Obj& obj, const step_summary& local, double margin = 4) {
  using namespace detail;
  digit_window w;
  if constexpr (!is_covariance_selection_v<typename Obj::selector_type> && Obj::selector_type::active) {
    if (!summary_has_histogram(obj) || local.values.size() < plan_header + plan_histogram) return w;
    const double* h = local.values.data() + plan_header;  // the stage-0 histogram comes first
    double n = 0;
    for (std::size_t g = 0; g < digit_groups; ++g) n += h[plan_buckets + g];
    if (n < 1) return w;
    const auto& p = term_of(obj.select).params;
    const auto N = static_cast<index_t>(n);
    index_t lo = 0, hi = 0;  // the targets' ascending ranks
    if (p.rule == selection_rule::top_k) {
      lo = hi = N - top_k_count(p.rho, N);
    } else {
      lo = static_cast<index_t>((1.0 - p.rho) * static_cast<double>(N - 1));
      hi = lo + 1 < N ? lo + 1 : lo;
    }
    const auto spread = static_cast<index_t>(margin * 0.4 * std::sqrt(n)) + 64;
    lo = lo > spread ? lo - spread : 0;
    hi = hi + spread < N ? hi + spread : N - 1;
    auto digit_of = [&](index_t rank) {  // rank < N: always found
      double below = 0;
      return static_cast<std::uint64_t>(std::min(digit_at_rank(h, static_cast<double>(rank), below), plan_buckets - 1));
    };
    w.lo = std::max<std::uint64_t>(digit_of(lo), 1);
    w.hi = digit_of(hi);
  }
  return w;
}

// Gathers a part's cut candidates for the first digits of `w` into `state` before the plan
// exists: right after the part's summary, while its data is still in the caches and the summaries
// (or the layout) are being exchanged, instead of once more after the sums arrive. The first round
// of the next plan that takes a round with this state and the same batch (the same entropies, the
// same number of responses) takes them if the step's targets fall inside the window, and gathers
// from the data if not. Needs nothing from the step: a part may gather before it knows its place.
template <class Obj, class T>
void gather_early(const Obj& obj, const batch_view<T>& batch, digit_window w, part_rounds& state,
                  const part_token_source* tokens = nullptr) {
  state = part_rounds{};
  if (!detail::summary_has_histogram(obj) || w.lo > w.hi) return;
  const detail::batch_pointers<T> b = detail::pointers_of(batch);
  detail::hold_before_plan(state, batch.layout.responses, b.entropy, sizeof(T));
  gather_part(b, detail::plan_digit_bits, w.lo, w.hi, state.candidates, tokens);
}

namespace detail {

// Whether a part's state holds candidates gathered for this plan, part (of R responses) and batch.
inline bool gathered_for(const part_rounds& st, const step_plan& plan, const step_part& part, index_t R,
                         const void* entropy) {
  return st.plan == plan.serial() && st.first_response == part.first_response && st.responses == R &&
         st.entropy == entropy && st.candidates.lo <= st.candidates.hi;
}

// Whether a part's state covers the plan's current prefixes [lo, hi] at `done` bits.
inline bool covers(const part_rounds& st, const step_plan& plan, const step_part& part, index_t R,
                   const void* entropy, int done, std::uint64_t lo, std::uint64_t hi) {
  const cut_candidates& c = st.candidates;
  if (!gathered_for(st, plan, part, R, entropy) || c.done > done) return false;
  const int s = done - c.done;
  return (lo >> s) >= c.lo && (hi >> s) <= c.hi;
}

// Whether the cut lies inside the values of a state's prefix range (then every token outside the
// candidates is on the same side of the cut as its range; NaN bounds fail the test).
inline bool cut_inside(const cut_candidates& c, std::size_t width, double cut) {
  const int s = static_cast<int>(width * 8) - c.done;
  const std::uint64_t low = c.lo << s, high = (c.hi << s) | ((std::uint64_t(1) << s) - 1);
  return key_value(low, width) <= cut && cut <= key_value(high, width);
}

}  // namespace detail

namespace detail {
template <class T>
void fill_round(const step_plan& plan, const batch_pointers<T>& b, const step_part& part, part_rounds* state,
                const part_token_source* tokens, step_summary& s);

// A covariance selection's round for a part: its candidates (covariance_candidates, gathered
// once per plan into the state, or every round without one) narrowed to the plan's prefix and
// counted by their next digit, or per response above and on the cut. The tokens left out lie
// below the cut, on no digit the rounds look at.
template <class Obj, class T>
void covariance_round(const Obj& obj, const step_plan& plan, const batch_pointers<T>& b, const step_part& part,
                      part_rounds* state, step_summary& s) {
  const index_t R = b.layout.responses;
  part_rounds scratch;
  part_rounds& st = state ? *state : scratch;
  cut_candidates& c = st.candidates;
  if (!gathered_for(st, plan, part, R, b.logp)) {
    st.plan = plan.serial();
    st.pending = st.window = 0;
    st.first_response = part.first_response;
    st.responses = R;
    st.entropy = b.logp;
    covariance_means m;
    m.adv = plan.covariance_adv_mean();
    m.logp = plan.covariance_logp_mean();
    std::int64_t valid = 0;  // the part's valid tokens (the summaries counted them)
    for (index_t i = 0; i < R; ++i) valid += plan.valid_tokens(part.first_response + i);
    st.left_out = covariance_candidates(obj, b, plan.advantages().data() + part.first_response, m,
                                        part.first_response, plan.selected_count(), c, {}, valid);
  }
  double* out = s.values.data() + plan_header;
  constexpr int W = 64;
  if (plan.stage() == step_plan::stage_kind::top_values) {
    // The part's first k candidates in the step's order (all of them when fewer) as (value,
    // response) pairs in its slots; the last slot counts the parts that sent fewer than all their
    // selectable tokens.
    const auto K = static_cast<std::size_t>(plan.selected_count());
    out[plan.round_body() - 1] = st.left_out || c.keys.size() > K ? 1 : 0;  // after every part's slots
    if (R == 0) return;
    const index_t p = plan.part_slot(part.first_response);
    require(p >= 0, "part.first_response", "starts no part of the step's summaries (" +
                                               std::to_string(part.first_response) + ")");
    thread_local std::vector<std::size_t> order;
    order.resize(c.keys.size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    const std::size_t n = std::min(K, order.size());
    if (n < order.size())
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                       [&c](std::size_t a, std::size_t b) {
                         return before_in_step(c.keys[a], c.responses[a], c.keys[b], c.responses[b]);
                       });
    double* slot = out + static_cast<std::size_t>(p) * plan.part_top_values();
    slot[0] = static_cast<double>(n);
    for (std::size_t j = 0; j < n; ++j) {
      slot[1 + 2 * j] = key_value(c.keys[order[j]], sizeof(double));
      slot[2 + 2 * j] = static_cast<double>(part.first_response + c.responses[order[j]]);
    }
  } else if (plan.stage() == step_plan::stage_kind::histogram) {
    const int done = plan.round() * plan_digit_bits;
    if (done > 0) c.narrow(W, done, plan.prefix(0), plan.prefix(0));
    const int shift = W - done - plan_digit_bits;
    for (const std::uint64_t k : c.keys) histogram_add(out, (k >> shift) & (plan_buckets - 1), 1);
    if (plan.round() == 0) out[plan_histogram] = st.left_out ? 1 : 0;
  } else {
    const double cut = plan.cut().value;
    for (index_t i = 0; i < R; ++i) out[2 * (part.first_response + i)] = static_cast<double>(c.above[static_cast<std::size_t>(i)]);
    for (std::size_t k = 0; k < c.keys.size(); ++k) {
      const double x = key_value(c.keys[k], sizeof(double));
      double* o = out + 2 * (part.first_response + c.responses[k]);
      o[0] += x > cut;
      o[1] += x == cut;
    }
  }
}
}  // namespace detail

// A part's summary for the plan's pending round (host memory): a histogram of its entropy keys
// under the current prefix, or its per-response counts above and on the cut. `state` (optional)
// keeps the part's cut candidates from one round to the next; `tokens` (optional) reads the
// part's tokens where they are, as for summarize.
template <class Obj, class T>
step_summary plan_round(const Obj& obj, const step_plan& plan, const batch_view<T>& batch, const step_part& part,
                        part_rounds* state = nullptr, const part_token_source* tokens = nullptr) {
  using namespace detail;
  require(!plan.complete(), "plan", "is complete; no round is pending");
  require(plan_fingerprint(obj, part.step, sizeof(T)) == plan.fingerprint(), "plan",
          "was built for another step, objective or value type than this part");
  const index_t R = batch.layout.responses;
  require(part.first_response >= 0 && part.first_response + R <= part.step.responses, "part.first_response",
          "the part's responses must lie in the step");
  const batch_pointers<T> b = pointers_of(batch);
  step_summary s = plan_summary(plan.round_body(), plan.stage_index(), sizeof(T), plan.fingerprint());
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) {
    refuse_token_source(tokens);
    covariance_round(obj, plan, b, part, state, s);
  } else {
    fill_round(plan, b, part, state, tokens, s);
  }
  return s;
}

namespace detail {
// A part's round of the plan into s (its header made): histogram or cut counts of the values
// b.entropy where b's mask is set.
template <class T>
void fill_round(const step_plan& plan, const batch_pointers<T>& b, const step_part& part, part_rounds* state,
                const part_token_source* tokens, step_summary& s) {
  const index_t R = b.layout.responses;
  const bool histogram = plan.stage() == step_plan::stage_kind::histogram;
  double* out = s.values.data() + plan_header;
  part_rounds scratch;
  part_rounds& st = state ? *state : scratch;
  // Candidates gathered early: this plan's if it is the first to take a round with them, at its
  // first round, with the batch they were gathered from.
  if (st.pending != 0) {
    if (st.plan == 0 && st.pending == sizeof(T) && plan.stage_index() == 1 && st.entropy == b.entropy &&
        st.responses == R) {
      st.plan = plan.serial();
      st.first_response = part.first_response;
    }
    st.pending = 0;
  }
  const int W = static_cast<int>(sizeof(T) * 8);
  if (histogram && plan.round() == 0) {
    // Every first digit (a windowed stage 0 missed the step's targets): one histogram.
    if (tokens) {
      part_token_sums sums;
      tokens->sums(false, false, true, sums);
      require(sums.histogram.size() == plan_histogram, "tokens", "returned a histogram of the wrong size");
      std::copy(sums.histogram.begin(), sums.histogram.end(), out);
    } else {
      bool nonfinite = false;  // checked by the summaries
      first_digit_histogram(b, out, &nonfinite);
    }
  } else if (histogram) {
    // The candidates under the targets' prefixes (the two targets of a quantile may differ),
    // gathered from the data or narrowed from the previous round's.
    const int done = plan.round() * plan_digit_bits;
    const std::uint64_t lo = plan.prefix(0), hi = plan.prefix(plan.targets() - 1);
    // After a windowed stage 0, a windowed part confirms that its window holds the targets'
    // digits (the plan compares the count and the ids with stage 0's); one that does not leaves
    // the round empty, which the plan then discards.
    const bool windowed = plan.windows() > 0 && st.window != 0 && gathered_for(st, plan, part, R, b.entropy);
    if (covers(st, plan, part, R, b.entropy, done, lo, hi)) {
      st.candidates.narrow(W, done, lo, hi);
      if (windowed) {
        s.values[plan_h_windows] = 1;
        s.values[plan_h_window_ids] = static_cast<double>(st.window);
      }
    } else if (windowed) {
      return;
    } else {
      st.plan = plan.serial();
      st.first_response = part.first_response;
      st.responses = R;
      st.entropy = b.entropy;
      gather_part(b, done, lo, hi, st.candidates, tokens);
    }
    const cut_candidates& c = st.candidates;
    const int shift = W - done - plan_digit_bits;
    for (int j = 0; j < plan.targets(); ++j) {
      double* hj = out + static_cast<std::size_t>(j) * plan_histogram;
      for (std::size_t k = 0; k < c.keys.size(); ++k)
        if ((c.keys[k] >> (W - done)) == plan.prefix(j))
          histogram_add(hj, (c.keys[k] >> shift) & (plan_buckets - 1), 1);
    }
  } else {
    const double cut = plan.cut().value;
    std::vector<std::int64_t> above(static_cast<std::size_t>(R)), on(static_cast<std::size_t>(R));
    const cut_candidates& c = st.candidates;
    if (state && gathered_for(st, plan, part, R, b.entropy) && cut_inside(c, sizeof(T), cut)) {
      // Outside the candidates' range every token lies on the side its range does.
      above = c.above;
      for (std::size_t k = 0; k < c.keys.size(); ++k) {
        const double x = key_value(c.keys[k], sizeof(T));
        const auto i = static_cast<std::size_t>(c.responses[k]);
        above[i] += x > cut;
        on[i] += x == cut;
      }
    } else if (tokens) {
      tokens->count_cut(cut, above.data(), on.data());
    } else {
      count_cut(b, cut, above.data(), on.data());
    }
    for (index_t i = 0; i < R; ++i) {
      out[2 * (part.first_response + i)] = static_cast<double>(above[i]);
      out[2 * (part.first_response + i) + 1] = static_cast<double>(on[i]);
    }
  }
}
}  // namespace detail

// Gradient accumulation in one process: the plan of a step given as parts (batches[p] is part
// parts[p]), with the summaries added here instead of all-reduced.
template <class Obj, class T>
step_plan plan_step(const Obj& obj, const step_info& step, const std::vector<batch_view<T>>& batches,
                    const std::vector<step_part>& parts, const window_sampling& sampling = {}) {
  detail::require(batches.size() == parts.size() && !parts.empty(), "parts",
                  "needs one step_part per batch (and at least one)");
  step_summary total;
  std::vector<part_rounds> states(parts.size());
  for (std::size_t p = 0; p < parts.size(); ++p) total += summarize(obj, batches[p], parts[p], states[p], sampling);
  step_plan plan = finish_plan(obj, step, total);
  detail::recycle_taken(std::move(total), plan.summary_histograms());
  while (!plan.complete()) {
    step_summary round;
    for (std::size_t p = 0; p < parts.size(); ++p) round += plan_round(obj, plan, batches[p], parts[p], &states[p]);
    const std::size_t round_histograms = detail::round_histograms(plan);
    plan.advance(round);
    detail::recycle_taken(std::move(round), round_histograms);
  }
  return plan;
}

RECO_NAMESPACE_END
