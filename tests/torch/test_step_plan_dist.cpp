// Split steps over processes: W = 1, 2, 4 ranks (forked, FileStore + ProcessGroupGloo on
// 127.0.0.1), each with 1, 2 or 3 micro-batches, every preset, in float64 and float32. The
// ranks' gradients, averaged as DDP does, must equal one call on the whole step; ranks that
// disagree on the preset or its overrides fail naming "plan"; a rank that never joins makes the
// others fail naming "process_group" after the group's timeout. Every process runs under alarm().
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include "forked_ranks.hpp"
#include "reco/torch/gloo_group.hpp"

#include "reco/torch/detail/plan_token_passes.hpp"
#include "reco/torch/policy_loss.hpp"
#include "reco/torch/step_plan.hpp"

namespace {

using reco::index_t;
using torch_test::spawn;

// A packed step in float64 with prompt ids; groups of 1..5, lengths 0..8, masked holes, entropies
// on a grid of 0.25 (ties at the 80/20 cut).
struct step_data {
  index_t R = 0, N = 0;
  std::vector<std::int64_t> offsets, prompt_ids;
  std::vector<double> logp, old_logp, ref_logp, entropy, rewards;
  std::vector<std::uint8_t> mask;
};

step_data make_step(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  step_data s;
  s.offsets.push_back(0);
  for (int g = 0; g < 9; ++g) {
    const int size = 1 + static_cast<int>(u(rng) * 5);
    for (int j = 0; j < size; ++j) {
      s.prompt_ids.push_back(100 + g);
      s.rewards.push_back(u(rng) < 0.5 ? 1.0 : 0.0);
      const int len = static_cast<int>(u(rng) * 9);
      for (int t = 0; t < len; ++t) {
        const double lp = -3.0 * u(rng) - 1e-4;
        s.logp.push_back(lp);
        s.old_logp.push_back(std::min(lp + 0.3 * (u(rng) - 0.5), -1e-6));
        s.ref_logp.push_back(std::min(lp + 0.2 * (u(rng) - 0.5), 0.0));
        s.entropy.push_back(std::round(12.0 * u(rng)) / 4.0);
        s.mask.push_back(t > 0 && u(rng) < 0.15 ? 0 : 1);
      }
      s.offsets.push_back(static_cast<std::int64_t>(s.logp.size()));
    }
  }
  s.R = static_cast<index_t>(s.rewards.size());
  s.N = static_cast<index_t>(s.logp.size());
  return s;
}

at::Tensor doubles(const std::vector<double>& v, std::int64_t a, std::int64_t b, at::ScalarType dt) {
  return at::tensor(std::vector<double>(v.begin() + a, v.begin() + b), at::kDouble).to(dt);
}

// Responses [a, b) of the step as adapter inputs (logp a leaf that requires grad).
reco::torch::policy_inputs inputs(const step_data& s, index_t a, index_t b, at::ScalarType dt) {
  const std::int64_t t0 = s.offsets[static_cast<std::size_t>(a)], t1 = s.offsets[static_cast<std::size_t>(b)];
  reco::torch::policy_inputs in;
  in.logp = doubles(s.logp, t0, t1, dt).requires_grad_(true);
  in.old_logp = doubles(s.old_logp, t0, t1, dt);
  in.ref_logp = doubles(s.ref_logp, t0, t1, dt);
  in.entropy = doubles(s.entropy, t0, t1, dt);
  in.mask = at::tensor(std::vector<std::uint8_t>(s.mask.begin() + t0, s.mask.begin() + t1), at::kByte).to(at::kBool);
  std::vector<std::int64_t> off;
  for (index_t i = a; i <= b; ++i) off.push_back(s.offsets[static_cast<std::size_t>(i)] - t0);
  in.offsets = at::tensor(off, at::kLong);
  in.rewards = doubles(s.rewards, a, b, dt);
  in.prompt_ids = at::tensor(std::vector<std::int64_t>(s.prompt_ids.begin() + a, s.prompt_ids.begin() + b), at::kLong);
  return in;
}

// Uneven, deterministic part boundaries over R responses (empty parts included).
std::vector<index_t> part_bounds(index_t R, int parts, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<index_t> cuts;
  for (int k = 0; k + 1 < parts; ++k) cuts.push_back(static_cast<index_t>(rng() % static_cast<std::uint64_t>(R + 1)));
  std::sort(cuts.begin(), cuts.end());
  if (parts >= 3) cuts[1] = cuts[0];  // an empty part
  std::vector<index_t> b{0};
  b.insert(b.end(), cuts.begin(), cuts.end());
  b.push_back(R);
  return b;
}

c10::intrusive_ptr<c10d::ProcessGroup> make_group(const std::string& path, int rank, int world, int timeout_ms) {
  auto store = c10::make_intrusive<c10d::FileStore>(path, world);
  return reco::torch::loopback_gloo_group(store, rank, world, std::chrono::milliseconds(timeout_ms));
}

// One rank of a (W, M) run over every preset and both value types; returns the failures seen.
int run_rank(const c10::intrusive_ptr<c10d::ProcessGroup>& group, int rank, int world, int micro,
             reco::torch::plan_passes passes = reco::torch::plan_passes::automatic,
             const reco::window_sampling& window = {}, int* fallbacks = nullptr) {
  int failures = 0;
  const step_data s = make_step(42);
  std::uint64_t step_id = 1;
  for (const std::string& preset : reco::torch::preset_names()) {
    for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
      const double tol = dt == at::kDouble ? 1e-12 : 1e-6;
      const auto bounds = part_bounds(s.R, world * micro, 7 + step_id);
      std::vector<reco::torch::policy_inputs> mbs;
      for (int j = 0; j < micro; ++j) {
        const int p = rank * micro + j;
        mbs.push_back(inputs(s, bounds[static_cast<std::size_t>(p)], bounds[static_cast<std::size_t>(p + 1)], dt));
      }
      reco::torch::step_options opt;
      opt.step = step_id++;
      opt.passes = passes;
      opt.window = window;
      // The covariance presets select one token of this small step at their own ratio; a wider
      // ratio (and Clip-Cov band) selects many, across the parts.
      std::map<std::string, double> over;
      if (preset == "kl_cov" || preset == "clip_cov") over = {{"select.ratio", 0.25}};
      if (preset == "clip_cov") over.insert({{"select.lb", -0.5}, {"select.ub", 0.5}});
      const auto plan = reco::torch::build_step_plan(group, preset, mbs, over, opt);
      // A plan whose windowed stage 0 missed the cut takes two stages more than the 80/20 cut's
      // histogram rounds and counts (2 for float32, 4 for float64).
      // (A covariance selection has no windows: its values need the step's means first.)
      if (fallbacks && !plan.plan.covariance() && plan.plan.stage_index() > (dt == at::kDouble ? 5 : 3)) ++*fallbacks;
      // This rank's gradient over the whole step's tokens (zeros elsewhere) and its loss.
      at::Tensor grad = at::zeros({s.N + 1}, at::kDouble);
      for (int j = 0; j < micro; ++j) {
        auto out = reco::torch::policy_loss(preset, mbs[static_cast<std::size_t>(j)], over, plan, static_cast<std::size_t>(j));
        out.loss.backward();
        const std::int64_t t0 = s.offsets[static_cast<std::size_t>(bounds[static_cast<std::size_t>(rank * micro + j)])];
        const at::Tensor g = mbs[static_cast<std::size_t>(j)].logp.grad();
        if (g.defined() && g.numel() > 0) grad.narrow(0, t0, g.numel()).add_(g.to(at::kDouble));
        grad[s.N] += out.loss.item<double>();
      }
      // DDP: the average over ranks.
      if (group) {
        std::vector<at::Tensor> ts{grad};
        group->allreduce(ts)->wait();
      }
      grad.div_(world);
      // One call on the whole step.
      auto whole_in = inputs(s, 0, s.R, dt);
      auto whole = reco::torch::policy_loss(preset, whole_in, over);
      whole.loss.backward();
      const at::Tensor wg = whole_in.logp.grad().to(at::kDouble);
      const double gmax = wg.abs().max().item<double>();
      const double gerr = (grad.narrow(0, 0, s.N) - wg).abs().max().item<double>() / std::max(gmax, 1e-300);
      const double wl = whole.loss.item<double>();
      const double lerr = std::fabs(grad[s.N].item<double>() - wl) / std::max(std::fabs(wl), 1e-3);
      if (!(gerr <= tol && lerr <= tol)) {
        std::fprintf(stderr, "rank %d W=%d M=%d %s %s: gradient error %.3g, loss error %.3g\n", rank, world, micro,
                     preset.c_str(), dt == at::kDouble ? "float64" : "float32", gerr, lerr);
        ++failures;
      }
      // The layout, the summaries, 3 histogram rounds (float64) and the counts; 2 more when a
      // windowed stage 0 missed the targets.
      if (plan.collectives > (window.min_samples <= 1 ? 9 : 7)) {
        std::fprintf(stderr, "%s: %d collectives\n", preset.c_str(), plan.collectives);
        ++failures;
      }
    }
  }
  return failures;
}

