// Reusable scratch memory for objective calls. A workspace grows to the largest call it has seen
// and is then reused, so steady-state calls allocate nothing. Memory comes from the backend
// (host memory for reco::cpu, stream-ordered device memory for reco::cuda) or from a caller's
// memory_resource (for example a framework's caching allocator).
#pragma once

#include <cstddef>
#include <cstdint>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN

class memory_resource {
 public:
  virtual ~memory_resource() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) = 0;
};

template <class Backend>
class workspace {
 public:
  workspace() = default;
  explicit workspace(memory_resource* resource) : resource_(resource) {}
  workspace(const workspace&) = delete;
  workspace& operator=(const workspace&) = delete;
  // The stream (or other context) of the workspace's last call may be gone by now, so the
  // buffers are handed to the backend's end-of-life release, which needs none.
  ~workspace() {
    if (data_ != nullptr) {
      if (resource_) resource_->deallocate(data_, capacity_);
      else Backend::release_at_end(data_, capacity_);
    }
    Backend::release_scratch(scratch_);
  }

  // The backend with this workspace's growable scratch attached (CUB temporary storage and
  // double buffers on CUDA; nothing on the CPU).
  Backend bind(const Backend& backend) { return backend.with_scratch(&scratch_, resource_); }

  // At least `bytes` bytes of the backend's memory, valid until the next reserve or release.
  std::byte* reserve(const Backend& backend, std::size_t bytes) {
    if (bytes <= capacity_ && data_ != nullptr) return data_;
    release();
    data_ = static_cast<std::byte*>(resource_ ? resource_->allocate(bytes) : backend.allocate(bytes));
    capacity_ = bytes;
    owner_ = backend;
    return data_;
  }
  void release() {
    if (data_ == nullptr) return;
    if (resource_) resource_->deallocate(data_, capacity_);
    else owner_.deallocate(data_, capacity_);
    data_ = nullptr;
    capacity_ = 0;
  }
  std::size_t capacity() const { return capacity_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
  memory_resource* resource_ = nullptr;
  Backend owner_{};
  typename Backend::scratch_state scratch_{};
};

namespace detail {

// Carves typed arrays out of one buffer. Run once with base == nullptr to measure, then again
// with the reserved buffer to hand out the same offsets.
class carver {
 public:
  explicit carver(std::byte* base) : base_(base) {}
  template <class T>
  T* take(index_t count) {
    used_ = (used_ + alignment - 1) / alignment * alignment;
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += sizeof(T) * static_cast<std::size_t>(count > 0 ? count : 0);
    return p;
  }
  std::size_t used() const { return used_; }
  static constexpr std::size_t alignment = 256;

 private:
  std::byte* base_;
  std::size_t used_ = 0;
};

}  // namespace detail
RECO_NAMESPACE_END
