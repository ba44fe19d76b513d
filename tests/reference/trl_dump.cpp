// Prints, as JSON, a random padded batch (reference/ref_test_util.hpp) and the reference's loss and
// gradient for TRL's loss types and switches. trl_literal_check.py recomputes them with TRL's
// formulas in PyTorch (autograd gradients). Usage: reco_reference_trl_dump <seed>.
#include <cstdio>
#include <string>
#include <vector>

#include "reference/ref_test_util.hpp"

namespace {

using namespace reco_ref;

void array(const char* key, const std::vector<double>& v) {
  std::printf("\"%s\": [", key);
  for (std::size_t i = 0; i < v.size(); ++i) std::printf("%s%.17g", i ? ", " : "", v[i]);
  std::printf("], ");
}

}  // namespace

int main(int argc, char** argv) {
  const std::uint64_t seed = argc > 1 ? std::stoull(argv[1]) : 1;
  reco_ref_test::batch_shape shape;
  shape.packed = false;  // padded: the Python side works on (R, T) arrays, as TRL
  const batch b = reco_ref_test::random_batch(seed, shape);
  // Invalid tokens hold NaN; any finite stand-in serves, TRL multiplies them by the mask.
  auto finite = [&](std::vector<double> v) {
    for (std::size_t t = 0; t < v.size(); ++t)
      if (!b.mask[t]) v[t] = -1.0;
    return v;
  };
  std::printf("{");
  array("logp", finite(b.logp));
  array("old_logp", finite(b.old_logp));
  array("ref_logp", finite(b.ref_logp));
  array("mask", std::vector<double>(b.mask.begin(), b.mask.end()));
  array("advantages", b.advantages);
  std::printf("\"R\": %zu, \"T\": %lld, \"cases\": {", b.token_begin.size(), static_cast<long long>(b.max_length));
  bool first = true;
  auto run = [&](const char* name, config c) {
    c.adv = advantage::given;  // TRL's loss sees the advantages as given
    const output o = evaluate(b, c);
    std::printf("%s\"%s\": {\"loss\": %.17g, ", first ? "" : ", ", name, o.loss);
    first = false;
    std::vector<double> g = o.grad_logp;
    array("grad", g);
    std::printf("\"tokens\": %lld}", static_cast<long long>(o.valid_tokens));
  };
  config c = preset("trl_bnpo");
  run("bnpo", c);
  c.delta = 1.5;
  run("bnpo_delta_1.5", c);
  c.delta = 1.1;
  run("bnpo_delta_1.1", c);
  c.delta = 0.95;
  c.eps_high = 0.28;
  run("bnpo_delta_0.95_eps_high_0.28", c);
  c = preset("trl_bnpo");
  c.kl_mode = kl::k3;
  c.kl_clamp = false;
  c.kl_beta = 0.04;
  run("bnpo_kl", c);
  c.kl_importance_weighted = true;
  run("bnpo_kl_bias_correction", c);
  run("vespo", preset("trl_vespo"));
  run("luspo", preset("trl_luspo"));
  std::printf("}}\n");
  return 0;
}
