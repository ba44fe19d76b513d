// Explicit instantiation of the presets' CPU objective pass. The pass of one preset (response scan,
// selection, the token loop at every SIMD width) is the heaviest code the library generates; a
// project that calls the presets from many translation units can compile it once:
//
//   // in every unit that calls the presets (or with -include): declarations only
//   #define RECO_EXTERN_CPU_PRESETS
//   #include "reco/backend/cpu_instances.hpp"
//
//   // in one unit of the project: the definitions
//   #include "reco/backend/cpu_instances.hpp"
//   RECO_FOR_EACH_CPU_PRESET(RECO_CPU_PRESET_INSTANCE_DEFINE)
//
// Presets sharing one objective type (reco and reco_no_cap differ only in constants) are one
// instance. Without the macro the header only declares nothing and changes nothing.
#pragma once

#include "reco/backend/cpu.hpp"
#include "reco/presets.hpp"

RECO_NAMESPACE_BEGIN
namespace presets {
// The reco::objective<...> a preset derives from: the type its calls run.
template <class... C>
objective<C...> objective_base(const objective<C...>&);
template <class P>
using objective_base_t = decltype(objective_base(std::declval<const P&>()));
}  // namespace presets
RECO_NAMESPACE_END

// One instance: the CPU pass of preset P for per-token values of type T.
#define RECO_CPU_PRESET_INSTANCE(EXTERN, P, T)                                                         \
  EXTERN template const ::reco::objective_result*                                                      \
  ::reco::objective_algorithm<::reco::cpu, ::reco::presets::objective_base_t<::reco::presets::P>>::run<T>( \
      const ::reco::presets::objective_base_t<::reco::presets::P>&, const ::reco::cpu&,                \
      const ::reco::batch_view<T>&, ::reco::gradients<T>, ::reco::workspace<::reco::cpu>&,             \
      const ::reco::normalisers&, const ::reco::detail::step_slice*);
#define RECO_CPU_PRESET_INSTANCE_DECLARE(P)   \
  RECO_CPU_PRESET_INSTANCE(extern, P, float) \
  RECO_CPU_PRESET_INSTANCE(extern, P, double)
#define RECO_CPU_PRESET_INSTANCE_DEFINE(P) \
  RECO_CPU_PRESET_INSTANCE(, P, float)     \
  RECO_CPU_PRESET_INSTANCE(, P, double)

// Every preset with an objective type of its own (trl_bnpo runs dapo's type).
#define RECO_FOR_EACH_CPU_PRESET(X) \
  X(grpo)                           \
  X(dr_grpo)                        \
  X(dapo)                           \
  X(gspo)                           \
  X(cispo)                          \
  X(aspo)                           \
  X(reco)                           \
  X(reco_response_only)             \
  X(reco_token_only)                \
  X(dapo_reco)                      \
  X(rule_80_20)                     \
  X(rule_80_20_reco)                \
  X(trl_luspo)                      \
  X(trl_vespo)                      \
  X(clip_cov)                       \
  X(kl_cov)

#ifdef RECO_EXTERN_CPU_PRESETS
RECO_FOR_EACH_CPU_PRESET(RECO_CPU_PRESET_INSTANCE_DECLARE)
#endif
