// Per-response and per-group passes of the generic objective algorithm. Each functor is a
// namespace-scope type (nvcc cannot pass private nested types to kernels) whose operator() runs
// on the host or the device.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "reco/algorithm/call_stages.hpp"
#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/token_body.hpp"
#include "reco/advantage/common.hpp"
#include "reco/batch.hpp"
#include "reco/component.hpp"
#include "reco/detail/math.hpp"
#include "reco/result.hpp"
#include "reco/weight/common.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

// Pointers to one call's inputs, in the backend's memory (null = not supplied).
template <class T>
struct batch_pointers {
  token_layout layout{};
  const index_t* group_offsets = nullptr;
  index_t groups = 0;
  const T* logp = nullptr;
  const T* old_logp = nullptr;
  const T* ref_logp = nullptr;
  const T* entropy = nullptr;
  const std::uint8_t* mask = nullptr;
  const T* token_weights = nullptr;
  const T* rewards = nullptr;
  const T* advantages = nullptr;
  const T* token_advantages = nullptr;  // given: A_t replaces the response's advantage per token
  const T* response_weights = nullptr;
  const T* rollout_logp = nullptr;  // given only when the weight averages it instead of old_logp

  RECO_HOST_DEVICE bool valid(index_t t) const { return mask == nullptr || mask[t] != 0; }
  // The advantage of token t of a response whose advantage is `response`.
  RECO_HOST_DEVICE double advantage_at(index_t t, double response) const {
    return token_advantages ? static_cast<double>(token_advantages[t]) : response;
  }
};

template <class T>
batch_pointers<T> pointers_of(const batch_view<T>& b) {
  batch_pointers<T> p;
  p.layout = b.layout;
  p.layout.tokens = b.logp.size();
  p.group_offsets = b.group_offsets.data();
  p.groups = b.group_offsets.size() > 0 ? b.group_offsets.size() - 1 : 0;
  auto opt = [](const span<const T>& s) { return s.empty() ? nullptr : s.data(); };
  p.logp = b.logp.data();
  p.old_logp = opt(b.old_logp);
  p.ref_logp = opt(b.ref_logp);
  p.entropy = opt(b.entropy);
  p.mask = b.mask.empty() ? nullptr : b.mask.data();
  p.token_weights = opt(b.token_weights);
  p.rewards = opt(b.rewards);
  p.advantages = opt(b.advantages);
  p.token_advantages = opt(b.token_advantages);
  p.response_weights = opt(b.response_weights);
  p.rollout_logp = opt(b.rollout_logp);
  return p;
}

// What pass 1 finds in one response's tokens.
struct token_scan {
  index_t n = 0, first = -1, last = -1;  // valid tokens, first and last valid position
  double old_sum = 0;                    // sum of old_logp (logp when on-policy; rollout_logp when given) over them
  std::uint32_t status = 0;              // value checks of the per-token inputs
};

// The value checks of a call's per-token inputs (logp always; the others where the batch holds
// them and the call reads them).
template <class T>
RECO_HOST_DEVICE token_checks all_token_checks(const batch_pointers<T>& b, const input_checks& checks) {
  return token_checks{b.old_logp != nullptr, checks.ref, checks.entropy, b.token_weights != nullptr};
}
// The checks of `all` that `moved` takes to another pass (in == false) or those it takes (true).
RECO_HOST_DEVICE inline token_checks checks_split(const token_checks& all, const token_checks& moved, bool in) {
  token_checks c;
  c.logp = all.logp && moved.logp == in;
  c.old_logp = all.old_logp && moved.old_logp == in;
  c.ref_logp = all.ref_logp && moved.ref_logp == in;
  c.entropy = all.entropy && moved.entropy == in;
  c.token_weights = all.token_weights && moved.token_weights == in;
  return c;
}

// A response's mean old log-prob from its sum over its n valid tokens (0 for none): one formula
// for the scan and for the token pass that weighs (token_fn::weight_from_sum), so their bits agree.
RECO_HOST_DEVICE inline double old_mean_of(double sum, index_t n) {
  return n > 0 ? sum / static_cast<double>(n) : 0.0;
}

