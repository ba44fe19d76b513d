// Host tests of the raw CUDA adapter, runnable without a GPU: every argument check names its
// field before anything touches the device, presets resolve by name, parameters are set by key,
// the C structs convert to the core's views, and the C interface reports argument errors with
// codes and messages.
// Pointers here are fake device addresses: validation must never dereference them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/presets_by_name.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/reco.hpp"

namespace {

namespace ca = reco::cuda_adapter;

// Distinct, suitably aligned addresses that are never dereferenced.
const void* fake(std::uintptr_t k) { return reinterpret_cast<const void*>(0x7f0000000000ull + 0x1000ull * k); }
void* fake_mut(std::uintptr_t k) { return const_cast<void*>(fake(k)); }

// A complete, valid call: packed layout, 2 groups of 3 responses, 40 float tokens.
reco_cuda_objective_args valid_args() {
  reco_cuda_objective_args a{};
  a.dtype = RECO_CUDA_FLOAT32;
  a.responses = 6;
  a.tokens = 40;
  a.offsets = static_cast<const int64_t*>(fake(1));
  a.groups = 2;
  a.group_offsets = static_cast<const int64_t*>(fake(2));
  a.logp = fake(3);
  a.old_logp = fake(4);
  a.ref_logp = fake(5);
  a.entropy = fake(6);
  a.mask = static_cast<const uint8_t*>(fake(7));
  a.rewards = fake(8);
  a.grad_logp = fake_mut(9);
  return a;
}

// The field a validation failure names, or "" when it passes.
template <class F>
std::string named(F&& f) {
  try {
    f();
  } catch (const reco::error& e) {
    return e.argument();
  }
  return "";
}

TEST(AdapterValidation, AValidCallPasses) {
  for (const std::string& p : ca::preset_names()) {
    reco_cuda_objective_args a = valid_args();
    EXPECT_EQ(named([&] { ca::validate(a, ca::preset_needs(p)); }), "") << p;
  }
}

TEST(AdapterValidation, EachBadFieldIsNamed) {
  const ca::objective_needs grpo = ca::preset_needs("grpo");
  auto check = [&](const char* field, auto&& mutate, const ca::objective_needs& needs) {
    reco_cuda_objective_args a = valid_args();
    mutate(a);
    EXPECT_EQ(named([&] { ca::validate(a, needs); }), std::string("args.") + field);
  };
  check("dtype", [](auto& a) { a.dtype = RECO_CUDA_BFLOAT16; }, grpo);
  check("dtype", [](auto& a) { a.dtype = static_cast<reco_cuda_dtype>(9); }, grpo);
  check("responses", [](auto& a) { a.responses = -1; }, grpo);
  check("tokens", [](auto& a) { a.tokens = -5; }, grpo);
  check("groups", [](auto& a) { a.groups = -1; }, grpo);
  check("groups", [](auto& a) { a.groups = 0; }, grpo);  // responses outside every group
  check("offsets", [](auto& a) { a.offsets = reinterpret_cast<const int64_t*>(static_cast<const char*>(fake(1)) + 4); },
        grpo);
  check("offsets", [](auto& a) { a.responses = 0; }, grpo);  // tokens but no response
  check("group_offsets", [](auto& a) { a.group_offsets = nullptr; }, grpo);
  check("logp", [](auto& a) { a.logp = nullptr; }, grpo);
  check("logp", [](auto& a) { a.logp = static_cast<const char*>(fake(3)) + 2; }, grpo);  // misaligned float
  check("old_logp", [](auto& a) { a.old_logp = static_cast<const char*>(fake(4)) + 1; }, grpo);
  check("ref_logp", [](auto& a) { a.ref_logp = nullptr; }, grpo);  // grpo's KL term
  check("rewards", [](auto& a) { a.rewards = nullptr; }, grpo);
  check("grad_logp", [](auto& a) { a.grad_logp = nullptr; }, grpo);
  check("global_tokens", [](auto& a) { a.global_tokens = -1; }, grpo);
  check("global_kept_responses", [](auto& a) { a.global_kept_responses = -3; }, grpo);
  check("entropy", [](auto& a) { a.entropy = nullptr; }, ca::preset_needs("rule_80_20"));
  // Padded layout: R * T must be N.
  check("tokens", [](auto& a) { a.offsets = nullptr, a.max_length = 7; }, grpo);
  check("max_length", [](auto& a) { a.offsets = nullptr, a.max_length = -1; }, grpo);
  // float64 values need 8-byte alignment.
  check("logp", [](auto& a) { a.dtype = RECO_CUDA_FLOAT64, a.logp = static_cast<const char*>(fake(3)) + 4; }, grpo);
  // What composed objectives need.
  using given = reco::objective<reco::given_advantage, reco::token_ratio, reco::ppo_clip, reco::caller_weight,
                                reco::token_mean, reco::entropy_bonus>;
  constexpr ca::objective_needs g = ca::needs_of<given>();
  check("advantages", [](auto& a) { a.rewards = nullptr; }, g);
  check("response_weights", [](auto& a) { a.advantages = fake(10); }, g);
  check("grad_entropy", [](auto& a) { a.advantages = fake(10), a.response_weights = fake(11); }, g);
}

TEST(AdapterValidation, OptionalInputsMayBeAbsentAndEmptyBatchesNeedNoPointers) {
  const ca::objective_needs dapo = ca::preset_needs("dapo");
  EXPECT_FALSE(dapo.ref_logp);
  EXPECT_TRUE(dapo.rewards);
  reco_cuda_objective_args a = valid_args();
  a.old_logp = a.ref_logp = a.entropy = nullptr;
  a.mask = nullptr;
  EXPECT_EQ(named([&] { ca::validate(a, dapo); }), "");
  reco_cuda_objective_args empty{};
  empty.dtype = RECO_CUDA_FLOAT64;
  empty.group_offsets = static_cast<const int64_t*>(fake(2));
  EXPECT_EQ(named([&] { ca::validate(empty, dapo); }), "") << "R = N = P = 0, padded [0, 0]";
}

TEST(AdapterValidation, PresetsByName) {
  EXPECT_EQ(ca::preset_names().size(), 21u);  // the 13 of the paper and the peers: trl_bnpo, trl_luspo, trl_vespo, gpg, sapo, clip_cov, kl_cov, dppo
  EXPECT_EQ(ca::preset_index("trl_vespo"), 15);
  EXPECT_EQ(ca::preset_index("rule_80_20_reco"), 12);
  try {
    ca::preset_index("grpoo");
    ADD_FAILURE() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "preset");
    EXPECT_NE(std::string(e.what()).find("rule_80_20_reco"), std::string::npos) << "lists the known presets";
  }
  EXPECT_TRUE(ca::preset_needs("grpo").ref_logp);
  EXPECT_TRUE(ca::preset_needs("reco").ref_logp);
  EXPECT_FALSE(ca::preset_needs("dapo_reco").ref_logp);
  EXPECT_TRUE(ca::preset_needs("rule_80_20").entropy);
  EXPECT_FALSE(ca::preset_needs("gspo").entropy);
  for (int k = 0; k < ca::preset_count; ++k) EXPECT_EQ(std::string(reco_cuda_preset_name(k)), ca::preset_names()[k]);
  EXPECT_EQ(reco_cuda_preset_name(ca::preset_count), nullptr);
  EXPECT_EQ(reco_cuda_preset_name(-1), nullptr);
}

