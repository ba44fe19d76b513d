// The CUDA side of the logits op, called from token_logp_entropy.cpp with a block of equally
// strided rows as a reco::logits::call (reco/logits/call.hpp: the description and dtype switch
// the raw CUDA adapter uses too). LibTorch-free, so the CUDA translation unit needs no LibTorch.
#pragma once

#include <cstdint>

#include "reco/config.hpp"
#include "reco/logits/call.hpp"

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {

// CUDA versions (reco_torch built with CUDA): enqueue on call.stream; the device error word (bad
// token, all -inf row) is ORed into *error_flags (device memory, one int).
void logits_forward_cuda(const logits::call& call, int* error_flags);
void logits_backward_cuda(const logits::call& call);
// Whether `stream` is being captured into a CUDA graph (no synchronisation is allowed then).
bool stream_is_capturing(void* stream);

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
