// The CPU backend: Thrust's OMP system when OpenMP is enabled, its sequential CPP system
// otherwise. Results are bitwise reproducible and independent of the thread count: every
// reduction runs over fixed-size chunks whose partials are merged in order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#if defined(_OPENMP)
#include <omp.h>
#include <thrust/system/omp/execution_policy.h>
#else
#include <thrust/system/cpp/execution_policy.h>
#endif

#include "reco/backend/cpu/float_order_statistics.hpp"
#include "reco/backend/cpu/packed_covariance.hpp"
#include "reco/backend/cpu/packed_kept.hpp"
#include "reco/backend/cpu/packed_pass.hpp"
#include "reco/backend/cpu/packed_scan.hpp"
#include "reco/backend/cpu/packed_tokens.hpp"
#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
template <class F, class Acc, class = void>
struct has_accumulate_range : std::false_type {};
template <class F, class Acc>
struct has_accumulate_range<F, Acc,
                            std::void_t<decltype(std::declval<const F&>().accumulate_range(
                                std::declval<Acc&>(), index_t{}, index_t{}, index_t{}))>> : std::true_type {};
// f.reduce_range(acc, b, e): acc = merge of acc, f(b) .. f(e - 1), the same bits (a vectorised form).
template <class F, class Acc, class = void>
struct has_reduce_range : std::false_type {};
template <class F, class Acc>
struct has_reduce_range<F, Acc,
                        std::void_t<decltype(std::declval<const F&>().reduce_range(std::declval<Acc&>(), index_t{},
                                                                                    index_t{}))>> : std::true_type {};

// f.run_range(b, e): f(b) .. f(e - 1), the same writes (a form the compiler vectorises).
template <class F, class = void>
struct has_run_range : std::false_type {};
template <class F>
struct has_run_range<F, std::void_t<decltype(std::declval<const F&>().run_range(index_t{}, index_t{}))>>
    : std::true_type {};

// The ranks[j]-th smallest of keys[0, n) for the m ranks taken in ascending order (order[] lists
// the slots of out by ascending rank, every rank in [0, n)); keys are permuted. Sorting rank r
// leaves the ranks above it in [r + 1, n), so each next selection only looks there.
inline void nested_order_statistics(double* keys, index_t n, const index_t* ranks, const int* order, int m,
                                    double* out) {
  index_t from = 0;  // keys[0, from) hold the smallest `from` keys
  index_t prev = -1;
  double prev_value = 0;
  for (int j = 0; j < m; ++j) {
    const index_t r = ranks[order[j]];
    if (r == prev) {
      out[order[j]] = prev_value;
      continue;
    }
    if (r == from) {
      std::iter_swap(keys + r, std::min_element(keys + r, keys + n));
    } else {
      std::nth_element(keys + from, keys + r, keys + n);
    }
    prev = r;
    prev_value = keys[r];
    out[order[j]] = prev_value;
    from = r + 1;
  }
}

// The sampled selection's counting pass: the keys below lo and inside [lo, hi]. A kernel of
// simd::run_widest so that its branch-free loop is vectorised for the widest instruction set:
// compiled for the baseline (SSE2) it takes about four times as long.
struct window_count {
  template <int W>
  static void run(const double* const& keys, const index_t& n, const double& lo, const double& hi, index_t& below,
                  index_t& inside) {
    index_t b = 0, in = 0;
    for (index_t i = 0; i < n; ++i) {
      const double k = keys[i];
      b += k < lo ? 1 : 0;
      in += ((k >= lo) & (k <= hi)) ? 1 : 0;
    }
    below = b, inside = in;
  }
};