TEST(AdapterValidation, PeerPresetsByName) {
  // A peer preset runs its base with the peer's settings, through the same host checks.
  ASSERT_EQ(std::string(reco_cuda_peer_preset_name(0)), "trl_dapo");
  int peers = 0;
  while (reco_cuda_peer_preset_name(peers) != nullptr) ++peers;
  EXPECT_EQ(peers, reco::registry::peer_preset_count);
  EXPECT_EQ(reco_cuda_peer_preset_name(-1), nullptr);
  EXPECT_FALSE(ca::preset_needs("verl_vanilla").ref_logp);
  EXPECT_EQ(ca::override_keys("verl_vanilla"), ca::override_keys("dapo"));
  std::vector<std::string> listed;
  for (int k = 0; reco_cuda_override_key("verl_vanilla", k) != nullptr; ++k)
    listed.emplace_back(reco_cuda_override_key("verl_vanilla", k));
  EXPECT_EQ(listed, ca::override_keys("dapo"));
  EXPECT_NO_THROW(ca::check_overrides("verl_vanilla", {{"clip.eps_high", 0.3}}));
  try {
    ca::check_overrides("openrlhf_ppo", {{"clip.eps_hi", 0.3}});
    ADD_FAILURE() << "expected reco::error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "overrides.clip.eps_hi");
  }
  const double v = 0.3;
  const char* key = "clip.eps_high";
  EXPECT_EQ(reco_cuda_check_overrides("verl_cispo", &key, &v, 1), RECO_CUDA_INVALID_ARGUMENT)
      << "cispo has no clip: the key is named";
  EXPECT_NE(std::string(reco_cuda_last_error()).find("overrides.clip.eps_high"), std::string::npos);
}

