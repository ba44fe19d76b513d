// The 80/20 cut over a population larger than one call's batch: TRL gathers the micro-batch's
// entropies across data-parallel ranks, the paper's rule uses the whole mini-batch. Compute the
// cut over that population here, then hand it to every call:
//   sel.params.use_given = true;  sel.params.given = reco::entropy_threshold(be, all_H, all_mask, sel.params, ws);
// The returned tie budget counts population ties; with continuous entropies ties do not occur,
// and a rank that cannot place its share of ties should pass ties = -1 (keep all).
#pragma once

#include "reco/algorithm/partials.hpp"
#include "reco/algorithm/select_tokens.hpp"
#include "reco/workspace.hpp"
#include "reco/select/top_entropy.hpp"
#include "reco/span.hpp"

RECO_NAMESPACE_BEGIN

template <class Backend, class T>
entropy_cut entropy_threshold(const Backend& backend, span<const T> entropy, span<const std::uint8_t> mask,
                              top_entropy_selection::params_type p, workspace<Backend>& ws) {
  top_entropy_selection sel;
  sel.params = p;
  sel.params.use_given = false;
  sel.validate("select");
  detail::require(mask.empty() || mask.size() == entropy.size(), "mask", "needs one entry per entropy");
  const index_t n = entropy.size();
  const Backend be = ws.bind(backend);
  detail::carver measure(nullptr);
  measure.take<detail::objective_scalars>(1);
  measure.take<double>(1);
  measure.take<double>(n);
  detail::carver cut(ws.reserve(be, measure.used()));
  auto* s = cut.take<detail::objective_scalars>(1);
  auto* population = cut.take<double>(1);
  auto* keys = cut.take<double>(n);
  const std::uint8_t* m = mask.empty() ? nullptr : mask.data();
  be.for_each(1, detail::init_scalars_fn{s});
  be.reduce(n, detail::count_nonfinite_fn<T>{entropy.data(), m}, detail::sum_fn{}, population);
  if (be.read(population) > 0) detail::fail("entropy", "NaN or infinite value in a valid token");
  be.reduce(n, detail::count_valid_fn{m}, detail::sum_fn{}, population);
  detail::compute_cut(be, entropy.data(), m, n, sel.params, population, keys, s);
  return be.read(&s->cut);
}

RECO_NAMESPACE_END
