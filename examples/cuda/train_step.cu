// A complete GRPO-family training loop on raw CUDA buffers with reco's raw adapter, for a trainer
// without LibTorch. The "model" is deliberately tiny so that the program is self-contained: a
// position-wise unigram policy, logits[r, t, :] = theta[t, :], trained by SGD on a verifiable
// reward (a response is correct when its first token is `target`). One step is:
//
//   1. logits from the parameters                        (this file's kernel)
//   2. log-probabilities and entropies of the sampled tokens   reco_cuda_logits_forward
//   3. the "reco" objective: loss, d loss / d logp, diagnostics reco::cuda_adapter::run_preset_async
//   4. d loss / d logits, written over the logits in place      reco::cuda_adapter::logits_backward
//   5. SGD on theta                                       (this file's kernel)
//
// Nothing in a step synchronises the host, so after one eager step (which grows the adapter's
// workspace) the whole step is captured into a CUDA graph and replayed; the host reads the
// diagnostics once per step only to print them. Sampling happens once on the host (a rollout
// batch), and the later steps are off-policy mini-batch updates against the sampling policy's
// old_logp, as in PPO-style trainers.
//
//   cmake -S . -B build -DRECO_ENABLE_CUDA=ON -DRECO_BUILD_EXAMPLES=ON
//   cmake --build build --target reco_example_cuda_train_step && build/examples/cuda/reco_example_cuda_train_step
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <vector>

#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/logits/logp_entropy.hpp"

namespace {

constexpr int vocab = 64;      // V
constexpr int max_len = 16;    // T: padded response length
constexpr int prompts = 32;    // P
constexpr int group = 8;       // G responses per prompt
constexpr int responses = prompts * group;  // R
constexpr int target = 7;      // the rewarded first token
constexpr float lr = 0.5f;
constexpr int steps = 8;

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    const cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)

// logits[r, t, v] = theta[t, v]
__global__ void expand_logits(const float* theta, float* logits) {
  const std::int64_t n = static_cast<std::int64_t>(responses) * max_len * vocab;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    logits[i] = theta[i % (static_cast<std::int64_t>(max_len) * vocab)];
}

// theta[t, v] -= lr * sum_r dlogits[r, t, v]  (one thread per parameter; the loss is already a mean)
__global__ void sgd(float* theta, const float* dlogits) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= max_len * vocab) return;
  float g = 0;
  for (int r = 0; r < responses; ++r) g += dlogits[static_cast<std::int64_t>(r) * max_len * vocab + p];
  theta[p] -= lr * g;
}

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, sizeof(T) * n));
  return p;
}

