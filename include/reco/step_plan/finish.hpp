// The plan from the sum of every part's stage-0 summary (finish_plan): the group and batch stages
// of the whole step run on the summed per-response fields with the call's own passes, and a
// selection's first cut round or covariance table is set up.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "reco/algorithm/covariance_tokens.hpp"
#include "reco/algorithm/response_passes.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/step_plan/call.hpp"
#include "reco/step_plan/fingerprint.hpp"
#include "reco/step_plan/plan.hpp"
#include "reco/step_plan/summary.hpp"
#include "reco/step_plan/summary_check.hpp"
#include "reco/validate.hpp"

RECO_NAMESPACE_BEGIN
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

// Whether stage 0 is the plan's last stage before the confirmation (no selection to run).
template <class Obj>
bool stage0_is_last(const Obj& obj) {
  if constexpr (is_covariance_selection_v<typename Obj::selector_type>) return false;
  else if constexpr (Obj::selector_type::active) return !term_on(obj.select);
  else return true;
}

// A response's stage-0 fields as a sum of valid summaries holds them (one part wrote them all).
// The messages are built only for a field that fails.
template <class Obj>
void check_response_fields(const double* f, index_t i, bool reads_old_mean, bool given_weights) {
  const double group = f[plan_f_group], length = f[plan_f_length], span = f[plan_f_span];
  const double old_mean = f[plan_f_old_mean], input = f[plan_f_input], w = f[plan_f_weight];
  const bool ok = is_count(group) && group >= 1 && is_count(span) && is_count(length) && length <= span &&
                  std::isfinite(old_mean) && old_mean <= 0 &&
                  (reads_old_mean ? length > 0 || old_mean == 0 : old_mean == 0) && std::isfinite(input) &&
                  std::isfinite(w) && w >= 0 && (given_weights || w == 1);
  if (ok) return;
  auto refuse = [i](const char* field, double value, const std::string& rule) {
    refuse_summary(field, "of response " + std::to_string(i) + " is " + std::to_string(value) + " (" + rule + ")");
  };
  if (!(is_count(group) && group >= 1)) refuse("group", group, "a group id + 1, an integer >= 1");
  if (!is_count(span)) refuse("span", span, "a count of token slots");
  if (!(is_count(length) && length <= span))
    refuse("length", length, "a count of valid tokens, at most its span " + std::to_string(span));
  if (reads_old_mean) {
    if (!(std::isfinite(old_mean) && old_mean <= 0 && (length > 0 || old_mean == 0)))
      refuse("old_mean", old_mean, "a mean of log-probabilities: finite, <= 0; 0 without valid tokens");
  } else if (old_mean != 0) {
    refuse("old_mean", old_mean, "0: the weight reads no old log-probabilities");
  }
  if (!std::isfinite(input)) refuse(Obj::needs_rewards ? "reward" : "advantage", input, "finite");
  refuse("weight", w, given_weights ? "a given weight: finite, >= 0" : "1: no weights are given");
}
}  // namespace detail

