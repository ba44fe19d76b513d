// Optional check that each pointer of a call is device memory (context_options::check_pointers):
// a host pointer handed to a kernel would fault and poison the CUDA context, so asking the
// driver first (cudaPointerGetAttributes, a host call of a few microseconds per pointer, no
// stream work) turns that mistake into an error naming the field. Host code.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "reco/config.hpp"
#include "reco/cuda_adapter/reco_cuda.h"

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {

inline void check_device_pointer(const void* p, const char* name) {
  if (p == nullptr) return;
  cudaPointerAttributes attr{};
  const cudaError_t e = cudaPointerGetAttributes(&attr, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // the query's error is not sticky; do not leave it for the caller
    ::reco::detail::fail(std::string("args.") + name,
                         std::string("cannot be queried by the CUDA runtime: ") + cudaGetErrorString(e));
  }
  if (attr.type == cudaMemoryTypeUnregistered)
    ::reco::detail::fail(std::string("args.") + name, "is host memory (pass device memory)");
}

inline void check_device_pointers(const reco_cuda_objective_args& a) {
  check_device_pointer(a.offsets, "offsets");
  check_device_pointer(a.group_offsets, "group_offsets");
  check_device_pointer(a.logp, "logp");
  check_device_pointer(a.old_logp, "old_logp");
  check_device_pointer(a.ref_logp, "ref_logp");
  check_device_pointer(a.entropy, "entropy");
  check_device_pointer(a.mask, "mask");
  check_device_pointer(a.token_weights, "token_weights");
  check_device_pointer(a.rewards, "rewards");
  check_device_pointer(a.advantages, "advantages");
  check_device_pointer(a.response_weights, "response_weights");
  check_device_pointer(a.grad_logp, "grad_logp");
  check_device_pointer(a.grad_entropy, "grad_entropy");
}

inline void check_device_pointers(const reco_cuda_logits_args& a) {
  check_device_pointer(a.logits, "logits");
  check_device_pointer(a.tokens, "tokens");
  check_device_pointer(a.row_mask, "row_mask");
  check_device_pointer(a.logp, "logp");
  check_device_pointer(a.entropy, "entropy");
  check_device_pointer(a.lse, "lse");
  check_device_pointer(a.sum_p_squared, "sum_p_squared");
  check_device_pointer(a.grad_logp, "grad_logp");
  check_device_pointer(a.grad_entropy, "grad_entropy");
  check_device_pointer(a.saved_lse, "saved_lse");
  check_device_pointer(a.saved_entropy, "saved_entropy");
  check_device_pointer(a.dlogits, "dlogits");
  check_device_pointer(a.error_flags, "error_flags");
}

}  // namespace cuda_adapter
RECO_NAMESPACE_END
