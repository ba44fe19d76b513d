// reco::logits::linear_forward / linear_backward / linear_fused over OpenBLAS: against the double
// reference that materialises the logits (every storage type, V = 1, 7, 33, 32,001, 151,936, odd H,
// N = 0 and 1, masked rows holding NaN, temperatures 1, 0.7 and 1.6, with and without bias),
// against central finite differences in double, chunk sizes 1..N, strided and transposed h and W,
// the skipped entropy backward, the fused pass, vocabulary shards merged, and the error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "logits/linear_reference.hpp"
#include "reco/logits/cblas_gemm.hpp"
#include "reco/logits/linear_logp_entropy.hpp"

namespace {

namespace rl = reco::logits;
using namespace linear_test;
using reco::index_t;

template <class T>
using acc = rl::accum_t<T>;

template <class A>
std::vector<A> cast_all(const std::vector<double>& v) {
  return std::vector<A>(v.begin(), v.end());
}

template <class T>
rl::linear_operands<T> operands_of(const problem<T>& p, bool use_mask = true) {
  rl::linear_operands<T> in;
  in.hidden = p.hs.data();
  in.rows = p.N;
  in.hidden_size = p.H;
  in.weight = p.ws.data();
  in.vocab = p.V;
  in.bias = p.bs.empty() ? nullptr : p.bs.data();
  in.tokens = p.tokens.data();
  in.row_mask = use_mask ? p.mask.data() : nullptr;
  return in;
}

template <class T>
struct results {
  std::vector<acc<T>> logp, entropy, lse, sum_p_squared;
  std::vector<double> dh, dw, db;  // widened
};

// Forward, then backward from the saved values; dW and dbias start at `start` to check the adding.
// `kept`: the forward keeps its last chunk's logits there and the backward takes them.
template <class T, class Gemm = rl::cblas_gemm>
results<T> run(const problem<T>& p, rl::linear_operands<T> in, rl::linear_options o, bool with_logp = true,
               bool with_entropy = true, double start = 0.25, rl::linear_kept_logits<acc<T>>* kept = nullptr,
               const Gemm& gemm = Gemm{}) {
  using A = acc<T>;
  results<T> res;
  const std::size_t N = static_cast<std::size_t>(p.N);
  res.logp.assign(N, -7), res.entropy.assign(N, -7), res.lse.assign(N, -7), res.sum_p_squared.assign(N, -7);
  o.sum_p_squared = true;
  rl::linear_forward(gemm, in, o,
                     rl::linear_outputs<A>{res.logp.data(), res.entropy.data(), res.lse.data(), res.sum_p_squared.data(),
                                           kept});
  const auto gl = cast_all<A>(p.g_logp), gh = cast_all<A>(p.g_entropy);
  std::vector<T> dh(static_cast<std::size_t>(p.N * p.H), store_as<T>(-5.0));
  std::vector<A> dw(static_cast<std::size_t>(p.V * p.H), A(start)), db(static_cast<std::size_t>(p.V), A(start));
  rl::linear_gradients<T> g;
  g.grad_logp = with_logp ? gl.data() : nullptr;
  g.grad_entropy = with_entropy ? gh.data() : nullptr;
  g.saved_lse = res.lse.data();
  g.saved_entropy = res.entropy.data();
  g.dhidden = dh.data();
  g.dweight = dw.data();
  g.dbias = in.bias ? db.data() : nullptr;
  g.kept = kept;
  rl::linear_backward(gemm, in, o, g);
  for (const T& v : dh) res.dh.push_back(load_from<T>(v));
  for (A v : dw) res.dw.push_back(static_cast<double>(v) - start);
  for (A v : db) res.db.push_back(static_cast<double>(v) - start);
  return res;
}

template <class T>
double unit_roundoff() {
  return std::is_same_v<T, double> ? 0x1p-53 : 0x1p-24;
}
template <class T>
double reduction_tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-6;
}
// Rounding of dh to its storage type (relative).
template <class T>
double output_rounding() {
  if constexpr (std::is_same_v<T, reco::bf16_t>) return 0x1p-8;
  else if constexpr (std::is_same_v<T, reco::f16_t>) return 0x1p-11;
  else return 0;
}