// Selection by sampling (Floyd and Rivest): the order statistics of a spread sample bracket the
// wanted ranks in a window [lo, hi] of values; one pass counts the keys below and inside it, and
// when the ranks fall inside, the window's keys (a few per cent) are moved to the front and the
// selection goes on there. When the sample misses (unlucky or adversarial data) it falls back to
// nested nth_element over all of keys. Either way the result is the exact order statistic.
inline void sampled_order_statistics(double* keys, index_t n, const index_t* ranks_in, const int* order, int m,
                                     double* out) {
  constexpr index_t direct_below = index_t(1) << 14;
  constexpr int s = 4096;  // sample size
  constexpr int max_m = 8;
  index_t ranks[max_m];
  for (int j = 0; j < m; ++j) ranks[j] = ranks_in[j];
  std::vector<double> sample;
  for (;;) {
    if (n < direct_below) break;
    const index_t rmin = ranks[order[0]], rmax = ranks[order[m - 1]];
    // A stratified sample: one key from each of s equal strata, at a fixed pseudo-random offset.
    sample.resize(s);
    const index_t stride = n / s;
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int j = 0; j < s; ++j) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      sample[j] = keys[static_cast<index_t>(j) * stride +
                       static_cast<index_t>((h >> 33) % static_cast<std::uint64_t>(stride))];
    }
    // Sample positions of the window's ends: the ranks' expected positions -/+ 3.5 standard deviations.
    auto spread = [&](index_t r) {
      const double q = (static_cast<double>(r) + 0.5) / static_cast<double>(n);
      return static_cast<index_t>(3.5 * std::sqrt(static_cast<double>(s) * q * (1 - q))) + 4;
    };
    const index_t lo_at = static_cast<index_t>(static_cast<double>(rmin) * s / static_cast<double>(n)) - spread(rmin);
    const index_t hi_at =
        static_cast<index_t>(static_cast<double>(rmax) * s / static_cast<double>(n)) + 1 + spread(rmax);
    double lo = -HUGE_VAL, hi = HUGE_VAL;
    if (lo_at >= 0) {
      std::nth_element(sample.begin(), sample.begin() + lo_at, sample.end());
      lo = sample[lo_at];
    }
    if (hi_at < s) {
      const index_t from = lo_at >= 0 ? lo_at : 0;
      std::nth_element(sample.begin() + from, sample.begin() + hi_at, sample.end());
      hi = sample[hi_at];
    }
    // Count the keys below lo and in [lo, hi].
    index_t below = 0, inside = 0;
    simd::run_widest_loops<window_count>(keys, n, lo, hi, below, inside);
    if (rmin < below || rmax >= below + inside || 2 * inside > n) break;  // missed, or no narrowing
    // Move the window's keys to the front (the others are not needed any more) and go on there.
    index_t c = 0;
    for (index_t i = 0; i < n; ++i) {
      const double k = keys[i];
      keys[c] = k;
      c += ((k >= lo) & (k <= hi)) ? 1 : 0;
    }
    n = c;
    for (int j = 0; j < m; ++j) ranks[j] -= below;
  }
  nested_order_statistics(keys, n, ranks, order, m, out);
}
}  // namespace detail

struct cpu {
  // Data handed to the CPU backend lives in host memory and can be read directly.
  static constexpr bool host_accessible = true;

  // A workspace keeps the reductions' partial sums between calls (no allocation in steady state).
  struct scratch_state {
    std::vector<unsigned char> partials;
  };
  scratch_state* scratch = nullptr;
  cpu with_scratch(scratch_state* st, memory_resource*) const {
    cpu c = *this;
    c.scratch = st;
    return c;
  }
  static void release_scratch(scratch_state& st) { std::vector<unsigned char>().swap(st.partials); }

  // Below this many tokens a call runs on the calling thread: an OpenMP team's fork and join
  // cost more than the work (and results are the same bits either way).
  static constexpr index_t serial_below = index_t(1) << 16;
  bool serial = false;

  // The per-token passes (the response scan and the token pass) run on packs (reco/backend/cpu/:
  // simd.hpp, packed_scan.hpp, packed_tokens.hpp) where the compiler and the objective's
  // components allow it, at the widest instruction set the CPU runs: packs of doubles for double
  // inputs, of floats for float inputs (docs/conventions.md, "Precision"). false keeps the scalar
  // loops, the device path's arithmetic token by token in double (for float inputs the results
  // differ from the packed pass within the policy's bounds; for double ones in the last bits).
  bool vectorise = true;
  // false: a call computes no token diagnostics (clip and dual fractions, ppo_kl, the ratio's
  // mean / min / max, the entropy means, the token variances read 0; the losses, the gradients,
  // the counts and ref_kl_mean are unchanged), so it pays for none of their per-token work.
  bool diagnostics = true;
  cpu for_work(index_t tokens) const {
    cpu c = *this;
    c.serial = serial || tokens < serial_below;
    return c;
  }

  static auto policy() {
#if defined(_OPENMP)
    return thrust::omp::par;
#else
    return thrust::cpp::par;
#endif
  }

