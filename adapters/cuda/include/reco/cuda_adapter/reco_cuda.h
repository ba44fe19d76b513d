/* reco's raw CUDA adapter, C interface: the policy objective (presets by name, parameters by
 * key) and the log-probability / entropy op on raw device pointers and a cudaStream_t, for
 * trainers that do not use LibTorch (C, C++, Python ctypes, JAX/CuPy custom calls, ...).
 *
 * Every pointer in the argument structs is device memory unless its comment says otherwise.
 * Nothing here synchronises the stream except a result requested on the host. Functions return
 * 0 on success and a nonzero reco_cuda_error code otherwise; reco_cuda_last_error() then gives
 * the message, which starts with the offending argument ("reco: args.old_logp: ...").
 *
 * The C++ interface (reco/cuda_adapter/adapter.hpp) takes the same structs and throws instead.
 * docs/cuda.md documents both, with a complete example program. */
#ifndef RECO_CUDA_ADAPTER_RECO_CUDA_H
#define RECO_CUDA_ADAPTER_RECO_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum reco_cuda_dtype {
  RECO_CUDA_FLOAT32 = 0,
  RECO_CUDA_FLOAT64 = 1,
  RECO_CUDA_BFLOAT16 = 2, /* logits only */
  RECO_CUDA_FLOAT16 = 3   /* logits only */
} reco_cuda_dtype;

typedef enum reco_cuda_error {
  RECO_CUDA_OK = 0,
  RECO_CUDA_INVALID_ARGUMENT = 1, /* a size, pointer, dtype, preset or parameter is wrong */
  RECO_CUDA_BAD_DATA = 2,         /* the data failed a check (NaN, malformed offsets): host results only */
  RECO_CUDA_RUNTIME_ERROR = 3     /* a CUDA call failed */
} reco_cuda_error;

/* Where the objective's result (loss parts and diagnostics, a reco_cuda_result) goes. */
typedef enum reco_cuda_result_location {
  RECO_CUDA_RESULT_HOST = 0,      /* copied to host memory; the stream is synchronised and bad
                                     data is reported as RECO_CUDA_BAD_DATA */
  RECO_CUDA_RESULT_DEVICE = 1,    /* copied to caller's device memory, stream-ordered, no sync;
                                     check result.status yourself */
  RECO_CUDA_RESULT_WORKSPACE = 2  /* no copy: *workspace_result points into the context's
                                     workspace (device memory), valid until its next call */
} reco_cuda_result_location;

/* One objective call. Per-token arrays have `tokens` entries, per-response arrays `responses`.
 * Values and gradients share one dtype (float32 or float64). NULL means "not supplied"; which
 * inputs are required depends on the objective (the error names the missing one). */
typedef struct reco_cuda_objective_args {
  reco_cuda_dtype dtype;
  int64_t responses;             /* R */
  int64_t tokens;                /* N */
  int64_t max_length;            /* padded layout [R, T]: T, and N must equal R * T */
  const int64_t* offsets;        /* packed layout: R + 1 token offsets (cu_seqlens); NULL = padded */
  int64_t groups;                /* P: prompts */
  const int64_t* group_offsets;  /* P + 1 response offsets; group g = responses [go[g], go[g+1]) */
  const void* logp;              /* log pi_theta of each token (required) */
  const void* old_logp;          /* sampling policy's log-probs; NULL = on-policy */
  const void* ref_logp;          /* reference policy (KL term) */
  const void* entropy;           /* policy entropy per token (80/20 selection, entropy clip/bonus) */
  const uint8_t* mask;           /* nonzero = valid token; NULL = every token in range valid */
  const void* token_weights;     /* rollout importance weights (policy term) */
  const void* rewards;           /* per response */
  const void* advantages;        /* per response (given advantages) */
  const void* response_weights;  /* per response (caller weights) */
  void* grad_logp;               /* out: d loss / d logp, one per token (required) */
  void* grad_entropy;            /* out: d loss / d entropy (required with an entropy term) */
  int64_t global_tokens;         /* global normalisers for data parallelism; 0 = count locally */
  int64_t global_responses;
  int64_t global_kept_tokens;
  int64_t global_kept_responses;
} reco_cuda_objective_args;

