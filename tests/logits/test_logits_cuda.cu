// reco::logits on CUDA. Without a device: a host replay of the kernels' per-row work (the
// per-thread functions are host-device) against the host library, and the host-side argument
// checks. With a device: CPU-vs-CUDA parity for every storage type, forward and backward,
// warp-per-row and block-per-row paths, 70,000 rows (past the 65,535 grid-dimension limit),
// V = 151,936 and 262,144, strided and misaligned rows, in-place backward, masked rows, and the
// device error flags; those tests skip with "no CUDA device" on a machine without one.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "logits/logits_reference.hpp"
#include "reco/logits/logp_entropy.cuh"
#include "reco/logits/logp_entropy.hpp"

namespace {

namespace rl = reco::logits;
using namespace logits_test;

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define RECO_REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device"

void ok(cudaError_t e) { ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e); }

// A device copy of a host vector (or n uninitialised elements), freed on scope exit.
template <class T>
struct device_buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit device_buffer(std::size_t count) : n(count) {
    if (cudaMalloc(&ptr, sizeof(T) * (n ? n : 1)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  explicit device_buffer(const std::vector<T>& host) : device_buffer(host.size()) {
    if (cudaMemcpy(ptr, host.data(), sizeof(T) * n, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(ptr); }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    if (cudaMemcpy(h.data(), ptr, sizeof(T) * n, cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("cudaMemcpy");
    return h;
  }
};

template <class T>
double forward_tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 3e-6;
}
template <class T>
double backward_tolerance() {  // relative, plus the same fraction of the row scale / 100
  if (std::is_same_v<T, double>) return 1e-11;
  // fp32: each side is off the float64 formula by up to ~1e-5 relative where |x - LSE| / tau is
  // ~15-20 (p_j = exp2 of a rounded argument; measured on an H100 at 70,000 rows: GPU 6e-6, CPU
  // 1.1e-5 and 2.6e-5 at the worst elements), and this test compares the two float paths.
  if (std::is_same_v<T, float>) return 3e-5;
  if (std::is_same_v<T, reco::bf16_t>) return 1.0 / 128;  // one bf16 ulp apart at most
  return 1.0 / 1024;
}

// Absolute part, as a fraction of the row's gradient scale: where the log-prob and entropy terms
// of dlogits_j nearly cancel, each float path keeps only ~16 eps of that scale (H100, 70,000
// rows: 1.1e-6 of the scale between the two paths; the GPU was the closer one to float64).
template <class T>
double backward_floor() {
  return std::is_same_v<T, float> ? 4e-6 : 1e-2 * backward_tolerance<T>();
}

struct shape {
  reco::index_t rows, vocab, pad;
};

template <class T>
void check_parity(const shape& sh, double tau, std::uint64_t seed) {
  using A = rl::accum_t<T>;
  SCOPED_TRACE(type_name<T>() + " rows=" + std::to_string(sh.rows) + " V=" + std::to_string(sh.vocab) +
               " pad=" + std::to_string(sh.pad) + " tau=" + std::to_string(tau));
  batch_options o;
  o.mask_every = 3;
  o.neg_inf_fraction = 0.1;
  o.pad = sh.pad;
  const auto b = make_batch<T>(sh.rows, sh.vocab, seed, o);
  const std::size_t n = static_cast<std::size_t>(b.rows);

  // CPU.
  std::vector<A> logp(n), h(n), lse(n), sq(n);
  rl::forward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, b.mask.data(), logp.data(), h.data(),
              lse.data(), sq.data());
  std::vector<A> g(n), gh(n);
  for (std::size_t r = 0; r < n; ++r) g[r] = A(0.5 + 0.25 * (r % 5)), gh[r] = A(-0.3 + 0.2 * (r % 4));
  std::vector<T> dx_cpu(b.stored.size());
  rl::backward(b.stored.data(), b.rows, b.vocab, b.stride, b.tokens.data(), tau, b.mask.data(), g.data(), gh.data(),
               lse.data(), h.data(), dx_cpu.data());

  // CUDA, forward then backward out of place and in place.
  device_buffer<T> d_x(b.stored), d_dx(b.stored.size());
  device_buffer<std::int64_t> d_tokens(b.tokens);
  device_buffer<std::uint8_t> d_mask(b.mask);
  device_buffer<A> d_logp(n), d_h(n), d_lse(n), d_sq(n), d_g(g), d_gh(gh);
  device_buffer<int> d_flags(std::vector<int>{0});
  ok(cudaMemcpy(d_dx.ptr, b.stored.data(), sizeof(T) * b.stored.size(), cudaMemcpyHostToDevice));  // padding
  rl::forward_cuda(d_x.ptr, b.rows, b.vocab, b.stride, d_tokens.ptr, tau, d_mask.ptr, d_logp.ptr, d_h.ptr, d_lse.ptr,
                   nullptr, d_sq.ptr, d_flags.ptr);
  rl::backward_cuda(d_x.ptr, b.rows, b.vocab, b.stride, d_tokens.ptr, tau, d_mask.ptr, d_g.ptr, d_gh.ptr, d_lse.ptr,
                    d_h.ptr, d_dx.ptr, nullptr, d_flags.ptr);
  const auto dx_out = d_dx.to_host();
  rl::backward_cuda(d_x.ptr, b.rows, b.vocab, b.stride, d_tokens.ptr, tau, d_mask.ptr, d_g.ptr, d_gh.ptr, d_lse.ptr,
                    d_h.ptr, d_x.ptr, nullptr, d_flags.ptr);
  ok(cudaDeviceSynchronize());
  const auto dx_in = d_x.to_host();
  EXPECT_EQ(d_flags.to_host()[0], 0);

  const auto c_logp = d_logp.to_host(), c_h = d_h.to_host(), c_lse = d_lse.to_host(), c_sq = d_sq.to_host();
  const double ft = forward_tolerance<T>();
  for (std::size_t r = 0; r < n; ++r) {
    if (!b.mask[r]) {
      ASSERT_EQ(c_logp[r], A(0));
      ASSERT_EQ(c_h[r], A(0));
      ASSERT_EQ(c_lse[r], A(0));
      continue;
    }
    ASSERT_NEAR(c_logp[r], logp[r], ft * (1 + std::fabs(logp[r]))) << r;
    ASSERT_NEAR(c_h[r], h[r], ft * (1 + h[r])) << r;
    ASSERT_NEAR(c_lse[r], lse[r], ft * (1 + std::fabs(lse[r]))) << r;
    ASSERT_NEAR(c_sq[r], sq[r], ft * sq[r] + 1e-9) << r;
  }

  // In place and out of place agree bit for bit on every row (the padding is untouched).
  EXPECT_EQ(0, std::memcmp(dx_in.data(), dx_out.data(), sizeof(T) * dx_in.size()));
  const double bt = backward_tolerance<T>();
  for (std::size_t r = 0; r < n; ++r) {
    const double scale = (std::fabs(g[r]) + std::fabs(gh[r]) * (1 + h[r])) / tau;
    for (reco::index_t j = 0; j < b.vocab; ++j) {
      const std::size_t i = r * static_cast<std::size_t>(b.stride) + static_cast<std::size_t>(j);
      const double got = load_from<T>(dx_out[i]), want = load_from<T>(dx_cpu[i]);
      if (!b.mask[r] || std::isinf(b.x[i])) {
        ASSERT_EQ(got, 0.0) << r << "," << j;
        continue;
      }
      ASSERT_NEAR(got, want, bt * std::fabs(want) + backward_floor<T>() * scale) << r << "," << j;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host replay of the kernels' per-row work. The per-thread functions of logp_entropy.cuh are
// host-device: here every thread of a row group runs in turn on the host (with std::exp2 for
// exp2f), their sums are merged pairwise as a block reduction would, and the results must match
// the host library. This checks the row split (head / 16-byte vectors / tail), the two-in-flight
// loop, the online rescaling and merging, the -inf and masked handling and the in-place gradient
// without a GPU; the device tests below check the rest (launch, reduction, grid loop).
// ---------------------------------------------------------------------------------------------

namespace cd = rl::cuda_detail;

template <class T, int threads>
cd::row_outputs<rl::accum_t<T>> replay_forward_row(const T* x, int vocab, std::int64_t y, double tau) {
  using A = rl::accum_t<T>;
  const A k = static_cast<A>(rl::detail::log2_e / tau);
  std::vector<cd::online_sums<A>> sums;
  for (int lane = 0; lane < threads; ++lane) sums.push_back(cd::thread_row_sums<T, threads, true>(x, vocab, lane, k));
  const cd::merge_sums<A> merge{k};
  for (std::size_t width = 1; width < sums.size(); width *= 2)
    for (std::size_t i = 0; i + width < sums.size(); i += 2 * width) sums[i] = merge(sums[i], sums[i + width]);
  return cd::finish_row(sums[0], static_cast<A>(x[y]), true, static_cast<A>(1.0 / tau));
}

template <class T, int threads>
void replay_backward_row(const T* x, T* dx, int vocab, std::int64_t y, double tau, rl::accum_t<T> g, rl::accum_t<T> gh,
                         rl::accum_t<T> lse, rl::accum_t<T> h) {
  using A = rl::accum_t<T>;
  const bool vector_ok = ((reinterpret_cast<std::uintptr_t>(x) ^ reinterpret_cast<std::uintptr_t>(dx)) & 15u) == 0;
  const cd::row_gradient<A> grad{static_cast<A>(rl::detail::log2_e / tau), lse * static_cast<A>(tau),
                                 -(g + gh * h) / static_cast<A>(tau), -gh * static_cast<A>(rl::detail::ln_2 / tau),
                                 g / static_cast<A>(tau), static_cast<int>(y)};
  for (int lane = 0; lane < threads; ++lane) cd::thread_row_gradient<T, threads>(x, dx, vocab, lane, vector_ok, grad);
}

template <class T>
void replay_row_and_compare(reco::index_t vocab, int offset, double tau, std::uint64_t seed) {
  using A = rl::accum_t<T>;
  SCOPED_TRACE(type_name<T>() + " V=" + std::to_string(vocab) + " offset=" + std::to_string(offset));
  batch_options o;
  o.neg_inf_fraction = 0.1;
  const auto b = make_batch<T>(1, vocab, seed, o);
  // The row starts `offset` elements past a 16-byte boundary: every head length is exercised.
  std::vector<T> storage(static_cast<std::size_t>(vocab) + 16);
  T* x = reinterpret_cast<T*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 15) & ~std::uintptr_t(15)) + offset;
  std::copy(b.stored.begin(), b.stored.end(), x);
  const std::int64_t y = b.tokens[0];
  A logp, h, lse, sq;
  rl::forward(x, 1, vocab, vocab, &y, tau, nullptr, &logp, &h, &lse, &sq);
  cd::row_outputs<A> out{};
  switch (cd::threads_per_row(vocab)) {
    case 32: out = replay_forward_row<T, 32>(x, static_cast<int>(vocab), y, tau); break;
    case 256: out = replay_forward_row<T, 256>(x, static_cast<int>(vocab), y, tau); break;
    default: out = replay_forward_row<T, 512>(x, static_cast<int>(vocab), y, tau); break;
  }
  const double ft = std::is_same_v<T, double> ? 1e-12 : 3e-6;
  EXPECT_FALSE(out.all_neg_inf);
  EXPECT_NEAR(out.logp, logp, ft * (1 + std::fabs(logp)));
  EXPECT_NEAR(out.entropy, h, ft * (1 + h));
  EXPECT_NEAR(out.lse, lse, ft * (1 + std::fabs(lse)));
  EXPECT_NEAR(out.sum_p_squared, sq, ft * sq + 1e-9);

  const A g = A(0.8), gh = A(-0.6);
  std::vector<T> want(static_cast<std::size_t>(vocab));
  rl::backward(x, 1, vocab, vocab, &y, tau, nullptr, &g, &gh, &lse, &h, want.data());
  // Out of place with the same alignment (vectors), out of place one element off (scalar path),
  // and in place: all equal to the host library within rounding, the first and last bit for bit.
  std::vector<T> out_storage(static_cast<std::size_t>(vocab) + 16);
  T* aligned_base = reinterpret_cast<T*>((reinterpret_cast<std::uintptr_t>(out_storage.data()) + 15) & ~std::uintptr_t(15));
  T* same_phase = aligned_base + offset;
  replay_backward_row<T, 32>(x, same_phase, static_cast<int>(vocab), y, tau, g, gh, lse, h);
  const std::vector<T> vec(same_phase, same_phase + vocab);
  T* other_phase = aligned_base + (offset + 1) % (16 / static_cast<int>(sizeof(T)));
  replay_backward_row<T, 512>(x, other_phase, static_cast<int>(vocab), y, tau, g, gh, lse, h);
  const std::vector<T> scalar(other_phase, other_phase + vocab);
  replay_backward_row<T, 256>(x, x, static_cast<int>(vocab), y, tau, g, gh, lse, h);
  EXPECT_EQ(0, std::memcmp(vec.data(), x, sizeof(T) * static_cast<std::size_t>(vocab)));
  EXPECT_EQ(0, std::memcmp(vec.data(), scalar.data(), sizeof(T) * static_cast<std::size_t>(vocab)));
  const double bt = std::is_same_v<T, double> ? 1e-11 : (sizeof(T) == 2 ? 1.0 / 128 : 5e-6);
  const double scale = (0.8 + 0.6 * (1 + h)) / tau;
  for (reco::index_t j = 0; j < vocab; ++j) {
    const double got = load_from<T>(vec[j]), ref = load_from<T>(want[j]);
    if (std::isinf(b.x[j])) {
      ASSERT_EQ(got, 0.0) << j;
      continue;
    }
    ASSERT_NEAR(got, ref, bt * std::fabs(ref) + 1e-2 * bt * scale) << j;
  }
  // A masked row is filled with exact zeros.
  switch (cd::threads_per_row(vocab)) {
    case 32:
      for (int lane = 0; lane < 32; ++lane) cd::thread_row_fill<T, 32>(x, static_cast<int>(vocab), lane, A(0));
      break;
    default:
      for (int lane = 0; lane < 256; ++lane) cd::thread_row_fill<T, 256>(x, static_cast<int>(vocab), lane, A(0));
      break;
  }
  for (reco::index_t j = 0; j < vocab; ++j) ASSERT_EQ(load_from<T>(x[j]), 0.0) << j;
}

template <class T>
class LogitsCudaRowReplay : public ::testing::Test {};
using replay_types = ::testing::Types<float, double, reco::bf16_t, reco::f16_t>;
TYPED_TEST_SUITE(LogitsCudaRowReplay, replay_types);

TYPED_TEST(LogitsCudaRowReplay, MatchesHostLibrary) {
  std::uint64_t seed = 60;
  for (reco::index_t vocab : {1, 7, 9, 1000, 5003, 40000, 151936})
    for (int offset = 0; offset < 16 / static_cast<int>(sizeof(TypeParam)); offset += (vocab > 10000 ? 3 : 1))
      replay_row_and_compare<TypeParam>(vocab, offset, vocab % 2 ? 0.7 : 1.6, seed++);
}

TEST(LogitsCudaRowReplay, AllNegInfRowIsFlagged) {
  std::vector<float> x(300, -INFINITY);
  const auto out = replay_forward_row<float, 32>(x.data(), 300, 0, 1.0);
  EXPECT_TRUE(out.all_neg_inf);
  EXPECT_TRUE(std::isnan(out.logp) && std::isnan(out.entropy) && std::isnan(out.lse));
  x[123] = 2.0f;  // one finite logit: a one-hot distribution
  const auto one = replay_forward_row<float, 32>(x.data(), 300, 123, 1.0);
  EXPECT_FALSE(one.all_neg_inf);
  EXPECT_EQ(one.logp, 0.0f);
  EXPECT_EQ(one.entropy, 0.0f);
  EXPECT_EQ(one.sum_p_squared, 1.0f);
}

// A +inf logit and a largest logit / temperature beyond FLT_MAX: NaN outputs and their own bits
// (the host version throws "logits" and "temperature" for them).
TEST(LogitsCudaRowReplay, PositiveInfAndOverflowRowsAreFlagged) {
  std::vector<float> x(300, 0.5f);
  x[7] = INFINITY;
  const auto hot = replay_forward_row<float, 32>(x.data(), 300, 0, 1.0);
  EXPECT_EQ(hot.error, rl::error_row_pos_inf);
  EXPECT_FALSE(hot.all_neg_inf);
  EXPECT_TRUE(std::isnan(hot.logp) && std::isnan(hot.entropy) && std::isnan(hot.lse));
  x[7] = 1e10f;  // 1e10 / 1e-30 overflows float
  const auto big = replay_forward_row<float, 32>(x.data(), 300, 0, 1e-30);
  EXPECT_EQ(big.error, rl::error_row_overflow);
  EXPECT_TRUE(std::isnan(big.logp) && std::isnan(big.lse));
  x[7] = 2.0f;  // 2 / 1e-30 fits: a one-hot distribution
  const auto fine = replay_forward_row<float, 32>(x.data(), 300, 7, 1e-30);
  EXPECT_EQ(fine.error, 0);
  EXPECT_EQ(fine.logp, 0.0f);
  EXPECT_EQ(fine.entropy, 0.0f);
  try {
    rl::throw_if_error_flags(rl::error_row_pos_inf);
    ADD_FAILURE() << "no exception";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "logits");
  }
  try {
    rl::throw_if_error_flags(rl::error_row_overflow);
    ADD_FAILURE() << "no exception";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "temperature");
  }
}

// ---------------------------------------------------------------------------------------------
// On the device.
// ---------------------------------------------------------------------------------------------

template <class T>
class LogitsCuda : public ::testing::Test {};
using storage_types = ::testing::Types<float, double, reco::bf16_t, reco::f16_t>;
TYPED_TEST_SUITE(LogitsCuda, storage_types);

TYPED_TEST(LogitsCuda, WarpPerRowManyRows) {
  RECO_REQUIRE_DEVICE();
  check_parity<TypeParam>({70000, 8, 0}, 0.7, 1);
  check_parity<TypeParam>({4000, 1000, 3}, 1.0, 2);  // strided: unaligned heads and tails
}

TYPED_TEST(LogitsCuda, BlockPerRowManyRows) {
  RECO_REQUIRE_DEVICE();
  check_parity<TypeParam>({70000, 1100, 0}, 1.3, 3);
  check_parity<TypeParam>({300, 16000, 5}, 0.6, 4);
}

TYPED_TEST(LogitsCuda, LargeVocabularies) {
  RECO_REQUIRE_DEVICE();
  check_parity<TypeParam>({24, 151936, 0}, 0.7, 5);
  check_parity<TypeParam>({12, 262144, 1}, 1.7, 6);
}

TEST(LogitsCudaOnly, MisalignedOutputFallsBackToScalar) {
  RECO_REQUIRE_DEVICE();
  // dlogits one element off the logits' 16-byte phase: every row takes the scalar path.
  const auto b = make_batch<reco::bf16_t>(40, 3000, 8);
  std::vector<float> logp(40), h(40), lse(40), g(40, 1.0f), gh(40, 0.5f);
  rl::forward(b.stored.data(), 40, 3000, 3000, b.tokens.data(), 0.9, nullptr, logp.data(), h.data(), lse.data());
  std::vector<reco::bf16_t> want(b.stored.size());
  rl::backward(b.stored.data(), 40, 3000, 3000, b.tokens.data(), 0.9, nullptr, g.data(), gh.data(), lse.data(), h.data(),
               want.data());
  device_buffer<reco::bf16_t> d_x(b.stored), d_out(b.stored.size() + 1);
  device_buffer<std::int64_t> d_tokens(b.tokens);
  device_buffer<float> d_lse(lse), d_h(h), d_g(g), d_gh(gh);
  rl::backward_cuda(d_x.ptr, 40, 3000, 3000, d_tokens.ptr, 0.9, nullptr, d_g.ptr, d_gh.ptr, d_lse.ptr, d_h.ptr,
                    d_out.ptr + 1, nullptr);
  ok(cudaDeviceSynchronize());
  const auto got = d_out.to_host();
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(static_cast<float>(got[i + 1]), static_cast<float>(want[i]), std::fabs(static_cast<float>(want[i])) / 128 + 1e-7)
        << i;
}

TEST(LogitsCudaOnly, ErrorFlagsAndNaNRows) {
  RECO_REQUIRE_DEVICE();
  auto b = make_batch<float>(6, 2000, 9);
  b.tokens[1] = 2000;  // out of range
  for (int j = 0; j < 2000; ++j) b.stored[4 * 2000 + j] = -INFINITY;  // all -inf
  device_buffer<float> d_x(b.stored), d_logp(6), d_h(6), d_lse(6), d_dx(b.stored.size());
  device_buffer<std::int64_t> d_tokens(b.tokens);
  device_buffer<int> d_flags(std::vector<int>{0});
  rl::forward_cuda(d_x.ptr, 6, 2000, 2000, d_tokens.ptr, 1.0, nullptr, d_logp.ptr, d_h.ptr, d_lse.ptr, nullptr, nullptr,
                   d_flags.ptr);
  ok(cudaDeviceSynchronize());
  const int flags = d_flags.to_host()[0];
  EXPECT_EQ(flags, rl::error_token_out_of_range | rl::error_row_all_neg_inf);
  const auto logp = d_logp.to_host(), h = d_h.to_host();
  EXPECT_TRUE(std::isnan(logp[1]));
  EXPECT_TRUE(std::isfinite(h[1]));  // the distribution itself is fine
  EXPECT_TRUE(std::isnan(logp[4]) && std::isnan(h[4]));
  EXPECT_TRUE(std::isfinite(logp[0]) && std::isfinite(logp[5]));
  try {
    rl::throw_if_error_flags(flags);
    ADD_FAILURE() << "no exception";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "tokens");
  }
  try {
    rl::throw_if_error_flags(rl::error_row_all_neg_inf);
    ADD_FAILURE() << "no exception";
  } catch (const reco::error& e) {
    EXPECT_EQ(e.argument(), "logits");
  }
  // Backward marks the bad token's row NaN and leaves the others finite.
  std::vector<float> ones(6, 1.0f);
  device_buffer<float> d_g(ones);
  ok(cudaMemset(d_flags.ptr, 0, sizeof(int)));
  rl::backward_cuda(d_x.ptr, 6, 2000, 2000, d_tokens.ptr, 1.0, nullptr, d_g.ptr, nullptr, d_lse.ptr, nullptr, d_dx.ptr,
                    nullptr, d_flags.ptr);
  ok(cudaDeviceSynchronize());
  EXPECT_EQ(d_flags.to_host()[0] & rl::error_token_out_of_range, rl::error_token_out_of_range);
  const auto dx = d_dx.to_host();
  EXPECT_TRUE(std::isnan(dx[1 * 2000 + 7]));
  EXPECT_TRUE(std::isfinite(dx[0 * 2000 + 7]));
}

TEST(LogitsCudaOnly, HostSideValidation) {
  // These checks run before any device work, so they hold with or without a GPU.
  float* p = reinterpret_cast<float*>(16);
  auto argument = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const reco::error& e) {
      return e.argument();
    }
    return "<no error>";
  };
  EXPECT_EQ(argument([&] { rl::forward_cuda(p, 4, 5, 5, nullptr, 0.0, nullptr, p, p, p, nullptr); }), "temperature");
  EXPECT_EQ(argument([&] { rl::forward_cuda(p, 4, 5, 3, nullptr, 1.0, nullptr, p, p, p, nullptr); }), "row_stride");
  EXPECT_EQ(argument([&] { rl::forward_cuda(p, 4, 5, 5, nullptr, 1.0, nullptr, p, p, p, nullptr); }), "tokens");
  EXPECT_EQ(argument([&] { rl::forward_cuda(p, 4, reco::index_t(1) << 32, reco::index_t(1) << 32, nullptr, 1.0, nullptr,
                                            nullptr, p, p, nullptr); }),
            "vocab");
  EXPECT_EQ(argument([&] { rl::backward_cuda(p, 4, 5, 5, nullptr, 1.0, nullptr, nullptr, p, p, nullptr, p, nullptr); }),
            "entropy");
  EXPECT_EQ(argument([&] { rl::backward_cuda(p, 4, 5, 5, nullptr, 1.0, nullptr, nullptr, nullptr, nullptr, nullptr, p,
                                             nullptr); }),
            "lse");
}

}  // namespace
