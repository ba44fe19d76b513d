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
RECO_NAMESPACE_END
