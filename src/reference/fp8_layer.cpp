// The fp8 layer-0 reference (reference.hpp: quantize_layer0, forward_fp8).
#include "comet/fp8.hpp"
#include "comet/reference.hpp"

namespace comet::reference {

Fp8Layer0<float> quantize_layer0(const MoeShape& shape, const ExpertWeights<float>& weights,
                                 const std::vector<RankInput<float>>& ranks) {
  const int H = shape.hidden, n0 = shape.w0_rows(), E = shape.num_experts;
  COMET_REQUIRE(weights.w0.size() == size_t(E) * n0 * H, "quantize_layer0: w0 has ", weights.w0.size(),
                " values, expected E x w0_rows x H = ", size_t(E) * n0 * H);
  Fp8Layer0<float> q{weights, ranks};
  for (int e = 0; e < E; ++e) {
    const size_t off = size_t(e) * n0 * H;
    const std::vector<float> w = fp8::quantize_weights(&weights.w0[off], n0, H).dequantize();
    std::copy(w.begin(), w.end(), q.weights.w0.begin() + off);
  }
  for (RankInput<float>& r : q.ranks) {
    COMET_REQUIRE(r.x.size() == size_t(r.tokens) * H, "quantize_layer0: a rank's x has ", r.x.size(),
                  " values for ", r.tokens, " tokens of ", H);
    if (r.tokens > 0) r.x = fp8::quantize_activations(r.x.data(), r.tokens, H).dequantize();
  }
  return q;
}

RankOutputs<float> forward_fp8(const MoeShape& shape, const Parallel& par, const ExpertWeights<float>& weights,
                               const std::vector<RankInput<float>>& ranks) {
  const Fp8Layer0<float> q = quantize_layer0(shape, weights, ranks);
  return forward(shape, par, q.weights, q.ranks);
}

}  // namespace comet::reference