// Pass 1, per response: offsets, valid-token count and span, mean old log-prob, value checks.
// A host backend's call moves the checks of the inputs no stage reads before the token pass into
// that pass (`deferred`), and sums old_logp only for a response weight (`sums_old`): its scan
// then reads the mask alone where it can, and the tokens' values are read once.
template <class T>
struct scan_response_fn {
  batch_pointers<T> b;
  input_checks checks;
  response_scratch r;
  token_checks deferred{false, false, false, false, false};
  bool sums_old = true;

  RECO_HOST_DEVICE void operator()(index_t i) const {
    finish(i, scan_tokens(b.layout.begin(i), b.layout.end(i)));
  }
  // Which per-token inputs the value checks read.
  RECO_HOST_DEVICE token_checks per_token_checks() const { return checks_split(all_token_checks(b, checks), deferred, false); }
  // Whether the scan reads any token value (else the mask alone).
  RECO_HOST_DEVICE bool reads_values() const { return sums_old || per_token_checks().any(); }

  // The tokens [begin, end) one at a time.
  RECO_HOST_DEVICE token_scan scan_tokens(index_t begin, index_t end) const {
    token_scan s;
    const token_checks which = per_token_checks();
    const bool values = reads_values();
    token_faults<double> faults;
    for (index_t t = begin; t < end; ++t) {
      if (!b.valid(t)) continue;
      ++s.n;
      if (s.first < 0) s.first = t;
      s.last = t;
      if (!values) continue;
      const double lp = static_cast<double>(b.logp[t]);
      const double old = b.old_logp ? static_cast<double>(b.old_logp[t]) : lp;
      if (sums_old) s.old_sum += b.rollout_logp ? static_cast<double>(b.rollout_logp[t]) : old;
      token_value_checks(faults, which, true, lp, old, which.ref_logp ? static_cast<double>(b.ref_logp[t]) : 0.0,
                         which.entropy ? static_cast<double>(b.entropy[t]) : 0.0,
                         which.token_weights ? static_cast<double>(b.token_weights[t]) : 0.0);
    }
    s.status |= fault_status(faults);
    return s;
  }

  // The per-response checks and the outputs.
  RECO_HOST_DEVICE void finish(index_t i, const token_scan& s) const {
    std::uint32_t st = s.status;
    const token_layout& L = b.layout;
    if (L.kind == layout_kind::packed) {
      const index_t o0 = L.offsets[i], o1 = L.offsets[i + 1];
      if (o1 < o0 || o0 < 0 || o1 > L.tokens) st |= bad_token_offsets;
      if (i == 0 && o0 != 0) st |= bad_token_offsets;
      if (i == L.responses - 1 && o1 != L.tokens) st |= bad_token_offsets;
    }
    if (checks.rewards && !finite(static_cast<double>(b.rewards[i]))) st |= bad_rewards;
    if (checks.advantages && !finite(static_cast<double>(b.advantages[i]))) st |= bad_advantages;
    if (checks.response_weights) {
      const double w = static_cast<double>(b.response_weights[i]);
      if (!finite(w) || w < 0) st |= bad_response_weights;
    }
    r.length[i] = s.n;
    r.first[i] = s.first;
    r.last[i] = s.last;
    r.old_mean[i] = old_mean_of(s.old_sum, s.n);
    r.status[i] = st;
  }
};

// Whether the 8 mask bytes at m are all zero.
inline bool mask_word_zero(const std::uint8_t* m) {
  std::uint64_t w;
  std::memcpy(&w, m, sizeof(w));
  return w == 0;
}

// The first and last valid token of [begin, end) into s; false when there is none. Packed scans
// read only that span, as packs from its first token (their sums round the same way). Masked
// runs are skipped 8 bytes at a time: a padded row's masked tail, byte by byte, was a quarter of
// the step plan's scan of old_logp (1,024-slot rows, a third of them padding).
inline bool trim_to_valid(const std::uint8_t* mask, index_t begin, index_t end, token_scan& s) {
  index_t first = begin, last = end - 1;
  if (mask) {
    while (end - first >= 8 && mask_word_zero(mask + first)) first += 8;
    while (first < end && mask[first] == 0) ++first;
    // mask[first] is valid here (or first == end): the words skipped lie after it.
    while (last - first >= 8 && mask_word_zero(mask + last - 7)) last -= 8;
    while (last > first && mask[last] == 0) --last;
  }
  if (first > last) return false;
  s.first = first;
  s.last = last;
  return true;
}


