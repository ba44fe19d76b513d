// The CPU backend: Thrust's OMP system when OpenMP is enabled, its sequential CPP system
// otherwise. Results are bitwise reproducible and independent of the thread count: every
// reduction runs over fixed-size chunks whose partials are merged in order.
#pragma once

#include <algorithm>
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
#include <thrust/system/omp/execution_policy.h>
#else
#include <thrust/system/cpp/execution_policy.h>
#endif

#include "reco/backend/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/result.hpp"

RECO_NAMESPACE_BEGIN

namespace detail {
template <class F, class = void>
struct has_run_packed : std::false_type {};
template <class F>
struct has_run_packed<F, std::void_t<decltype(std::declval<const F&>().run_packed(index_t{}))>> : std::true_type {};
template <class F, class Acc, class = void>
struct has_accumulate_segment : std::false_type {};
template <class F, class Acc>
struct has_accumulate_segment<F, Acc,
                              std::void_t<decltype(std::declval<const F&>().accumulate_segment(
                                  std::declval<Acc&>(), index_t{}, index_t{}, index_t{}, bool{}))>> : std::true_type {};
template <class F, class Acc, class = void>
struct has_accumulate_range : std::false_type {};
template <class F, class Acc>
struct has_accumulate_range<F, Acc,
                            std::void_t<decltype(std::declval<const F&>().accumulate_range(
                                std::declval<Acc&>(), index_t{}, index_t{}, index_t{}))>> : std::true_type {};
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

  // The per-token passes (the response scan and the token pass) run on packs of doubles
  // (reco/detail/simd.hpp) where the compiler and the objective's components allow it, at the
  // widest instruction set the CPU runs. false keeps the scalar loops, the device path's
  // arithmetic token by token (results differ from the packed passes in the last bits).
  bool vectorise = true;
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

  // f(i) for i in [0, n); f.run_packed(i) instead where f has a vectorised form (vectorise).
  template <class F>
  void for_each(index_t n, F f) const {
    if constexpr (detail::has_run_packed<F>::value) {
      if (vectorise) {
        for_each_index(n, [f](index_t i) { f.run_packed(i); });
        return;
      }
    }
    for_each_index(n, f);
  }
  // f(i) for i in [0, n), in parallel unless serial.
  template <class F>
  void for_each_index(index_t n, F f) const {
    if (n <= 0) return;
    if (serial || n == 1) {
      for (index_t i = 0; i < n; ++i) f(i);
      return;
    }
    thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), n, f);
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
      for (index_t i = c * chunk; i < e; ++i) acc = merge(acc, f(i));
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
      if constexpr (detail::has_accumulate_segment<F, Acc>::value) {
        // One call per response segment of the chunk, accumulating in place (vectorised).
        for (index_t t = b; t < e;) {
          while (t >= layout.end(i)) ++i;
          const index_t stop = std::min(e, layout.end(i));
          f.accumulate_segment(acc, i, t, stop, packed);
          t = stop;
        }
      } else if constexpr (detail::has_accumulate_range<F, Acc>::value) {
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

  // out[j] = the ranks[j]-th smallest of keys[0, n) (keys may be permuted). O(n) selection.
  void order_statistics(double* keys, index_t n, const index_t* ranks, int m, double* out) const {
    for (int j = 0; j < m; ++j) {
      const index_t r = ranks[j];
      if (r < 0 || r >= n) { out[j] = 0; continue; }
      std::nth_element(keys, keys + r, keys + n);
      out[j] = keys[r];
    }
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
  void deallocate(void* p, std::size_t) const { ::operator delete(p, std::align_val_t{256}); }

  template <class T>
  void copy_to_host(T* dst, const T* src, index_t n) const {
    if (n > 0) std::memcpy(dst, src, sizeof(T) * static_cast<std::size_t>(n));
  }
  template <class T>
  T read(const T* src) const { return *src; }
  void synchronize() const {}
};

RECO_NAMESPACE_END
