// The raw CUDA adapter's host side: presets by name, the synchronous and stream-ordered entry
// points, the logits op's validation, and the C interface (reco_cuda.h) over all of it.
#include <cstddef>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "library.hpp"
#include "reco/cuda_adapter/adapter.hpp"
#include "reco/cuda_adapter/pointers.hpp"
#include "reco/cuda_adapter/presets_by_name.hpp"
#include "reco/cuda_adapter/reco_cuda.h"
#include "reco/cuda_adapter/validate.hpp"
#include "reco/detail/cuda_check.cuh"
#include "reco/result.hpp"

// The C result struct is reco::objective_result, field for field, so results are copied as bytes.
static_assert(std::is_standard_layout_v<reco::objective_result> && std::is_standard_layout_v<reco_cuda_result>);
static_assert(sizeof(reco_cuda_result) == sizeof(reco::objective_result));
#define RECO_SAME_OFFSET(c_field, cpp_field) \
  static_assert(offsetof(reco_cuda_result, c_field) == offsetof(reco::objective_result, cpp_field), #c_field)
RECO_SAME_OFFSET(loss, loss);
RECO_SAME_OFFSET(policy_loss, policy_loss);
RECO_SAME_OFFSET(kl_loss, kl_loss);
RECO_SAME_OFFSET(entropy_loss, entropy_loss);
RECO_SAME_OFFSET(stats.clip_frac, stats.clip_frac);
RECO_SAME_OFFSET(stats.ratio_max, stats.ratio_max);
RECO_SAME_OFFSET(stats.kept_frac, stats.kept_frac);
RECO_SAME_OFFSET(stats.weight_cap_hits, stats.weight_cap_hits);
RECO_SAME_OFFSET(stats.zero_std_group_frac, stats.zero_std_group_frac);
RECO_SAME_OFFSET(stats.token_variance, stats.token_variance);
RECO_SAME_OFFSET(stats.valid_tokens, stats.valid_tokens);
RECO_SAME_OFFSET(stats.nonempty_responses, stats.nonempty_responses);
RECO_SAME_OFFSET(status, status);
#undef RECO_SAME_OFFSET

RECO_NAMESPACE_BEGIN
namespace cuda_adapter {
using ::reco::detail::cuda_check;

static_assert(parts::part_bounds[3] == preset_count, "the three preset translation units cover every preset");

const std::vector<std::string>& preset_names() { return registry::preset_names(); }

objective_needs preset_needs(const std::string& preset) { return needs_of_preset(preset); }

std::vector<std::string> override_keys(const std::string& preset) { return registry::preset_override_keys(preset); }

void check_overrides(const std::string& preset, const override_list& overrides) {
  registry::with_preset(preset, [&](auto obj) { registry::apply_overrides(obj, overrides, "preset '" + preset + "'"); });
}

const objective_result* run_preset_async(const std::string& preset, const override_list& overrides,
                                         const reco_cuda_objective_args& args, cudaStream_t stream, context& ctx,
                                         objective_result* device_result) {
  // A peer preset runs its base with the peer's settings before the caller's overrides.
  const registry::resolved_preset run = registry::resolve_preset(preset, overrides);
  // Bad overrides and arguments are reported here, before any device work; the translation unit
  // that runs the preset applies the overrides to its object and the typed call validates again.
  if (!overrides.empty()) check_overrides(preset, overrides);
  validate(args, needs_of_preset(run.index));
  const objective_result* out = nullptr;
  if (!(parts::run_part0(run.index, run.overrides, args, stream, ctx, device_result, &out) ||
        parts::run_part1(run.index, run.overrides, args, stream, ctx, device_result, &out) ||
        parts::run_part2(run.index, run.overrides, args, stream, ctx, device_result, &out)))
    ::reco::detail::fail("preset", "no translation unit compiled preset '" + preset + "'");
  return out;
}

const objective_result* run_preset_async(const std::string& preset, const reco_cuda_objective_args& args,
                                         cudaStream_t stream, context& ctx, objective_result* device_result) {
  return run_preset_async(preset, override_list{}, args, stream, ctx, device_result);
}

objective_result run_preset(const std::string& preset, const reco_cuda_objective_args& args, cudaStream_t stream,
                            context& ctx) {
  return run_preset(preset, override_list{}, args, stream, ctx);
}

objective_result run_preset(const std::string& preset, const override_list& overrides,
                            const reco_cuda_objective_args& args, cudaStream_t stream, context& ctx) {
  const objective_result* r = run_preset_async(preset, overrides, args, stream, ctx);
  objective_result out;
  cuda_check(cudaMemcpyAsync(&out, r, sizeof(out), cudaMemcpyDeviceToHost, stream),
                                  "copy of the result");
  cuda_check(cudaStreamSynchronize(stream), "synchronize");
  throw_if_error(out.status);
  return out;
}

void logits_forward(const reco_cuda_logits_args& args, cudaStream_t stream, bool check_pointers) {
  validate(args, false);
  if (check_pointers) check_device_pointers(args);
  parts::logits_forward_device(args, stream);
}

void logits_backward(const reco_cuda_logits_args& args, cudaStream_t stream, bool check_pointers) {
  validate(args, true);
  if (check_pointers) check_device_pointers(args);
  parts::logits_backward_device(args, stream);
}

}  // namespace cuda_adapter
RECO_NAMESPACE_END

// ---- C interface ---------------------------------------------------------------------------

struct reco_cuda_context {
  reco::cuda_adapter::context ctx;
  reco_cuda_context() : ctx() {}
};

namespace {

thread_local std::string last_error;

// Runs f, turning exceptions into the C error codes (the message is kept for reco_cuda_last_error).
template <class F>
int guarded(F&& f) {
  try {
    f();
    last_error.clear();
    return RECO_CUDA_OK;
  } catch (const reco::error& e) {
    last_error = e.what();
    return RECO_CUDA_INVALID_ARGUMENT;
  } catch (const std::bad_alloc& e) {
    last_error = std::string("reco: out of host memory: ") + e.what();
    return RECO_CUDA_RUNTIME_ERROR;
  } catch (const std::exception& e) {
    last_error = e.what();
    return RECO_CUDA_RUNTIME_ERROR;
  }
}

int bad_argument(const char* argument, const char* what) {
  last_error = std::string("reco: ") + argument + ": " + what;
  return RECO_CUDA_INVALID_ARGUMENT;
}

// The C arrays of keys and values as an override list (throws reco::error naming the array).
reco::cuda_adapter::override_list overrides_of(const char* const* keys, const double* values, int64_t count) {
  reco::detail::require(count >= 0, "count", "must be >= 0");
  reco::cuda_adapter::override_list list;
  if (count == 0) return list;
  reco::detail::require(keys != nullptr, "keys", "is null but count is " + std::to_string(count));
  reco::detail::require(values != nullptr, "values", "is null but count is " + std::to_string(count));
  list.reserve(static_cast<std::size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    reco::detail::require(keys[k] != nullptr, "keys", "entry " + std::to_string(k) + " is null");
    list.emplace_back(keys[k], values[k]);
  }
  return list;
}

}  // namespace

extern "C" {

reco_cuda_context* reco_cuda_context_create(void) {
  reco_cuda_context* ctx = nullptr;
  if (guarded([&] { ctx = new reco_cuda_context(); }) != RECO_CUDA_OK) return nullptr;
  return ctx;
}

void reco_cuda_context_destroy(reco_cuda_context* ctx) { delete ctx; }

int reco_cuda_context_set_options(reco_cuda_context* ctx, int max_blocks, int vector_loads, int check_pointers) {
  if (ctx == nullptr) return bad_argument("ctx", "is null");
  if (max_blocks < 0) return bad_argument("max_blocks", "must be >= 0 (0: fill the device)");
  auto& o = ctx->ctx.options();
  o.max_blocks = max_blocks;
  o.vector_loads = vector_loads != 0;
  o.check_pointers = check_pointers != 0;
  last_error.clear();
  return RECO_CUDA_OK;
}

int reco_cuda_objective(reco_cuda_context* ctx, const char* preset, const reco_cuda_objective_args* args,
                        cudaStream_t stream, reco_cuda_result_location where, reco_cuda_result* result,
                        const reco_cuda_result** workspace_result) {
  return reco_cuda_objective_overrides(ctx, preset, nullptr, nullptr, 0, args, stream, where, result,
                                       workspace_result);
}

int reco_cuda_objective_overrides(reco_cuda_context* ctx, const char* preset, const char* const* keys,
                                  const double* values, int64_t count, const reco_cuda_objective_args* args,
                                  cudaStream_t stream, reco_cuda_result_location where, reco_cuda_result* result,
                                  const reco_cuda_result** workspace_result) {
  if (ctx == nullptr) return bad_argument("ctx", "is null");
  if (preset == nullptr) return bad_argument("preset", "is null");
  if (args == nullptr) return bad_argument("args", "is null");
  if ((where == RECO_CUDA_RESULT_HOST || where == RECO_CUDA_RESULT_DEVICE) && result == nullptr)
    return bad_argument("result", "is null but the result is requested in host or device memory");
  if (where == RECO_CUDA_RESULT_WORKSPACE && workspace_result == nullptr)
    return bad_argument("workspace_result", "is null but the workspace result is requested");
  if (where != RECO_CUDA_RESULT_HOST && where != RECO_CUDA_RESULT_DEVICE && where != RECO_CUDA_RESULT_WORKSPACE)
    return bad_argument("where", "must be RECO_CUDA_RESULT_HOST, _DEVICE or _WORKSPACE");
  namespace ca = reco::cuda_adapter;
  std::uint32_t status = 0;
  const int rc = guarded([&] {
    auto* device = where == RECO_CUDA_RESULT_DEVICE ? reinterpret_cast<reco::objective_result*>(result) : nullptr;
    const reco::objective_result* r =
        ca::run_preset_async(preset, overrides_of(keys, values, count), *args, stream, ctx->ctx, device);
    if (where == RECO_CUDA_RESULT_WORKSPACE) *workspace_result = reinterpret_cast<const reco_cuda_result*>(r);
    if (where != RECO_CUDA_RESULT_HOST) return;
    ca::cuda_check(cudaMemcpyAsync(result, r, sizeof(*result), cudaMemcpyDeviceToHost, stream), "copy of the result");
    ca::cuda_check(cudaStreamSynchronize(stream), "synchronize");
    status = result->status;
  });
  if (rc != RECO_CUDA_OK) return rc;
  if (status != 0) {
    last_error = "reco: " + reco::describe_status(status);
    return RECO_CUDA_BAD_DATA;
  }
  return RECO_CUDA_OK;
}

int reco_cuda_logits_forward(const reco_cuda_logits_args* args, cudaStream_t stream) {
  if (args == nullptr) return bad_argument("args", "is null");
  return guarded([&] { reco::cuda_adapter::logits_forward(*args, stream); });
}

int reco_cuda_logits_backward(const reco_cuda_logits_args* args, cudaStream_t stream) {
  if (args == nullptr) return bad_argument("args", "is null");
  return guarded([&] { reco::cuda_adapter::logits_backward(*args, stream); });
}

int64_t reco_cuda_linear_workspace_bytes(const reco_cuda_linear_args* args) {
  std::int64_t bytes = -1;
  if (args == nullptr) return bad_argument("args", "is null"), -1;
  return guarded([&] { bytes = reco::cuda_adapter::parts::linear_workspace_bytes(*args); }) == RECO_CUDA_OK ? bytes : -1;
}

int reco_cuda_linear_forward(const reco_cuda_linear_args* args, cudaStream_t stream) {
  if (args == nullptr) return bad_argument("args", "is null");
  return guarded([&] { reco::cuda_adapter::parts::linear_forward_device(*args, stream); });
}

int reco_cuda_linear_backward(const reco_cuda_linear_args* args, cudaStream_t stream) {
  if (args == nullptr) return bad_argument("args", "is null");
  return guarded([&] { reco::cuda_adapter::parts::linear_backward_device(*args, stream); });
}

int reco_cuda_check_overrides(const char* preset, const char* const* keys, const double* values, int64_t count) {
  if (preset == nullptr) return bad_argument("preset", "is null");
  return guarded([&] { reco::cuda_adapter::check_overrides(preset, overrides_of(keys, values, count)); });
}

const char* reco_cuda_preset_name(int k) { return reco::registry::preset_name(k); }

const char* reco_cuda_peer_preset_name(int k) {
  return k >= 0 && k < reco::registry::peer_preset_count ? reco::registry::peer_preset_table[k].name : nullptr;
}

const char* reco_cuda_override_key(const char* preset, int k) {
  if (preset == nullptr) {
    bad_argument("preset", "is null");
    return nullptr;
  }
  const char* key = nullptr;
  guarded([&] {
    // Every preset's keys, computed once; the strings live as long as the library.
    static const std::vector<std::vector<std::string>> keys = [] {
      std::vector<std::vector<std::string>> all;
      for (const std::string& name : reco::registry::preset_names())
        all.push_back(reco::registry::preset_override_keys(name));
      return all;
    }();
    // A peer preset takes its base's keys.
    const auto& list = keys[static_cast<std::size_t>(reco::registry::base_preset_index(preset))];
    if (k >= 0 && static_cast<std::size_t>(k) < list.size()) key = list[static_cast<std::size_t>(k)].c_str();
  });
  return key;
}

const char* reco_cuda_last_error(void) { return last_error.c_str(); }

const char* reco_cuda_describe_status(uint32_t status) {
  static thread_local std::string text;
  text = reco::describe_status(status);
  return text.c_str();
}

}  // extern "C"