// ---- the error path of a host-accessible backend --------------------------------------------
//
// The status word says which input failed a value check, not where or how. When the data can be
// read on the host, the first failing token of that input is looked up (the cost is irrelevant
// on this path) and named with its position and cause.

// What is wrong with one value of a per-token input ("" when nothing), per token_value_checks.
inline std::string token_fault_cause(std::uint32_t bit, double x) {
  char value[32];
  std::snprintf(value, sizeof value, "%.6g", x);
  if (x != x) return "is NaN";
  if (x - x != 0) return x > 0 ? "is +inf" : "is -inf";
  if ((bit == bad_logp || bit == bad_old_logp || bit == bad_ref_logp) && x > 0)
    return std::string("is positive (") + value + "); log-probabilities must be <= 0";
  if (bit == bad_token_weights && x < 0) return std::string("is negative (") + value + "); weights must be >= 0";
  return "";
}

// For a token-value bit: "token t (response i, position k) <cause>" of the first failing valid
// token of that input, "" when none is found (or the bit is not a token-value bit).
template <class T>
std::string locate_token_fault(const batch_pointers<T>& b, std::uint32_t bit) {
  const T* values = bit == bad_logp            ? b.logp
                    : bit == bad_old_logp      ? b.old_logp
                    : bit == bad_ref_logp      ? b.ref_logp
                    : bit == bad_entropy       ? b.entropy
                    : bit == bad_token_weights ? b.token_weights
                                               : nullptr;
  if (values == nullptr) return "";
  const token_layout& L = b.layout;
  for (index_t i = 0; i < L.responses; ++i)
    for (index_t t = L.begin(i); t < L.end(i); ++t) {
      if (!b.valid(t)) continue;
      const std::string cause = token_fault_cause(bit, static_cast<double>(values[t]));
      if (!cause.empty())
        return "token " + std::to_string(t) + " (response " + std::to_string(i) + ", position " +
               std::to_string(t - L.begin(i)) + ") " + cause;
    }
  return "";
}

// Throws for the first error in `status` (the order of describe_status), naming the failing
// token of a per-token input. Offsets come first in that order, so the layout can be walked.
template <class T>
void throw_data_error(const batch_pointers<T>& b, std::uint32_t status) {
  for (const auto& e : status_table) {
    if (!(status & e.bit)) continue;
    if (e.bit == weight_overflow && b.rollout_logp != nullptr) fail("batch.rollout_logp", rollout_weight_overflow);
    const std::string where = locate_token_fault(b, e.bit);
    if (!where.empty()) fail(e.argument, where);
    fail(e.argument, e.what);
  }
}

// Advantages given per token, response i: their mean over the valid tokens, and in *m2 the sum of
// squared deviations from it (the diagnostics' token-weighted moments).
template <class T>
RECO_HOST_DEVICE double token_advantage_mean(const batch_pointers<T>& b, index_t i, double* m2) {
  *m2 = 0;
  if (b.token_advantages == nullptr) return 0;  // no token at all: no advantage was needed
  const index_t begin = b.layout.begin(i), end = b.layout.end(i);
  double sum = 0, n = 0;
  for (index_t t = begin; t < end; ++t)
    if (b.valid(t)) {
      sum += static_cast<double>(b.token_advantages[t]);
      n += 1;
    }
  const double mean = n > 0 ? sum / n : 0.0;
  double ss = 0;
  for (index_t t = begin; t < end; ++t)
    if (b.valid(t)) {
      const double d = static_cast<double>(b.token_advantages[t]) - mean;
      ss += d * d;
    }
  *m2 = ss;
  return mean;
}