class Distributed : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(Distributed, AveragedGradientsEqualTheWholeStep) {
  const auto [world, micro] = GetParam();
  const auto codes = spawn(world, 120, [world = world, micro = micro](int rank, const std::string& path) {
    auto group = make_group(path, rank, world, 30000);
    return run_rank(group, rank, world, micro) == 0 ? 0 : 1;
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndMicroBatches, Distributed,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 2, 3)));

// The same with every micro-batch's stage 0 windowed (reco::window_sampling; the test's steps are
// too small for the default), with the default margins (the windows mostly hold the step's cut)
// and with none (they mostly miss it, and the plan counts every first digit in one more round).
class DistributedWindowed : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(DistributedWindowed, AveragedGradientsEqualTheWholeStep) {
  const auto [world, micro, narrow] = GetParam();
  reco::window_sampling w;
  w.stride = 1;
  w.min_samples = 1;
  w.max_fraction = 1;
  if (narrow) w.margin = w.slack = 0;
  const auto codes = spawn(world, 120, [world = world, micro = micro, narrow = narrow, w](int rank,
                                                                                        const std::string& path) {
    auto group = make_group(path, rank, world, 30000);
    int fallbacks = 0;
    if (run_rank(group, rank, world, micro, reco::torch::plan_passes::automatic, w, &fallbacks) != 0) return 1;
    // Windows of no margin miss the step's cut somewhere when there are 3 parts or more (with one
    // part, its quantile is the step's; with two, this step's tied entropies keep them inside).
    return narrow && world * micro >= 3 && fallbacks == 0 ? 3 : 0;
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(codes[static_cast<std::size_t>(r)], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndMicroBatches, DistributedWindowed,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(1, 3), ::testing::Values(0, 1)));

// Gradient accumulation in one process: no process group, the same plan.
TEST(StepPlanTorch, AccumulationWithoutProcessGroup) {
  const auto codes = spawn(1, 120, [](int, const std::string&) {
    reco::window_sampling narrow;  // every micro-batch windowed, the windows mostly missing the cut
    narrow.stride = 1;
    narrow.min_samples = 1;
    narrow.max_fraction = 1;
    narrow.margin = narrow.slack = 0;
    const c10::intrusive_ptr<c10d::ProcessGroup> none;
    int fallbacks = 0;
    return run_rank(none, 0, 1, 3) == 0 &&
                   run_rank(none, 0, 1, 3, reco::torch::plan_passes::automatic, narrow, &fallbacks) == 0 &&
                   fallbacks > 0
               ? 0
               : 1;
  });
  EXPECT_EQ(codes[0], 0);
}

// The plan's token passes as tensor operations (what CUDA micro-batches run on the device), here
// on CPU tensors: the same split-invariant steps over 2 ranks x 3 micro-batches.
TEST(StepPlanTorch, TensorPassesOverTwoRanks) {
  const auto codes = spawn(2, 120, [](int rank, const std::string& path) {
    auto group = make_group(path, rank, 2, 30000);
    return run_rank(group, rank, 2, 3, reco::torch::plan_passes::tensor_ops) == 0 ? 0 : 1;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// Responses [a, b) of the step as a padded [R, T] micro-batch (3 slots of padding after the
// longest response, masked, holding valid-looking values).
reco::torch::policy_inputs padded_inputs(const step_data& s, index_t a, index_t b, at::ScalarType dt) {
  std::int64_t T = 0;
  for (index_t i = a; i < b; ++i) T = std::max<std::int64_t>(T, s.offsets[i + 1] - s.offsets[i]);
  T += 3;
  const std::int64_t R = b - a;
  std::vector<double> logp(R * T, -1.0), old_logp(R * T, -1.0), ref_logp(R * T, -1.0), entropy(R * T, 0.5);
  std::vector<std::uint8_t> mask(R * T, 0);
  for (index_t i = a; i < b; ++i)
    for (std::int64_t t = s.offsets[i], j = 0; t < s.offsets[i + 1]; ++t, ++j) {
      const std::int64_t k = (i - a) * T + j;
      logp[k] = s.logp[t];
      old_logp[k] = s.old_logp[t];
      ref_logp[k] = s.ref_logp[t];
      entropy[k] = s.entropy[t];
      mask[k] = s.mask[t];
    }
  auto matrix = [&](const std::vector<double>& v) { return at::tensor(v, at::kDouble).view({R, T}).to(dt); };
  reco::torch::policy_inputs in;
  in.logp = matrix(logp).requires_grad_(true);
  in.old_logp = matrix(old_logp);
  in.ref_logp = matrix(ref_logp);
  in.entropy = matrix(entropy);
  in.mask = at::tensor(mask, at::kByte).view({R, T}).to(at::kBool);
  in.rewards = doubles(s.rewards, a, b, dt);
  in.prompt_ids = at::tensor(std::vector<std::int64_t>(s.prompt_ids.begin() + a, s.prompt_ids.begin() + b), at::kLong);
  return in;
}

double relative_error(const at::Tensor& x, const at::Tensor& ref) {
  const double scale = std::max(ref.abs().max().item<double>(), 1e-300);
  return (x.to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>() / scale;
}

// The token passes as tensor operations make the host passes' plan: the same cut, kept counts and
// planned calls (the old log-probabilities' per-response sums may round differently), for every
// preset, both value types, packed and padded micro-batches; and, without state, the same
// summaries round by round (plan_summary, as the Python ops run it).
TEST(StepPlanTorch, TensorPassesMakeTheHostPlan) {
  const step_data s = make_step(21);
  const auto bounds = part_bounds(s.R, 3, 5);
  std::uint64_t id = 1;
  int compared = 0, later_rounds = 0;
  for (const std::string& preset : reco::torch::preset_names()) {
    if (preset == "clip_cov" || preset == "kl_cov") continue;  // its plan reads logp on the host only
    for (at::ScalarType dt : {at::kDouble, at::kFloat}) {
      const double tol = dt == at::kDouble ? 1e-13 : 1e-6;
      for (bool padded : {false, true}) {
        auto micro = [&] {
          std::vector<reco::torch::policy_inputs> mbs;
          for (int j = 0; j < 3; ++j)
            mbs.push_back(padded ? padded_inputs(s, bounds[j], bounds[j + 1], dt) : inputs(s, bounds[j], bounds[j + 1], dt));
          return mbs;
        };
        const std::string what = preset + (dt == at::kDouble ? " float64 " : " float32 ") + (padded ? "padded" : "packed");
        std::vector<reco::torch::policy_inputs> host_mbs = micro(), tensor_mbs = micro();
        reco::torch::step_options opt;
        opt.step = id++;
        opt.passes = reco::torch::plan_passes::host;
        const auto host = reco::torch::build_step_plan({}, preset, host_mbs, {}, opt);
        opt.passes = reco::torch::plan_passes::tensor_ops;
        const auto tensor = reco::torch::build_step_plan({}, preset, tensor_mbs, {}, opt);
        EXPECT_EQ(host.collectives, tensor.collectives) << what;
        EXPECT_EQ(host.plan.kept(), tensor.plan.kept()) << what;
        EXPECT_EQ(host.plan.cut().value, tensor.plan.cut().value) << what;
        EXPECT_EQ(host.plan.cut().ties, tensor.plan.cut().ties) << what;
        for (std::size_t j = 0; j < 3; ++j) {
          auto oh = reco::torch::policy_loss(preset, host_mbs[j], {}, host, j);
          auto ot = reco::torch::policy_loss(preset, tensor_mbs[j], {}, tensor, j);
          oh.loss.backward();
          ot.loss.backward();
          EXPECT_LE(std::fabs(oh.loss.item<double>() - ot.loss.item<double>()),
                    tol * std::max(1.0, std::fabs(oh.loss.item<double>())))
              << what << " micro-batch " << j;
          if (host_mbs[j].logp.grad().defined() && host_mbs[j].logp.numel() > 0) {
            EXPECT_LE(relative_error(tensor_mbs[j].logp.grad(), host_mbs[j].logp.grad()), tol) << what;
          }
        }
        // Stateless, the whole step as one part: the summaries of every round.
        const reco::torch::policy_inputs whole = padded ? padded_inputs(s, 0, s.R, dt) : inputs(s, 0, s.R, dt);
        reco::step_part part;
        part.step.id = id++;
        part.step.responses = s.R;
        std::vector<at::Tensor> summed;
        for (int round = 0; round < 8; ++round) {
          const at::Tensor h = reco::torch::plan_summary(preset, {}, part, whole, summed, reco::torch::plan_passes::host);
          const at::Tensor t =
              reco::torch::plan_summary(preset, {}, part, whole, summed, reco::torch::plan_passes::tensor_ops);
          ASSERT_EQ(h.numel(), t.numel()) << what << " round " << round;
          if (h.numel() == 0) break;
          // The values, not their checksums: a rounding apart in an old-log-probability sum changes
          // the checksums' hash of its bits (each kind's summaries carry their own, sealed).
          auto values = [](at::Tensor x) {
            x = x.clone();
            x.narrow(0, reco::detail::plan_h_check, 3).zero_();
            return x;
          };
          EXPECT_LE((values(h) - values(t)).abs().max().item<double>(),
                    1e-13 * std::max(1.0, h.abs().max().item<double>()))
              << what << " round " << round;
          summed.push_back(h);
          ++compared;
          later_rounds += round > 0;
        }
      }
    }
  }
  EXPECT_GE(compared, 100);
  EXPECT_GE(later_rounds, 24);  // the 80/20 presets' histogram and cut-count rounds
}

// The first-digit histogram of the tensor passes (sorted digits, binary searches), against a
// count by hand, from int32 and int64 digits; clustered digits, every digit of the range, none.
TEST(StepPlanTorch, DigitCountsBySearch) {
  std::mt19937_64 rng(5);
  for (std::int64_t n : {0, 1, 6, 7, 100, 1000, 4099}) {
    std::vector<std::int64_t> d(static_cast<std::size_t>(n));
    for (auto& x : d) x = rng() % 4 == 0 ? static_cast<std::int64_t>(rng() % 65536) : 48000 + static_cast<std::int64_t>(rng() % 3);
    if (n > 2) {
      d[0] = 0;
      d[1] = 65535;
    }
    std::vector<std::int64_t> expect(65536, 0);
    for (auto x : d) ++expect[static_cast<std::size_t>(x)];
    for (at::ScalarType dt : {at::kInt, at::kLong}) {
      const at::Tensor c = reco::torch::detail::digit_counts(at::tensor(d, at::kLong).to(dt));
      ASSERT_EQ(c.numel(), 65536);
      ASSERT_EQ(c.scalar_type(), at::kLong);
      const std::int64_t* p = c.data_ptr<std::int64_t>();
      for (std::size_t k = 0; k < 65536; ++k) ASSERT_EQ(p[k], expect[k]) << "n " << n << " digit " << k;
    }
  }
}

// Bad values the plan reads are named alike by both kinds of passes.
TEST(StepPlanTorch, TensorPassesNameBadValues) {
  const step_data s = make_step(22);
  for (auto passes : {reco::torch::plan_passes::host, reco::torch::plan_passes::tensor_ops}) {
    for (bool padded : {false, true}) {
      auto mb = [&] { return padded ? padded_inputs(s, 0, s.R, at::kFloat) : inputs(s, 0, s.R, at::kFloat); };
      reco::torch::step_options opt;
      opt.passes = passes;
      auto expect = [&](const char* preset, const reco::torch::policy_inputs& in, const char* argument) {
        try {
          reco::torch::build_step_plan({}, preset, {in}, {}, opt);
          ADD_FAILURE() << preset << ": no error, expected one naming " << argument;
        } catch (const reco::error& e) {
          EXPECT_EQ(e.argument(), argument) << e.what();
        }
      };
      // The first valid token of the step (a response's first token is never masked here).
      index_t first = 0;
      while (s.offsets[first + 1] == s.offsets[first]) ++first;
      const std::int64_t flat = padded ? 0 : s.offsets[first];
      auto with = [&](at::Tensor reco::torch::policy_inputs::*field, double v) {
        reco::torch::policy_inputs in = mb();
        at::Tensor t = (in.*field).detach().clone();
        if (padded) t[first][0] = v; else t[flat] = v;
        in.*field = t;
        return in;
      };
      expect("rule_80_20", with(&reco::torch::policy_inputs::entropy, std::nan("")), "batch.entropy");
      expect("rule_80_20", with(&reco::torch::policy_inputs::entropy, HUGE_VAL), "batch.entropy");
      expect("reco", with(&reco::torch::policy_inputs::old_logp, 0.5), "batch.old_logp");
      reco::torch::policy_inputs on_policy = with(&reco::torch::policy_inputs::logp, 0.5);
      on_policy.old_logp = at::Tensor();
      expect("reco", on_policy, "batch.logp");
    }
  }
}

// Exit 0 when build_step_plan throws reco::error naming `argument`.
int expect_error(const std::function<void()>& f, const char* argument) {
  try {
    f();
  } catch (const reco::error& e) {
    if (e.argument() == argument) return 0;
    std::fprintf(stderr, "wrong argument: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "no error\n");
  return 4;
}

TEST(StepPlanTorch, RanksDisagreeingOnTheObjectiveFailNamingPlan) {
  const auto codes = spawn(2, 60, [](int rank, const std::string& path) {
    auto group = make_group(path, rank, 2, 20000);
    const step_data s = make_step(3);
    std::vector<reco::torch::policy_inputs> mbs{rank == 0 ? inputs(s, 0, s.R / 2, at::kDouble)
                                                          : inputs(s, s.R / 2, s.R, at::kDouble)};
    const std::map<std::string, double> overrides =
        rank == 0 ? std::map<std::string, double>{} : std::map<std::string, double>{{"clip.eps_high", 0.3}};
    int code = expect_error([&] { reco::torch::build_step_plan(group, "grpo", mbs, overrides, {}); }, "plan");
    // Another preset on one rank.
    code |= expect_error([&] { reco::torch::build_step_plan(group, rank == 0 ? "grpo" : "dapo", mbs, {}, {}); },
                         "plan");
    // Another step id on one rank.
    reco::torch::step_options opt;
    opt.step = static_cast<std::uint64_t>(rank);
    code |= expect_error([&] { reco::torch::build_step_plan(group, "reco", mbs, {}, opt); }, "plan");
    return code;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// A caller that knows the layout (where each rank's responses and groups start) passes it: one
// collective fewer, the same plan. A layout that does not fit the data fails naming the plan.
TEST(StepPlanTorch, GivenLayoutSkipsTheAllGather) {
  const auto codes = spawn(2, 60, [](int rank, const std::string& path) {
    auto group = make_group(path, rank, 2, 20000);
    const step_data s = make_step(6);
    const index_t cut = s.R / 2 + 1;  // a prompt group continues on rank 1 (make_step's groups are 1..5)
    const index_t a = rank == 0 ? 0 : cut, b = rank == 0 ? cut : s.R;
    std::int64_t first_group = 0;  // the step's id of response a's group
    for (index_t i = 1; i <= a && i < s.R; ++i)
      first_group += s.prompt_ids[static_cast<std::size_t>(i)] != s.prompt_ids[static_cast<std::size_t>(i - 1)];
    int code = 0;
    std::uint64_t id = 1;
    for (const char* preset : {"rule_80_20", "reco", "dr_grpo"}) {
      std::vector<reco::torch::policy_inputs> ex{inputs(s, a, b, at::kDouble)}, gv{inputs(s, a, b, at::kDouble)};
      reco::torch::step_options opt;
      opt.step = id++;
      const auto exchanged = reco::torch::build_step_plan(group, preset, ex, {}, opt);
      opt.layout = reco::torch::step_layout{s.R, a, first_group};
      const auto given = reco::torch::build_step_plan(group, preset, gv, {}, opt);
      if (given.collectives != exchanged.collectives - 1) code |= 8;
      auto oe = reco::torch::policy_loss(preset, ex[0], {}, exchanged, 0);
      auto og = reco::torch::policy_loss(preset, gv[0], {}, given, 0);
      oe.loss.backward();
      og.loss.backward();
      if (oe.loss.item<double>() != og.loss.item<double>()) code |= 16;
      if (!at::equal(ex[0].logp.grad(), gv[0].logp.grad())) code |= 32;
    }
    // Rank 1 placed one response too early: response cut - 1 claimed twice, the last by no rank.
    std::vector<reco::torch::policy_inputs> mbs{inputs(s, a, b, at::kDouble)};
    reco::torch::step_options bad;
    bad.step = id;
    bad.layout = reco::torch::step_layout{s.R, rank == 0 ? a : a - 1, first_group};
    code |= expect_error([&] { reco::torch::build_step_plan(group, "grpo", mbs, {}, bad); }, "plan");
    return code;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

TEST(StepPlanTorch, RankThatNeverJoinsTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  const auto codes = spawn(2, 60, [](int rank, const std::string& path) {
    auto group = make_group(path, rank, 2, 2000);  // a 2 s collective timeout
    const step_data s = make_step(4);
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));  // never calls build_step_plan
      return 0;
    }
    std::vector<reco::torch::policy_inputs> mbs{inputs(s, 0, s.R, at::kDouble)};
    return expect_error([&] { reco::torch::build_step_plan(group, "grpo", mbs, {}, {}); }, "process_group");
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// ---- the training loop of docs/distributed.md (verbatim) -----------------------------------

// A toy policy: logits = bias + theta over a vocabulary of V tokens at every position.
struct micro_batch_data {
  at::Tensor bias;        // [n, V] per-position context (data)
  at::Tensor tokens;      // [n] sampled token ids
  at::Tensor old_logp;    // [n] log-probabilities at sampling time
  at::Tensor mask;        // [n] bool
  at::Tensor offsets;     // [R + 1] packed layout
  at::Tensor rewards;     // [R]
  at::Tensor prompt_ids;  // [R]; a prompt's responses may continue in the next micro-batch
};

// One optimizer step over this rank's micro-batches; returns this rank's share of the loss.
double train_step(const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor& theta,
                  const std::vector<micro_batch_data>& mbs, std::uint64_t step, double lr) {
  const std::string preset = "rule_80_20_reco";
  auto inputs_of = [&](const micro_batch_data& mb, const at::Tensor& logp, const at::Tensor& entropy) {
    reco::torch::policy_inputs in;
    in.logp = logp;
    in.entropy = entropy;
    in.old_logp = mb.old_logp;
    in.mask = mb.mask;
    in.offsets = mb.offsets;
    in.rewards = mb.rewards;
    in.prompt_ids = mb.prompt_ids;
    return in;
  };
  // 1. The plan, from a forward pass without gradient (entropies of the current policy).
  std::vector<reco::torch::policy_inputs> planning;
  {
    at::NoGradGuard no_grad;
    for (const auto& mb : mbs) {
      const at::Tensor lp = at::log_softmax(mb.bias + theta, -1);
      const at::Tensor entropy = -(lp.exp() * lp).sum(-1);
      planning.push_back(inputs_of(mb, lp.gather(1, mb.tokens.unsqueeze(1)).squeeze(1), entropy));
    }
  }
  reco::torch::step_options options;
  options.step = step;  // the same on every rank
  const reco::torch::planned_step plan = reco::torch::build_step_plan(group, preset, planning, {}, options);

  // 2. Each micro-batch's share with gradient; gradients accumulate (no division by anything).
  double loss = 0;
  for (std::size_t j = 0; j < mbs.size(); ++j) {
    const at::Tensor lp = at::log_softmax(mbs[j].bias + theta, -1);
    const at::Tensor logp = lp.gather(1, mbs[j].tokens.unsqueeze(1)).squeeze(1);
    auto out = reco::torch::policy_loss(preset, inputs_of(mbs[j], logp, planning[j].entropy), {}, plan, j);
    out.loss.backward();
    loss += out.loss.item<double>();
  }
  // 3. What DDP does after backward: average the gradients over the ranks.
  if (group) {
    std::vector<at::Tensor> grads{theta.grad()};
    group->allreduce(grads)->wait();
    theta.grad().div_(group->getSize());
  }
  // 4. The optimizer step (plain SGD).
  at::NoGradGuard no_grad;
  theta.sub_(lr * theta.grad());
  theta.grad().zero_();
  return loss;
}

// ---- end of the loop ---------------------------------------------------------------------

// Responses [a, b) of a toy rollout as a micro-batch (V = 5 tokens, float64).
micro_batch_data toy_micro_batch(const step_data& s, index_t a, index_t b) {
  const std::int64_t t0 = s.offsets[static_cast<std::size_t>(a)], t1 = s.offsets[static_cast<std::size_t>(b)];
  micro_batch_data mb;
  const std::int64_t n = t1 - t0;
  std::vector<double> bias;
  std::vector<std::int64_t> tokens;
  for (std::int64_t t = t0; t < t1; ++t) {
    for (int v = 0; v < 5; ++v) bias.push_back(std::sin(0.7 * static_cast<double>(t) + 1.3 * v) + s.entropy[t] * 0.3 * v);
    tokens.push_back((t * 7) % 5);
  }
  mb.bias = at::tensor(bias, at::kDouble).view({n, 5});
  mb.tokens = at::tensor(tokens, at::kLong);
  mb.old_logp = at::log_softmax(mb.bias + 0.05, -1).gather(1, mb.tokens.unsqueeze(1)).squeeze(1);
  mb.mask = at::tensor(std::vector<std::uint8_t>(s.mask.begin() + t0, s.mask.begin() + t1), at::kByte).to(at::kBool);
  std::vector<std::int64_t> off;
  for (index_t i = a; i <= b; ++i) off.push_back(s.offsets[static_cast<std::size_t>(i)] - t0);
  mb.offsets = at::tensor(off, at::kLong);
  mb.rewards = doubles(s.rewards, a, b, at::kDouble);
  mb.prompt_ids = at::tensor(std::vector<std::int64_t>(s.prompt_ids.begin() + a, s.prompt_ids.begin() + b), at::kLong);
  return mb;
}

// The loop on W = 2 ranks x 2 micro-batches takes the same optimizer steps as one process with
// the whole step in one micro-batch.
TEST(StepPlanTorch, DocumentedTrainingLoop) {
  const auto codes = spawn(2, 120, [](int rank, const std::string& path) {
    auto group = make_group(path, rank, 2, 30000);
    const step_data s = make_step(11);
    const auto bounds = part_bounds(s.R, 4, 3);
    std::vector<micro_batch_data> mine{toy_micro_batch(s, bounds[2 * rank], bounds[2 * rank + 1]),
                                       toy_micro_batch(s, bounds[2 * rank + 1], bounds[2 * rank + 2])};
    std::vector<micro_batch_data> whole{toy_micro_batch(s, 0, s.R)};
    at::Tensor theta = at::zeros({5}, at::kDouble).requires_grad_(true);
    at::Tensor ref = at::zeros({5}, at::kDouble).requires_grad_(true);
    for (std::uint64_t step = 1; step <= 3; ++step) {
      train_step(group, theta, mine, step, 0.5);
      train_step({}, ref, whole, step, 0.5);
    }
    const double err = (theta - ref).abs().max().item<double>() / std::max(ref.abs().max().item<double>(), 1e-300);
    if (err > 1e-12 || ref.abs().max().item<double>() == 0) {
      std::fprintf(stderr, "rank %d: parameters differ by %.3g (relative)\n", rank, err);
      return 1;
    }
    return 0;
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// ---- faults: every rank fails alike, none waits ------------------------------------------------

// Runs `body` on `world` forked ranks (a Gloo group with a `timeout_ms` collective timeout); each
// rank's reco::error (argument and message) or "ok" goes to a file. Returns them by rank, with
// the wall time of the slowest rank's body in *seconds.
template <class Body>
std::vector<std::string> errors_on_ranks(int world, int timeout_ms, Body body, double* seconds = nullptr) {
  char dir[] = "/tmp/reco_fault_XXXXXX";
  const std::string d = mkdtemp(dir);
  const auto start = std::chrono::steady_clock::now();
  const auto codes = spawn(world, 60, [&](int rank, const std::string& path) {
    std::string result = "ok";
    auto group = make_group(path, rank, world, timeout_ms);
    try {
      body(group, rank);
    } catch (const reco::error& e) {
      result = e.argument() + " | " + e.what();
    }
    FILE* f = std::fopen((d + "/rank" + std::to_string(rank)).c_str(), "w");
    std::fputs(result.c_str(), f);
    std::fclose(f);
    return 0;
  });
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const std::string file = d + "/rank" + std::to_string(r);
    std::string text = codes[static_cast<std::size_t>(r)] == 0 ? "" : "exit " + std::to_string(codes[r]);
    if (FILE* f = std::fopen(file.c_str(), "r")) {
      char buf[4096] = {};
      text += std::string(buf, std::fread(buf, 1, sizeof buf - 1, f));
      std::fclose(f);
      std::remove(file.c_str());
    }
    out.push_back(text);
  }
  rmdir(d.c_str());
  return out;
}

// Every rank raised the same error naming `argument`.
void expect_alike(const std::vector<std::string>& errors, const std::string& argument, const std::string& label) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    EXPECT_EQ(errors[r].substr(0, errors[r].find(" | ")), argument) << label << ", rank " << r << ": " << errors[r];
    EXPECT_EQ(errors[r], errors[0]) << label << ": ranks 0 and " << r << " raised different errors";
  }
}

// Two ranks, half of the step each (rank 1's micro-batch spoiled by `spoil`).
std::vector<reco::torch::policy_inputs> half_step(const step_data& s, int rank) {
  return {rank == 0 ? inputs(s, 0, s.R / 2, at::kDouble) : inputs(s, s.R / 2, s.R, at::kDouble)};
}

// The first valid token of rank 1's half (a response's first token is never masked in make_step).
std::int64_t first_valid_of_second_half(const step_data& s) {
  index_t i = s.R / 2;
  while (s.offsets[i + 1] == s.offsets[i]) ++i;
  return s.offsets[i] - s.offsets[s.R / 2];
}

// A NaN (or another bad value) in each kind of input on one rank: every rank raises the same
// error, naming the input, from the same collective (the summaries' all-reduce), long before the
// group's timeout.
TEST(StepPlanFaults, BadValueOnOneRankFailsEveryRankAlike) {
  const step_data s = make_step(41);
  const std::int64_t t = first_valid_of_second_half(s);
  const double nan = std::nan("");
  struct fault {
    const char* preset;
    std::map<std::string, double> overrides;
    const char* argument;
    std::function<void(reco::torch::policy_inputs&)> spoil;
  };
  auto at_token = [t](at::Tensor reco::torch::policy_inputs::*f, double v) {
    return [f, v, t](reco::torch::policy_inputs& in) {
      in.*f = (in.*f).detach().clone();
      (in.*f)[t] = v;
    };
  };
  const std::vector<fault> faults{
      {"grpo", {}, "batch.rewards", [](reco::torch::policy_inputs& in) { in.rewards = in.rewards.clone(); in.rewards[0] = std::nan(""); }},
      {"rule_80_20", {}, "batch.entropy", at_token(&reco::torch::policy_inputs::entropy, nan)},
      {"reco", {}, "batch.old_logp", at_token(&reco::torch::policy_inputs::old_logp, 0.5)},
      {"kl_cov", {}, "batch.logp", at_token(&reco::torch::policy_inputs::logp, nan)},
      {"kl_cov", {}, "batch.token_advantages",
       [t](reco::torch::policy_inputs& in) {
         in.token_advantages = at::zeros_like(in.logp).detach();
         in.token_advantages[t] = std::nan("");
         in.rewards = at::Tensor();
       }},
      {"reco", {{"weight.sampling", 1}}, "batch.rollout_logp",
       [t](reco::torch::policy_inputs& in) {
         in.rollout_logp = in.old_logp.clone();
         in.rollout_logp[t] = std::nan("");
       }},
      {"grpo", {}, "batch.layout.offsets",
       [](reco::torch::policy_inputs& in) {
         in.offsets = in.offsets.clone();
         in.offsets[1] = in.offsets[2].item<std::int64_t>() + 1;
       }},
      // A shape error (the adapter names the user's argument): the layout's exchange carries it.
      {"grpo", {}, "rewards", [](reco::torch::policy_inputs& in) { in.rewards = in.rewards.narrow(0, 0, 1); }},
  };
  double worst = 0;
  for (const fault& f : faults) {
    double seconds = 0;
    const auto errors = errors_on_ranks(2, 10000, [&](const auto& group, int rank) {
      auto mbs = half_step(s, rank);
      if (rank == 1) f.spoil(mbs[0]);
      if (std::string(f.argument) == "batch.token_advantages" && rank == 0) {  // given A_t on every rank
        mbs[0].token_advantages = at::zeros_like(mbs[0].logp).detach();
        mbs[0].rewards = at::Tensor();
      }
      if (std::string(f.argument) == "batch.rollout_logp" && rank == 0) mbs[0].rollout_logp = mbs[0].old_logp.clone();
      reco::torch::build_step_plan(group, f.preset, mbs, f.overrides, {});
    }, &seconds);
    expect_alike(errors, f.argument, std::string(f.preset) + " " + f.argument);
    EXPECT_LT(seconds, 8.0) << f.argument << ": a rank waited for the timeout";
    worst = std::max(worst, seconds);
  }
  std::printf("bad values on one of 2 ranks: %zu cases, every rank failed alike within %.2f s (group timeout 10 s)\n",
              faults.size(), worst);
}

// With a given layout there is no exchange to carry an error: a micro-batch one rank cannot
// convert (a rewards tensor of the wrong shape) becomes a refusal of the step's summary size, and
// every rank raises it from the summaries' all-reduce, naming the input; that rank adds its own.
TEST(StepPlanFaults, RefusedMicroBatchWithAGivenLayoutFailsEveryRank) {
  const step_data s = make_step(44);
  double seconds = 0;
  const auto errors = errors_on_ranks(2, 10000, [&](const auto& group, int rank) {
    auto mbs = half_step(s, rank);
    const index_t a = rank == 0 ? 0 : s.R / 2;
    std::int64_t first_group = 0;  // the step's id of response a's group
    for (index_t i = 1; i <= a; ++i)
      first_group += s.prompt_ids[static_cast<std::size_t>(i)] != s.prompt_ids[static_cast<std::size_t>(i - 1)];
    reco::torch::step_options opt;
    opt.step = 7;
    opt.layout = reco::torch::step_layout{s.R, a, first_group};
    if (rank == 1) mbs[0].rewards = mbs[0].rewards.narrow(0, 0, 1);
    reco::torch::build_step_plan(group, "grpo", mbs, {}, opt);
  }, &seconds);
  EXPECT_EQ(errors[0].substr(0, errors[0].find(" | ")), "rewards") << errors[0];
  EXPECT_NE(errors[0].find("failed its checks on 1 of 2 parts"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1].substr(0, errors[0].size()), errors[0]) << "rank 1: " << errors[1];
  EXPECT_NE(errors[1].find("; on this rank: rewards: "), std::string::npos) << errors[1];
  EXPECT_LT(seconds, 8.0) << "a rank waited for the timeout";
}

// A rank that dies between stages (after the summaries' all-reduce): the other gets an error
// naming the process group and the stage the plan was in, within the group's timeout.
TEST(StepPlanFaults, RankThatDiesBetweenStages) {
  const step_data s = make_step(42);
  for (const char* preset : {"rule_80_20_reco", "grpo"}) {
    double seconds = 0;
    const auto errors = errors_on_ranks(2, 2000, [&](const auto& group, int rank) {
      reco::torch::step_options opt;
      opt.step = 3;
      if (rank == 1)
        opt.hooks.after_sum = [](int stage, std::vector<double>&) {
          if (stage == 0) raise(SIGKILL);
        };
      reco::torch::build_step_plan(group, preset, half_step(s, rank), {}, opt);
    }, &seconds);
    EXPECT_EQ(errors[1], "exit 137") << preset;
    EXPECT_EQ(errors[0].substr(0, errors[0].find(" | ")), "process_group") << preset << ": " << errors[0];
    EXPECT_NE(errors[0].find("stage 1"), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find("of step 3"), std::string::npos) << errors[0];
    EXPECT_LT(seconds, 8.0) << preset;
    std::printf("%s: a rank killed after stage 0; the other failed naming the process group in %.2f s (timeout 2 s)\n",
                preset, seconds);
  }
}

// One rank's copy of the sums altered after the all-reduce (a test hook): at the plan's last
// stage every rank refuses at the confirmation; at a histogram round (whose next round's size
// depends on the sums) that rank refuses at once and the other fails naming the process group.
TEST(StepPlanFaults, SumsAlteredOnOneRankAreRefused) {
  const step_data s = make_step(43);
  struct alteration {
    const char* preset;
    int stage;
    bool alike;
  };
  for (const alteration& a : {alteration{"grpo", 0, true}, alteration{"reco", 0, true},
                              alteration{"rule_80_20", 4, true}, alteration{"kl_cov", 1, true},
                              alteration{"rule_80_20", 1, false}}) {
    const auto errors = errors_on_ranks(2, 2000, [&](const auto& group, int rank) {
      reco::torch::step_options opt;
      opt.step = 5;
      if (rank == 1)
        opt.hooks.after_sum = [&a](int stage, std::vector<double>& v) {
          if (stage == a.stage) v[v.size() - 1] += 1;  // a response's field, a count or a top value
        };
      std::map<std::string, double> over;
      if (std::string(a.preset) == "kl_cov") over = {{"select.ratio", 0.25}};
      reco::torch::build_step_plan(group, a.preset, half_step(s, rank), over, opt);
    });
    const std::string label = std::string(a.preset) + " stage " + std::to_string(a.stage);
    if (a.alike) {
      expect_alike(errors, "summaries", label);
    } else {
      EXPECT_EQ(errors[1].substr(0, errors[1].find(" | ")), "summaries") << label << ": " << errors[1];
      EXPECT_EQ(errors[0].substr(0, errors[0].find(" | ")), "process_group") << label << ": " << errors[0];
    }
  }
}

// Ranks that disagree on the preset (summaries of different sizes), its overrides, the step id or
// the library build: every rank raises the same error naming the plan, after the layout's
// exchange.
TEST(StepPlanFaults, RanksThatDisagreeFailAlike) {
  const step_data s = make_step(44);
  struct disagreement {
    const char* what;
    std::function<void(int rank, std::string& preset, std::map<std::string, double>&, reco::torch::step_options&)> set;
  };
  const std::vector<disagreement> cases{
      {"preset", [](int rank, std::string& p, auto&, auto&) { p = rank == 0 ? "grpo" : "rule_80_20"; }},
      {"override", [](int rank, std::string&, auto& o, auto&) { if (rank == 1) o["clip.eps_high"] = 0.3; }},
      {"step id", [](int rank, std::string&, auto&, auto& opt) { opt.step = static_cast<std::uint64_t>(rank); }},
      {"build", [](int rank, std::string&, auto&, auto& opt) { opt.hooks.build_salt = static_cast<std::uint64_t>(rank); }},
      {"unknown preset", [](int rank, std::string& p, auto&, auto&) { if (rank == 1) p = "no_such_preset"; }},
  };
  for (const auto& c : cases) {
    double seconds = 0;
    const auto errors = errors_on_ranks(2, 10000, [&](const auto& group, int rank) {
      std::string preset = "grpo";
      std::map<std::string, double> over;
      reco::torch::step_options opt;
      c.set(rank, preset, over, opt);
      reco::torch::build_step_plan(group, preset, half_step(s, rank), over, opt);
    }, &seconds);
    expect_alike(errors, std::string(c.what) == "unknown preset" ? "preset" : "plan", c.what);
    EXPECT_LT(seconds, 8.0) << c.what;
  }
}

}  // namespace
