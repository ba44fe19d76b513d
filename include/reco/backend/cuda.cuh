// The CUDA backend: Thrust's CUDA system (par_nosync) and CUB on the caller's stream. Nothing in
// an objective call synchronises with the host: scalars stay in device memory, reductions write
// to device pointers, and memory is stream-ordered (cudaMallocAsync) and reused through the
// workspace. Requires nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <cub/util_type.cuh>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/system/cuda/execution_policy.h>

#include "reco/workspace.hpp"
#include "reco/batch.hpp"
#include "reco/config.hpp"
#include "reco/detail/cuda_check.cuh"

RECO_NAMESPACE_BEGIN

namespace detail {

// Wraps a token functor f(i, t) as a function of t alone (i found by the layout).
template <class F>
struct token_caller {
  token_layout layout;
  F f;
  RECO_HOST_DEVICE auto operator()(index_t t) const { return f(layout.response_of(t), t); }
};

struct pick_ranks_fn {
  const double* sorted;
  const index_t* ranks;
  double* out;
  index_t n;
  RECO_HOST_DEVICE void operator()(index_t j) const {
    const index_t r = ranks[j];
    out[j] = (r >= 0 && r < n) ? sorted[r] : 0.0;
  }
};

struct layout_begin_fn {
  token_layout layout;
  RECO_HOST_DEVICE index_t operator()(index_t i) const { return layout.begin(i); }
};
struct layout_end_fn {
  token_layout layout;
  RECO_HOST_DEVICE index_t operator()(index_t i) const { return layout.end(i); }
};
// f(j) for j < n and 0 at j == n.
template <class F>
struct padded_fn {
  F f;
  index_t n;
  RECO_HOST_DEVICE index_t operator()(index_t j) const { return j < n ? static_cast<index_t>(f(j)) : index_t(0); }
};

}  // namespace detail

struct cuda {
  cudaStream_t stream = nullptr;

  static constexpr bool host_accessible = false;

  // Growable device buffers kept by a workspace: [0] CUB temporary storage, [1] double buffers.
  struct scratch_state {
    void* data[2] = {nullptr, nullptr};
    std::size_t bytes[2] = {0, 0};
    cudaStream_t stream = nullptr;
    memory_resource* resource = nullptr;
  };
  scratch_state* scratch = nullptr;

  cuda() = default;
  explicit cuda(cudaStream_t s) : stream(s) {}

  cuda with_scratch(scratch_state* st, memory_resource* resource) const {
    cuda c = *this;
    st->resource = resource;
    c.scratch = st;
    return c;
  }
  // At the workspace's end (see release_at_end).
  static void release_scratch(scratch_state& st) {
    for (int k = 0; k < 2; ++k) {
      if (st.data[k] == nullptr) continue;
      if (st.resource) st.resource->deallocate(st.data[k], st.bytes[k]);
      else release_at_end(st.data[k], st.bytes[k]);
      st.data[k] = nullptr;
      st.bytes[k] = 0;
    }
  }

  auto policy() const { return thrust::cuda::par_nosync.on(stream); }

  // The device sizes every launch from its own arguments: nothing to adapt.
  cuda for_work(index_t) const { return *this; }

