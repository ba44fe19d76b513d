// The step plan's token passes as tensor operations (plan_token_passes.hpp). Each pass ends in one
// copy to the host of everything it found, concatenated as float64 (counts below 2^53 are exact).
#include "reco/torch/detail/plan_token_passes.hpp"

#include <cfloat>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

RECO_NAMESPACE_BEGIN
namespace torch {
namespace detail {
namespace {

// The top 16 bits of the order-preserving keys of x's values (reco::detail::order_key_bits), as
// int32: the sign bit of a non-negative value flipped, every bit of a negative one; -0 as +0.
at::Tensor first_digits(const at::Tensor& x) {
  const at::Tensor v = x + 0;  // -0 + 0 = +0: the two share a key
  if (x.scalar_type() == at::kFloat) {
    const at::Tensor u = v.view(at::kInt);
    const at::Tensor key = at::bitwise_xor(u, at::bitwise_or(u.__rshift__(31), std::numeric_limits<std::int32_t>::min()));
    return at::bitwise_and(key.__rshift__(16), 0xffff);  // the shift extends the sign: masked off
  }
  const at::Tensor u = v.view(at::kLong);
  const at::Tensor key = at::bitwise_xor(u, at::bitwise_or(u.__rshift__(63), std::numeric_limits<std::int64_t>::min()));
  return at::bitwise_and(key.__rshift__(48), 0xffff).to(at::kInt);
}

}  // namespace

// Through page-locked memory (LibTorch's caching host allocator): a copy between a device and
// pageable memory goes through the driver's own staging buffer (~0.2 ms each way for the 7
// doubles per response of 16K responses, on an H100 machine).
at::Tensor to_host(const at::Tensor& t) {
  if (!t.is_cuda()) return t.contiguous();
  at::Tensor h = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  h.copy_(t);  // waits for the work that made t
  return h;
}

at::Tensor float64_tensor_on(const std::vector<double>& values, const at::Device& device) {
  const auto n = static_cast<std::int64_t>(values.size());
  at::Tensor h = at::empty({n}, at::TensorOptions().dtype(at::kDouble).pinned_memory(!device.is_cpu()));
  if (n > 0) std::memcpy(h.data_ptr<double>(), values.data(), values.size() * sizeof(double));
  // The allocator keeps the pinned block until the copy, ordered on the current stream, is done.
  return device.is_cpu() ? h : h.to(device, /*non_blocking=*/true);
}

at::Tensor digit_counts(const at::Tensor& d) {
  constexpr auto D = static_cast<std::int64_t>(reco::detail::key_digits);
  // Sorted, then each digit's first place found by binary search: on an H100 at 2^24 tokens 1.3 ms,
  // against 3.3 ms for private bincounts of runs of 2^18 tokens and 5.4 ms for one bincount (the
  // entropies' digits cluster, and the atomic increments of one digit queue).
  const at::Tensor sorted = std::get<0>(at::sort(d.to(at::kInt)));
  const at::Tensor edges = at::searchsorted(sorted, at::arange(D + 1, sorted.options()));
  return (edges.slice(0, 1) - edges.slice(0, 0, D)).to(at::kLong);
}

namespace {

template <class T>
std::uint64_t key_of(double v) {
  return reco::detail::order_key_bits(static_cast<T>(v));
}

}  // namespace

tensor_token_passes::tensor_token_passes(const policy_inputs& in, bool use_double) : use_double_(use_double) {
  logp_ = in.logp.detach();
  // The plan's copies on the host passed the request's checks; the device is checked here (the
  // passes read these tensors where they are).
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{in.old_logp, "old_logp"},
                                {in.entropy, "entropy"}, {in.mask, "mask"}, {in.offsets, "offsets"}})
    if (t.defined() && t.device() != logp_.device())
      reco::detail::fail(name, "is on " + t.device().str() + ", logp on " + logp_.device().str() +
                                   ": a micro-batch's tensors must share one device");
  packed_ = in.offsets.defined();
  if (packed_) {
    offsets_ = in.offsets.detach().to(logp_.device(), at::kLong).contiguous();
    responses_ = offsets_.numel() - 1;
  } else {
    responses_ = logp_.size(0);
    width_ = logp_.size(1);
  }
  if (in.old_logp.defined()) old_logp_ = in.old_logp.detach();
  if (in.entropy.defined()) entropy_ = in.entropy.detach().to(use_double ? at::kDouble : at::kFloat);
  valid_ = in.mask.defined() ? in.mask.detach().to(at::kBool)
                              : at::ones(logp_.sizes(), logp_.options().dtype(at::kBool));
  source_.sums = [this](bool old_mean, bool entropy, bool histogram, reco::part_token_sums& out) {
    sums(old_mean, entropy, histogram, out);
  };
  source_.gather = [this](int done, std::uint64_t lo, std::uint64_t hi, reco::detail::cut_candidates& out) {
    gather(done, lo, hi, out);
  };
  source_.count_cut = [this](double cut, std::int64_t* above, std::int64_t* on) { count_cut(cut, above, on); };
}

at::Tensor tensor_token_passes::per_response(const at::Tensor& x) const {
  if (!packed_) return x.sum(1);  // [R, T] -> [R]
  if (x.numel() == 0) return at::zeros({responses_}, x.options());
  return at::segment_reduce(x, "sum", c10::nullopt, c10::nullopt, offsets_);  // empty responses: 0
}

at::Tensor tensor_token_passes::count_per_response(const at::Tensor& flags) const {
  // Padded: the bool rows summed as int64 (exact), no float64 copy of the [R, T] flags (128 MB at
  // 2^24 slots); segment_reduce takes floating values only.
  if (!packed_) return flags.sum(1).to(at::kDouble);
  return per_response(flags.to(at::kDouble));
}