  // f(i) for i in [0, n); its form on packs instead where it has one (reco/backend/cpu/packed_pass.hpp).
  template <class F>
  void for_each(index_t n, F f) const {
    if constexpr (detail::packed_pass<F>::available) {
      if (vectorise) {
        for_each_index(n, [f](index_t i) { detail::packed_pass<F>::run(f, i); });
        return;
      }
    }
    for_each_index(n, f);
  }
  // f(i) for i in [0, n), in parallel unless serial.
  template <class F>
  void for_each_index(index_t n, F f) const {
    if (n <= 0) return;
    if constexpr (detail::has_run_range<F>::value) {
      if (serial || n < serial_below) {
        f.run_range(0, n);
        return;
      }
      constexpr index_t block = 1024;
      thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), (n + block - 1) / block,
                         [=](index_t c) { f.run_range(c * block, std::min(n, (c + 1) * block)); });
      return;
    }
    if (serial || n == 1) {
      for (index_t i = 0; i < n; ++i) f(i);
      return;
    }
    if (n < serial_below) {
      thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), n, f);
      return;
    }
    // Large n (per-token passes): blocks of indices, each a plain loop the compiler can inline and
    // vectorise (f(i) once per index either way, so the results are the same).
    constexpr index_t block = 1024;
    thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), (n + block - 1) / block, [=](index_t c) {
      const index_t e = std::min(n, (c + 1) * block);
      for (index_t i = c * block; i < e; ++i) f(i);
    });
  }

  // Whether reduce_tokens runs the pass F on packs (for advantages per response): the packed token
  // pass then takes on an earlier pass's work (token_fn::weighs).
  template <class F>
  bool packs_tokens() const {
    if constexpr (detail::packed_pass<F>::available) return vectorise;
    else return false;
  }

  // *out = merge of f(0) .. f(n-1); Acc{} must be the identity of merge.
  template <class Acc, class F, class Merge>
  void reduce(index_t n, F f, Merge merge, Acc* out) const {
    constexpr index_t chunk = 1024;
    const index_t chunks = (n + chunk - 1) / chunk;
    std::vector<unsigned char> local;
    Acc* parts = partial_buffer<Acc>(chunks, local);
    for_each(chunks, [=](index_t c) {
      Acc acc{};
      const index_t e = std::min(n, (c + 1) * chunk);
      if constexpr (detail::has_reduce_range<F, Acc>::value) {
        f.reduce_range(acc, c * chunk, e);
      } else {
        for (index_t i = c * chunk; i < e; ++i) acc = merge(acc, f(i));
      }
      new (parts + c) Acc(acc);
    });
    Acc acc{};
    for (index_t c = 0; c < chunks; ++c) acc = merge(acc, parts[c]);
    *out = acc;
  }

  // Reduction over every token position of a layout, f(i, t) with i the owning response.
  // f is called exactly once per token (it may write per-token outputs).
  template <class Acc, class F, class Merge>
  void reduce_tokens(const token_layout& layout, F f, Merge merge, Acc* out) const {
    constexpr index_t chunk = 8192;
    const index_t n = layout.tokens;
    const index_t chunks = (n + chunk - 1) / chunk;
    std::vector<unsigned char> local;
    Acc* parts = partial_buffer<Acc>(chunks, local);
    const bool packed = vectorise;
    for_each(chunks, [=](index_t c) {
      Acc acc{};
      const index_t b = c * chunk, e = std::min(n, b + chunk);
      index_t i = layout.response_of(b);
      if constexpr (detail::has_accumulate_range<F, Acc>::value) {
        // The chunk on packs where the pass has that form (reco/backend/cpu/packed_pass.hpp),
        // else one call per response segment of the chunk, accumulating in place.
        if constexpr (detail::packed_pass<F>::available) {
          if (packed) {
            detail::packed_pass<F>::accumulate_chunk(f, acc, i, b, e);
            new (parts + c) Acc(acc);
            return;
          }
        }
        for (index_t t = b; t < e;) {
          while (t >= layout.end(i)) ++i;
          const index_t stop = std::min(e, layout.end(i));
          f.accumulate_range(acc, i, t, stop);
          t = stop;
        }
      } else {
        for (index_t t = b; t < e; ++t) {
          while (t >= layout.end(i)) ++i;
          acc = merge(acc, f(i, t));
        }
      }
      new (parts + c) Acc(acc);
    });
    Acc acc{};
    for (index_t c = 0; c < chunks; ++c) acc = merge(acc, parts[c]);
    *out = acc;
  }

  // out[j] = the ranks[j]-th smallest of keys[0, n) (keys may be permuted; 0 for a rank outside
  // [0, n)). O(n) selection, on the calling thread: the value is exact, so it does not depend on
  // the thread count.
  void order_statistics(double* keys, index_t n, const index_t* ranks, int m, double* out) const {
    constexpr int max_m = 8;
    int order[max_m];
    index_t valid_ranks[max_m];
    double valid_out[max_m];
    int v = 0;
    for (int j = 0; j < m; ++j) {
      const index_t r = ranks[j];
      out[j] = 0;
      if (r < 0 || r >= n) continue;
      if (v == max_m) {  // many ranks: one nth_element each over all of keys
        std::nth_element(keys, keys + r, keys + n);
        out[j] = keys[r];
        continue;
      }
      valid_ranks[v] = r;
      order[v] = v;
      ++v;
    }
    if (v == 0) return;
    for (int a = 1; a < v; ++a) {  // insertion sort of the slots by rank (v <= max_m)
      const int o = order[a];
      int b = a;
      for (; b > 0 && valid_ranks[order[b - 1]] > valid_ranks[o]; --b) order[b] = order[b - 1];
      order[b] = o;
    }
    detail::sampled_order_statistics(keys, n, valid_ranks, order, v, valid_out);
    for (int j = 0, w = 0; j < m && w < v; ++j) {
      if (ranks[j] < 0 || ranks[j] >= n) continue;
      out[j] = valid_out[w++];
    }
  }

  // The same over the valid entries of float values (masked ones count as +inf), without a key
  // per token: a radix selection on the floats' bits (reco/backend/cpu/float_order_statistics.hpp).
  // counts (may be null): how many valid values lie above out[0] and on it.
  // Its passes run in a part per thread (of at least 2^20 values), in parallel unless serial: the
  // counts are exact, so the parts do not change the result.
  void masked_order_statistics(const float* values, const std::uint8_t* mask, index_t n, const index_t* ranks, int m,
                               double* out, double* counts = nullptr) const {
    index_t parts = 1;
#if defined(_OPENMP)
    if (!serial) parts = std::min<index_t>(omp_get_max_threads(), std::max<index_t>(1, n >> 20));
#endif
    parts = std::max<index_t>(parts, (n >> 31) + 1);  // a part's 32-bit counts cannot overflow
    detail::masked_float_order_statistics(values, mask, n, ranks, m, out, counts, static_cast<int>(parts),
                                          [this](index_t k, auto f) { for_each(k, f); });
  }

  // Sorts each response's slice [begin_i, end_i) of keys ascending.
  void segmented_sort(double* keys, const token_layout& layout) const {
    for_each(layout.responses, [=](index_t i) { std::sort(keys + layout.begin(i), keys + layout.end(i)); });
  }

  // out[j] = f(0) + ... + f(j - 1) for j in [0, n]: out has n + 1 entries, the last the total.
  template <class F>
  void exclusive_scan(index_t n, F f, index_t* out) const {
    index_t run = 0;
    for (index_t j = 0; j < n; ++j) {
      out[j] = run;
      run += f(j);
    }
    out[n] = run;
  }

  // Storage for `count` partial sums: the workspace's scratch when bound, else `local`.
  template <class Acc>
  Acc* partial_buffer(index_t count, std::vector<unsigned char>& local) const {
    static_assert(std::is_trivially_copyable_v<Acc> && std::is_trivially_destructible_v<Acc>,
                  "reco::cpu: reduction values must be trivially copyable");
    std::vector<unsigned char>& buf = scratch ? scratch->partials : local;
    const std::size_t need = sizeof(Acc) * static_cast<std::size_t>(count > 0 ? count : 0);
    if (buf.size() < need) buf.resize(need);
    return reinterpret_cast<Acc*>(buf.data());
  }

  void* allocate(std::size_t bytes) const {
    void* p = ::operator new(bytes, std::align_val_t{256});
    return p;
  }
  void deallocate(void* p, std::size_t bytes) const { release_at_end(p, bytes); }
  static void release_at_end(void* p, std::size_t) { ::operator delete(p, std::align_val_t{256}); }

  template <class T>
  void copy_to_host(T* dst, const T* src, index_t n) const {
    if (n > 0) std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  void copy_to_device(T* dst, const T* src, index_t n) const {
    if (n > 0) std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  T read(const T* src) const { return *src; }
  void synchronize() const {}
};

RECO_NAMESPACE_END