// Every result within its bound (docs/logits.md, "From hidden states: exactness").
template <class T>
void expect_matches_reference(const problem<T>& p, const results<T>& res, double tau, bool dweight_checked = true) {
  const reference ref = compute_reference(p, tau);
  const double u = unit_roundoff<T>(), red = reduction_tolerance<T>();
  double worst_eps = 0;
  for (index_t r = 0; r < p.N; ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    if (!p.mask[r]) {
      EXPECT_EQ(res.logp[r], 0);
      EXPECT_EQ(res.entropy[r], 0);
      EXPECT_EQ(res.lse[r], 0);
      EXPECT_EQ(res.sum_p_squared[r], 0);
      for (index_t k = 0; k < p.H; ++k) EXPECT_EQ(res.dh[r * p.H + k], 0.0);
      continue;
    }
    const double dx = u * ref.logit_error[r] / tau;  // bound on the error of z_j = x_j / τ
    EXPECT_NEAR(res.logp[r], ref.logp[r], 2 * dx + red * (1 + std::fabs(ref.logp[r])));
    EXPECT_NEAR(res.entropy[r], ref.entropy[r], 2 * u * ref.entropy_error[r] / tau + red * (1 + ref.entropy[r]));
    EXPECT_NEAR(res.lse[r], ref.lse[r], dx + red * (1 + std::fabs(ref.lse[r])));
    EXPECT_NEAR(res.sum_p_squared[r], ref.sum_p_squared[r], 4 * ref.sum_p_squared[r] * dx + red * ref.sum_p_squared[r] + red * 1e-3);
    // Relative error of each p_j = e^{z_j - LSE} recomputed in the backward.
    const double eps = 2 * dx + red * (2 + std::fabs(ref.lse[r]) + ref.entropy[r]);
    worst_eps = std::max(worst_eps, eps);
    for (index_t k = 0; k < p.H; ++k) {
      const index_t i = r * p.H + k;
      const double tol = eps * ref.dh_err_mag[i] + (p.V + 2) * u * ref.dh_mag[i] +
                         output_rounding<T>() * std::fabs(ref.dh[i]) + 1e-300;
      EXPECT_NEAR(res.dh[i], ref.dh[i], tol) << "dh k=" << k;
    }
  }
  if (!dweight_checked) return;
  for (index_t i = 0; i < p.V * p.H; ++i) {
    const double tol = worst_eps * ref.dw_err_mag[i] + (p.N + 2) * u * ref.dw_mag[i] + 4 * u * 0.25 + 1e-300;
    ASSERT_NEAR(res.dw[i], ref.dw[i], tol) << "dW " << i / p.H << "," << i % p.H;
  }
  if (!p.b.empty())
    for (index_t j = 0; j < p.V; ++j) {
      const double tol = worst_eps * ref.db_err_mag[j] + (p.N + 2) * u * ref.db_mag[j] + 4 * u * 0.25 + 1e-300;
      ASSERT_NEAR(res.db[j], ref.db[j], tol) << "dbias " << j;
    }
}

template <class T>
class LinearLogpEntropy : public ::testing::Test {};
using storage_types = ::testing::Types<float, double, reco::bf16_t, reco::f16_t>;
TYPED_TEST_SUITE(LinearLogpEntropy, storage_types);

TYPED_TEST(LinearLogpEntropy, MatchesMaterialisedReference) {
  using T = TypeParam;
  struct shape {
    index_t N, H, V;
    int mask_every;
  };
  for (const shape s : {shape{1, 1, 1, 0}, shape{5, 3, 1, 2}, shape{6, 5, 7, 3}, shape{9, 17, 33, 4}, shape{1, 9, 7, 0}})
    for (double tau : {1.0, 0.7, 1.6})
      for (bool bias : {false, true}) {
        SCOPED_TRACE("N=" + std::to_string(s.N) + " H=" + std::to_string(s.H) + " V=" + std::to_string(s.V) +
                     " tau=" + std::to_string(tau) + " bias=" + std::to_string(bias));
        const auto p = make_problem<T>(s.N, s.H, s.V, 11 * s.V + s.H, bias, s.mask_every);
        rl::linear_options o;
        o.temperature = tau;
        o.chunk_rows = 2;  // several chunks
        expect_matches_reference(p, run(p, operands_of(p), o), tau);
      }
}

// V not a multiple of any block or lane width, at small N (the reference is N·V·H work).
TYPED_TEST(LinearLogpEntropy, LargeOddVocabularies) {
  using T = TypeParam;
  for (index_t V : {32001, 151936}) {
    SCOPED_TRACE("V=" + std::to_string(V));
    const auto p = make_problem<T>(3, 5, V, 5 + V, true, 3);
    rl::linear_options o;
    o.temperature = 0.7;
    expect_matches_reference(p, run(p, operands_of(p), o), 0.7);
  }
}