  void* allocate(std::size_t bytes) const {
    void* p = nullptr;
    detail::cuda_check(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync");
    return p;
  }
  void deallocate(void* p, std::size_t) const { cudaFreeAsync(p, stream); }
  // A buffer whose last stream may be gone (destroying the stream before the workspace is
  // ordinary RAII order): cudaFree waits for the device and needs no stream.
  static void release_at_end(void* p, std::size_t) { cudaFree(p); }

  template <class F>
  void for_each(index_t n, F f) const {
    if (n <= 0) return;
    thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), n, f);
  }

  template <class Acc, class F, class Merge>
  void reduce(index_t n, F f, Merge merge, Acc* out) const {
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), f);
    std::size_t bytes = 0;
    detail::cuda_check(cub::DeviceReduce::Reduce(nullptr, bytes, in, out, n, merge, Acc{}, stream), "reduce");
    void* tmp = temp(0, bytes);
    detail::cuda_check(cub::DeviceReduce::Reduce(tmp, bytes, in, out, n, merge, Acc{}, stream), "reduce");
  }

  template <class Acc, class F, class Merge>
  void reduce_tokens(const token_layout& layout, F f, Merge merge, Acc* out) const {
    reduce(layout.tokens, detail::token_caller<F>{layout, f}, merge, out);
  }

  void order_statistics(double* keys, index_t n, const index_t* ranks, int m, double* out) const {
    if (n > 0) {
      double* alt = static_cast<double*>(temp(1, sizeof(double) * static_cast<std::size_t>(n)));
      cub::DoubleBuffer<double> buf(keys, alt);
      std::size_t bytes = 0;
      detail::cuda_check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, buf, n, 0, 64, stream), "sort");
      void* tmp = temp(0, bytes);
      detail::cuda_check(cub::DeviceRadixSort::SortKeys(tmp, bytes, buf, n, 0, 64, stream), "sort");
      for_each(m, detail::pick_ranks_fn{buf.Current(), ranks, out, n});
    } else {
      for_each(m, detail::pick_ranks_fn{keys, ranks, out, 0});
    }
  }

  void segmented_sort(double* keys, const token_layout& layout) const {
    const index_t n = layout.tokens;
    if (n <= 0 || layout.responses <= 0) return;
    double* alt = static_cast<double*>(temp(1, sizeof(double) * static_cast<std::size_t>(n)));
    cub::DoubleBuffer<double> buf(keys, alt);
    auto begins = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), detail::layout_begin_fn{layout});
    auto ends = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), detail::layout_end_fn{layout});
    std::size_t bytes = 0;
    detail::cuda_check(cub::DeviceSegmentedSort::SortKeys(nullptr, bytes, buf, n, layout.responses, begins, ends, stream),
                       "segmented sort");
    void* tmp = temp(0, bytes);
    detail::cuda_check(cub::DeviceSegmentedSort::SortKeys(tmp, bytes, buf, n, layout.responses, begins, ends, stream),
                       "segmented sort");
    if (buf.Current() != keys)
      detail::cuda_check(cudaMemcpyAsync(keys, buf.Current(), sizeof(double) * static_cast<std::size_t>(n),
                                         cudaMemcpyDeviceToDevice, stream),
                         "copy");
  }

  // out[j] = f(0) + ... + f(j - 1) for j in [0, n]: out has n + 1 entries, the last the total.
  template <class F>
  void exclusive_scan(index_t n, F f, index_t* out) const {
    // Scanning n + 1 items whose last is 0 leaves the total in out[n].
    auto in = thrust::make_transform_iterator(thrust::counting_iterator<index_t>(0), detail::padded_fn<F>{f, n});
    std::size_t bytes = 0;
    detail::cuda_check(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n + 1, stream), "scan");
    void* tmp = temp(0, bytes);
    detail::cuda_check(cub::DeviceScan::ExclusiveSum(tmp, bytes, in, out, n + 1, stream), "scan");
  }

  template <class T>
  void copy_to_host(T* dst, const T* src, index_t n) const {
    if (n > 0)
      detail::cuda_check(cudaMemcpyAsync(dst, src, sizeof(T) * static_cast<std::size_t>(n), cudaMemcpyDeviceToHost, stream),
                         "copy to host");
  }
  // Stream-ordered; a pageable `src` is staged before this returns, so it may be released then.
  template <class T>
  void copy_to_device(T* dst, const T* src, index_t n) const {
    if (n > 0)
      detail::cuda_check(cudaMemcpyAsync(dst, src, sizeof(T) * static_cast<std::size_t>(n), cudaMemcpyHostToDevice, stream),
                         "copy to device");
  }
  template <class T>
  T read(const T* src) const {
    T v;
    copy_to_host(&v, src, 1);
    synchronize();
    return v;
  }
  void synchronize() const { detail::cuda_check(cudaStreamSynchronize(stream), "synchronize"); }

 private:
  // A scratch slot of at least `bytes`, grown stream-ordered (no host synchronisation).
  void* temp(int slot, std::size_t bytes) const {
    if (bytes == 0) bytes = 1;
    if (scratch == nullptr) throw std::logic_error("reco::cuda: primitive called without a workspace-bound scratch");
    scratch_state& st = *scratch;
    if (st.bytes[slot] >= bytes) return st.data[slot];
    if (st.data[slot] != nullptr) {
      if (st.resource) st.resource->deallocate(st.data[slot], st.bytes[slot]);
      // Stream-ordered when this call's stream last used the buffer; otherwise that stream may
      // be gone.
      else if (st.stream == stream) cudaFreeAsync(st.data[slot], stream);
      else release_at_end(st.data[slot], st.bytes[slot]);
    }
    st.data[slot] = st.resource ? st.resource->allocate(bytes) : allocate(bytes);
    st.bytes[slot] = bytes;
    st.stream = stream;
    return st.data[slot];
  }
};

RECO_NAMESPACE_END