TEST(AdapterValidation, StructsConvertToTheCoreViews) {
  reco_cuda_objective_args a = valid_args();
  a.global_tokens = 1000;
  a.global_kept_tokens = 200;
  const auto b = ca::batch_of<float>(a);
  EXPECT_EQ(b.layout.kind, reco::layout_kind::packed);
  EXPECT_EQ(b.layout.responses, 6);
  EXPECT_EQ(b.layout.offsets.size(), 7);
  EXPECT_EQ(b.group_offsets.size(), 3);
  EXPECT_EQ(b.logp.size(), 40);
  EXPECT_EQ(static_cast<const void*>(b.old_logp.data()), a.old_logp);
  EXPECT_TRUE(b.token_weights.empty());
  EXPECT_EQ(b.rewards.size(), 6);
  EXPECT_TRUE(b.advantages.empty());
  const auto g = ca::gradients_of<float>(a);
  EXPECT_EQ(g.logp.size(), 40);
  EXPECT_TRUE(g.entropy.empty());
  const auto n = ca::normalisers_of(a);
  EXPECT_EQ(n.tokens, 1000);
  EXPECT_EQ(n.kept_tokens, 200);
  a.offsets = nullptr;
  a.responses = 5;
  a.max_length = 8;
  const auto p = ca::batch_of<double>(a);
  EXPECT_EQ(p.layout.kind, reco::layout_kind::padded);
  EXPECT_EQ(p.layout.tokens, 40);
}

reco_cuda_logits_args valid_logits() {
  reco_cuda_logits_args a{};
  a.dtype = RECO_CUDA_BFLOAT16;
  a.logits = fake(1);
  a.rows = 100;
  a.vocab = 151936;
  a.row_stride = 151936;
  a.tokens = static_cast<const int64_t*>(fake(2));
  a.temperature = 0.7;
  a.logp = fake_mut(3);
  a.entropy = fake_mut(4);
  a.lse = fake_mut(5);
  a.grad_logp = fake(6);
  a.saved_lse = fake(7);
  a.dlogits = fake_mut(8);
  return a;
}

TEST(AdapterValidation, LogitsArguments) {
  auto check = [&](const char* field, bool backward, auto&& mutate) {
    reco_cuda_logits_args a = valid_logits();
    mutate(a);
    EXPECT_EQ(named([&] { ca::validate(a, backward); }), std::string("args.") + field)
        << (backward ? "backward" : "forward");
  };
  EXPECT_EQ(named([] { ca::validate(valid_logits(), false); }), "");
  EXPECT_EQ(named([] { ca::validate(valid_logits(), true); }), "");
  check("dtype", false, [](auto& a) { a.dtype = static_cast<reco_cuda_dtype>(7); });
  check("rows", false, [](auto& a) { a.rows = -1; });
  check("vocab", false, [](auto& a) { a.vocab = 0; });
  check("vocab", false, [](auto& a) { a.vocab = a.row_stride = (int64_t(1) << 31); });
  check("row_stride", false, [](auto& a) { a.row_stride = 1000; });
  check("temperature", false, [](auto& a) { a.temperature = 0; });
  check("temperature", true, [](auto& a) { a.temperature = std::nan(""); });
  check("logits", false, [](auto& a) { a.logits = nullptr; });
  check("logits", false, [](auto& a) { a.logits = static_cast<const char*>(fake(1)) + 1; });  // odd bf16 address
  check("tokens", false, [](auto& a) { a.tokens = nullptr; });
  check("logp", false, [](auto& a) { a.logp = a.entropy = a.lse = nullptr; });  // nothing to compute
  check("entropy", false, [](auto& a) { a.entropy = static_cast<char*>(fake_mut(4)) + 2; });
  check("tokens", true, [](auto& a) { a.tokens = nullptr; });
  check("saved_lse", true, [](auto& a) { a.saved_lse = nullptr; });
  check("saved_entropy", true, [](auto& a) { a.grad_entropy = fake(9); });
  check("dlogits", true, [](auto& a) { a.dlogits = nullptr; });
  // Only entropy wanted: no tokens needed.
  reco_cuda_logits_args e = valid_logits();
  e.logp = nullptr;
  e.tokens = nullptr;
  EXPECT_EQ(named([&] { ca::validate(e, false); }), "");
}