// Host softmax sampling from theta (the rollout policy).
std::vector<std::int64_t> sample(const std::vector<float>& theta, std::mt19937& rng) {
  std::vector<std::int64_t> tokens(static_cast<std::size_t>(responses) * max_len);
  for (int r = 0; r < responses; ++r)
    for (int t = 0; t < max_len; ++t) {
      std::vector<double> w(vocab);
      double mx = -1e30;
      for (int v = 0; v < vocab; ++v) mx = std::max(mx, static_cast<double>(theta[t * vocab + v]));
      for (int v = 0; v < vocab; ++v) w[v] = std::exp(theta[t * vocab + v] - mx);
      std::discrete_distribution<int> d(w.begin(), w.end());
      tokens[static_cast<std::size_t>(r) * max_len + t] = d(rng);
    }
  return tokens;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("train_step: no CUDA device, nothing to run\n");
    return 0;
  }
  namespace ca = reco::cuda_adapter;
  std::mt19937 rng(1234);

  // ---- a rollout batch, sampled from the initial policy ----------------------------------------
  std::vector<float> theta_host(max_len * vocab, 0.0f);  // uniform policy
  const std::vector<std::int64_t> tokens_host = sample(theta_host, rng);
  std::vector<std::uint8_t> mask_host(static_cast<std::size_t>(responses) * max_len);
  std::vector<float> rewards_host(responses);
  std::uniform_int_distribution<int> length(1, max_len);
  for (int r = 0; r < responses; ++r) {
    const int len = length(rng);
    for (int t = 0; t < max_len; ++t) mask_host[static_cast<std::size_t>(r) * max_len + t] = t < len ? 1 : 0;
    rewards_host[r] = tokens_host[static_cast<std::size_t>(r) * max_len] == target ? 1.0f : 0.0f;
  }
  std::vector<std::int64_t> group_offsets_host(prompts + 1);
  for (int g = 0; g <= prompts; ++g) group_offsets_host[g] = static_cast<std::int64_t>(g) * group;

  const std::size_t N = static_cast<std::size_t>(responses) * max_len;
  float* theta = device_alloc<float>(max_len * vocab);
  float* logits = device_alloc<float>(N * vocab);
  std::int64_t* tokens = device_alloc<std::int64_t>(N);
  std::uint8_t* mask = device_alloc<std::uint8_t>(N);
  float* logp = device_alloc<float>(N);
  float* old_logp = device_alloc<float>(N);
  float* ref_logp = device_alloc<float>(N);
  float* entropy = device_alloc<float>(N);
  float* lse = device_alloc<float>(N);
  float* grad_logp = device_alloc<float>(N);
  float* rewards = device_alloc<float>(responses);
  std::int64_t* group_offsets = device_alloc<std::int64_t>(prompts + 1);
  reco::objective_result* result = device_alloc<reco::objective_result>(1);
  int* error_flags = device_alloc<int>(1);
  CHECK(cudaMemcpy(theta, theta_host.data(), sizeof(float) * theta_host.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(tokens, tokens_host.data(), sizeof(std::int64_t) * N, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(mask, mask_host.data(), N, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(rewards, rewards_host.data(), sizeof(float) * responses, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(group_offsets, group_offsets_host.data(), sizeof(std::int64_t) * (prompts + 1),
                   cudaMemcpyHostToDevice));
  CHECK(cudaMemset(error_flags, 0, sizeof(int)));

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // ---- the argument structs: device pointers and sizes, set once -----------------------------
  reco_cuda_logits_args lg{};
  lg.dtype = RECO_CUDA_FLOAT32;
  lg.logits = logits;
  lg.rows = static_cast<std::int64_t>(N);
  lg.vocab = vocab;
  lg.row_stride = vocab;
  lg.tokens = tokens;
  lg.temperature = 1.0;
  lg.row_mask = mask;  // padding positions are never read and get exactly zero gradient
  lg.logp = logp;
  lg.entropy = entropy;
  lg.lse = lse;
  lg.grad_logp = grad_logp;
  lg.saved_lse = lse;
  lg.dlogits = logits;  // in place: the logits are not needed after the backward
  lg.error_flags = error_flags;

  reco_cuda_objective_args obj{};
  obj.dtype = RECO_CUDA_FLOAT32;
  obj.responses = responses;
  obj.tokens = static_cast<std::int64_t>(N);
  obj.max_length = max_len;  // padded [R, T] layout (offsets = NULL)
  obj.groups = prompts;
  obj.group_offsets = group_offsets;
  obj.logp = logp;
  obj.old_logp = old_logp;
  obj.ref_logp = ref_logp;
  obj.entropy = entropy;
  obj.mask = mask;
  obj.rewards = rewards;
  obj.grad_logp = grad_logp;

  ca::context ctx;  // owns the reusable workspace: nothing is allocated per step once warm
  auto step = [&] {
    expand_logits<<<256, 256, 0, stream>>>(theta, logits);
    ca::logits_forward(lg, stream);
    ca::run_preset_async("reco", obj, stream, ctx, result);  // into `result`, device memory
    ca::logits_backward(lg, stream);
    sgd<<<(max_len * vocab + 255) / 256, 256, 0, stream>>>(theta, logits);
  };
  auto report = [&](int s) {
    reco::objective_result r;
    int flags = 0;
    CHECK(cudaMemcpyAsync(&r, result, sizeof(r), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(&flags, error_flags, sizeof(int), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    reco::throw_if_error(r.status);          // NaN inputs, malformed offsets, ...
    reco::logits::throw_if_error_flags(flags);  // a token outside [0, V), an all -inf row
    std::printf("step %d  loss %+.5f  policy %+.5f  kl %.2e  clip %.3f  ratio [%.3f, %.3f]  weight mean %.3f"
                "  (cap hits %lld)  entropy %.3f\n",
                s, r.loss, r.policy_loss, r.kl_loss, r.stats.clip_frac, r.stats.ratio_min, r.stats.ratio_max,
                r.stats.weight_mean, static_cast<long long>(r.stats.weight_cap_hits), r.stats.entropy_mean);
  };

  // The rollout policy's log-probs: old_logp (sampling policy) and ref_logp (reference model).
  expand_logits<<<256, 256, 0, stream>>>(theta, logits);
  ca::logits_forward(lg, stream);
  CHECK(cudaMemcpyAsync(old_logp, logp, sizeof(float) * N, cudaMemcpyDeviceToDevice, stream));
  CHECK(cudaMemcpyAsync(ref_logp, logp, sizeof(float) * N, cudaMemcpyDeviceToDevice, stream));

  // Step 0 eagerly (the workspace grows here), then the same step as a CUDA graph.
  try {
    step();
    report(0);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    step();
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int s = 1; s < steps; ++s) {
      CHECK(cudaGraphLaunch(exec, stream));
      report(s);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }

  // The policy should now favour the rewarded first token.
  CHECK(cudaMemcpy(theta_host.data(), theta, sizeof(float) * theta_host.size(), cudaMemcpyDeviceToHost));
  double mx = -1e30, z = 0;
  for (int v = 0; v < vocab; ++v) mx = std::max(mx, static_cast<double>(theta_host[v]));
  for (int v = 0; v < vocab; ++v) z += std::exp(theta_host[v] - mx);
  std::printf("p(first token = %d): %.4f (uniform: %.4f)\n", target, std::exp(theta_host[target] - mx) / z,
              1.0 / vocab);

  for (void* p : {static_cast<void*>(theta), static_cast<void*>(logits), static_cast<void*>(tokens),
                  static_cast<void*>(mask), static_cast<void*>(logp), static_cast<void*>(old_logp),
                  static_cast<void*>(ref_logp), static_cast<void*>(entropy), static_cast<void*>(lse),
                  static_cast<void*>(grad_logp), static_cast<void*>(rewards), static_cast<void*>(group_offsets),
                  static_cast<void*>(result), static_cast<void*>(error_flags)})
    CHECK(cudaFree(p));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
