#include "harness/moe_problem.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "kernels/fp8_quantize.hpp"

namespace comet::testing {

reference::ExpertWeights<float> random_expert_weights(const MoeShape& shape, uint64_t seed) {
  const int H = shape.hidden, F = shape.ffn, E = shape.num_experts;
  // Scales keep pre-activations and outputs O(1): x ~ U(-1,1), w0 ~ U(-1,1)/sqrt(H), w1 ~ U(-1,1)/sqrt(F).
  reference::ExpertWeights<float> w;
  w.w0 = random_bf16_values(size_t(E) * shape.w0_rows() * H, 1.5f / std::sqrt(float(H)), seed * 7 + 1);
  w.w1 = random_bf16_values(size_t(E) * H * F, 1.5f / std::sqrt(float(F)), seed * 7 + 2);
  return w;
}

MoeProblem MoeProblem::make(const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens_per_rank,
                            RoutingKind kind, uint64_t seed, int hot_expert) {
  MoeProblem p{shape, par, random_expert_weights(shape, seed), {}};
  const int H = shape.hidden;
  const auto routing = make_routing(shape, par, tokens_per_rank, kind, seed * 7 + 3, hot_expert);
  for (size_t s = 0; s < tokens_per_rank.size(); ++s) {
    reference::RankInput<float> in;
    in.tokens = tokens_per_rank[s];
    in.x = random_bf16_values(size_t(in.tokens) * H, 1.0f, seed * 7 + 4 + s * 13);
    in.ids = routing[s].ids;
    in.gates = routing[s].gates;
    p.inputs.push_back(std::move(in));
  }
  return p;
}

int MoeProblem::max_tokens() const {
  int m = 1;
  for (const auto& in : inputs) m = std::max(m, in.tokens);
  return m;
}

RankBatch DeviceRank::batch() const {
  return RankBatch{tokens, x.get(), ids.as<int32_t>(), gates.as<float>(), out.get()};
}

std::vector<float> DeviceRank::output() const {
  const size_t n = out.bytes() / 2;
  return from_bf16(out.download<bf16_bits>(n));
}

Fp8W0 quantize_w0(const MoeShape& shape, const Parallel& par, const void* w0_bf16, cudaStream_t stream) {
  const int El = par.local_experts(shape), rows = shape.w0_rows() / par.tp, H = shape.hidden;
  Fp8W0 w{DeviceBuffer(size_t(El) * rows * H),
          DeviceBuffer(size_t(El) * ((rows + fp8::kBlock - 1) / fp8::kBlock) * (H / fp8::kBlock) * sizeof(float))};
  kernels::quantize_weights_e4m3(w0_bf16, El, rows, H, w.codes.get(), w.scales.as<float>(), stream);
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
  return w;
}

std::unique_ptr<DeviceRank> upload_rank(const MoeProblem& p, int rank) {
  auto d = std::make_unique<DeviceRank>();
  const auto& in = p.inputs[rank];
  d->rank = rank;
  d->tokens = in.tokens;
  d->x = DeviceBuffer(to_bf16(in.x));
  d->ids = DeviceBuffer(in.ids);
  d->gates = DeviceBuffer(in.gates);
  d->out = DeviceBuffer(size_t(in.tokens) * p.shape.hidden * 2);
  d->out.fill_bytes(0xFF);  // NaN: every element must be written
  const RankWeights w = shard_weights(p.shape, p.par, rank, p.weights.w0, p.weights.w1);
  d->w0 = DeviceBuffer(w.w0);
  d->w1 = DeviceBuffer(w.w1);
  return d;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return std::numeric_limits<double>::infinity();
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool all_nan(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isnan(x)) return false;
  return true;
}

double worst_row_error(const std::vector<float>& a, const std::vector<float>& b, int row_len) {
  double worst = 0;
  for (size_t r = 0; r * row_len < b.size(); ++r) {
    std::vector<float> ra(a.begin() + r * row_len, a.begin() + (r + 1) * row_len);
    std::vector<float> rb(b.begin() + r * row_len, b.begin() + (r + 1) * row_len);
    worst = std::max(worst, relative_error(ra, rb));
  }
  return worst;
}

}  // namespace comet::testing