TYPED_TEST(LinearLogpEntropy, NoRowsAndAllRowsMasked) {
  using T = TypeParam;
  using A = acc<T>;
  auto p = make_problem<T>(0, 3, 7, 1, true);
  auto res = run(p, operands_of(p), rl::linear_options{});
  for (double v : res.dw) EXPECT_EQ(v, 0.0);  // dW unchanged
  p = make_problem<T>(4, 3, 7, 2, true, 1);  // every row masked, NaN hidden states
  res = run(p, operands_of(p), rl::linear_options{});
  for (A v : res.logp) EXPECT_EQ(v, 0);
  for (double v : res.dh) EXPECT_EQ(v, 0.0);
  for (double v : res.dw) EXPECT_EQ(v, 0.0);
  for (double v : res.db) EXPECT_EQ(v, 0.0);
}

// L(h, W, b) = Σ_r g_r logp_r + gH_r H_r through the library's double forward.
double objective(const problem<double>& p, const std::vector<double>& h, const std::vector<double>& w,
                 const std::vector<double>& b, double tau) {
  const std::size_t N = static_cast<std::size_t>(p.N);
  std::vector<double> logp(N), ent(N), lse(N);
  rl::linear_operands<double> in = operands_of(p);
  in.hidden = h.data(), in.weight = w.data(), in.bias = b.data();
  rl::linear_options o;
  o.temperature = tau;
  rl::linear_forward(rl::cblas_gemm{}, in, o, rl::linear_outputs<double>{logp.data(), ent.data(), lse.data()});
  double l = 0;
  for (std::size_t r = 0; r < N; ++r) l += p.g_logp[r] * logp[r] + p.g_entropy[r] * ent[r];
  return l;
}

TEST(LinearLogpEntropyGrad, CentralFiniteDifferences) {
  for (double tau : {1.0, 0.6}) {
    SCOPED_TRACE("tau=" + std::to_string(tau));
    auto p = make_problem<double>(4, 5, 7, 77, true, 4);
    rl::linear_options o;
    o.temperature = tau;
    o.chunk_rows = 2;
    const auto res = run(p, operands_of(p), o);
    const double step = 1e-6;
    auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* what) {
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i])) continue;  // a masked row
        const double x0 = x[i];
        x[i] = x0 + step;
        const double up = objective(p, p.h, p.w, p.b, tau);
        x[i] = x0 - step;
        const double down = objective(p, p.h, p.w, p.b, tau);
        x[i] = x0;
        EXPECT_NEAR(grad[i], (up - down) / (2 * step), 2e-7 * (1 + std::fabs(grad[i]))) << what << " " << i;
      }
    };
    check(p.h, res.dh, "dh");
    check(p.w, res.dw, "dW");
    check(p.b, res.db, "dbias");
    // Masked rows: exactly zero gradient.
    for (index_t k = 0; k < p.H; ++k) EXPECT_EQ(res.dh[3 * p.H + k], 0.0);
  }
}

TYPED_TEST(LinearLogpEntropy, ChunkSizesAgree) {
  using T = TypeParam;
  const auto p = make_problem<T>(7, 9, 33, 3, true, 5);
  rl::linear_options o;
  o.temperature = 0.8;
  o.chunk_rows = 7;
  const auto all = run(p, operands_of(p), o);
  expect_matches_reference(p, all, o.temperature);
  // Each chunk size is its own GEMM shape, for which the BLAS may pick another kernel and so
  // another summation order: every result is held to the reference's rounding bound, not to
  // another chunking's digits.
  for (index_t c = 1; c <= 7; ++c) {
    SCOPED_TRACE("chunk_rows=" + std::to_string(c));
    o.chunk_rows = c;
    expect_matches_reference(p, run(p, operands_of(p), o), o.temperature);
  }
  // A budget instead of a chunk size: 3 rows' worth (a chunk of 3).
  o.chunk_rows = 0;
  o.memory_budget = rl::linear_workspace_bytes(3, p.V, p.H, std::is_same_v<T, acc<T>> ? 0 : p.V, sizeof(acc<T>));
  EXPECT_EQ(rl::linear_chunking_of(p.N, p.V, p.H, sizeof(acc<T>), !std::is_same_v<T, acc<T>>, o.memory_budget, 0).chunk_rows, 3);
  expect_matches_reference(p, run(p, operands_of(p), o), o.temperature);
}

