// reco::linear_policy_loss (hidden states -> logp, entropy -> objective -> dh, dW, dbias) over
// OpenBLAS and the CPU backend, for grpo, reco, dapo (folded into the chunk pass), gspo and
// rule_80_20 (forward, objective, backward) and a composition with an entropy bonus (folded, with
// an entropy gradient): against the double reference that materialises the logits and runs the
// objective on its exact logp, against central finite differences of the loss, against the
// explicit linear_forward + objective + linear_backward, chunk sizes 1..N, the number of logits
// GEMMs each schedule makes, masked tokens (exactly zero dh), and the errors it adds.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "logits/linear_reference.hpp"
#include "reco/backend/cpu.hpp"
#include "reco/composition.hpp"
#include "reco/logits/cblas_gemm.hpp"
#include "reco/logits/linear_policy_loss.hpp"
#include "reco/presets.hpp"
#include "reco/registry.hpp"
#include "reco/step_plan.hpp"

namespace {

namespace rl = reco::logits;
using namespace linear_test;
using reco::index_t;

// cblas_gemm, counting the logits GEMMs (x = h W^T: W row-major, read transposed).
struct counting_gemm {
  int* logits_calls;
  template <class A>
  void operator()(bool ta, bool tb, index_t m, index_t n, index_t k, A alpha, const A* a, index_t lda, const A* b,
                  index_t ldb, A beta, A* c, index_t ldc) const {
    if (!ta && tb) ++*logits_calls;
    rl::cblas_gemm{}(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

// A micro-batch of R = 4 responses (2 groups of 2) of T = 6 tokens, padded; every 4th token
// masked (NaN hidden state, token -100); old_logp = the exact logp + U(-0.3, 0.3) (some ratios
// clip at eps 0.2), ref_logp likewise, rewards 0/1 with both in each group.
struct micro_batch {
  static constexpr index_t R = 4, T = 6;
  problem<double> p;
  reference ref;
  std::vector<double> old_logp, ref_logp, rewards{1, 0, 0, 1};
  std::vector<double> old_logp_frozen;  // the old_logp of the finite differences
  std::vector<index_t> groups{0, 2, 4};

  micro_batch(index_t H, index_t V, std::uint64_t seed) {
    p = make_problem<double>(R * T, H, V, seed, true, 4);
    ref = compute_reference(p, 1.0);
    std::mt19937_64 rng(seed + 7);
    std::uniform_real_distribution<double> u(-0.3, 0.3);
    for (index_t t = 0; t < R * T; ++t) {
      old_logp.push_back(p.mask[t] ? ref.logp[t] + u(rng) : 0.0);
      ref_logp.push_back(p.mask[t] ? ref.logp[t] + u(rng) : 0.0);
    }
  }
  // The batch without logp / entropy, in A; ref_logp only where the objective reads it.
  template <class A, class Obj>
  reco::batch_view<A> view(const Obj& obj, const std::vector<A>& old, const std::vector<A>& refl,
                           const std::vector<A>& rew, bool off_policy) const {
    reco::batch_view<A> b;
    b.layout = reco::padded(R, T);
    b.group_offsets = groups;
    b.mask = p.mask;
    if (off_policy) b.old_logp = old;
    if (obj.needs().ref_logp) b.ref_logp = refl;
    b.rewards = rew;
    return b;
  }
};

template <class T>
rl::linear_operands<T> operands(const std::vector<T>& h, const std::vector<T>& w, const std::vector<T>& bias,
                                const std::vector<std::int64_t>& tokens, index_t N, index_t H, index_t V) {
  rl::linear_operands<T> in;
  in.hidden = h.data(), in.rows = N, in.hidden_size = H;
  in.weight = w.data(), in.vocab = V;
  in.bias = bias.empty() ? nullptr : bias.data();
  in.tokens = tokens.data();
  return in;
}

struct grads_out {
  std::vector<double> dh, dw, db;
  double loss = 0;
};

// reco::linear_policy_loss in double on micro-batch m with hidden states h and weight w.
template <class Obj, class Gemm = rl::cblas_gemm>
grads_out run_double(const Obj& obj, const micro_batch& m, const std::vector<double>& h, const std::vector<double>& w,
                     bool off_policy, index_t chunk_rows, Gemm gemm = {}) {
  const problem<double>& p = m.p;
  grads_out o;
  o.dh.assign(p.N * p.H, -1.0), o.dw.assign(p.V * p.H, 0.0), o.db.assign(p.V, 0.0);
  rl::linear_options opt;
  opt.chunk_rows = chunk_rows;
  rl::linear_gradients<double> g;
  g.dhidden = o.dh.data(), g.dweight = o.dw.data(), g.dbias = o.db.data();
  reco::workspace<reco::cpu> ws;
  o.loss = reco::linear_policy_loss(obj, reco::cpu{}, gemm, operands(h, w, p.b, p.tokens, p.N, p.H, p.V), opt,
                                    m.view<double>(obj, m.old_logp, m.ref_logp, m.rewards, off_policy), g, ws)
               .loss;
  return o;
}

// The loss from the naive double logits, for finite differences. Its stop-gradient terms are
// frozen as docs/concepts.md prescribes: an on-policy call gets the unperturbed logp as old_logp;
// an objective whose own surrogate holds sg(·) terms (`linearised`: ReCo's variance ratio) is
// replaced by its first-order part at the base point, Σ_t g_t logp_t + g^H_t H_t, with the
// objective's gradients g, g^H there (from the double reference).
template <class Obj>
double reference_loss(const Obj& obj, const micro_batch& m, const std::vector<double>& h, const std::vector<double>& w,
                      bool linearised, const std::vector<double>& g_logp, const std::vector<double>& g_entropy) {
  problem<double> q = m.p;
  q.h = h, q.w = w;
  const reference r = compute_reference(q, 1.0);
  if (linearised) {
    double s = 0;
    for (index_t t = 0; t < q.N; ++t) s += g_logp[t] * r.logp[t] + g_entropy[t] * r.entropy[t];
    return s;
  }
  reco::batch_view<double> b = m.view<double>(obj, m.old_logp, m.ref_logp, m.rewards, true);
  b.old_logp = m.old_logp_frozen;
  b.logp = r.logp;
  if (obj.needs().entropy) b.entropy = r.entropy;
  std::vector<double> gl(q.N), ge(q.N);
  reco::gradients<double> g{gl, obj.needs().entropy_gradient ? reco::span<double>(ge) : reco::span<double>()};
  return obj(reco::cpu{}, b, g).loss;
}

template <class Obj>
void check_against_reference(const Obj& obj, const std::string& name, bool off_policy, bool folds,
                             bool linearised = false) {
  SCOPED_TRACE(name);
  micro_batch m(5, 33, 11);
  problem<double>& p = m.p;
  m.old_logp_frozen = off_policy ? m.old_logp : m.ref.logp;
  EXPECT_EQ(reco::linear_loss_folds(obj, m.view<double>(obj, m.old_logp, m.ref_logp, m.rewards, off_policy)), folds);

  // The double reference: the objective on the exact logp and entropy, then dlogits through the
  // naive logits (compute_reference with the objective's upstream gradients).
  reco::batch_view<double> b = m.view<double>(obj, m.old_logp, m.ref_logp, m.rewards, off_policy);
  b.logp = m.ref.logp;
  if (obj.needs().entropy) b.entropy = m.ref.entropy;
  std::vector<double> gl(p.N), ge(p.N, 0.0);
  reco::gradients<double> g{gl, obj.needs().entropy_gradient ? reco::span<double>(ge) : reco::span<double>()};
  const double ref_loss = obj(reco::cpu{}, b, g).loss;
  problem<double> q = p;
  q.g_logp = gl, q.g_entropy = ge;
  const reference full = compute_reference(q, 1.0);

  int logits_gemms = 0;
  const index_t unmasked = p.N - p.N / 4, chunk = 4, chunks = (unmasked + chunk - 1) / chunk;
  const grads_out o = run_double(obj, m, p.h, p.w, off_policy, chunk, counting_gemm{&logits_gemms});
  // Folded: one logits GEMM per chunk (3 GEMMs with dh and dW); otherwise the backward recomputes
  // it for every chunk but the last, whose logits the forward keeps.
  EXPECT_EQ(logits_gemms, folds ? chunks : 2 * chunks - 1);
  EXPECT_NEAR(o.loss, ref_loss, 1e-12 * (1 + std::fabs(ref_loss)));
  for (index_t i = 0; i < p.N * p.H; ++i) {
    if (!p.mask[i / p.H]) {
      EXPECT_EQ(o.dh[i], 0.0) << "masked row " << i / p.H;
      continue;
    }
    EXPECT_NEAR(o.dh[i], full.dh[i], 1e-12 + 1e-12 * full.dh_mag[i]) << i;
  }
  for (index_t i = 0; i < p.V * p.H; ++i) EXPECT_NEAR(o.dw[i], full.dw[i], 1e-12 + 1e-12 * full.dw_mag[i]) << i;
  for (index_t j = 0; j < p.V; ++j) EXPECT_NEAR(o.db[j], full.db[j], 1e-12 + 1e-12 * full.db_mag[j]) << j;
  double grad_norm = 0;
  for (double x : o.dh) grad_norm += std::fabs(x);
  EXPECT_GT(grad_norm, 1e-3);  // the objective's gradient does reach h

  // Chunk sizes 1, 7 and all rows give the same gradients.
  for (index_t c : {1, 7, 0}) {
    const grads_out oc = run_double(obj, m, p.h, p.w, off_policy, c);
    EXPECT_NEAR(oc.loss, o.loss, 1e-13 * (1 + std::fabs(o.loss))) << "chunk " << c;
    for (index_t i = 0; i < p.N * p.H; ++i) EXPECT_NEAR(oc.dh[i], o.dh[i], 1e-13 * (1 + std::fabs(o.dh[i])));
    for (index_t i = 0; i < p.V * p.H; ++i) EXPECT_NEAR(oc.dw[i], o.dw[i], 1e-12 * (1 + std::fabs(o.dw[i])));
  }

  // Central finite differences of the (frozen) loss in h (unmasked rows) and W.
  const double eps = 1e-6;
  for (index_t i : {0, 7, 13, 22, 29, 41, 58, 96, 118}) {
    if (!p.mask[i / p.H]) continue;
    std::vector<double> hp = p.h, hm = p.h;
    hp[i] += eps, hm[i] -= eps;
    const double fd = (reference_loss(obj, m, hp, p.w, linearised, gl, ge) -
                       reference_loss(obj, m, hm, p.w, linearised, gl, ge)) / (2 * eps);
    EXPECT_NEAR(o.dh[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << "dh " << i;
  }
  for (index_t i : {0, 5, 31, 77, 120, 164}) {
    std::vector<double> wp = p.w, wm = p.w;
    wp[i] += eps, wm[i] -= eps;
    const double fd = (reference_loss(obj, m, p.h, wp, linearised, gl, ge) -
                       reference_loss(obj, m, p.h, wm, linearised, gl, ge)) / (2 * eps);
    EXPECT_NEAR(o.dw[i], fd, 1e-7 + 1e-5 * std::fabs(fd)) << "dW " << i;
  }
}

reco::composed_objective grpo_with_entropy_bonus() {
  reco::composed_objective obj = reco::compose("advantage=grpo ratio=token clip=ppo entropy=entropy_bonus");
  reco::registry::apply_overrides(obj, {{"entropy.coef", 0.05}});
  return obj;
}

TEST(LinearPolicyLoss, FoldedPresetsMatchTheDoubleReference) {
  check_against_reference(reco::presets::grpo{}, "grpo", true, true);
  check_against_reference(reco::presets::grpo{}, "grpo on-policy", false, true);
  check_against_reference(reco::presets::reco{}, "reco", true, true, true);
  check_against_reference(reco::presets::dapo{}, "dapo", true, true);
  check_against_reference(grpo_with_entropy_bonus(), "grpo + entropy bonus", true, true);
}

TEST(LinearPolicyLoss, UnfoldedPresetsMatchTheDoubleReference) {
  check_against_reference(reco::presets::gspo{}, "gspo", true, false);
  check_against_reference(reco::presets::rule_80_20{}, "rule_80_20", true, false);
  // On-policy, ReCo's response weight averages the current logp: not token-local.
  check_against_reference(reco::presets::reco{}, "reco on-policy", false, false, true);
}

// In float (and bf16 hidden states and weight): the one call equals linear_forward, the
// objective on its logp, and linear_backward, to rounding.
template <class T, class Obj>
void check_against_explicit(const Obj& obj, const std::string& name) {
  SCOPED_TRACE(name);
  using A = rl::accum_t<T>;
  micro_batch m(7, 40, 23);
  const problem<double>& p = m.p;
  std::vector<T> h, w, bias;
  for (double x : p.h) h.push_back(static_cast<T>(static_cast<float>(x)));
  for (double x : p.w) w.push_back(static_cast<T>(static_cast<float>(x)));
  for (double x : p.b) bias.push_back(static_cast<T>(static_cast<float>(x)));
  const std::vector<A> old(m.old_logp.begin(), m.old_logp.end()), refl(m.ref_logp.begin(), m.ref_logp.end()),
      rew(m.rewards.begin(), m.rewards.end());
  const auto in = operands(h, w, bias, p.tokens, p.N, p.H, p.V);
  rl::linear_options opt;
  opt.chunk_rows = 5;
  const reco::batch_view<A> batch = m.view<A>(obj, old, refl, rew, true);

  std::vector<A> dh(p.N * p.H, A(-1)), dw(p.V * p.H, A(0)), db(p.V, A(0));
  rl::linear_gradients<T> g;
  g.dhidden_accum = dh.data(), g.dweight = dw.data(), g.dbias = db.data();
  reco::workspace<reco::cpu> ws;
  const double loss = reco::linear_policy_loss(obj, reco::cpu{}, rl::cblas_gemm{}, in, opt, batch, g, ws).loss;

  // Explicit: forward, the objective, backward.
  std::vector<A> logp(p.N), ent(p.N), lse(p.N), gl(p.N), ge(p.N, A(0));
  auto masked_in = in;
  masked_in.row_mask = p.mask.data();
  rl::linear_forward(rl::cblas_gemm{}, masked_in, opt, rl::linear_outputs<A>{logp.data(), ent.data(), lse.data()});
  reco::batch_view<A> b = batch;
  b.logp = logp;
  if (obj.needs().entropy) b.entropy = ent;
  const double loss_explicit =
      obj(reco::cpu{}, b, reco::gradients<A>{gl, obj.needs().entropy_gradient ? reco::span<A>(ge) : reco::span<A>()})
          .loss;
  std::vector<A> dh2(p.N * p.H), dw2(p.V * p.H, A(0)), db2(p.V, A(0));
  rl::linear_gradients<T> g2;
  g2.grad_logp = gl.data(), g2.grad_entropy = ge.data(), g2.saved_lse = lse.data(), g2.saved_entropy = ent.data();
  g2.dhidden_accum = dh2.data(), g2.dweight = dw2.data(), g2.dbias = db2.data();
  rl::linear_backward(rl::cblas_gemm{}, masked_in, opt, g2);

  EXPECT_NEAR(loss, loss_explicit, 1e-6 * (1 + std::fabs(loss_explicit)));
  double scale = 0;
  for (A x : dw2) scale = std::max(scale, static_cast<double>(std::fabs(x)));
  ASSERT_GT(scale, 0);
  for (index_t i = 0; i < p.N * p.H; ++i) {
    if (!p.mask[i / p.H]) {
      EXPECT_EQ(dh[i], A(0));
    }
    EXPECT_NEAR(dh[i], dh2[i], 1e-5 * scale) << i;
  }
  for (index_t i = 0; i < p.V * p.H; ++i) EXPECT_NEAR(dw[i], dw2[i], 1e-5 * scale) << i;
  for (index_t j = 0; j < p.V; ++j) EXPECT_NEAR(db[j], db2[j], 1e-5 * scale) << j;
}

TEST(LinearPolicyLoss, EqualsForwardObjectiveBackward) {
  check_against_explicit<float>(reco::presets::grpo{}, "grpo float");
  check_against_explicit<float>(reco::presets::reco{}, "reco float");
  check_against_explicit<float>(reco::presets::dapo{}, "dapo float");
  check_against_explicit<float>(reco::presets::gspo{}, "gspo float");
  check_against_explicit<float>(reco::presets::rule_80_20{}, "rule_80_20 float");
  check_against_explicit<reco::bf16_t>(reco::presets::reco{}, "reco bf16");
}

// A step of the four responses split into two parts (one group each), each part's call with the
// step's plan: the parts' losses and gradients add up to the one call's. The summaries read the
// exact logp and entropy (a caller's no-grad forward; a folded objective's plan needs neither).
template <class Obj>
void check_split_step(const Obj& obj, const std::string& name) {
  SCOPED_TRACE(name);
  micro_batch m(5, 33, 17);
  const problem<double>& p = m.p;
  const grads_out whole = run_double(obj, m, p.h, p.w, true, 4);

  const index_t half = p.N / 2, R = micro_batch::R, T = micro_batch::T;
  const reco::step_info step{3, R, 1.0, 0};
  const std::vector<index_t> part_groups{0, 2};
  auto part_view = [&](int k, bool with_logp) {
    const index_t t0 = k * half;
    reco::batch_view<double> b;
    b.layout = reco::padded(R / 2, T);
    b.group_offsets = reco::span<const index_t>(part_groups.data(), 2);
    b.mask = reco::span<const std::uint8_t>(p.mask.data() + t0, half);
    b.old_logp = reco::span<const double>(m.old_logp.data() + t0, half);
    if (obj.needs().ref_logp) b.ref_logp = reco::span<const double>(m.ref_logp.data() + t0, half);
    b.rewards = reco::span<const double>(m.rewards.data() + k * (R / 2), R / 2);
    if (with_logp) {
      b.logp = reco::span<const double>(m.ref.logp.data() + t0, half);
      if (obj.needs().entropy) b.entropy = reco::span<const double>(m.ref.entropy.data() + t0, half);
    }
    return b;
  };
  const reco::step_part parts[2] = {{step, 0, 0}, {step, R / 2, 1}};
  reco::step_summary total;
  for (int k = 0; k < 2; ++k) total += reco::summarize(obj, part_view(k, true), parts[k]);
  reco::step_plan plan = reco::finish_plan(obj, step, total);
  while (!plan.complete()) {
    reco::step_summary r;
    for (int k = 0; k < 2; ++k) r += reco::plan_round(obj, plan, part_view(k, true), parts[k]);
    plan.advance(r);
  }

  double loss = 0;
  std::vector<double> dh(p.N * p.H, -1.0), dw(p.V * p.H, 0.0), db(p.V, 0.0);
  for (int k = 0; k < 2; ++k) {
    auto in = operands(p.h, p.w, p.b, p.tokens, p.N, p.H, p.V);
    in.hidden = p.h.data() + k * half * p.H, in.rows = half, in.tokens = p.tokens.data() + k * half;
    rl::linear_options opt;
    opt.chunk_rows = 4;
    rl::linear_gradients<double> g;
    g.dhidden = dh.data() + k * half * p.H, g.dweight = dw.data(), g.dbias = db.data();
    reco::workspace<reco::cpu> ws;
    loss += reco::linear_policy_loss(obj, reco::cpu{}, rl::cblas_gemm{}, in, opt, part_view(k, false), g, ws, plan,
                                     parts[k])
                .loss;
  }
  EXPECT_NEAR(loss, whole.loss, 1e-12 * (1 + std::fabs(whole.loss)));
  for (index_t i = 0; i < p.N * p.H; ++i) EXPECT_NEAR(dh[i], whole.dh[i], 1e-12 * (1 + std::fabs(whole.dh[i]))) << i;
  for (index_t i = 0; i < p.V * p.H; ++i) EXPECT_NEAR(dw[i], whole.dw[i], 1e-12 * (1 + std::fabs(whole.dw[i]))) << i;
  for (index_t j = 0; j < p.V; ++j) EXPECT_NEAR(db[j], whole.db[j], 1e-12 * (1 + std::fabs(whole.db[j]))) << j;
}

TEST(LinearPolicyLoss, SplitStepWithItsPlanEqualsOneCall) {
  check_split_step(reco::presets::grpo{}, "grpo");
  check_split_step(reco::presets::reco{}, "reco");
  check_split_step(reco::presets::rule_80_20{}, "rule_80_20");
}

// Every token masked: zero dh, dW untouched, the objective's zero loss.
TEST(LinearPolicyLoss, EveryTokenMasked) {
  micro_batch m(3, 9, 5);
  m.p.mask.assign(m.p.N, 0);
  for (auto& t : m.p.tokens) t = -100;
  const grads_out o = run_double(reco::presets::grpo{}, m, m.p.h, m.p.w, true, 0);
  EXPECT_EQ(o.loss, 0.0);
  for (double x : o.dh) EXPECT_EQ(x, 0.0);
  for (double x : o.dw) EXPECT_EQ(x, 0.0);
}

TEST(LinearPolicyLoss, NamedErrors) {
  micro_batch m(3, 9, 5);
  const problem<double>& p = m.p;
  const reco::presets::grpo obj;
  std::vector<double> dh(p.N * p.H), dw(p.V * p.H), logp(p.N);
  rl::linear_gradients<double> g;
  g.dhidden = dh.data(), g.dweight = dw.data();
  const auto good_in = operands(p.h, p.w, p.b, p.tokens, p.N, p.H, p.V);
  const auto good_batch = m.view<double>(obj, m.old_logp, m.ref_logp, m.rewards, true);
  auto call = [&](rl::linear_operands<double> in, reco::batch_view<double> b, rl::linear_gradients<double> gr) {
    return [=] {
      reco::workspace<reco::cpu> ws;
      reco::linear_policy_loss(obj, reco::cpu{}, rl::cblas_gemm{}, in, rl::linear_options{}, b, gr, ws);
    };
  };
  auto b = good_batch;
  b.logp = logp;
  expect_error(call(good_in, b, g), "batch.logp");
  b = good_batch, b.entropy = logp;
  expect_error(call(good_in, b, g), "batch.entropy");
  auto in = good_in;
  in.row_mask = p.mask.data();
  expect_error(call(in, good_batch, g), "row_mask");
  in = good_in, in.rows = p.N - 1;
  expect_error(call(in, good_batch, g), "hidden");
  in = good_in, in.total_vocab = p.V + 3;
  expect_error(call(in, good_batch, g), "total_vocab");
  auto g2 = g;
  g2.grad_logp = logp.data();
  expect_error(call(good_in, good_batch, g2), "grads.grad_logp");
  b = good_batch, b.rewards = {};
  expect_error(call(good_in, b, g), "batch.rewards");
  // Nothing was written by the refused calls.
  for (double x : dw) EXPECT_EQ(x, 0.0);
}

}  // namespace