// The plan from the sum of every part's summary (the same on every part).
template <class Obj>
step_plan finish_plan(const Obj& obj_in, const step_info& step, const step_summary& total) {
  using namespace detail;
  obj_in.validate();
  check_step(step, "step");
  // The checksum first (summary_check.hpp): sums altered after their parts made them are refused
  // before anything reads them. When no round follows, the refusal waits for the confirmation, so
  // that every rank refuses alike.
  std::uint64_t digest = 0;
  if (!checksum_holds(total, &digest)) {
    // Parts that claimed a response twice (or none) add values where one part writes: the
    // checksum cannot hold, and the parts' layout is the error (on every rank alike).
    const std::size_t hist0 = stage0_block(obj_in, step.responses);
    if (total.values.size() == plan_header + hist0 + plan_fields * static_cast<std::size_t>(step.responses))
      for (index_t i = 0; i < step.responses; ++i) {
        const double c = total.values[plan_header + hist0 + plan_fields * static_cast<std::size_t>(i) + plan_f_claimed];
        if (c != 1)
          fail("plan", "response " + std::to_string(i) + " of the step is in " + std::to_string(c) +
                           " parts (each response must be in exactly one part)");
      }
    if (!stage0_is_last(obj_in)) refuse_summary("of stage 0", checksum_failure());
    step_plan refused;
    refused.step_ = step;
    refused.fingerprint_ = plan_fingerprint(obj_in, step, 8);
    refused.serial_ = next_plan_serial();
    refused.refuse_to_confirm();
    return refused;
  }
  // The parts' input errors before their agreement: a part that failed on its rank sends a summary
  // of nothing but its error.
  check_header_counts(total);
  throw_if_refused(total);
  std::uint32_t bits = 0;
  for (int k = 0; k < plan_status_bits; ++k)
    if (total.values[plan_h_status + k] > 0) bits |= 1u << k;
  throw_if_error(bits);
  const summed_head head =
      stage0_head(obj_in, total, step, "plan", "the summaries were made for another step or objective than this one");
  const std::uint64_t fp = head.fp;
  const std::size_t width = head.width;

  const index_t R = step.responses;
  const std::size_t fields = plan_fields * static_cast<std::size_t>(R);
  const std::size_t hist = stage0_block(obj_in, R);
  require(total.values.size() == plan_header + hist + fields, "plan",
          "summary of the wrong size for the step's " + std::to_string(R) + " responses");
  const bool reads_old_mean = needs_old_mean(obj_in.weight), given_weights = obj_in.needs().response_weights;
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
  double valid_sum = 0, span_sum = 0;
  for (index_t i = 0; i < R; ++i) {
    const double c = field(i, plan_f_claimed);
    if (c != 1)
      fail("plan", "response " + std::to_string(i) + " of the step is in " + std::to_string(static_cast<long long>(c)) +
                       " parts (each response must be in exactly one part)");
    check_response_fields<Obj>(body + hist + plan_fields * static_cast<std::size_t>(i), i, reads_old_mean,
                               given_weights);
    const double g = field(i, plan_f_group);
    if (i > 0) {
      const double prev = field(i - 1, plan_f_group);
      if (g < prev)
        fail("plan", "group ids decrease at response " + std::to_string(i) +
                         " of the step (a part's first_group is wrong)");
      if (g != prev) group_offsets.push_back(i);
    }
    length[i] = static_cast<index_t>(field(i, plan_f_length));
    valid_sum += field(i, plan_f_length);
    span_sum += field(i, plan_f_span);
    if (span_sum > max_count)
      refuse_summary("span", "of responses 0.." + std::to_string(i) + " sum to " + std::to_string(span_sum) +
                                 " token slots (more than 2^53)");
    token_offsets.push_back(token_offsets.back() + static_cast<index_t>(field(i, plan_f_span)));
    old_mean[i] = field(i, plan_f_old_mean);
    input[i] = field(i, plan_f_input);
    given[i] = field(i, plan_f_weight);
  }
  if (R > 0) group_offsets.push_back(R);
  if (summary_has_histogram(obj_in)) {
    const double counted = check_histogram(body, "histogram");
    if (counted != valid_sum)
      refuse_summary("histogram", "of stage 0 counts " + std::to_string(counted) + " tokens; the responses hold " +
                                      std::to_string(valid_sum) + " valid tokens");
  }

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
  plan.digest_ = digest;
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
  plan.stage_ = step_plan::stage_kind::confirm;
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
      const double flag = cv[2];
      if (!(is_count(flag) && flag <= 3 && (i > 0 || flag >= covariance_part_start)))
        refuse_summary("covariance.flags", "of response " + std::to_string(i) + " are " + std::to_string(flag) +
                                               (i == 0 ? " (the step's first response starts a part: 2 or 3)"
                                                       : " (0 to 3)"));
      const bool token_adv = (static_cast<int>(flag) & covariance_token_advantages) != 0;
      if (!(std::isfinite(cv[0]) && cv[0] <= 0 && (plan.length_[i] > 0 || cv[0] == 0)))
        refuse_summary("covariance.logp", "of response " + std::to_string(i) + " is " + std::to_string(cv[0]) +
                                              " (a sum of log-probabilities over its valid tokens: finite, <= 0)");
      if (!(std::isfinite(cv[1]) && (token_adv || cv[1] == 0)))
        refuse_summary("covariance.advantages", "of response " + std::to_string(i) + " is " + std::to_string(cv[1]) +
                                                    (token_adv ? " (finite)" : " (0 without advantages per token)"));
      covariance_sums c;
      c.n = static_cast<double>(plan.length_[i]);
      c.logp = cv[0];
      c.adv = cv[1];
      const int flags = static_cast<int>(cv[2]);
      covariance_add(m, c, plan.adv_[i], (flags & covariance_token_advantages) != 0);
      if (flags & covariance_part_start) plan.part_starts_.push_back(i);
    }
    if (static_cast<double>(plan.part_starts_.size()) > total.values[plan_h_parts])
      refuse_summary("covariance.flags", "mark " + std::to_string(plan.part_starts_.size()) + " parts' starts in a sum of " +
                                             std::to_string(total.values[plan_h_parts]) + " parts");
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
RECO_NAMESPACE_END
