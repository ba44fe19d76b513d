// A small decoder-only transformer (pre-LayerNorm, learned positions, GELU MLP) written with
// LibTorch's C++ API, plus batched sampling with a key/value cache.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace ablation {

struct model_config {
  int vocab = 110;
  int d_model = 64;
  int layers = 2;
  int heads = 4;
  int d_ff = 256;
  int max_len = 32;
  std::string describe() const {
    return "d" + std::to_string(d_model) + "_l" + std::to_string(layers) + "_h" + std::to_string(heads) + "_f" +
           std::to_string(d_ff) + "_v" + std::to_string(vocab) + "_t" + std::to_string(max_len);
  }
};

// Keys and values of every layer for positions [0, length): [B, H, max_len, head_dim] each.
struct kv_cache {
  std::vector<torch::Tensor> k, v;
  int64_t length = 0;
};

struct block_impl : torch::nn::Module {
  block_impl(const model_config& c) : heads(c.heads), head_dim(c.d_model / c.heads) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    qkv = register_module("qkv", torch::nn::Linear(c.d_model, 3 * c.d_model));
    proj = register_module("proj", torch::nn::Linear(c.d_model, c.d_model));
    fc1 = register_module("fc1", torch::nn::Linear(c.d_model, c.d_ff));
    fc2 = register_module("fc2", torch::nn::Linear(c.d_ff, c.d_model));
  }

  // x: [B, T, D] for positions [start, start + T). With a cache, keys and values are written at
  // those positions and attention reads the cache up to start + T.
  torch::Tensor forward(const torch::Tensor& x, kv_cache* cache, int layer, int64_t start) {
    const int64_t B = x.size(0), T = x.size(1), D = x.size(2);
    auto h = ln1(x);
    auto q_k_v = qkv(h).view({B, T, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});  // [3, B, H, T, hd]
    auto q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    if (cache) {
      cache->k[layer].narrow(2, start, T).copy_(k);
      cache->v[layer].narrow(2, start, T).copy_(v);
      k = cache->k[layer].narrow(2, 0, start + T);
      v = cache->v[layer].narrow(2, 0, start + T);
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    torch::Tensor att_out;
    if (T == 1) {
      // One new position (decoding): broadcast products beat a batched GEMM of B*H tiny
      // matrices on the CPU; nothing to mask since the cache only holds the past.
      auto scores = (q * k).sum(-1, true).mul_(scale);                  // [B, H, S, 1] via broadcast
      auto w = torch::softmax(scores, 2);
      att_out = (w * v).sum(2, true);                                   // [B, H, 1, hd]
    } else {
      const int64_t S = k.size(2);
      auto scores = torch::matmul(q, k.transpose(-2, -1)).mul_(scale);  // [B, H, T, S]
      auto mask = torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
                      .triu(S - T + 1);
      scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
      att_out = torch::matmul(torch::softmax(scores, -1), v);           // [B, H, T, hd]
    }
    auto y = x + proj(att_out.transpose(1, 2).reshape({B, T, D}));
    return y + fc2(torch::gelu(fc1(ln2(y))));
  }

  int heads, head_dim;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE_IMPL(block, block_impl);

struct transformer_impl : torch::nn::Module {
  explicit transformer_impl(const model_config& c) : cfg(c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.d_model));
    pos = register_module("pos", torch::nn::Embedding(c.max_len, c.d_model));
    for (int l = 0; l < c.layers; ++l) blocks.push_back(register_module("block" + std::to_string(l), block(c)));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head = register_module("head", torch::nn::Linear(c.d_model, c.vocab));
    // GPT-2 style initialisation: small normal weights, residual projections scaled by depth.
    for (auto& p : named_parameters()) {
      const std::string& n = p.key();
      torch::NoGradGuard ng;
      if (n.find("ln") != std::string::npos) continue;  // LayerNorm keeps ones/zeros
      if (n.find("bias") != std::string::npos) {
        p.value().zero_();
      } else {
        const bool residual = n.find("proj.weight") != std::string::npos || n.find("fc2.weight") != std::string::npos;
        p.value().normal_(0.0, residual ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02);
      }
    }
  }

  // tokens [B, T] (positions start..start+T-1) -> logits [B, T, V].
  torch::Tensor forward(const torch::Tensor& tokens, kv_cache* cache = nullptr, int64_t start = 0) {
    const int64_t T = tokens.size(1);
    auto positions = torch::arange(start, start + T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
    auto x = tok(tokens) + pos(positions).unsqueeze(0);
    for (std::size_t l = 0; l < blocks.size(); ++l) x = blocks[l]->forward(x, cache, static_cast<int>(l), start);
    if (cache) cache->length = start + T;
    return head(ln_f(x));
  }

  kv_cache make_cache(int64_t batch, torch::Device device) const {
    kv_cache c;
    const int hd = cfg.d_model / cfg.heads;
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    for (int l = 0; l < cfg.layers; ++l) {
      c.k.push_back(torch::zeros({batch, cfg.heads, cfg.max_len, hd}, opts));
      c.v.push_back(torch::zeros({batch, cfg.heads, cfg.max_len, hd}, opts));
    }
    return c;
  }

  model_config cfg;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<block> blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE_IMPL(transformer, transformer_impl);

// A deterministic stream of uniforms for sampling, drawn on the CPU so that CPU and CUDA runs
// of the same seed consume the same numbers.
class uniform_stream {
 public:
  explicit uniform_stream(uint64_t seed) : gen_(at::detail::createCPUGenerator(seed)) {}
  torch::Tensor next(int64_t n, torch::Device device) {
    return torch::rand({n}, gen_, torch::TensorOptions().dtype(torch::kFloat)).to(device);
  }

 private:
  at::Generator gen_;
};

struct sample_settings {
  double temperature = 1.0;
  double top_p = 1.0;
  int max_new = 24;
};

struct rollout {
  torch::Tensor tokens;  // [B, L] int64 response tokens; PAD after EOS
  torch::Tensor mask;    // [B, L] bool: the response's tokens (up to and including EOS)
  torch::Tensor logp;    // [B, L] float: log-probability of each token under the sampling distribution
  torch::Tensor entropy; // [B, L] float: entropy of the sampling distribution (before the top-p cut)
};

// Samples one response per prompt row. prompts: [B, P] int64 (all prompts have the same length).
inline rollout generate(transformer& model, const torch::Tensor& prompts, const sample_settings& s, int eos, int pad,
                        uniform_stream& uniforms) {
  torch::NoGradGuard ng;
  const auto device = prompts.device();
  const int64_t B = prompts.size(0), P = prompts.size(1);
  const int64_t L = std::min<int64_t>(s.max_new, model->cfg.max_len - P);
  kv_cache cache = model->make_cache(B, device);
  auto logits = model->forward(prompts, &cache, 0).select(1, P - 1);  // [B, V]
  auto tokens = torch::full({B, L}, pad, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto logps = torch::zeros({B, L}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  auto entropies = torch::zeros({B, L}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  auto done = torch::zeros({B}, torch::TensorOptions().dtype(torch::kBool).device(device));
  for (int64_t t = 0; t < L; ++t) {
    auto logprobs = torch::log_softmax(logits / s.temperature, -1);  // [B, V]
    auto probs = logprobs.exp();
    entropies.select(1, t).copy_(-(probs * logprobs).sum(-1).masked_fill(done, 0.0));
    torch::Tensor order;  // token ids in the order the cumulative sum walks them
    torch::Tensor walk;
    if (s.top_p < 1.0) {
      // Nucleus: keep the smallest prefix of tokens (by probability) whose mass reaches top_p.
      auto sorted = torch::sort(probs, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
      walk = std::get<0>(sorted);
      order = std::get<1>(sorted);
      auto before = walk.cumsum(-1) - walk;
      walk = walk.masked_fill(before >= s.top_p, 0.0);
    } else {
      walk = probs;
    }
    auto cum = walk.cumsum(-1);
    auto u = uniforms.next(B, device).unsqueeze(1) * cum.narrow(1, cum.size(1) - 1, 1);
    auto idx = (cum <= u).sum(-1, true).clamp_max(cum.size(1) - 1);  // first index with cum > u
    auto next = order.defined() ? order.gather(1, idx) : idx;
    next = next.squeeze(1);
    // Log-probability under the distribution actually sampled from (after the top-p cut).
    auto lp = logprobs.gather(1, next.unsqueeze(1)).squeeze(1);
    if (s.top_p < 1.0) lp = lp - cum.narrow(1, cum.size(1) - 1, 1).squeeze(1).log();
    next = next.masked_fill(done, pad);
    tokens.select(1, t).copy_(next);
    logps.select(1, t).copy_(lp.masked_fill(done, 0.0));
    done = done.logical_or(next == eos);
    if (t + 1 == L || done.all().item<bool>()) break;
    logits = model->forward(next.unsqueeze(1), &cache, P + t).select(1, 0);
  }
  rollout r;
  r.tokens = tokens;
  r.mask = tokens != pad;
  r.logp = logps;
  r.entropy = entropies;
  return r;
}

}  // namespace ablation
