// A random MoE layer problem (weights, every rank's tokens and routing) with its device copies, for
// GPU tests and benchmarks. Values are bf16-representable, so the fp32 reference sees exactly what
// the GPU sees.
#pragma once

#include <memory>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "harness/device_buffer.hpp"
#include "harness/routing_gen.hpp"

namespace comet::testing {

// Random full expert weights (w0 [E][w0_rows][H], w1 [E][H][F]), bf16-representable, scaled so that
// pre-activations and outputs stay O(1) for inputs in [-1, 1].
reference::ExpertWeights<float> random_expert_weights(const MoeShape& shape, uint64_t seed);

struct MoeProblem {
  MoeShape shape;
  Parallel par;
  reference::ExpertWeights<float> weights;
  std::vector<reference::RankInput<float>> inputs;  // per rank

  static MoeProblem make(const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens_per_rank,
                         RoutingKind kind, uint64_t seed, int hot_expert = 0);
  int max_tokens() const;
};

// One rank's device-side data for a call.
struct DeviceRank {
  int rank = 0;
  int tokens = 0;
  DeviceBuffer x, ids, gates, out, w0, w1;
  RankBatch batch() const;
  std::vector<float> output() const;  // out as floats [tokens][H]
};

std::unique_ptr<DeviceRank> upload_rank(const MoeProblem& p, int rank);

// A rank's W0 as an fp8 layer 0 multiplies it (MoeOptions::dtype e4m3): e4m3 codes in the local layout
// and fp32 scales of each local expert's 128 x 128 blocks, quantised on the GPU from the rank's bf16 W0
// shard [E_l][w0 rows of the shard][H] (kernels/fp8_quantize.hpp), on `stream`, which is synchronised.
struct Fp8W0 {
  DeviceBuffer codes, scales;
  const float* scale_ptr() const { return scales.as<float>(); }
};
Fp8W0 quantize_w0(const MoeShape& shape, const Parallel& par, const void* w0_bf16, cudaStream_t stream = nullptr);

// A forced tile and comm-block count; m_group 0 leaves the rasterisation to the planner.
inline LayerRequest forced(int tile_n, int n_comm, int m_group = 0, int n_group = 1) {
  LayerRequest r = LayerRequest::forced(tile_n, n_comm);
  if (m_group > 0) r.m_group = m_group;
  r.n_group = n_group;
  return r;
}

// The request with its standalone GEMM (gemm_only, or the sequential schedule's GEMM launch) set.
inline LayerRequest with_standalone(LayerRequest r, StandaloneGemm gemm) {
  r.standalone_gemm = gemm;
  return r;
}

// The request with a combine launch's sequential schedule in one launch (true) or two (false).
inline LayerRequest with_one_launch(LayerRequest r, bool one_launch) {
  r.one_launch = one_launch;
  return r;
}

// ||a - b|| / ||b|| (returns +inf if a has a NaN).
double relative_error(const std::vector<float>& a, const std::vector<float>& b);

// Whether every value is NaN (what a failed call writes into its outputs).
bool all_nan(const std::vector<float>& v);

// Largest relative error of a single row: catches one misplaced row that a global norm could hide.
double worst_row_error(const std::vector<float>& a, const std::vector<float>& b, int row_len);

}  // namespace comet::testing
