// Host tests of the fused CUDA objective, runnable without a GPU: the launch configuration, the scratch
// layout, the last-block ticket protocol, and the host emulation of the fused stages (the same
// step functions the kernels run) against the generic CPU path for every preset and the
// component combinations with their own stages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/random_batch.hpp"
#include "core/step_split.hpp"
#include "cuda_fast/fused_compare.hpp"
#include "cuda_fast/fused_emulation.hpp"
#include "reco/fused/layout.hpp"
#include "reco/fused/launch_config.hpp"
#include "reco/fused/ticket.hpp"
#include "reco/reco.hpp"

namespace {

using reco::index_t;
using reco_test::batch_spec;
using reco_test::make_batch;
using reco_test::master_batch;
using reco_test::typed_batch;
namespace fused = reco::fused;

// ---- launch configuration -------------------------------------------------------------------------

TEST(FusedPlan, GridsCoverTheWorkWithinResidency) {
  EXPECT_EQ(fused::grid_for(5, 132, 2, 0), 5);      // less work than the device holds
  EXPECT_EQ(fused::grid_for(1000, 132, 2, 0), 264);  // capped at one resident wave
  EXPECT_EQ(fused::grid_for(1000, 132, 2, 7), 7);    // pinned
  EXPECT_EQ(fused::grid_for(0, 132, 2, 0), 1);       // an empty batch still writes its result
  EXPECT_EQ(fused::grid_for(10, 0, 0, 0), 1);        // a failed device query cannot give 0 blocks
  EXPECT_LE(fused::grid_for(index_t(1) << 40, 1 << 20, 1 << 10, 0), fused::max_grid);
}

TEST(FusedPlan, TokenTilesUse64BitArithmeticAt64MAndBeyond) {
  const fused::device_limits h100{132, 2, 2, 2};
  fused::token_pointers none;
  for (index_t n : {index_t(64) << 20, (index_t(1) << 31) + 12345, index_t(1) << 40}) {
    const fused::launch_config p = fused::make_launch_config({n / 512, n, n / 4096}, {}, h100, none, true, 0);
    EXPECT_EQ(p.tiles, (n + fused::token_tile - 1) / fused::token_tile);
    EXPECT_EQ(p.token_grid, 264) << "grid-stride: the grid never grows with N";
    EXPECT_EQ(p.response_grid, 264);
    EXPECT_GE(p.token_grid * fused::token_tile * ((p.tiles + p.token_grid - 1) / p.token_grid), n)
        << "the grid-stride loop reaches every token";
  }
  // More than 65,535 responses and groups: one dimension of blocks, grid-stride over groups.
  const fused::launch_config p = fused::make_launch_config({200000, 600000, 100000}, {}, h100, none, true, 0);
  EXPECT_EQ(p.response_grid, 264);
  EXPECT_LT(p.response_grid, 65536);
  // Kernel A runs a warp per group: 20 groups fill three blocks of eight warps.
  EXPECT_EQ(fused::make_launch_config({160, 80000, 20}, {}, h100, none, true, 0).response_grid, 3);
}

TEST(FusedPlan, StagesAndLaunchesPerPreset) {
  const fused::device_limits dev{132, 2, 2, 2};
  fused::token_pointers none;
  const fused::shape sh{1000, 500000, 125};
  auto kernels = [&](const auto& obj) { return fused::make_launch_config(sh, fused::stages_of(obj), dev, none, true, 0); };
  namespace ps = reco::presets;
  // Two fused kernels and no generic pass for every preset without a selector.
  for (const fused::launch_config& p : {kernels(ps::grpo{}), kernels(ps::dr_grpo{}), kernels(ps::dapo{}), kernels(ps::gspo{}),
                               kernels(ps::cispo{}), kernels(ps::aspo{}), kernels(ps::reco{}), kernels(ps::reco_no_cap{}),
                               kernels(ps::reco_response_only{}), kernels(ps::reco_token_only{}),
                               kernels(ps::dapo_reco{})}) {
    EXPECT_EQ(p.fused_kernels, 2);
    EXPECT_EQ(p.finalize_grid, 0);
    EXPECT_FALSE(p.generic_selection || p.generic_kept_counts || p.generic_entropy_quantile);
  }
  for (const fused::launch_config& p : {kernels(ps::rule_80_20{}), kernels(ps::rule_80_20_reco{})}) {
    EXPECT_EQ(p.fused_kernels, 2);
    EXPECT_TRUE(p.generic_selection);
    EXPECT_FALSE(p.generic_kept_counts) << "the presets divide by all valid tokens";
  }
  EXPECT_TRUE(fused::stages_of(ps::reco{}).old_mean);
  EXPECT_FALSE(fused::stages_of(ps::grpo{}).old_mean);
  EXPECT_TRUE(fused::stages_of(ps::gspo{}).sequence);
  EXPECT_FALSE(fused::stages_of(ps::gspo{}).sequence_in_finalize);

  // Batch stages and batch-mean weights add kernel F; GMPO after REINFORCE++ waits for it.
  using rpp_gmpo = reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::uniform_weight,
                                   reco::seq_mean_token_mean>;
  const fused::stages s = fused::stages_of(rpp_gmpo{});
  EXPECT_TRUE(s.finalize && s.sequence && s.sequence_in_finalize);
  EXPECT_EQ(kernels(rpp_gmpo{}).fused_kernels, 3);
  ps::reco batch_mean;
  batch_mean.weight.params.normalise = reco::weight_normalisation::batch_mean;
  EXPECT_EQ(kernels(batch_mean).fused_kernels, 3);
  ps::rule_80_20 kept;
  kept.select.params.denominator = reco::selection_denominator::kept;
  EXPECT_TRUE(kernels(kept).generic_kept_counts);
  using split = reco::objective<reco::grpo_advantage, reco::token_ratio, reco::entropy_split_clip,
                                reco::uniform_weight, reco::token_mean>;
  EXPECT_TRUE(kernels(split{}).generic_entropy_quantile);
}

TEST(FusedPlan, VectorPathOnlyForAlignedArrays) {
  alignas(16) static float values[64];
  alignas(16) static std::uint8_t mask[64];
  fused::token_pointers p;
  p.add_value(values);
  p.add_value(values + 4);
  p.add_value(nullptr);  // absent inputs do not count
  p.add_bytes(mask);
  EXPECT_TRUE(fused::vector_aligned(p));
  fused::token_pointers shifted = p;
  shifted.add_value(values + 1);  // 4 bytes off a 16-byte boundary
  EXPECT_FALSE(fused::vector_aligned(shifted));
  fused::token_pointers odd_mask;
  odd_mask.add_value(values);
  odd_mask.add_bytes(mask + 2);
  EXPECT_FALSE(fused::vector_aligned(odd_mask));
  const fused::launch_config with = fused::make_launch_config({1, 4096, 1}, {}, {1, 1, 1, 1}, p, true, 0);
  const fused::launch_config without = fused::make_launch_config({1, 4096, 1}, {}, {1, 1, 1, 1}, p, false, 0);
  EXPECT_TRUE(with.vector_loads);
  EXPECT_FALSE(without.vector_loads);
}

TEST(FusedPlan, BytesPerToken) {
  namespace ps = reco::presets;
  fused::token_inputs grpo_in;  // float logp, old_logp, ref_logp, mask
  grpo_in.ref_logp = true;
  const fused::traffic g = fused::traffic_per_token(fused::stages_of(ps::grpo{}), grpo_in);
  EXPECT_EQ(g.compulsory, 4 + 4 + 4 + 1 + 4);
  EXPECT_EQ(g.fused_extra, 1);  // kernel A reads the mask
  const fused::traffic r = fused::traffic_per_token(fused::stages_of(ps::reco{}), grpo_in);
  EXPECT_EQ(r.fused_extra, 1 + 4);  // + old_logp for the response weights
  fused::token_inputs dapo_in;
  EXPECT_EQ(fused::traffic_per_token(fused::stages_of(ps::dapo{}), dapo_in).compulsory, 13);
  const fused::traffic s = fused::traffic_per_token(fused::stages_of(ps::gspo{}), dapo_in);
  EXPECT_EQ(s.fused_extra, 1 + 4 + 4);  // mask, then logp and old_logp for the sequence ratio
  fused::token_inputs rule_in;
  rule_in.entropy = true;
  rule_in.kept_flags = true;
  const fused::traffic k = fused::traffic_per_token(fused::stages_of(ps::rule_80_20{}), rule_in);
  EXPECT_EQ(k.compulsory, 17);
  EXPECT_EQ(k.fused_extra, 2);
  const fused::traffic kr = fused::traffic_per_token(fused::stages_of(ps::rule_80_20_reco{}), rule_in);
  EXPECT_EQ(kr.fused_extra, 1 + 1 + 4);  // kept flags, mask, old_logp
  fused::token_inputs on_policy_double;
  on_policy_double.value_bytes = 8;
  on_policy_double.old_logp = false;
  on_policy_double.mask = false;
  const fused::traffic d = fused::traffic_per_token(fused::stages_of(ps::reco_response_only{}), on_policy_double);
  EXPECT_EQ(d.compulsory, 16);
  EXPECT_EQ(d.fused_extra, 8);  // on-policy: the old mean reads logp
}

// ---- scratch layout ----------------------------------------------------------------------------

template <class Obj>
void check_layout(const fused::shape& sh) {
  const fused::launch_config p = fused::make_launch_config(sh, fused::stages_of(Obj{}), {8, 2, 2, 2}, {}, true, 0);
  const std::size_t bytes = fused::scratch_bytes(sh, p);
  std::vector<std::byte> buffer(bytes + 256);
  auto* base = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(buffer.data()) + 255) / 256 * 256);
  reco::detail::carver c(base);
  fused::scratch s;
  s.carve(c, sh, p);
  EXPECT_EQ(c.used(), bytes);
  struct range {
    const void* p;
    std::size_t n;
    const char* name;
  };
  const auto R = static_cast<std::size_t>(sh.responses), P = static_cast<std::size_t>(sh.groups),
             N = static_cast<std::size_t>(sh.tokens);
  std::vector<range> ranges = {{s.scalars, sizeof(*s.scalars), "scalars"},
                               {s.result, sizeof(*s.result), "result"},
                               {s.tokens, sizeof(*s.tokens), "tokens"},
                               {s.tickets, 8 * fused::ticket_slots, "tickets"},
                               {s.r.length, 8 * R, "length"},
                               {s.r.first, 8 * R, "first"},
                               {s.r.last, 8 * R, "last"},
                               {s.r.old_mean, 8 * R, "old_mean"},
                               {s.r.adv, 8 * R, "adv"},
                               {s.r.weight, 8 * R, "weight"},
                               {s.r.status, 4 * R, "status"},
                               {s.r.capped, R, "capped"},
                               {s.group_status, 4 * P, "group_status"},
                               {s.group_zero_std, P, "group_zero_std"},
                               {s.response_partials, sizeof(fused::response_block_partial) * p.response_grid, "A slots"},
                               {s.token_partials, sizeof(fused::token_block_partial) * p.token_grid, "B slots"}};
  if (Obj::selector_type::active) {
    ranges.push_back({s.r.kept, 8 * R, "kept counts"});
    ranges.push_back({s.kept, N, "kept flags"});
    ranges.push_back({s.tie_rank, 8 * (N + 1), "tie ranks"});
    ranges.push_back({s.keys, 8 * N, "keys"});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.kept) % 256, 0u) << "the token kernel loads kept flags 4 at a time";
  } else {
    EXPECT_EQ(s.r.kept, s.r.length) << "without a selector every valid token is a policy token";
  }
  if (Obj::ratio_type::scope == reco::ratio_scope::sequence) ranges.push_back({s.r.seq_log, 8 * R, "seq_log"});
  for (const range& a : ranges) {
    ASSERT_NE(a.p, nullptr) << a.name;
    const auto lo = reinterpret_cast<std::uintptr_t>(a.p);
    EXPECT_EQ(lo % 8, 0u) << a.name;
    EXPECT_GE(lo, reinterpret_cast<std::uintptr_t>(base)) << a.name;
    EXPECT_LE(lo + a.n, reinterpret_cast<std::uintptr_t>(base) + bytes) << a.name;
    for (const range& b : ranges) {
      if (&a == &b) continue;
      const auto blo = reinterpret_cast<std::uintptr_t>(b.p);
      EXPECT_TRUE(lo + a.n <= blo || blo + b.n <= lo) << a.name << " overlaps " << b.name;
    }
  }
}

