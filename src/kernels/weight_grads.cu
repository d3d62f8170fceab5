// Launch of the weight-gradient GEMM (weight_grad_kernel.cuh): one persistent grid over the tiles of
// every local expert, 128 x 256 tiles (the widths of the weights are multiples of 256 in the models we
// know; an M of 128 keeps the K-per-expert pipelines short).
#include <algorithm>

#include "comet/cuda_check.hpp"
#include "kernels/fused_launch.cuh"
#include "kernels/weight_grad_kernel.cuh"

namespace comet::kernels {

using WeightGradConfig = GemmConfig<kTileM, 256, Major::mn, Major::mn>;

void launch_weight_grad(const WeightGradLaunch& l, cudaStream_t stream) {
  if (l.kernel != WeightGradKernel::persistent) {
    launch_weight_grad_grouped(l, stream);
    return;
  }
  using Cfg = WeightGradConfig;
  COMET_REQUIRE(l.p_cols % 8 == 0 && l.q_cols % 8 == 0 && l.p_cols > 0 && l.q_cols > 0,
                "weight gradient: operand widths (", l.p_cols, ", ", l.q_cols, ") must be positive multiples of 8");
  COMET_REQUIRE(l.experts > 0 && l.rows_cap > 0 && l.rows_cap % Cfg::TileK == 0, "weight gradient: bad extents");
  const LaunchLimits lim = resident_limits(weight_grad_kernel<Cfg>, Cfg::kSharedBytes, Cfg::kThreads);
  WeightGradParams<Cfg> p{};
  // GEMM M = P's columns, N = Q's columns, K = the gathered rows; one L (the experts are K ranges).
  p.ext = GemmExtents{l.p_cols, l.q_cols, l.rows_cap, 1};
  p.mainloop = Cfg::make_params(l.p, l.p_cols, l.rows_cap, l.q, l.q_cols, 1);
  p.expert_offset = l.expert_offset;
  p.expert_rows = l.expert_rows;
  p.experts = l.experts;
  p.m_blocks = (l.p_cols + Cfg::TileM - 1) / Cfg::TileM;
  p.n_blocks = (l.q_cols + Cfg::TileN - 1) / Cfg::TileN;
  p.out = l.out;
  p.out_f32 = l.out_f32;
  p.accumulate = l.accumulate;
  const long long tiles = (long long)l.experts * p.m_blocks * p.n_blocks;
  COMET_REQUIRE(tiles < (1LL << 31), "weight gradient: too many tiles");
  const int grid = int(std::min<long long>(tiles, lim.max_blocks));
  weight_grad_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSharedBytes, stream>>>(p);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
