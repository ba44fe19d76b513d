// A step cut into parts for the split-step tests (tests/core/test_step_plan.cpp, the fused path's
// host emulation and its GPU test): each part a batch of its own, and where it sits in the step.
#pragma once

#include <vector>

#include "core/random_batch.hpp"
#include "reco/step_plan.hpp"

namespace reco_test {

// Responses [a, b) of m as a batch of their own, and where they sit in the step.
inline master_batch slice(const master_batch& m, index_t a, index_t b, index_t& first_group) {
  master_batch s;
  s.padded = m.padded;
  s.T = m.T;
  s.R = b - a;
  const index_t t0 = a < b ? m.begin(a) : 0, t1 = a < b ? m.end(b - 1) : 0;
  s.N = t1 - t0;
  auto tok = [&](const std::vector<double>& v) {
    return v.empty() ? v : std::vector<double>(v.begin() + t0, v.begin() + t1);
  };
  auto resp = [&](const std::vector<double>& v) {
    return v.empty() ? v : std::vector<double>(v.begin() + a, v.begin() + b);
  };
  s.logp = tok(m.logp);
  s.old_logp = tok(m.old_logp);
  s.ref_logp = tok(m.ref_logp);
  s.entropy = tok(m.entropy);
  s.token_weights = tok(m.token_weights);
  s.token_advantages = tok(m.token_advantages);
  s.mask.assign(m.mask.begin() + t0, m.mask.begin() + t1);
  s.rewards = resp(m.rewards);
  s.advantages = resp(m.advantages);
  s.response_weights = resp(m.response_weights);
  s.lengths.assign(m.lengths.begin() + a, m.lengths.begin() + b);
  if (!m.padded) {
    s.offsets.push_back(0);
    for (index_t i = a; i < b; ++i) s.offsets.push_back(m.offsets[i + 1] - t0);
  }
  s.group_offsets.push_back(0);
  first_group = 0;
  const index_t P = static_cast<index_t>(m.group_offsets.size()) - 1;
  for (index_t g = 0; g < P; ++g)
    if (m.group_offsets[g] <= a && a < m.group_offsets[g + 1]) first_group = g;
  for (index_t g = 1; g < P; ++g)
    if (m.group_offsets[g] > a && m.group_offsets[g] < b) s.group_offsets.push_back(m.group_offsets[g] - a);
  if (b > a) s.group_offsets.push_back(b - a);
  return s;
}

// The step m cut at `cuts` (inner response boundaries, sorted; a repeated cut is an empty part):
// the parts' batches in type T, their views and their step_parts.
template <class T>
struct split_step {
  reco::step_info step;
  std::vector<index_t> bounds;  // 0, cuts..., R
  std::vector<master_batch> subs;
  std::vector<typed_batch<T>> typed;
  std::vector<reco::batch_view<T>> views;
  std::vector<reco::step_part> parts;

  split_step(const master_batch& m, const std::vector<index_t>& cuts, const reco::step_info& info) : step(info) {
    bounds.push_back(0);
    bounds.insert(bounds.end(), cuts.begin(), cuts.end());
    bounds.push_back(m.R);
    typed.reserve(bounds.size());  // the views point into these
    for (std::size_t p = 0; p + 1 < bounds.size(); ++p) {
      index_t fg = 0;
      subs.push_back(slice(m, bounds[p], bounds[p + 1], fg));
      parts.push_back(reco::step_part{step, bounds[p], fg});
      typed.emplace_back(subs.back());
      views.push_back(typed.back().view());
    }
  }
  split_step(const split_step&) = delete;
  split_step& operator=(const split_step&) = delete;

  // The first token of part p in the whole step.
  index_t first_token(const master_batch& m, std::size_t p) const {
    return bounds[p] < bounds[p + 1] ? m.begin(bounds[p]) : 0;
  }
};

}  // namespace reco_test