// Per response, for advantages given per token: A_i and its moments (token_advantage_mean).
// Nothing else reads A_i then: every per-token term reads A_t (batch_pointers::advantage_at).
template <class T>
struct token_advantage_moments_fn {
  batch_pointers<T> b;
  response_scratch r;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    double m2 = 0;
    r.adv[i] = token_advantage_mean(b, i, &m2);
    if (r.adv_m2) r.adv_m2[i] = m2;
  }
};

// What a response weighter sees of response j.
template <class T>
RECO_HOST_DEVICE response_context weight_context(const batch_pointers<T>& b, index_t length, double mean_old_logp,
                                                 index_t group_size, index_t j) {
  response_context ctx;
  ctx.group_size = group_size;
  ctx.length = length;
  ctx.mean_old_logp = mean_old_logp;
  ctx.given_weight = b.response_weights ? static_cast<double>(b.response_weights[j]) : 1.0;
  return ctx;
}
// The weight before any normalisation, capped at the weighter's cap (`capped` set where it bit).
template <class W>
RECO_HOST_DEVICE double capped_weight(const W& weight, const response_context& ctx, std::uint8_t& capped) {
  const double w = weight.raw(ctx), cap = weight.cap();
  capped = cap > 0 && w > cap;
  return capped ? cap : w;
}

// Pass 2, per group: group offsets, the estimator's group stage, raw capped weights and the
// group-mean weight normalisation.
template <class Obj, class T>
struct group_fn {
  Obj obj;
  batch_pointers<T> b;
  response_scratch r;
  std::uint32_t* group_status;
  std::uint8_t* group_zero_std;

  RECO_HOST_DEVICE void operator()(index_t g) const {
    std::uint32_t st = 0;
    const index_t R = b.layout.responses;
    index_t lo = b.group_offsets[g], hi = b.group_offsets[g + 1];
    if (hi < lo || lo < 0 || hi > R) st |= bad_group_offsets;
    if (g == 0 && lo != 0) st |= bad_group_offsets;
    if (g == b.groups - 1 && hi != R) st |= bad_group_offsets;
    lo = lo < 0 ? 0 : (lo > R ? R : lo);
    hi = hi < lo ? lo : (hi > R ? R : hi);
    const index_t size = hi - lo;

    using adv_t = typename Obj::advantage_type;
    const T* input = adv_t::input == advantage_input::rewards ? b.rewards : b.advantages;
    // "All rewards equal" holds vacuously for an empty group and trivially for a singleton.
    std::uint8_t zero_std = adv_t::input == advantage_input::rewards ? 1 : 0;
    // Advantages given per token (or none, for a batch without tokens): A_i was set by
    // token_advantage_moments_fn.
    if (size > 0 && input != nullptr) {
      group_input<T> gi{size, input + lo, r.length + lo};
      obj.advantage.group(gi, r.adv + lo, st);
      if (adv_t::input == advantage_input::rewards)
        for (index_t j = lo + 1; j < hi; ++j)
          if (static_cast<double>(b.rewards[j]) != static_cast<double>(b.rewards[lo])) zero_std = 0;
    }

    // The token pass weighs the responses (weight_in_token_pass): it needs their group's size;
    // the weights read 0 until it has written them.
    if (r.group_size != nullptr) {
      for (index_t j = lo; j < hi; ++j) {
        r.group_size[j] = size;
        r.weight[j] = 0;
        r.log_weight[j] = 0;
        r.capped[j] = 0;
      }
      group_status[g] = st;
      group_zero_std[g] = zero_std;
      return;
    }
    const double cap = obj.weight.cap();
    const weight_normalisation norm = obj.weight.normalisation();
    double sum = 0, count = 0, log_max = -HUGE_VAL;
    for (index_t j = lo; j < hi; ++j) {
      const response_context ctx = weight_context(b, r.length[j], r.old_mean[j], size, j);
      std::uint8_t capped = 0;
      double w = capped_weight(obj.weight, ctx, capped);
      double lw = norm == weight_normalisation::none ? 0.0 : (capped ? ::log(cap) : log_raw_weight(obj.weight, ctx));
      r.weight[j] = w;
      r.log_weight[j] = lw;
      r.capped[j] = capped;
      if (ctx.length > 0) {
        sum += w;
        count += 1;
        log_max = lw > log_max ? lw : log_max;
      }
    }
    if (norm == weight_normalisation::group_mean && sum > 0) {
      if (finite(sum)) {
        const double scale = count / sum;
        for (index_t j = lo; j < hi; ++j)
          if (r.length[j] > 0) r.weight[j] *= scale;
      } else {
        // Some weight (or their sum) overflows: w_j = n exp(lw_j - max) / sum_k exp(lw_k - max).
        double scaled = 0;
        for (index_t j = lo; j < hi; ++j)
          if (r.length[j] > 0) scaled += ::exp(r.log_weight[j] - log_max);
        for (index_t j = lo; j < hi; ++j)
          if (r.length[j] > 0) r.weight[j] = count * ::exp(r.log_weight[j] - log_max) / scaled;
      }
    }
    // Batch-mean normalisation (later, in log space where needed) brings overflowing weights back
    // into range; otherwise a weight beyond the double range cannot be represented.
    if (norm != weight_normalisation::batch_mean)
      for (index_t j = lo; j < hi; ++j)
        if (r.length[j] > 0 && !finite(r.weight[j])) st |= weight_overflow;
    group_status[g] = st;
    group_zero_std[g] = zero_std;
  }
};

