// Host code (a .cuh because it needs the CUDA runtime headers). The one check of a CUDA runtime call's status for the library, the logits kernels and the CUDA
// adapter: an error becomes std::runtime_error("reco: CUDA error in <what>: <CUDA's message>").
// (Argument errors are reco::error naming the argument; a failing CUDA call is not one.)
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "reco/config.hpp"

RECO_NAMESPACE_BEGIN
namespace detail {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("reco: CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace detail
RECO_NAMESPACE_END
