// The raw CUDA adapter's C interface of linear_logp_entropy (reco_cuda.h), host side: the workspace
// size is the library's plan, and bad arguments are RECO_CUDA_INVALID_ARGUMENT with a message
// naming the argument, before any device work (no GPU needed).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/logits/linear_logp_entropy.hpp"

namespace {

// Device pointers are never dereferenced on the host: any distinct non-null addresses do.
void* fake(std::uintptr_t k) { return reinterpret_cast<void*>(k * 256); }

reco_cuda_linear_args valid() {
  reco_cuda_linear_args a{};
  a.dtype = RECO_CUDA_BFLOAT16;
  a.hidden = fake(1);
  a.rows = 1000, a.hidden_size = 64, a.hidden_stride_col = 1;
  a.weight = fake(2);
  a.vocab = 5000, a.weight_stride_col = 1;
  a.tokens = static_cast<const int64_t*>(fake(3));
  a.temperature = 0.7;
  a.memory_budget = 8 << 20;
  a.logp = fake(4), a.entropy = fake(5), a.lse = fake(6);
  a.cublas_handle = fake(7);  // not used before the arguments are checked
  return a;
}

std::string message_of(int rc) {
  EXPECT_EQ(rc, RECO_CUDA_INVALID_ARGUMENT);
  return reco_cuda_last_error();
}

TEST(LinearCApi, WorkspaceBytesAreThePlans) {
  const reco_cuda_linear_args a = valid();
  const auto plan = reco::logits::linear_cuda_chunking_of(1000, 5000, 64, 2, 4, 8 << 20, 0);
  EXPECT_EQ(reco_cuda_linear_workspace_bytes(&a), static_cast<int64_t>(plan.workspace_bytes));
  EXPECT_LE(plan.workspace_bytes, std::size_t(8) << 20);
  EXPECT_LT(plan.chunk_rows, 1000);
}

TEST(LinearCApi, BadArgumentsNameTheArgument) {
  auto a = valid();
  a.dtype = static_cast<reco_cuda_dtype>(9);
  EXPECT_EQ(reco_cuda_linear_workspace_bytes(&a), -1);
  EXPECT_NE(std::string(reco_cuda_last_error()).find("dtype"), std::string::npos);
  a = valid(), a.memory_budget = 100;
  EXPECT_NE(message_of(reco_cuda_linear_forward(&a, nullptr)).find("memory_budget"), std::string::npos);
  a = valid(), a.workspace = fake(8), a.workspace_bytes = 10;
  EXPECT_NE(message_of(reco_cuda_linear_forward(&a, nullptr)).find("workspace_bytes"), std::string::npos);
  a = valid(), a.workspace = nullptr;
  EXPECT_NE(message_of(reco_cuda_linear_backward(&a, nullptr)).find("workspace"), std::string::npos);
  a = valid(), a.temperature = 0;
  EXPECT_NE(message_of(reco_cuda_linear_forward(&a, nullptr)).find("temperature"), std::string::npos);
  a = valid(), a.hidden_size = 0;
  EXPECT_NE(message_of(reco_cuda_linear_forward(&a, nullptr)).find("hidden_size"), std::string::npos);
  EXPECT_NE(message_of(reco_cuda_linear_forward(nullptr, nullptr)).find("args"), std::string::npos);
  // A weight with no unit stride is refused by the device call (after the workspace checks).
  a = valid();
  a.workspace_bytes = reco_cuda_linear_workspace_bytes(&a), a.workspace = fake(9);
  a.weight_stride_row = 128, a.weight_stride_col = 2;
  EXPECT_NE(message_of(reco_cuda_linear_forward(&a, nullptr)).find("weight"), std::string::npos);
}

}  // namespace