TEST(FusedLayout, ArraysAreDisjointAlignedAndInside) {
  check_layout<reco::presets::grpo>({37, 1001, 9});
  check_layout<reco::presets::gspo>({37, 1001, 9});
  check_layout<reco::presets::rule_80_20_reco>({70000, 300001, 70000});
}

TEST(FusedLayout, SteadyStateNeedsNoGrowth) {
  // A workspace sized for one batch serves every smaller one without reallocating.
  const fused::device_limits dev{132, 2, 2, 2};
  auto bytes = [&](const fused::shape& sh) {
    const reco::presets::rule_80_20_reco o;
    return fused::scratch_bytes(
        sh, fused::make_launch_config(sh, fused::stages_of(o), dev, {}, true, 0));
  };
  const std::size_t big = bytes({4096, 2 << 20, 512});
  EXPECT_LE(bytes({4000, 2 << 20, 500}), big);
  EXPECT_LE(bytes({16, 8192, 2}), big);
  EXPECT_EQ(bytes({4096, 2 << 20, 512}), big) << "the same shape asks for the same bytes";
}

// ---- tickets -----------------------------------------------------------------------------------

TEST(FusedTicket, LastArrivalIsDetectedFromAnyStartingWord) {
  const std::uint64_t epoch = 12345;
  for (std::uint64_t garbage : {std::uint64_t(0), ~std::uint64_t(0), std::uint64_t(0xA5A5A5A5A5A5A5A5),
                                (std::uint64_t(999) << fused::ticket_count_bits) | 7}) {
    std::uint64_t word = garbage;
    const int blocks = 5;
    for (int k = 1; k <= blocks; ++k) {
      word = fused::ticket_next(word, epoch);
      EXPECT_EQ(fused::ticket_count(word), static_cast<std::uint64_t>(k)) << "arrival " << k;
    }
    // The last block resets the word; a replay of the same call (a CUDA graph) counts again.
    word = fused::ticket_reset(epoch);
    for (int k = 1; k <= blocks; ++k) word = fused::ticket_next(word, epoch);
    EXPECT_EQ(fused::ticket_count(word), static_cast<std::uint64_t>(blocks));
    // A new call (new epoch) restarts whatever the word holds.
    EXPECT_EQ(fused::ticket_count(fused::ticket_next(word, epoch + 1)), 1u);
  }
}