// The GEMMs of the call through OpenBLAS, with the row count of every logits GEMM (the only ones
// that write a tile row of V columns from untransposed h) recorded in call order.
struct counting_gemm {
  std::vector<index_t>* logits_rows;
  index_t vocab;
  template <class A>
  void operator()(bool trans_a, bool trans_b, index_t m, index_t n, index_t k, A alpha, const A* a, index_t lda,
                  const A* b, index_t ldb, A beta, A* c, index_t ldc) const {
    if (!trans_a && ldc == vocab) logits_rows->push_back(m);
    rl::cblas_gemm{}(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

// The forward keeps its last chunk's logits and the backward, last chunk first, skips their GEMM:
// the results stay within the reference's bound, the first chunk takes the remainder, the kept
// tile is taken (empty afterwards) and one belonging to another call is not used.
TYPED_TEST(LinearLogpEntropy, KeptLastChunkSkipsItsRecompute) {
  using T = TypeParam;
  using A = acc<T>;
  const auto p = make_problem<T>(11, 6, 37, 21, true, 4);  // rows 0, 4, 8 masked: 8 live rows
  index_t live = 0;
  for (index_t r = 0; r < p.N; ++r) live += p.mask[r] ? 1 : 0;
  for (index_t c : {3, 8, 11}) {
    SCOPED_TRACE("chunk_rows=" + std::to_string(c));
    rl::linear_options o;
    o.temperature = 0.9;
    o.chunk_rows = c;
    const index_t chunks = (live + c - 1) / c, first = live - (chunks - 1) * std::min(c, p.N);
    std::vector<index_t> gemm_rows;
    rl::linear_kept_logits<A> kept;
    const auto res = run(p, operands_of(p), o, true, true, 0.25, &kept, counting_gemm{&gemm_rows, p.V});
    expect_matches_reference(p, res, o.temperature);
    EXPECT_TRUE(kept.empty());
    // Forward: chunks in row order, the remainder first; backward: every chunk but the kept one,
    // from the last to the first (one block of W per chunk: the whole V fits the budget).
    std::vector<index_t> expected;
    for (index_t j = 0; j < chunks; ++j) expected.push_back(j == 0 ? first : std::min(c, p.N));
    for (index_t j = chunks - 2; j >= 0; --j) expected.push_back(expected[static_cast<std::size_t>(j)]);
    EXPECT_EQ(gemm_rows, expected);
  }
  // Kept by another call (other hidden states; the same ones in another chunking): recomputed,
  // and still taken.
  const auto q = make_problem<T>(11, 6, 37, 22, true, 4);
  rl::linear_options o;
  std::vector<A> logp(11), ent(11), lse(11);
  const auto gl = cast_all<A>(p.g_logp);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "other hidden states" : "other chunking");
    o.chunk_rows = which == 0 ? 3 : 4;
    rl::linear_kept_logits<A> stale;
    rl::linear_forward(rl::cblas_gemm{}, operands_of(which == 0 ? q : p), o,
                       rl::linear_outputs<A>{logp.data(), ent.data(), lse.data(), nullptr, &stale});
    ASSERT_FALSE(stale.empty());
    EXPECT_EQ(stale.bytes(), static_cast<std::size_t>(o.chunk_rows * p.V) * sizeof(A));
    o.chunk_rows = 3;
    rl::linear_forward(rl::cblas_gemm{}, operands_of(p), o, rl::linear_outputs<A>{logp.data(), ent.data(), lse.data()});
    std::vector<T> dh(11 * 6);
    rl::linear_gradients<T> g;
    g.grad_logp = gl.data(), g.saved_lse = lse.data(), g.dhidden = dh.data(), g.kept = &stale;
    std::vector<index_t> gemm_rows;
    rl::linear_backward(counting_gemm{&gemm_rows, p.V}, operands_of(p), o, g);
    EXPECT_TRUE(stale.empty());
    std::vector<index_t> expected;  // chunks of 3 over the live rows, the remainder first; last first
    for (index_t left = live; left > 0; left -= 3) expected.push_back(std::min<index_t>(3, left));
    EXPECT_EQ(gemm_rows, expected) << "every chunk recomputed, the last first";
  }
}

// h and W as strided and transposed views of other buffers: within the same bound as contiguous.
TYPED_TEST(LinearLogpEntropy, StridedAndTransposedInputs) {
  using T = TypeParam;
  const auto p = make_problem<T>(5, 6, 11, 9, true, 4);
  rl::linear_options o;
  o.temperature = 1.3;
  expect_matches_reference(p, run(p, operands_of(p), o), o.temperature);
  const index_t N = p.N, H = p.H, V = p.V;
  const T nan = store_as<T>(std::numeric_limits<double>::quiet_NaN());
  struct layout {
    const char* name;
    index_t h_row, h_col, w_row, w_col;
  };
  for (const layout l : {layout{"padded rows", H + 3, 1, H + 2, 1}, layout{"transposed", 1, N, 1, V},
                         layout{"every other element", 2 * H, 2, 2 * H, 2}, layout{"h transposed, W padded", 1, N + 1, H + 1, 1}}) {
    SCOPED_TRACE(l.name);
    // Buffers big enough for the strides; everything not addressed is NaN (must never be read).
    std::vector<T> h(static_cast<std::size_t>((N - 1) * l.h_row + (H - 1) * l.h_col + 1), nan);
    std::vector<T> w(static_cast<std::size_t>((V - 1) * l.w_row + (H - 1) * l.w_col + 1), nan);
    for (index_t r = 0; r < N; ++r)
      for (index_t k = 0; k < H; ++k) h[r * l.h_row + k * l.h_col] = p.hs[r * H + k];
    for (index_t v = 0; v < V; ++v)
      for (index_t k = 0; k < H; ++k) w[v * l.w_row + k * l.w_col] = p.ws[v * H + k];
    auto in = operands_of(p);
    in.hidden = h.data(), in.hidden_stride_row = l.h_row, in.hidden_stride_col = l.h_col;
    in.weight = w.data(), in.weight_stride_row = l.w_row, in.weight_stride_col = l.w_col;
    // A transposed operand is another GEMM kernel (another summation order): held to the
    // reference's rounding bound like the contiguous call.
    expect_matches_reference(p, run(p, in, o), o.temperature);
  }
}

// A zero (or absent) entropy gradient skips its backward: the same as the logp-only gradient,
// without the saved entropy; no upstream gradient at all: dh = 0, dW untouched.
TEST(LinearLogpEntropyGrad, SkippedEntropyBackward) {
  auto p = make_problem<float>(6, 5, 13, 4, true, 3);
  const auto logp_only = run(p, operands_of(p), rl::linear_options{}, true, false);
  std::fill(p.g_entropy.begin(), p.g_entropy.end(), 0.0);
  std::vector<float> logp(6), ent(6), lse(6);
  const auto in = operands_of(p);
  rl::linear_forward(rl::cblas_gemm{}, in, rl::linear_options{}, rl::linear_outputs<float>{logp.data(), ent.data(), lse.data()});
  const auto gl = cast_all<float>(p.g_logp), gh = cast_all<float>(p.g_entropy);
  std::vector<float> dh(30, -1), dw(13 * 5, 0.25f), db(13, 0.25f);
  rl::linear_gradients<float> g;
  g.grad_logp = gl.data();
  g.grad_entropy = gh.data();
  g.saved_lse = lse.data();  // no saved entropy: not needed
  g.dhidden = dh.data(), g.dweight = dw.data(), g.dbias = db.data();
  rl::linear_backward(rl::cblas_gemm{}, in, rl::linear_options{}, g);
  for (std::size_t i = 0; i < dh.size(); ++i) EXPECT_EQ(dh[i], logp_only.dh[i]);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(dw[i] - 0.25f, static_cast<float>(logp_only.dw[i]));
  // Neither gradient: dh zero, dW unchanged.
  g.grad_logp = nullptr;
  std::fill(dw.begin(), dw.end(), 0.25f);
  rl::linear_backward(rl::cblas_gemm{}, in, rl::linear_options{}, g);
  for (float v : dh) EXPECT_EQ(v, 0.0f);
  for (float v : dw) EXPECT_EQ(v, 0.25f);
}

// The fused pass with a token-local loss equals forward, the loss's gradient, then backward.
TYPED_TEST(LinearLogpEntropy, FusedEqualsForwardThenBackward) {
  using T = TypeParam;
  using A = acc<T>;
  auto p = make_problem<T>(9, 7, 19, 21, true, 4);
  rl::linear_options o;
  o.temperature = 0.9;
  o.chunk_rows = 4;
  // Loss per token: a_r · e^{logp_r} - 0.01 · H_r (a ratio-like term and an entropy bonus).
  std::vector<double> adv(9);
  for (int r = 0; r < 9; ++r) adv[r] = 0.3 * r - 1.0;
  std::vector<A> logp(9), ent(9), lse(9);
  rl::linear_forward(rl::cblas_gemm{}, operands_of(p), o, rl::linear_outputs<A>{logp.data(), ent.data(), lse.data()});
  for (int r = 0; r < 9; ++r) p.g_logp[r] = adv[r] * std::exp(static_cast<double>(logp[r])), p.g_entropy[r] = -0.01;
  const auto two_pass = run(p, operands_of(p), o);
  std::vector<A> f_logp(9, -7), f_ent(9, -7);
  std::vector<T> dh(static_cast<std::size_t>(9 * 7));
  std::vector<A> dw(static_cast<std::size_t>(19 * 7), A(0.25)), db(19, A(0.25));
  rl::linear_gradients<T> g;
  g.dhidden = dh.data(), g.dweight = dw.data(), g.dbias = db.data();
  index_t seen = 0;
  rl::linear_fused(rl::cblas_gemm{}, operands_of(p), o, rl::linear_outputs<A>{f_logp.data(), f_ent.data()}, g,
                   [&](const index_t* rows, index_t n, const A* lp, const A*, A* g_logp, A* g_ent) {
                     for (index_t i = 0; i < n; ++i) {
                       g_logp[i] = static_cast<A>(adv[rows[i]] * std::exp(static_cast<double>(lp[i])));
                       g_ent[i] = A(-0.01);
                       EXPECT_TRUE(p.mask[rows[i]]);
                     }
                     seen += n;
                   });
  EXPECT_EQ(seen, 7);  // the unmasked rows, once each
  for (int r = 0; r < 9; ++r) {
    EXPECT_EQ(f_logp[r], two_pass.logp[r]);
    EXPECT_EQ(f_ent[r], two_pass.entropy[r]);
  }
  const double rel = std::is_same_v<T, double> ? 1e-13 : 2e-6;
  for (std::size_t i = 0; i < dh.size(); ++i)
    EXPECT_NEAR(load_from<T>(dh[i]), two_pass.dh[i], (rel + output_rounding<T>()) * (1e-3 + std::fabs(two_pass.dh[i])));
  // The backward adds the chunks' dW in the reverse order: each addition to the start value 0.25
  // rounds at its own ulp, whatever the order.
  for (std::size_t i = 0; i < dw.size(); ++i)
    EXPECT_NEAR(static_cast<double>(dw[i]) - 0.25, two_pass.dw[i],
                rel * (1e-2 + std::fabs(two_pass.dw[i])) + 4 * unit_roundoff<T>() * 0.25);
}

// The vocabulary split into parts (one call each, the partials of all parts merged in the
// reducer as ranks would after their all-reduce): the same as the whole vocabulary.
TEST(LinearLogpEntropyShards, PartsMergedEqualWhole) {
  const auto p = make_problem<double>(5, 4, 23, 8, true, 3);
  rl::linear_options o;
  o.temperature = 0.8;
  o.chunk_rows = 2;
  const auto whole = run(p, operands_of(p), o);
  for (int parts : {1, 2, 3, 4}) {
    SCOPED_TRACE("parts=" + std::to_string(parts));
    std::vector<index_t> begin;
    for (int k = 0; k <= parts; ++k) begin.push_back(p.V * k / parts);
    // First every part's partials (recorded chunk by chunk), then each part's call again with the
    // merged partials supplied by its reducer.
    std::vector<std::vector<rl::row_partial<double>>> recorded(parts);
    auto part = [&](int k) {
      auto in = operands_of(p);
      in.weight = p.ws.data() + begin[k] * p.H;
      in.bias = p.bs.data() + begin[k];
      in.vocab = begin[k + 1] - begin[k];
      in.vocab_begin = begin[k];
      in.total_vocab = p.V;
      return in;
    };
    for (int k = 0; k < parts; ++k) {
      std::vector<double> lp(5);
      rl::linear_forward(rl::cblas_gemm{}, part(k), o, rl::linear_outputs<double>{lp.data()},
                         [&](rl::row_partial<double>* s, index_t n) { recorded[k].insert(recorded[k].end(), s, s + n); });
    }
    std::vector<rl::row_partial<double>> merged(recorded[0].size());
    std::vector<const rl::row_partial<double>*> ptrs;
    for (auto& r : recorded) ptrs.push_back(r.data());
    rl::merge_partials(ptrs.data(), parts, static_cast<index_t>(merged.size()), o.temperature, merged.data());
    for (int k = 0; k < parts; ++k) {
      std::vector<double> lp(5), ent(5), lse(5);
      index_t offset = 0;
      rl::linear_forward(rl::cblas_gemm{}, part(k), o, rl::linear_outputs<double>{lp.data(), ent.data(), lse.data()},
                         [&](rl::row_partial<double>* s, index_t n) {
                           std::copy(merged.begin() + offset, merged.begin() + offset + n, s);
                           offset += n;
                         });
      for (int r = 0; r < 5; ++r) {
        EXPECT_NEAR(lp[r], whole.logp[r], 1e-13);
        EXPECT_NEAR(ent[r], whole.entropy[r], 1e-13);
        EXPECT_NEAR(lse[r], whole.lse[r], 1e-13);
      }
    }
  }
}

// A non-finite weight is refused naming its row, whatever W's layout (row-major, padded rows,
// column-major through a transposed view), for float and double, the unaddressed padding NaN.
template <class T>
void expect_weight_row_refused() {
  const index_t N = 3, H = 37, V = 21;  // H and V not multiples of any vector width
  const auto p = make_problem<T>(N, H, V, 2, false);
  std::vector<T> logp(N), ent(N), lse(N);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  struct layout {
    const char* name;
    index_t row, col;
  };
  for (const layout l : {layout{"row-major", H, 1}, layout{"padded rows", H + 3, 1}, layout{"column-major", 1, V + 2}})
    for (const index_t bad_row : {index_t(0), index_t(13), V - 1})
      for (const T bad : {nan, std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
        SCOPED_TRACE(std::string(l.name) + " row " + std::to_string(bad_row));
        std::vector<T> w(static_cast<std::size_t>((V - 1) * l.row + (H - 1) * l.col + 1), nan);
        for (index_t v = 0; v < V; ++v)
          for (index_t k = 0; k < H; ++k) w[v * l.row + k * l.col] = p.ws[v * H + k];
        auto in = operands_of(p, false);
        in.weight = w.data(), in.weight_stride_row = l.row, in.weight_stride_col = l.col;
        // Unaddressed padding holds NaN: a finite W passes.
        EXPECT_NO_THROW(rl::linear_forward(rl::cblas_gemm{}, in, rl::linear_options{},
                                           rl::linear_outputs<T>{logp.data(), ent.data(), lse.data()}));
        w[bad_row * l.row + (H - 2) * l.col] = bad;
        try {
          rl::linear_forward(rl::cblas_gemm{}, in, rl::linear_options{}, rl::linear_outputs<T>{logp.data(), ent.data(), lse.data()});
          ADD_FAILURE() << "no error";
        } catch (const reco::error& e) {
          EXPECT_EQ(e.argument(), "weight");
          EXPECT_NE(std::string(e.what()).find("row " + std::to_string(bad_row) + " "), std::string::npos) << e.what();
        }
      }
}

TEST(LinearLogpEntropyErrors, NonFiniteWeightRowInEveryLayout) {
  expect_weight_row_refused<float>();
  expect_weight_row_refused<double>();
}

TEST(LinearLogpEntropyErrors, NamedArguments) {
  auto p = make_problem<float>(3, 4, 6, 1, true);
  std::vector<float> logp(3), ent(3), lse(3);
  const rl::linear_outputs<float> out{logp.data(), ent.data(), lse.data()};
  auto fwd = [&](rl::linear_operands<float> in, rl::linear_options o = {}) {
    return [=] { rl::linear_forward(rl::cblas_gemm{}, in, o, out); };
  };
  const auto good = operands_of(p);
  auto in = good;
  in.hidden_size = 0;
  expect_error(fwd(in), "hidden_size");
  in = good, in.vocab = 0;
  expect_error(fwd(in), "vocab");
  in = good, in.weight = nullptr;
  expect_error(fwd(in), "weight");
  in = good, in.tokens = nullptr;
  expect_error(fwd(in), "tokens");
  auto bad_tokens = p.tokens;
  bad_tokens[1] = 6;
  in = good, in.tokens = bad_tokens.data();
  expect_error(fwd(in), "tokens");
  bad_tokens[1] = -1;
  expect_error(fwd(in), "tokens");
  rl::linear_options o;
  o.temperature = 0;
  expect_error(fwd(good, o), "temperature");
  o.temperature = 1e-300;  // 1/τ overflows float
  expect_error(fwd(good, o), "temperature");
  o = {};
  o.memory_budget = 100;  // less than one row
  expect_error(fwd(good, o), "memory_budget");
  in = good, in.vocab_begin = 2;  // [2, 8) is not inside [0, 6)
  expect_error(fwd(in), "vocab_begin");
  // Non-finite inputs: named, for in-place (float) and widened (bf16) weights.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto q = p;
    q.hs[5] = bad;
    expect_error(fwd(operands_of(q)), "hidden");
    q = p, q.ws[7] = bad;
    expect_error(fwd(operands_of(q)), "weight");
    q = p, q.bs[2] = bad;
    expect_error(fwd(operands_of(q)), "bias");
  }
  auto pb = make_problem<reco::bf16_t>(3, 4, 6, 1, false);
  pb.ws[3] = reco::bf16_t(std::numeric_limits<float>::infinity());
  expect_error([&] { rl::linear_forward(rl::cblas_gemm{}, operands_of(pb), rl::linear_options{}, out); }, "weight");
  // Finite values whose products overflow float.
  auto q = p;
  for (auto& v : q.hs) v = 1e30f;
  for (auto& v : q.ws) v = 1e30f;
  expect_error(fwd(operands_of(q)), "hidden");

  // Backward.
  rl::linear_forward(rl::cblas_gemm{}, good, rl::linear_options{}, out);
  std::vector<float> g(3, 1.0f), dh(12), dw(24);
  rl::linear_gradients<float> gr;
  gr.grad_logp = g.data(), gr.grad_entropy = g.data(), gr.saved_lse = lse.data(), gr.saved_entropy = ent.data();
  gr.dhidden = dh.data(), gr.dweight = dw.data();
  auto bwd = [&](rl::linear_gradients<float> x) {
    return [=] { rl::linear_backward(rl::cblas_gemm{}, good, rl::linear_options{}, x); };
  };
  auto x = gr;
  x.saved_lse = nullptr;
  expect_error(bwd(x), "saved_lse");
  x = gr, x.saved_entropy = nullptr;
  expect_error(bwd(x), "saved_entropy");
  std::vector<float> dh_acc(12);
  x = gr, x.dhidden_accum = dh_acc.data();  // both
  expect_error(bwd(x), "dhidden");
  x = gr, x.dweight_stride = 2;
  expect_error(bwd(x), "dweight_stride");
}

}  // namespace