struct group_partial_fn {
  const std::uint32_t* status;
  const std::uint8_t* zero_std;
  RECO_HOST_DEVICE group_partial operator()(index_t g) const {
    return {status[g], static_cast<double>(zero_std[g])};
  }
};

template <class T>
struct batch_partial_fn {
  batch_pointers<T> b;
  response_scratch r;
  bool reads_rewards;
  RECO_HOST_DEVICE batch_partial operator()(index_t i) const {
    // Every field written once, in declaration order (a default-constructed partial zeroed first
    // was a block store per response, about a sixth of finish_plan's time over 16K responses).
    const index_t n = r.length[i];
    const double s = reads_rewards ? static_cast<double>(b.rewards[i]) : 0.0;
    const bool weighs = n > 0 && r.weight[i] > 0;
    return batch_partial{r.status[i],
                         n > 0 ? 1.0 : 0.0,
                         static_cast<double>(n),
                         static_cast<double>(b.layout.end(i) - b.layout.begin(i)),
                         reads_rewards ? moments::of(s) : moments{},
                         s != 0 ? 1.0 : 0.0,
                         moments::of(r.adv[i], static_cast<double>(n)),
                         n > 0 ? r.weight[i] : 0.0,
                         weighs ? r.log_weight[i] : 0.0,
                         weighs ? 1.0 : 0.0};
  }
};

// Single-thread step: batch statistics for the estimators and the batch weight normalisation.
template <class Obj>
struct batch_stats_fn {
  objective_scalars* s;
  Obj obj;
  RECO_HOST_DEVICE void operator()(index_t) const {
    const batch_partial& p = s->batch;
    s->adv_stats = advantage_stats_of(p.reward, p.nonzero_rewards, p.token_adv);
    s->weight_scale = 1.0;
    s->weight_log_space = 0;
    if (obj.weight.normalisation() == weight_normalisation::batch_mean && p.weight_sum > 0) {
      if (finite(p.weight_sum)) {
        s->weight_scale = p.nonempty / p.weight_sum;
      } else {
        // w_i R' / sum_k w_k = exp(log w_i + log R' - max - log sum_k exp(log w_k - max)).
        s->weight_log_space = 1;
        s->weight_log_shift = ::log(p.nonempty) - p.weight_log_max - ::log(p.weight_log_sum);
      }
    }
    s->status = p.status | s->groups.status;
  }
};

// Per response: the estimator's batch stage and the batch weight normalisation.
template <class Obj>
struct finalize_response_fn {
  Obj obj;
  response_scratch r;
  const objective_scalars* s;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    r.adv[i] = obj.advantage.finalize(r.adv[i], s->adv_stats);
    if (r.length[i] > 0) {
      if (s->weight_log_space)
        r.weight[i] = r.weight[i] > 0 ? ::exp(r.log_weight[i] + s->weight_log_shift) : 0.0;
      else
        r.weight[i] *= s->weight_scale;
    }
  }
};

