// reco::span: a non-owning pointer + length usable on the host and the device.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

#include "reco/config.hpp"

#if defined(__has_cpp_attribute)
#if __has_cpp_attribute(clang::lifetimebound)
#define RECO_LIFETIMEBOUND [[clang::lifetimebound]]
#endif
#endif
#ifndef RECO_LIFETIMEBOUND
#define RECO_LIFETIMEBOUND
#endif

RECO_NAMESPACE_BEGIN

template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr span() noexcept = default;
  RECO_HOST_DEVICE constexpr span(T* data, index_t size) noexcept : data_(data), size_(size) {}
  // A span of const T from a span of T.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T>>>
  RECO_HOST_DEVICE constexpr span(span<U> other) noexcept : data_(other.data()), size_(other.size()) {}
  // Convenience for host containers (tests, examples).
  template <class U, class A,
            class = std::enable_if_t<std::is_same_v<U, value_type> &&
                                     (std::is_const_v<T> || !std::is_const_v<U>)>>
  span(std::vector<U, A>& v) noexcept : data_(v.data()), size_(static_cast<index_t>(v.size())) {}
  template <class U, class A, class = std::enable_if_t<std::is_same_v<U, value_type> && std::is_const_v<T>>>
  span(const std::vector<U, A>& v) noexcept : data_(v.data()), size_(static_cast<index_t>(v.size())) {}
  // A span never owns its data. A temporary container passed as a call's argument lives until
  // the call returns, so a span of const T may view it there (`pass_at_k_curve(n, c,
  // std::vector<index_t>{1, 8})`); clang warns where such a span outlives its statement. Stored
  // into a batch (`batch.rewards = std::vector<float>{1, 0};`) it would dangle at once: assigning
  // a temporary container to a span is a compile error, and so is a mutable span of one.
  template <class U, class A, class = std::enable_if_t<std::is_same_v<U, value_type> && std::is_const_v<T>>>
  span(std::vector<U, A>&& v RECO_LIFETIMEBOUND) noexcept : data_(v.data()), size_(static_cast<index_t>(v.size())) {}
  template <class U, class A, class = std::enable_if_t<!std::is_const_v<T> && sizeof(U) != 0>, class = void>
  span(std::vector<U, A>&& v) = delete;
  template <class U, class A>
  span& operator=(std::vector<U, A>&& v) = delete;
  template <class U, class A>
  span& operator=(const std::vector<U, A>&& v) = delete;

  RECO_HOST_DEVICE constexpr T* data() const noexcept { return data_; }
  RECO_HOST_DEVICE constexpr index_t size() const noexcept { return size_; }
  RECO_HOST_DEVICE constexpr bool empty() const noexcept { return size_ == 0; }
  RECO_HOST_DEVICE constexpr T& operator[](index_t i) const noexcept { return data_[i]; }
  RECO_HOST_DEVICE constexpr T* begin() const noexcept { return data_; }
  RECO_HOST_DEVICE constexpr T* end() const noexcept { return data_ + size_; }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

template <class T>
span(std::vector<T>&) -> span<T>;
template <class T>
span(const std::vector<T>&) -> span<const T>;

RECO_NAMESPACE_END