/* The result, laid out exactly as reco::objective_result (checked at compile time). */
typedef struct reco_cuda_diagnostics {
  double clip_frac, clip_frac_low, clip_frac_high, dual_clip_frac;
  double ppo_kl, ratio_mean, ratio_min, ratio_max;
  double ref_kl_mean, entropy_mean, entropy_kept_mean, kept_frac;
  double weight_mean, weight_min, weight_max;
  int64_t weight_cap_hits;
  double zero_std_group_frac, advantage_mean, advantage_std;
  double token_variance[3];
  int64_t valid_tokens, policy_tokens, nonempty_responses;
} reco_cuda_diagnostics;

typedef struct reco_cuda_result {
  double loss, policy_loss, kl_loss, entropy_loss;
  reco_cuda_diagnostics stats;
  uint32_t status; /* 0 = ok; reco::input_error bits otherwise (reco_cuda_describe_status) */
  uint32_t reserved; /* always 0 */
} reco_cuda_result;

/* Log-probability and entropy from logits [rows, vocab] (row r starts at logits + r * row_stride).
 * Per-row values are float (double for float64 logits). Outputs may be NULL (not computed);
 * backward needs the lse of forward, and the entropy too when grad_entropy is given. */
typedef struct reco_cuda_logits_args {
  reco_cuda_dtype dtype; /* of logits and dlogits: bfloat16, float16, float32, float64 */
  const void* logits;
  int64_t rows, vocab, row_stride;
  const int64_t* tokens;  /* sampled token per row; needed for logp / grad_logp */
  double temperature;     /* > 0; logits are divided by it */
  const uint8_t* row_mask; /* 0 = padding row: never read, outputs 0, dlogits row exactly 0 */
  /* forward outputs */
  void* logp;
  void* entropy;
  void* lse;
  void* sum_p_squared;
  /* backward inputs and output (dlogits may equal logits: in place) */
  const void* grad_logp;
  const void* grad_entropy;
  const void* saved_lse;
  const void* saved_entropy;
  void* dlogits;
  int* error_flags; /* optional device int: bits of reco::logits::error_flag (bad token, all -inf row) */
} reco_cuda_logits_args;

/* Log-probability and entropy from hidden states [rows, hidden_size] and the lm_head weight
 * [vocab, hidden_size] (+ bias [vocab]) without the [rows, vocab] logits: chunks of tokens, a
 * cuBLAS GEMM each (docs/logits.md, "From hidden states"). h[r, k] = hidden[r * hidden_stride_row +
 * k * hidden_stride_col] (row stride 0: hidden_size); the weight row- or column-major (one stride 1).
 * Per-row values are float (double for float64). dweight and dbias are float (double) buffers that
 * the backward adds to; dhidden has the inputs' dtype and is written. workspace: device memory of
 * at least reco_cuda_linear_workspace_bytes(args) bytes (from memory_budget, 0: 256 MiB, or
 * chunk_rows > 0). cublas_handle: a cublasHandle_t, or NULL for one per thread made on first use. */
typedef struct reco_cuda_linear_args {
  reco_cuda_dtype dtype; /* of hidden, weight, bias and dhidden */
  const void* hidden;
  int64_t rows, hidden_size, hidden_stride_row, hidden_stride_col;
  const void* weight;
  int64_t vocab, weight_stride_row, weight_stride_col;
  const void* bias; /* NULL: none */
  int64_t bias_stride;
  const int64_t* tokens;
  const uint8_t* row_mask;
  double temperature;
  int64_t memory_budget, chunk_rows;
  /* forward outputs (NULL: not computed) */
  void* logp;
  void* entropy;
  void* lse;
  void* sum_p_squared;
  /* backward */
  const void* grad_logp;
  const void* grad_entropy;
  const void* saved_lse;
  const void* saved_entropy;
  void* dhidden;
  int64_t dhidden_stride;
  void* dweight;
  int64_t dweight_stride;
  void* dbias;
  void* workspace;
  int64_t workspace_bytes;
  void* cublas_handle;
  int* error_flags;
} reco_cuda_linear_args;

