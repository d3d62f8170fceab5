// Capacity resolution and the per-rank memory of a FusedMoe (comet/footprint.hpp). MoeEngine
// allocates from these numbers; a GPU test holds it to them (FusedMoeMemory.FootprintIsWhatIsAllocated).
#include "comet/footprint.hpp"

#include <algorithm>
#include <cmath>

#include "comet/device_plan.hpp"
#include "comet/fp8.hpp"
#include "comet/plan.hpp"
#include "comet/tune.hpp"
#include "kernels/layer_sync.hpp"
#include "kernels/fused_layers.hpp"

namespace comet {
namespace {

constexpr int kTileM = kernels::kTileM;
constexpr long long kMaxRows = (1LL << 31) - kTileM;  // rounded up to kTileM, rows must stay an int

long long round_up(long long v, long long to) { return (v + to - 1) / to * to; }

// Every allocation of the engine is at least this large (MoeEngine::alloc).
size_t alloc_size(size_t bytes) { return std::max<size_t>(bytes, 16); }

}  // namespace

MoeCapacity resolve_capacity(const MoeShape& shape, const Parallel& par, const MoeCapacity& cap) {
  COMET_REQUIRE(cap.max_tokens_per_rank > 0, "FusedMoe: MoeCapacity::max_tokens_per_rank must be positive");
  COMET_REQUIRE(cap.max_rows_per_rank >= 0, "FusedMoe: MoeCapacity::max_rows_per_rank must be >= 0");
  COMET_REQUIRE(cap.max_rows_per_rank <= kMaxRows, "FusedMoe: MoeCapacity::max_rows_per_rank (", cap.max_rows_per_rank,
                ") must be at most 2^31 - ", kTileM);
  COMET_REQUIRE(std::isfinite(cap.load_factor) && cap.load_factor >= 0.0,
                "FusedMoe: MoeCapacity::load_factor must be finite and >= 0, got ", cap.load_factor);
  COMET_REQUIRE(cap.max_rows_per_rank == 0 || cap.load_factor == 0.0,
                "FusedMoe: give MoeCapacity::max_rows_per_rank or load_factor, not both");
  const long long W = par.world(), T = cap.max_tokens_per_rank, k = shape.topk, E = shape.num_experts;
  const long long el = par.local_experts(shape);
  const long long padding = el * (kTileM - 1);
  const long long worst = W * T * std::min(k, el) + padding;
  MoeCapacity out = cap;
  out.load_factor = 0.0;
  if (cap.max_rows_per_rank > 0) {
    out.max_rows_per_rank = int(round_up(cap.max_rows_per_rank, kTileM));
    return out;
  }
  long long rows = worst;
  if (cap.load_factor > 0.0) {
    const double mean = double(W) * double(T) * double(k) * double(el) / double(E);
    rows = std::min(worst, (long long)std::ceil(cap.load_factor * mean) + padding);
  }
  COMET_REQUIRE(rows < kMaxRows, "FusedMoe: the gathered buffer would have ", rows,
                " rows; give MoeCapacity::max_rows_per_rank (or a smaller load_factor) explicitly");
  out.max_rows_per_rank = int(round_up(std::max(rows, 1LL), kTileM));
  return out;
}

int gate_partial_columns(const MoeShape& shape, const Parallel& par) {
  return (par.ffn_shard(shape) + kTileM - 1) / kTileM;
}

LayerFootprint layer_footprint(const MoeShape& shape, const Parallel& par, const MoeCapacity& cap, bool training,
                               DType dtype) {
  COMET_REQUIRE(cap.max_rows_per_rank > 0 && cap.max_rows_per_rank % kTileM == 0,
                "layer_footprint: the capacity must be resolved (resolve_capacity)");
  const size_t rows = size_t(cap.max_rows_per_rank), T = size_t(cap.max_tokens_per_rank);
  const size_t H = size_t(shape.hidden), W = size_t(par.world()), k = size_t(shape.topk);
  const size_t fs = size_t(par.ffn_shard(shape)), n0 = is_gated(shape.act) ? 2 * fs : fs;
  const int max_tiles = int(rows / kTileM), max_n_blocks = (shape.hidden + 127) / 128;
  LayerFootprint f;
  f.gathered = alloc_size(rows * H * 2);
  f.expert_out = training ? alloc_size(rows * H * 2) : 0;
  f.hidden = alloc_size(rows * fs * 2);
  f.self_partial = alloc_size(T * H * 2);
  f.flags = alloc_size(kernels::LayerSync::bytes(max_tiles, max_n_blocks)) + alloc_size(kLaunchLayers * 4);
  const PlanConfig plan{shape, par, 0, kTileM, PlanCapacity{cap.max_tokens_per_rank, cap.max_rows_per_rank}};
  f.plan = plan_bytes(plan) + plan_scratch_bytes(plan);
  if (training) {
    f.training = alloc_size(rows * n0 * 2) + alloc_size(rows * H * 2) +
                 alloc_size(rows * size_t(gate_partial_columns(shape, par)) * sizeof(float)) +
                 (fs <= H ? 0 : alloc_size(rows * fs * 2));
  }
  f.workspaces = alloc_size(kernels::expert_gemm_grouped_workspace_bytes(par.local_experts(shape))) +
                 (training ? alloc_size(2 * kernels::weight_grad_grouped_workspace_bytes(par.local_experts(shape))) : 0);
  const size_t x_row = dtype == DType::e4m3 ? size_t(fp8::record_bytes(shape.hidden)) : H * 2;
  f.symmetric = T * x_row + RoutingBufferLayout{cap.max_tokens_per_rank, shape.topk}.bytes() + W * T * H * 2 + W * 4 +
                (training ? W * T * k * sizeof(float) : 0);
  return f;
}

}  // namespace comet