// The C interface: argument errors come back as codes with the message naming the argument,
// before any device work (none of these calls reaches the GPU).
TEST(AdapterCInterface, ArgumentErrorsBeforeAnyDeviceWork) {
  reco_cuda_context* ctx = reco_cuda_context_create();
  ASSERT_NE(ctx, nullptr);
  reco_cuda_result result{};
  const reco_cuda_objective_args good = valid_args();
  auto message = [] { return std::string(reco_cuda_last_error()); };

  EXPECT_EQ(reco_cuda_objective(nullptr, "grpo", &good, nullptr, RECO_CUDA_RESULT_HOST, &result, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: ctx:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_objective(ctx, "nope", &good, nullptr, RECO_CUDA_RESULT_HOST, &result, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: preset:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_objective(ctx, "grpo", &good, nullptr, RECO_CUDA_RESULT_HOST, nullptr, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: result:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_objective(ctx, "grpo", &good, nullptr, RECO_CUDA_RESULT_WORKSPACE, nullptr, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: workspace_result:", 0), 0u) << message();
  reco_cuda_objective_args bad = good;
  bad.ref_logp = nullptr;
  EXPECT_EQ(reco_cuda_objective(ctx, "grpo", &bad, nullptr, RECO_CUDA_RESULT_HOST, &result, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: args.ref_logp:", 0), 0u) << message();
  bad = good;
  bad.dtype = RECO_CUDA_FLOAT16;
  EXPECT_EQ(reco_cuda_objective(ctx, "dapo", &bad, nullptr, RECO_CUDA_RESULT_DEVICE, &result, nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: args.dtype:", 0), 0u) << message();

  EXPECT_EQ(reco_cuda_context_set_options(ctx, -1, 1, 0), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(reco_cuda_context_set_options(ctx, 64, 0, 1), RECO_CUDA_OK);
  EXPECT_EQ(message(), "");

  reco_cuda_logits_args la = valid_logits();
  la.vocab = 0;
  EXPECT_EQ(reco_cuda_logits_forward(&la, nullptr), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: args.vocab:", 0), 0u) << message();
  la = valid_logits();
  la.saved_lse = nullptr;
  EXPECT_EQ(reco_cuda_logits_backward(&la, nullptr), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: args.saved_lse:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_logits_forward(nullptr, nullptr), RECO_CUDA_INVALID_ARGUMENT);

  EXPECT_EQ(std::string(reco_cuda_describe_status(0)), "ok");
  EXPECT_EQ(std::string(reco_cuda_describe_status(reco::bad_old_logp | reco::bad_rewards)).rfind("batch.old_logp:", 0),
            0u);
  reco_cuda_context_destroy(ctx);
}

// Parameter overrides through the C++ and C interfaces: the registry's keys, and every bad key,
// value or array reported before any device work.
TEST(AdapterOverrides, KeysOfAPreset) {
  const std::vector<std::string> keys = ca::override_keys("rule_80_20");
  EXPECT_NE(std::find(keys.begin(), keys.end(), "select.rho"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "clip.eps_high"), keys.end());
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "weight.cap"), keys.end());
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "kl.beta"), keys.end());
  for (const std::string& p : ca::preset_names()) {
    const std::vector<std::string> expected = ca::override_keys(p);
    std::vector<std::string> listed;
    for (int k = 0; reco_cuda_override_key(p.c_str(), k) != nullptr; ++k) listed.emplace_back(reco_cuda_override_key(p.c_str(), k));
    EXPECT_EQ(listed, expected) << p;
    EXPECT_EQ(reco_cuda_override_key(p.c_str(), -1), nullptr);
  }
  EXPECT_EQ(reco_cuda_override_key("grpoo", 0), nullptr);
  EXPECT_EQ(std::string(reco_cuda_last_error()).rfind("reco: preset:", 0), 0u) << reco_cuda_last_error();
  EXPECT_EQ(reco_cuda_override_key(nullptr, 0), nullptr);
}

TEST(AdapterOverrides, CheckedByKeyBeforeAnyDeviceWork) {
  EXPECT_EQ(named([] { ca::check_overrides("reco", {{"clip.eps_high", 0.28}, {"kl.beta", 0.01}, {"kl.clamp", 0}}); }),
            "");
  EXPECT_EQ(named([] { ca::check_overrides("grpo", {{"clip.eps_lo", 0.1}}); }), "overrides.clip.eps_lo");
  EXPECT_EQ(named([] { ca::check_overrides("dapo", {{"kl.beta", 0.1}}); }), "overrides.kl.beta");  // no KL term
  EXPECT_EQ(named([] { ca::check_overrides("grpo", {{"kl.clamp", 0.5}}); }), "overrides.kl.clamp");
  EXPECT_EQ(named([] { ca::check_overrides("grpo", {{"clip.dual_clip", 3}}); }), "overrides.clip.dual_clip");
  EXPECT_EQ(named([] { ca::check_overrides("grpo", {{"kl.beta", 0.1}, {"kl.beta", 0.2}}); }), "overrides.kl.beta");
  EXPECT_EQ(named([] { ca::check_overrides("nope", {}); }), "preset");
  // The run entry checks the overrides before the arguments and before the device: a bad key is
  // reported even though the arguments lack grpo's ref_logp.
  reco_cuda_objective_args a = valid_args();
  a.ref_logp = nullptr;
  ca::context ctx;  // created without a device, as reco_cuda_context_create is above
  EXPECT_EQ(named([&] { ca::run_preset_async("grpo", {{"weight.cap", 5}}, a, nullptr, ctx); }),
            "overrides.weight.cap");
  EXPECT_EQ(named([&] { ca::run_preset_async("grpo", {{"clip.eps_high", 0.3}}, a, nullptr, ctx); }),
            "args.ref_logp");
}

TEST(AdapterOverrides, CInterface) {
  auto message = [] { return std::string(reco_cuda_last_error()); };
  const char* keys[] = {"clip.eps_high", "kl.beta", "clip.dual_clip"};
  const double values[] = {0.28, 0.01, 2};
  EXPECT_EQ(reco_cuda_check_overrides("grpo", keys, values, 3), RECO_CUDA_OK) << message();
  EXPECT_EQ(reco_cuda_check_overrides("grpo", nullptr, nullptr, 0), RECO_CUDA_OK);
  EXPECT_EQ(reco_cuda_check_overrides("dapo", keys, values, 3), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: overrides.kl.beta:", 0), 0u) << message();
  const double bad_choice[] = {0.28, 0.01, 1.5};
  EXPECT_EQ(reco_cuda_check_overrides("grpo", keys, bad_choice, 3), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: overrides.clip.dual_clip:", 0), 0u) << message();
  EXPECT_NE(message().find("0 (off), 1 (hard), 2 (soft)"), std::string::npos) << message();
  const char* flag_key[] = {"kl.straight_through"};
  const double flag_value[] = {2};
  EXPECT_EQ(reco_cuda_check_overrides("reco", flag_key, flag_value, 1), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: overrides.kl.straight_through:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_check_overrides("grpo", keys, values, -1), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: count:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_check_overrides("grpo", nullptr, values, 1), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: keys:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_check_overrides("grpo", keys, nullptr, 1), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: values:", 0), 0u) << message();
  const char* null_entry[] = {"kl.beta", nullptr};
  EXPECT_EQ(reco_cuda_check_overrides("grpo", null_entry, values, 2), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: keys:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_check_overrides(nullptr, keys, values, 1), RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: preset:", 0), 0u) << message();

  // The objective entry: overrides are checked before the arguments and the device.
  reco_cuda_context* ctx = reco_cuda_context_create();
  ASSERT_NE(ctx, nullptr);
  reco_cuda_result result{};
  reco_cuda_objective_args bad = valid_args();
  bad.ref_logp = nullptr;
  const char* typo[] = {"clip.eps_lo"};
  EXPECT_EQ(reco_cuda_objective_overrides(ctx, "grpo", typo, values, 1, &bad, nullptr, RECO_CUDA_RESULT_HOST, &result,
                                          nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: overrides.clip.eps_lo:", 0), 0u) << message();
  EXPECT_NE(message().find("clip.eps_low"), std::string::npos) << "lists the preset's keys: " << message();
  EXPECT_EQ(reco_cuda_objective_overrides(ctx, "grpo", keys, values, 3, &bad, nullptr, RECO_CUDA_RESULT_HOST, &result,
                                          nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: args.ref_logp:", 0), 0u) << message();
  EXPECT_EQ(reco_cuda_objective_overrides(ctx, "grpo", keys, values, -2, &bad, nullptr, RECO_CUDA_RESULT_HOST, &result,
                                          nullptr),
            RECO_CUDA_INVALID_ARGUMENT);
  EXPECT_EQ(message().rfind("reco: count:", 0), 0u) << message();
  reco_cuda_context_destroy(ctx);
}

}  // namespace