// Per response: the sequence log-ratio of a sequence-scope ratio form (needs final advantages).
template <class Obj, class T>
struct sequence_fn {
  Obj obj;
  batch_pointers<T> b;
  response_scratch r;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const index_t begin = b.layout.begin(i), end = b.layout.end(i);
    double sum = 0;
    token_context c;
    for (index_t t = begin; t < end; ++t) {
      if (!b.valid(t)) continue;
      c.advantage = b.advantage_at(t, r.adv[i]);
      c.logp = static_cast<double>(b.logp[t]);
      c.old_logp = b.old_logp ? static_cast<double>(b.old_logp[t]) : c.logp;
      sum += obj.ratio.sequence_term(c);
    }
    r.seq_log[i] = sequence_value_of(obj.ratio, sum, r.length[i]);
  }
};

// Per token: the entropy as a sort key, +inf for an invalid token (sorted last).
template <class T>
struct fill_entropy_keys_fn {
  batch_pointers<T> b;
  double* keys;
  RECO_HOST_DEVICE void operator()(index_t t) const {
    keys[t] = b.valid(t) ? static_cast<double>(b.entropy[t]) : HUGE_VAL;
  }
};

// Per response: the `percentile` quantile of its valid tokens' entropies, read from keys sorted
// ascending within each response (invalid tokens sorted last as +inf).
struct entropy_quantile_fn {
  token_layout layout;
  const double* sorted;
  response_scratch r;
  double percentile;
  RECO_HOST_DEVICE void operator()(index_t i) const {
    const index_t n = r.length[i];
    if (n == 0) {
      r.entropy_q[i] = 0;
      return;
    }
    const double* v = sorted + layout.begin(i);
    const double pos = percentile * static_cast<double>(n - 1);
    index_t lo = static_cast<index_t>(pos);
    if (lo > n - 1) lo = n - 1;
    const index_t hi = lo + 1 < n ? lo + 1 : n - 1;
    r.entropy_q[i] = v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
  }
};

// The entropy-split clip's stage: each response's entropy quantile into r.entropy_q (keys: N
// doubles of scratch). One stage for the generic algorithm and the fused CUDA call.
template <class Backend, class T>
void entropy_quantiles(const Backend& be, const batch_pointers<T>& b, double* keys, const response_scratch& r,
                       double percentile) {
  be.for_each(b.layout.tokens, fill_entropy_keys_fn<T>{b, keys});
  be.segmented_sort(keys, b.layout);
  be.for_each(b.layout.responses, entropy_quantile_fn{b.layout, keys, r, percentile});
}

struct response_partial_fn {
  response_scratch r;
  RECO_HOST_DEVICE response_partial operator()(index_t i) const {
    response_partial p = weights_of(r, i);
    const index_t kept = r.kept[i];
    p.kept_tokens = static_cast<double>(kept);
    p.kept_nonempty = kept > 0 ? 1.0 : 0.0;
    p.adv = moments::of(r.adv[i], static_cast<double>(r.length[i]));
    if (r.adv_m2 && r.length[i] > 0) p.adv.m2 = r.adv_m2[i];
    return p;
  }
  // The weight fields alone (the rest as a default partial).
  RECO_HOST_DEVICE static response_partial weights_of(const response_scratch& r, index_t i) {
    response_partial p;
    if (r.length[i] > 0) {
      const double w = r.weight[i];
      p.weight_count = 1;
      p.weight_sum = w;
      p.weight_min = w;
      p.weight_max = w;
      p.cap_hits = r.capped[i];
    }
    return p;
  }
};
// The weight fields of response_partial_fn, for the weights the token pass computes
// (token_fn::weighs): the other fields merge as empty moments, without their divisions.
struct response_weights_fn {
  response_scratch r;
  RECO_HOST_DEVICE response_partial operator()(index_t i) const { return response_partial_fn::weights_of(r, i); }
};

}  // namespace detail
RECO_NAMESPACE_END
