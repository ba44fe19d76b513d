// reco: configuration macros, version and the library's error type.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#define RECO_VERSION_MAJOR 0
#define RECO_VERSION_MINOR 1
#define RECO_VERSION_PATCH 0

// Functions that hold the math are compiled for the host and, under nvcc, for the device.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define RECO_HOST_DEVICE __host__ __device__
#define RECO_DEVICE_COMPILER 1
#else
#define RECO_HOST_DEVICE
#define RECO_DEVICE_COMPILER 0
#endif

#if defined(__CUDA_ARCH__)
#define RECO_IN_DEVICE_CODE 1
#else
#define RECO_IN_DEVICE_CODE 0
#endif

// The ABI version lives in an inline namespace so that two builds with different layouts of
// the public structs cannot be linked together silently.
#define RECO_NAMESPACE_BEGIN \
  namespace reco {           \
  inline namespace v0 {
#define RECO_NAMESPACE_END \
  }                        \
  }

RECO_NAMESPACE_BEGIN

using index_t = std::int64_t;

// Every error the library raises on bad input: the message names the offending argument
// (or parameter) first, e.g. "reco: batch.old_logp: size 10 does not match logp (12)".
class error : public std::invalid_argument {
 public:
  error(std::string argument, const std::string& what)
      : std::invalid_argument("reco: " + argument + ": " + what), argument_(std::move(argument)) {}
  const std::string& argument() const noexcept { return argument_; }
  // What follows "reco: <argument>: " in what(): the words, to raise again under another name.
  std::string message() const { return std::string(what() + 8 + argument_.size()); }

 private:
  std::string argument_;
};

namespace detail {
[[noreturn]] inline void fail(const std::string& argument, const std::string& what) {
  throw error(argument, what);
}
inline void require(bool ok, const std::string& argument, const std::string& what) {
  if (!ok) fail(argument, what);
}
}  // namespace detail

RECO_NAMESPACE_END
