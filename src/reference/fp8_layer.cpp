// The fp8 layer-0 reference (reference.hpp: quantize_layer0, forward_fp8).
#include "comet/fp8.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"

namespace comet::reference {

Fp8Layer0<float> quantize_layer0(const MoeShape& shape, const Parallel& par, const ExpertWeights<float>& weights,
                                 const std::vector<RankInput<float>>& ranks) {
  const int H = shape.hidden, n0 = shape.w0_rows(), E = shape.num_experts;
  COMET_REQUIRE(weights.w0.size() == size_t(E) * n0 * H, "quantize_layer0: w0 has ", weights.w0.size(),
                " values, expected E x w0_rows x H = ", size_t(E) * n0 * H);
  COMET_REQUIRE(H % fp8::kBlock == 0, "quantize_layer0: H (", H, ") must be a multiple of ", fp8::kBlock);
  Fp8Layer0<float> q{weights, ranks, {}};
  const int kb = H / fp8::kBlock, El = par.local_experts(shape);
  q.w0_scales.assign(size_t(E) * n0 * kb, 0.0f);
  std::vector<float> w0_full(weights.w0.size(), 0.0f);
  // Each rank's local w0, quantised per expert, back into the full layout: every full element lives on
  // exactly one rank (weight_layout.hpp), so the ranks' pieces add up to the whole.
  for (int r = 0; r < par.world(); ++r) {
    RankWeightsF32 local = shard_weights_f32(shape, par, r, weights.w0, weights.w1);
    const int rows = local.w0_rows;
    for (int e = 0; e < El; ++e) {
      float* w = &local.w0[size_t(e) * rows * H];
      const fp8::Quantized qw = fp8::quantize_weights(w, rows, H);
      const std::vector<float> d = qw.dequantize();
      std::copy(d.begin(), d.end(), w);
      const int expert = par.ep_index(r) * El + e;
      for (int n = 0; n < rows; ++n) {
        const int full_row = w0_full_row(shape, par, r, n);
        for (int j = 0; j < kb; ++j)
          q.w0_scales[(size_t(expert) * n0 + full_row) * kb + j] = qw.scale_of(n, j * fp8::kBlock);
      }
    }
    unshard_add_w0(shape, par, r, local.w0, w0_full);
  }
  q.weights.w0 = std::move(w0_full);
  for (RankInput<float>& r : q.ranks) {
    COMET_REQUIRE(r.x.size() == size_t(r.tokens) * H, "quantize_layer0: a rank's x has ", r.x.size(),
                  " values for ", r.tokens, " tokens of ", H);
    if (r.tokens > 0) r.x = fp8::quantize_activations(r.x.data(), r.tokens, H).dequantize();
  }
  return q;
}

RankOutputs<float> forward_fp8(const MoeShape& shape, const Parallel& par, const ExpertWeights<float>& weights,
                               const std::vector<RankInput<float>>& ranks) {
  const Fp8Layer0<float> q = quantize_layer0(shape, par, weights, ranks);
  return forward(shape, par, q.weights, q.ranks);
}

}  // namespace comet::reference
