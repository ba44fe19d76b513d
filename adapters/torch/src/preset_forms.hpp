// A preset by name in the form a call needs: as defined, or around given advantages. Shared by
// the CPU and CUDA instantiations (LibTorch-free).
#pragma once

#include <string>

#include "presets.hpp"
#include "reco/given_advantages.hpp"
#include "reco/registry.hpp"

namespace reco::torch::detail {

// Returns f(objective) for preset `preset` with `overrides` applied, or f(its given-advantage
// form). With given advantages the estimator is not run, so a key of it is an error rather than
// a setting silently ignored.
template <class F>
decltype(auto) with_preset_form(const std::string& preset, const override_map& overrides, bool given_advantages,
                                F&& f) {
  return registry::with_preset(preset, [&](auto obj) {
    const std::string who = "preset '" + preset + "'";
    registry::apply_overrides(obj, overrides, who);
    if (given_advantages) {
      for (const auto& kv : overrides)
        if (kv.first.compare(0, 10, "advantage.") == 0)
          ::reco::detail::fail("overrides." + kv.first, "sets a parameter of " + who +
                                                            "'s advantage estimator, which does not run when "
                                                            "advantages are given");
      return f(reco::with_given_advantages(obj));
    }
    return f(obj);
  });
}

}  // namespace reco::torch::detail