namespace {

// The device call's plan, on the host: offsets aligned and disjoint, the workspace within the
// budget and the largest chunk that fits, 16-bit dlogits only for 16-bit inputs.
TEST(LinearLogpEntropyPlan, DevicePlanFitsTheBudget) {
  namespace rl = reco::logits;
  for (std::size_t t : {2, 4}) {
    const std::size_t budget = std::size_t(64) << 20;
    const auto p = rl::linear_cuda_chunking_of(100000, 151936, 2048, t, 4, budget, 0);
    EXPECT_LE(p.workspace_bytes, budget);
    EXPECT_GT(rl::linear_cuda_chunking_of(100000, 151936, 2048, t, 4, budget, p.chunk_rows + 1).workspace_bytes, budget);
    for (std::size_t off : {p.tile, p.dlogits_t, p.hidden, p.dhidden, p.ones}) EXPECT_EQ(off % 256, 0u);
    const std::size_t C = static_cast<std::size_t>(p.chunk_rows);
    EXPECT_GE(p.dlogits_t - p.tile, C * 151936 * 4);
    EXPECT_EQ(p.hidden - p.dlogits_t >= C * 151936 * t, t == 2);
    EXPECT_GE(p.workspace_bytes - p.ones, C * t);
  }
  EXPECT_EQ(rl::linear_cuda_chunking_of(5, 100, 8, 4, 4, std::size_t(1) << 30, 0).chunk_rows, 5);  // at most the rows
  EXPECT_EQ(rl::linear_cuda_chunking_of(50, 100, 8, 4, 4, 0, 7).chunk_rows, 7);                     // chunk_rows given
  try {
    rl::linear_cuda_chunking_of(50, 151936, 2048, 2, 4, 1000, 0);
    ADD_FAILURE() << "no error";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "memory_budget");
  }
}

}  // namespace