/* Bytes of device workspace the call needs (-1 on an argument error: reco_cuda_last_error). */
int64_t reco_cuda_linear_workspace_bytes(const reco_cuda_linear_args* args);
int reco_cuda_linear_forward(const reco_cuda_linear_args* args, cudaStream_t stream);
int reco_cuda_linear_backward(const reco_cuda_linear_args* args, cudaStream_t stream);

typedef struct reco_cuda_context reco_cuda_context;

/* A context owns the reusable workspace (grown to the largest call, then reused: no allocation
 * per call in steady state) and the fused path's options. One context per stream at a time. */
reco_cuda_context* reco_cuda_context_create(void);
void reco_cuda_context_destroy(reco_cuda_context* ctx);
/* max_blocks > 0 pins every fused grid (bitwise-reproducible results across devices);
 * vector_loads 0 forces the scalar token path; check_pointers 1 asks the CUDA driver whether
 * each pointer is device memory before any work (a host pointer is then an argument error). */
int reco_cuda_context_set_options(reco_cuda_context* ctx, int max_blocks, int vector_loads, int check_pointers);

/* The objective called `preset` (reco_cuda_preset_name lists them; a peer preset's name,
 * reco_cuda_peer_preset_name, runs its base with the peer's constants). `result` receives the result
 * for RECO_CUDA_RESULT_HOST (host memory) and RECO_CUDA_RESULT_DEVICE (device memory);
 * `workspace_result` receives the workspace pointer for RECO_CUDA_RESULT_WORKSPACE (else NULL). */
int reco_cuda_objective(reco_cuda_context* ctx, const char* preset, const reco_cuda_objective_args* args,
                        cudaStream_t stream, reco_cuda_result_location where, reco_cuda_result* result,
                        const reco_cuda_result** workspace_result);

/* reco_cuda_objective with parameters set by key: `count` pairs of a key "<component>.<field>"
 * (e.g. "clip.eps_high"; reco_cuda_override_key lists a preset's keys) and its value, applied in
 * order to the preset's constants. A real parameter takes any value its range check accepts, a
 * flag 0 or 1, a choice the index of its label (e.g. "clip.dual_clip": 0 off, 1 hard, 2 soft).
 * `keys` (NUL-terminated strings) and `values` are host memory; count 0 is reco_cuda_objective.
 * An unknown key, a bad value, a key given twice or a parameter out of range is
 * RECO_CUDA_INVALID_ARGUMENT with a message naming "overrides.<key>", before any device work. */
int reco_cuda_objective_overrides(reco_cuda_context* ctx, const char* preset, const char* const* keys,
                                  const double* values, int64_t count, const reco_cuda_objective_args* args,
                                  cudaStream_t stream, reco_cuda_result_location where, reco_cuda_result* result,
                                  const reco_cuda_result** workspace_result);
/* Checks overrides for a preset as reco_cuda_objective_overrides does, without running anything
 * (no device needed): 0, or RECO_CUDA_INVALID_ARGUMENT with the message. */
int reco_cuda_check_overrides(const char* preset, const char* const* keys, const double* values, int64_t count);

int reco_cuda_logits_forward(const reco_cuda_logits_args* args, cudaStream_t stream);
int reco_cuda_logits_backward(const reco_cuda_logits_args* args, cudaStream_t stream);

/* The k-th preset name (NULL past the last). */
const char* reco_cuda_preset_name(int k);
/* The k-th peer preset name (NULL past the last): a preset with a peer's default constants,
 * accepted wherever a preset name is (docs/presets.md, "Peer presets"). */
const char* reco_cuda_peer_preset_name(int k);
/* The k-th override key `preset` accepts (NULL past the last; NULL for an unknown preset, with
 * reco_cuda_last_error naming "preset"). The string is static. */
const char* reco_cuda_override_key(const char* preset, int k);
/* The calling thread's last error message ("" when none). */
const char* reco_cuda_last_error(void);
/* A status word as "argument: what" ("ok" for 0); the string is static. */
const char* reco_cuda_describe_status(uint32_t status);

#ifdef __cplusplus
}
#endif

#endif /* RECO_CUDA_ADAPTER_RECO_CUDA_H */
