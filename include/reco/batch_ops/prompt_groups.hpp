// Groups from per-response prompt ids. reco expects the responses of one prompt to be
// contiguous; group_offsets_from_prompt_ids checks that and builds the offsets, and
// group_by_prompt gives the permutation that makes any batch contiguous (stable: prompts in
// order of first appearance, responses in their original order within a prompt).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "reco/config.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

// Offsets (P + 1 entries) of the runs of equal ids; throws reco::error naming prompt_ids when a
// prompt's responses are split into several runs.
template <class Id>
std::vector<index_t> group_offsets_from_prompt_ids(span<const Id> prompt_ids) {
  std::vector<index_t> offsets{0};
  std::unordered_map<Id, index_t> seen;  // id -> position of its run's start
  for (index_t i = 0; i < prompt_ids.size(); ++i) {
    if (i > 0 && prompt_ids[i] == prompt_ids[i - 1]) continue;
    auto [it, fresh] = seen.emplace(prompt_ids[i], i);
    if (!fresh)
      detail::fail("prompt_ids", "the responses of prompt " + std::to_string(prompt_ids[i]) +
                                     " are not contiguous (positions " + std::to_string(it->second) + " and " +
                                     std::to_string(i) + "); reorder the batch with reco::group_by_prompt");
    if (i > 0) offsets.push_back(i);
  }
  offsets.push_back(prompt_ids.size());
  if (prompt_ids.size() == 0) offsets.resize(1);
  return offsets;
}

struct prompt_grouping {
  std::vector<index_t> order;          // new position j holds original response order[j]
  std::vector<index_t> group_offsets;  // P + 1 entries over the reordered responses
};

// A stable regrouping of any batch by prompt id.
template <class Id>
prompt_grouping group_by_prompt(span<const Id> prompt_ids) {
  std::unordered_map<Id, index_t> group_of;
  std::vector<std::vector<index_t>> members;
  for (index_t i = 0; i < prompt_ids.size(); ++i) {
    auto [it, fresh] = group_of.emplace(prompt_ids[i], static_cast<index_t>(members.size()));
    if (fresh) members.emplace_back();
    members[static_cast<std::size_t>(it->second)].push_back(i);
  }
  prompt_grouping g;
  g.group_offsets.push_back(0);
  for (const auto& m : members) {
    g.order.insert(g.order.end(), m.begin(), m.end());
    g.group_offsets.push_back(static_cast<index_t>(g.order.size()));
  }
  return g;
}

RECO_NAMESPACE_END