TEST(FusedTicket, EpochsAreFreshAndNonZero) {
  const std::uint64_t a = fused::next_epoch(), b = fused::next_epoch();
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a & ~fused::ticket_epoch_mask, 0u) << "the epoch fits above the count bits";
}

// ---- host emulation against the generic CPU path ---------------------------------------------

// The generic path the fused one is held to: the CPU backend's default packed pass. Both compute
// per token in the inputs' precision: double inputs in double (the fused kernels on a
// token_context, the packed pass on packs of doubles), float inputs in float (the fused kernels
// on float lanes with the C library's expf, the packed pass on packs of floats with its own
// exponentials; docs/conventions.md, "Precision").
template <class T>
reco::cpu generic_backend() {
  return reco::cpu{};
}

using fused_test::close;
using fused_test::expect_same_call;
using fused_test::expect_same_result;
using fused_test::same_gradient;

template <class Obj, class T>
void compare(const Obj& obj, const master_batch& m, const fused_test::emulation_options& opt, const std::string& label) {
  SCOPED_TRACE(label);
  typed_batch<T> h(m);
  const auto n = m.logp.size();
  std::vector<T> g_gen(n, T(-3)), gh_gen(n, T(-3)), g_fus(n, T(-5)), gh_fus(n, T(-5));
  const bool eg = Obj::has_entropy_gradient;
  reco::workspace<reco::cpu> ws;
  const reco::objective_result generic =
      obj(generic_backend<T>(), h.view(), reco::gradients<T>{g_gen, eg ? reco::span<T>(gh_gen) : reco::span<T>()}, ws);
  const auto fusedr = fused_test::emulate(
      obj, h.view(), reco::gradients<T>{g_fus, eg ? reco::span<T>(gh_fus) : reco::span<T>()}, {}, opt);
  expect_same_call(fusedr.result, generic, g_fus, g_gen, gh_fus, gh_gen, eg);
}