void tensor_token_passes::sums(bool old_mean, bool entropy, bool histogram, reco::part_token_sums& out) const {
  const at::Tensor& v = valid_;
  std::vector<at::Tensor> parts{count_per_response(v)};
  if (old_mean) {
    const at::Tensor x = (old_logp_.defined() ? old_logp_ : logp_).to(at::kDouble);
    parts.push_back(per_response(x.masked_fill(at::logical_not(v), 0)));
    // A log-probability must be finite and <= 0 (reco::detail::bad_log_probability).
    const at::Tensor ok = at::logical_and(x.le(0), x.ge(-DBL_MAX));
    parts.push_back(at::logical_and(v, at::logical_not(ok)).any().to(at::kDouble).reshape({1}));
  }
  const bool reads_entropy = entropy || histogram;
  if (reads_entropy)
    parts.push_back(at::logical_and(v, at::logical_not(at::isfinite(entropy_))).any().to(at::kDouble).reshape({1}));
  if (histogram) {
    const at::Tensor d = first_digits(entropy_).masked_fill(at::logical_not(v), 0).flatten();
    parts.push_back(digit_counts(d).to(at::kDouble));
  }
  const at::Tensor host = to_host(at::cat(parts));
  const double* p = host.data_ptr<double>();
  const auto R = static_cast<std::size_t>(responses_);
  out.valid.resize(R);
  for (std::size_t i = 0; i < R; ++i) out.valid[i] = static_cast<index_t>(p[i]);
  p += R;
  out.status = 0;
  out.old_sum.clear();
  if (old_mean) {
    out.old_sum.assign(p, p + R);
    if (p[R] != 0) out.status |= old_logp_.defined() ? reco::bad_old_logp : reco::bad_logp;
    p += R + 1;
  }
  if (reads_entropy) {
    if (p[0] != 0) out.status |= reco::bad_entropy;
    p += 1;
  }
  out.histogram.clear();
  if (histogram) {
    out.histogram.assign(reco::detail::digit_histogram_size, 0.0);
    // Digit 0 holds the masked tokens (and negative NaNs, an error found above): never counted.
    for (std::size_t d = 1; d < reco::detail::key_digits; ++d)
      if (p[d] != 0) reco::detail::histogram_add(out.histogram.data(), d, p[d]);
  }
}

void tensor_token_passes::gather(int done, std::uint64_t lo, std::uint64_t hi,
                                 reco::detail::cut_candidates& out) const {
  // The range's bounds as values, as the host pass compares them (valid entropies are finite
  // here: the summaries checked them).
  double from = 0, up = 0;
  if (use_double_) {
    const reco::detail::candidate_bounds<double> r(done, lo, hi);
    from = r.from;
    up = r.up;
  } else {
    const reco::detail::candidate_bounds<float> r(done, lo, hi);
    from = r.from;
    up = r.up;
  }
  const at::Tensor& v = valid_;
  const at::Tensor above = at::logical_and(v, entropy_.ge(up));
  const at::Tensor inside = at::logical_and(at::logical_and(v, entropy_.ge(from)), at::logical_not(above));
  const at::Tensor idx = at::nonzero(inside.flatten()).flatten();  // position order
  const std::int64_t k = idx.numel();
  std::vector<at::Tensor> parts{count_per_response(above)};
  if (k > 0) {
    parts.push_back(entropy_.flatten().index_select(0, idx).to(at::kDouble));
    const at::Tensor response = packed_ ? at::searchsorted(offsets_, idx, false, true) - 1
                                        : at::div(idx, width_, "floor");
    parts.push_back(response.to(at::kDouble));
  }
  const at::Tensor host = to_host(at::cat(parts));
  const double* p = host.data_ptr<double>();
  const auto R = static_cast<std::size_t>(responses_);
  out.above.resize(R);
  for (std::size_t i = 0; i < R; ++i) out.above[i] = static_cast<std::int64_t>(p[i]);
  out.keys.resize(static_cast<std::size_t>(k));
  out.responses.resize(static_cast<std::size_t>(k));
  for (std::int64_t j = 0; j < k; ++j) {
    const double x = p[R + static_cast<std::size_t>(j)];
    out.keys[static_cast<std::size_t>(j)] = use_double_ ? key_of<double>(x) : key_of<float>(x);
    out.responses[static_cast<std::size_t>(j)] = static_cast<index_t>(p[R + static_cast<std::size_t>(k + j)]);
  }
}

void tensor_token_passes::count_cut(double cut, std::int64_t* above, std::int64_t* on) const {
  // As the host pass compares: in the entropies' own type when the cut is one of its values (a
  // tensor-scalar comparison runs in the tensor's type), else in float64, to which a float32
  // value widens exactly (an interpolated quantile need not be a float32 value).
  const at::Tensor& v = valid_;
  const bool own_type = use_double_ || static_cast<double>(static_cast<float>(cut)) == cut;
  const at::Tensor x = own_type ? entropy_ : entropy_.to(at::kDouble);
  const at::Tensor host = to_host(at::cat({count_per_response(at::logical_and(v, x.gt(cut))),
                                           count_per_response(at::logical_and(v, x.eq(cut)))}));
  const double* p = host.data_ptr<double>();
  for (std::int64_t i = 0; i < responses_; ++i) {
    above[i] = static_cast<std::int64_t>(p[i]);
    on[i] = static_cast<std::int64_t>(p[responses_ + i]);
  }
}

}  // namespace detail
}  // namespace torch
RECO_NAMESPACE_END