// Every option set the emulation runs with: a small device (several groups and tiles per
// block), one block for everything (the longest grid-stride walks), the scalar token path.
std::vector<fused_test::emulation_options> option_sets() {
  fused_test::emulation_options small, single, scalar;
  single.max_blocks = 1;
  scalar.vector_loads = false;
  scalar.device = {1, 3, 1, 5};
  return {small, single, scalar};
}

template <class Obj>
void check_objective(const Obj& obj, const std::string& name, int stride = 3) {
  const auto specs = reco_test::standard_specs();
  const auto options = option_sets();
  for (std::size_t k = 0; k < specs.size(); k += static_cast<std::size_t>(stride)) {
    master_batch m = make_batch(7000 + k, specs[k]);
    const auto& opt = options[k % options.size()];
    compare<Obj, double>(obj, m, opt, name + " double, batch " + std::to_string(k));
    reco_test::round_to<float>(m);
    compare<Obj, float>(obj, m, opt, name + " float, batch " + std::to_string(k));
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Long responses: runs of tokens cross tiles and threads, views carry over.
  batch_spec big;
  big.groups = 12;
  big.max_length = 1500;
  big.response_weights = true;
  big.token_weights = true;
  compare<Obj, float>(obj, make_batch(99, big), {}, name + " long responses");
}

TEST(FusedEmulation, EveryPresetMatchesTheGenericPath) {
  namespace ps = reco::presets;
  check_objective(ps::grpo{}, "grpo");
  check_objective(ps::dr_grpo{}, "dr_grpo");
  check_objective(ps::dapo{}, "dapo");
  check_objective(ps::gspo{}, "gspo");
  check_objective(ps::cispo{}, "cispo");
  check_objective(ps::aspo{}, "aspo");
  check_objective(ps::reco{}, "reco");
  check_objective(ps::reco_no_cap{}, "reco_no_cap");
  check_objective(ps::reco_response_only{}, "reco_response_only");
  check_objective(ps::reco_token_only{}, "reco_token_only");
  check_objective(ps::dapo_reco{}, "dapo_reco");
  check_objective(ps::rule_80_20{}, "rule_80_20");
  check_objective(ps::rule_80_20_reco{}, "rule_80_20_reco");
  check_objective(ps::trl_bnpo{}, "trl_bnpo");
  check_objective(ps::trl_luspo{}, "trl_luspo");
  check_objective(ps::trl_vespo{}, "trl_vespo");
}

TEST(FusedEmulation, ComponentsWithTheirOwnStages) {
  // Batch-stage advantages with GMPO (sequence pass in kernel F) and caller weights.
  check_objective(reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::caller_weight,
                                  reco::seq_mean_token_mean>{},
                  "reinforce_pp + gmpo + caller weights", 2);
  // Entropy quantiles (segmented sort), batch std, entropy bonus (entropy gradient) and KL.
  check_objective(reco::objective<reco::batch_std_advantage, reco::variance_ratio, reco::entropy_split_clip,
                                  reco::expected_count_weight, reco::token_mean, reco::entropy_bonus,
                                  reco::kl_penalty>{},
                  "batch std + entropy split + entropy bonus", 2);
  // GPG's batch scale, the quantile selection rule and the kept denominator.
  {
    reco::objective<reco::gpg_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                    reco::seq_mean_token_mean, reco::top_entropy_selection>
        o;
    o.select.params.rule = reco::selection_rule::quantile;
    o.select.params.denominator = reco::selection_denominator::kept;
    check_objective(o, "gpg + quantile selection, kept denominator", 2);
  }
  // Batch-mean and group-mean weight normalisation, given advantages, OPO, RLOO, pass@k, SAPO.
  {
    reco::presets::reco o;
    o.weight.params.normalise = reco::weight_normalisation::batch_mean;
    check_objective(o, "reco, batch-mean weights", 2);
    o.weight.params.normalise = reco::weight_normalisation::group_mean;
    check_objective(o, "reco, group-mean weights", 2);
  }
  check_objective(reco::objective<reco::given_advantage, reco::sapo_ratio, reco::no_clip, reco::uniform_weight,
                                  reco::seq_mean_token_sum>{},
                  "given advantages + sapo", 3);
  check_objective(reco::objective<reco::opo_advantage, reco::flipped_ratio, reco::ppo_clip, reco::uniform_weight,
                                  reco::token_mean, reco::kl_penalty>{},
                  "opo + flipped", 3);
  check_objective(reco::objective<reco::rloo_advantage, reco::reinforce_ratio, reco::no_clip, reco::uniform_weight,
                                  reco::seq_mean_token_sum_norm>{},
                  "rloo + reinforce", 3);
  check_objective(reco::objective<reco::pass_at_k_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                                  reco::token_mean>{},
                  "pass@k", 3);
}

// ---- calls of a split step (reco/step_plan.hpp) -------------------------------------------------

// A step cut into uneven parts (one of them empty) and planned on the CPU: each part's fused call
// with the plan equals the generic path's planned call of the same part.
template <class Obj, class T>
reco::step_plan compare_planned(const Obj& obj, const master_batch& m, const std::vector<index_t>& cuts, double scale,
                                const fused_test::emulation_options& opt, const std::string& label) {
  SCOPED_TRACE(label);
  reco_test::split_step<T> sp(m, cuts, reco::step_info{41, m.R, scale, 0});
  const reco::step_plan plan = reco::plan_step(obj, sp.step, sp.views, sp.parts);
  const bool eg = Obj::has_entropy_gradient;
  reco::workspace<reco::cpu> ws;
  for (std::size_t p = 0; p < sp.parts.size(); ++p) {
    SCOPED_TRACE("part " + std::to_string(p));
    const auto n = sp.subs[p].logp.size();
    std::vector<T> g_gen(n, T(-3)), gh_gen(n, T(-3)), g_fus(n, T(-5)), gh_fus(n, T(-5));
    const reco::objective_result generic =
        obj(generic_backend<T>(), sp.views[p], reco::gradients<T>{g_gen, eg ? reco::span<T>(gh_gen) : reco::span<T>()}, ws,
            plan, sp.parts[p]);
    const reco::detail::step_slice call = plan.call_for(sp.parts[p].first_response, sp.views[p].layout.responses);
    const auto fusedr = fused_test::emulate(
        obj, sp.views[p], reco::gradients<T>{g_fus, eg ? reco::span<T>(gh_fus) : reco::span<T>()}, {}, opt, &call);
    EXPECT_EQ(fusedr.launch.finalize_grid, 0) << "a planned call runs no batch stage";
    expect_same_call(fusedr.result, generic, g_fus, g_gen, gh_fus, gh_gen, eg);
  }
  return plan;
}

template <class Obj>
void check_planned(const Obj& obj, const std::string& name) {
  const auto specs = reco_test::standard_specs();
  const auto options = option_sets();
  for (std::size_t k = 0; k < specs.size(); k += 4) {
    master_batch m = make_batch(9100 + k, specs[k]);
    // Uneven parts, one empty, a group split across parts where the step has several.
    const index_t R = m.R;
    const std::vector<index_t> cuts{R / 3, R / 3, (2 * R) / 3 + 1 > R ? R : (2 * R) / 3 + 1};
    const auto& opt = options[k % options.size()];
    compare_planned<Obj, double>(obj, m, cuts, 1.0, opt, name + " double, batch " + std::to_string(k));
    reco_test::round_to<float>(m);
    compare_planned<Obj, float>(obj, m, cuts, 4.0, opt, name + " float, scale 4, batch " + std::to_string(k));
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Entropies on four values: the cut falls inside a run of ties that spans responses and parts,
  // and the response the budget runs out in keeps its first ties only.
  batch_spec spec;
  spec.groups = 9;
  spec.max_length = 14;
  spec.response_weights = true;
  master_batch m = make_batch(9180, spec);
  for (double& h : m.entropy) h = std::floor(h * 4.0 / 3.0) * 0.75;
  const reco::step_plan plan =
      compare_planned<Obj, double>(obj, m, {m.R / 4, m.R / 2, (3 * m.R) / 4}, 1.0, {}, name + " tied entropies");
  if (name.rfind("rule_80_20", 0) == 0) {  // this batch's cut keeps some of one response's ties
    const reco::detail::step_slice c = plan.call_for(0, m.R);
    index_t partial = 0;
    for (index_t i = 0; i < m.R; ++i) partial += c.ties[i] > 0 ? 1 : 0;
    EXPECT_EQ(partial, 1) << name << ": the tied batch should leave one response with part of its ties";
  }
}

TEST(FusedEmulation, PlannedPartsMatchTheGenericPlannedCalls) {
  namespace ps = reco::presets;
  check_planned(ps::grpo{}, "grpo");
  check_planned(ps::dr_grpo{}, "dr_grpo");
  check_planned(ps::dapo{}, "dapo");
  check_planned(ps::gspo{}, "gspo");
  check_planned(ps::cispo{}, "cispo");
  check_planned(ps::aspo{}, "aspo");
  check_planned(ps::reco{}, "reco");
  check_planned(ps::reco_no_cap{}, "reco_no_cap");
  check_planned(ps::reco_response_only{}, "reco_response_only");
  check_planned(ps::reco_token_only{}, "reco_token_only");
  check_planned(ps::dapo_reco{}, "dapo_reco");
  check_planned(ps::rule_80_20{}, "rule_80_20");
  check_planned(ps::rule_80_20_reco{}, "rule_80_20_reco");
  check_planned(ps::trl_bnpo{}, "trl_bnpo");
  check_planned(ps::trl_luspo{}, "trl_luspo");
  check_planned(ps::trl_vespo{}, "trl_vespo");
  // Batch-stage advantages with GMPO: its sequence pass waits for them unplanned (kernel F), and
  // runs in kernel A once the plan gives the final advantages.
  check_planned(reco::objective<reco::reinforce_pp_advantage, reco::gmpo_ratio, reco::no_clip, reco::caller_weight,
                                reco::seq_mean_token_mean>{},
                "reinforce_pp + gmpo + caller weights");
  {
    reco::objective<reco::gpg_advantage, reco::token_ratio, reco::ppo_clip, reco::uniform_weight,
                    reco::seq_mean_token_mean, reco::top_entropy_selection>
        o;
    o.select.params.rule = reco::selection_rule::quantile;
    o.select.params.denominator = reco::selection_denominator::kept;
    check_planned(o, "gpg + quantile selection, kept denominator");
  }
  {
    reco::presets::reco o;
    o.weight.params.normalise = reco::weight_normalisation::batch_mean;
    check_planned(o, "reco, batch-mean weights");
  }
}

// A plan applied to other data: the fused path reports it in the status word, naming `plan`, where
// the generic path throws.
TEST(FusedEmulation, PlannedCallOnOtherDataIsFlagged) {
  batch_spec spec;
  spec.groups = 6;
  spec.max_length = 12;
  master_batch m = make_batch(77, spec);
  const reco::presets::rule_80_20 obj;
  reco_test::split_step<double> sp(m, {m.R / 2}, reco::step_info{3, m.R, 1.0, 0});
  const reco::step_plan plan = reco::plan_step(obj, sp.step, sp.views, sp.parts);
  const reco::detail::step_slice call = plan.call_for(0, sp.views[0].layout.responses);
  const auto n = sp.subs[0].logp.size();
  std::vector<double> g(n);
  // Another mask: a valid-token count differs.
  {
    std::vector<std::uint8_t> mask = sp.typed[0].mask;
    std::size_t t = 0;
    while (t < n && mask[t] == 0) ++t;
    ASSERT_LT(t, n);
    mask[t] = 0;
    reco::batch_view<double> v = sp.views[0];
    v.mask = mask;
    const auto r = fused_test::emulate(obj, v, reco::gradients<double>{g, {}}, {}, {}, &call);
    EXPECT_TRUE(r.result.status & reco::plan_length_mismatch);
    EXPECT_EQ(reco::describe_status(r.result.status).rfind("plan:", 0), 0u) << reco::describe_status(r.result.status);
  }
  // Other entropies: the step's cut keeps other tokens.
  {
    std::vector<double> entropy = sp.typed[0].entropy;
    for (double& h : entropy) h = -h;
    reco::batch_view<double> v = sp.views[0];
    v.entropy = entropy;
    const auto r = fused_test::emulate(obj, v, reco::gradients<double>{g, {}}, {}, {}, &call);
    EXPECT_TRUE(r.result.status & reco::plan_kept_mismatch);
  }
  // The same data: no error.
  const auto r = fused_test::emulate(obj, sp.views[0], reco::gradients<double>{g, {}}, {}, {}, &call);
  EXPECT_EQ(r.result.status, 0u) << reco::describe_status(r.result.status);
}

TEST(FusedEmulation, GlobalNormalisersAndOnPolicy) {
  batch_spec spec;
  spec.groups = 7;
  master_batch m = make_batch(31, spec);
  typed_batch<double> h(m);
  reco::batch_view<double> v = h.view();
  v.old_logp = {};  // on-policy
  const reco::normalisers norm{5000, 300, 0, 0};
  const reco::presets::reco obj;
  std::vector<double> g1(m.logp.size()), g2(m.logp.size());
  const auto generic = obj(reco::cpu{}, v, reco::gradients<double>{g1, {}}, norm);
  const auto fusedr = fused_test::emulate(obj, v, reco::gradients<double>{g2, {}}, norm);
  expect_same_result(fusedr.result, generic);
  for (std::size_t t = 0; t < g1.size(); ++t) ASSERT_TRUE(same_gradient(g2[t], g1[t])) << "token " << t;
}

TEST(FusedEmulation, MoreThan65535ResponsesAndGroups) {
  batch_spec spec;
  spec.groups = 40000;
  spec.max_group = 3;
  spec.max_length = 5;
  const master_batch m = make_batch(5, spec);
  ASSERT_GT(m.R, 65535);
  ASSERT_GT(static_cast<index_t>(m.group_offsets.size()) - 1, 32768);
  compare<reco::presets::reco, float>(reco::presets::reco{}, m, {}, "reco, many responses");
  compare<reco::presets::gspo, double>(reco::presets::gspo{}, m, {}, "gspo, many responses");
}

// Bad data: the fused path flags in the status word exactly what the generic CPU path throws for
// (the value checks moved to the token step, the offset checks stayed per response).
template <class Obj>
void expect_flagged(const Obj& obj, master_batch m, const std::string& argument, const std::string& label) {
  SCOPED_TRACE(label);
  typed_batch<double> h(m);
  std::vector<double> g(m.logp.size()), gh(m.logp.size());
  const bool eg = Obj::has_entropy_gradient;
  const reco::gradients<double> grads{g, eg ? reco::span<double>(gh) : reco::span<double>()};
  std::string thrown;
  try {
    reco::workspace<reco::cpu> ws;
    reco::batch_view<double> v = h.view();
    obj(reco::cpu{}, v, grads, ws);
  } catch (const reco::error& e) {
    thrown = e.argument();
  }
  EXPECT_EQ(thrown, argument) << "the generic path's error";
  const auto r = fused_test::emulate(obj, h.view(), grads);
  EXPECT_NE(r.result.status, 0u);
  EXPECT_EQ(reco::describe_status(r.result.status).rfind(argument + ":", 0), 0u)
      << reco::describe_status(r.result.status);
}

index_t first_valid(const master_batch& m) {
  for (std::size_t t = 0; t < m.mask.size(); ++t)
    if (m.mask[t]) return static_cast<index_t>(t);
  return -1;
}

TEST(FusedEmulation, BadDataIsFlaggedLikeTheGenericPath) {
  batch_spec spec;
  spec.groups = 5;
  spec.token_weights = true;
  spec.response_weights = true;
  const master_batch base = make_batch(77, spec);
  const index_t t = first_valid(base);
  ASSERT_GE(t, 0);
  namespace ps = reco::presets;
  {
    master_batch m = base;
    m.logp[static_cast<std::size_t>(t)] = std::nan("");
    expect_flagged(ps::grpo{}, m, "batch.logp", "NaN logp");
  }
  {
    master_batch m = base;
    m.old_logp[static_cast<std::size_t>(t)] = 0.5;  // a probability above 1 for the variance ratio
    expect_flagged(ps::reco{}, m, "batch.old_logp", "old_logp > 0");
  }
  // A positive log-probability (a negative log-likelihood passed by mistake) is rejected by
  // every preset, not only by the variance ratio.
  {
    master_batch m = base;
    m.logp[static_cast<std::size_t>(t)] = 0.25;
    expect_flagged(ps::grpo{}, m, "batch.logp", "logp > 0, token ratio");
  }
  {
    master_batch m = base;
    m.old_logp[static_cast<std::size_t>(t)] = 0.25;
    expect_flagged(ps::gspo{}, m, "batch.old_logp", "old_logp > 0, sequence ratio");
  }
  {
    master_batch m = base;
    m.ref_logp[static_cast<std::size_t>(t)] = 0.25;
    expect_flagged(ps::grpo{}, m, "batch.ref_logp", "ref_logp > 0");
  }
  {
    master_batch m = base;
    m.ref_logp[static_cast<std::size_t>(t)] = INFINITY;
    expect_flagged(ps::grpo{}, m, "batch.ref_logp", "infinite ref_logp");
  }
  {
    master_batch m = base;
    m.entropy[static_cast<std::size_t>(t)] = INFINITY;  // (inf, not NaN: the CPU sort needs an order)
    expect_flagged(ps::rule_80_20{}, m, "batch.entropy", "infinite entropy");
  }
  {
    master_batch m = base;
    m.token_weights[static_cast<std::size_t>(t)] = -1;
    expect_flagged(ps::dapo{}, m, "batch.token_weights", "negative token weight");
  }
  {
    master_batch m = base;
    m.rewards[1] = std::nan("");
    expect_flagged(ps::dapo{}, m, "batch.rewards", "NaN reward");
  }
  {
    master_batch m = base;
    m.response_weights[0] = -2;
    expect_flagged(reco::objective<reco::grpo_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight,
                                   reco::token_mean>{},
                   m, "batch.response_weights", "negative response weight");
  }
  {
    master_batch m = base;
    // A masked token may hold anything: it is never read for its value.
    for (std::size_t k = 0; k < m.mask.size(); ++k)
      if (!m.mask[k]) m.logp[k] = std::nan("");
    typed_batch<double> h(m);
    std::vector<double> g(m.logp.size());
    const auto r = fused_test::emulate(ps::grpo{}, h.view(), reco::gradients<double>{g, {}});
    EXPECT_EQ(r.result.status, 0u);
    for (std::size_t k = 0; k < m.mask.size(); ++k)
      if (!m.mask[k]) {
        ASSERT_EQ(g[k], 0.0) << "masked token " << k << " gets exactly 0";
      }
  }
}

TEST(FusedEmulation, MalformedOffsetsAreFlaggedNotFollowed) {
  batch_spec spec;
  spec.groups = 6;
  const master_batch base = make_batch(3, spec);
  ASSERT_FALSE(base.padded);
  {
    master_batch m = base;
    std::swap(m.offsets[2], m.offsets[3]);  // decreasing token offsets
    if (m.offsets[2] == m.offsets[3]) m.offsets[2] += 1;
    expect_flagged(reco::presets::dapo{}, m, "batch.layout.offsets", "decreasing token offsets");
  }
  {
    master_batch m = base;
    m.group_offsets[1] = m.group_offsets[2] + 1;  // decreasing group offsets
    expect_flagged(reco::presets::grpo{}, m, "batch.group_offsets", "decreasing group offsets");
  }
}

TEST(FusedEmulation, CoverageErrorsAreStructural) {
  std::vector<float> logp(6, -1.f), grad(6), rewards(2, 1.f);
  std::vector<index_t> none = {0}, offsets = {0, 3, 6};
  reco::batch_view<float> v;
  v.layout = reco::packed(reco::span<const index_t>(offsets));
  v.group_offsets = none;  // two responses, no group
  v.logp = logp;
  v.rewards = rewards;
  try {
    fused_test::emulate(reco::presets::dapo{}, v, reco::gradients<float>{grad, {}});
    ADD_FAILURE() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "batch.group_offsets");
  }
  std::vector<index_t> no_response = {0};
  v.layout = reco::packed(reco::span<const index_t>(no_response));  // six tokens, no response
  v.rewards = {};
  try {
    fused_test::emulate(reco::presets::dapo{}, v, reco::gradients<float>{grad, {}});
    ADD_FAILURE() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "batch.layout.offsets");
  }
}

}  // namespace
