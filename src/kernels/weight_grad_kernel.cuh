// Weight gradients of the local experts: out_e = P_e^T Q_e, where P_e and Q_e are expert e's rows of
// two gathered buffers (dW1_e = G_e^T (g h)_e and dW0_e = dPre_e^T A_e). The GEMM's M runs over P's
// columns, N over Q's, and K over the expert's rows: both operands are read MN-major, and every tile
// has its own K range (the expert's segment of the plan). No comm role: the rows are all here.
//   tiles        (expert, M-block, N-block), N-block fastest: a block's successive tiles share P's slab
//   K range      K-tiles [expert_offset[e] / TileK, + ceil(expert_rows[e] / TileK)); the last one
//                reaches into the segment's padding rows, which the callers keep zero
//   epilogue     fp32 accumulators -> out (fp32 or bf16), overwritten or added to; each element is
//                written by one tile, so the result is bitwise reproducible
#pragma once

#include <cuda_bf16.h>

#include "kernels/compute_role.cuh"
#include "kernels/epilogue.cuh"

namespace comet::kernels {

template <class Cfg>
struct WeightGradParams {
  typename Cfg::MainloopParams mainloop;
  GemmExtents ext;  // rows_cap = P's columns (M), n = Q's columns, k = gathered rows, experts = 1
  const int32_t* expert_offset;
  const int32_t* expert_rows;
  int experts;
  int m_blocks;
  int n_blocks;
  void* out;  // [experts][M][N]
  bool out_f32;
  bool accumulate;
};

struct WeightGradSchedule {
  const int32_t* expert_offset;
  const int32_t* expert_rows;
  int experts, m_blocks, n_blocks, tile_m, tile_k;
  __device__ int count() const { return experts * m_blocks * n_blocks; }
  __device__ TileCoord at(int w) const {
    const int per_expert = m_blocks * n_blocks;
    const int e = w / per_expert, r = w % per_expert;
    TileCoord t{r / n_blocks, r % n_blocks, e, tile_m};
    t.k_begin = expert_offset[e] / tile_k;
    t.k_tiles = (expert_rows[e] + tile_k - 1) / tile_k;
    t.batch = 0;
    return t;
  }
};

template <class Cfg>
struct WeightGradHooks {
  const WeightGradParams<Cfg>& p;

  __device__ void before_load(const TileCoord&, int) {}

  template <class Acc>
  __device__ void epilogue(const Acc& acc, const TileCoord& tile, int mma_thread, char* /*staging*/) {
    using namespace cute;
    typename Cfg::TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(mma_thread);
    Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));
    const int M = p.ext.rows_cap, N = p.ext.n;
    const size_t base = size_t(tile.expert) * M * N;
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // (i, i+1): two adjacent columns of one row
      const int m = tile.m_block * Cfg::TileM + get<0>(coords(i));
      const int n = tile.n_block * Cfg::TileN + get<1>(coords(i));
      if (m >= M || n >= N) continue;
      const size_t at = base + size_t(m) * N + n;
      float2 v{acc(i), acc(i + 1)};
      if (p.out_f32) {
        float2* o = reinterpret_cast<float2*>(static_cast<float*>(p.out) + at);
        if (p.accumulate) {
          const float2 old = *o;
          v.x += old.x;
          v.y += old.y;
        }
        *o = v;
      } else {
        __nv_bfloat16* o = static_cast<__nv_bfloat16*>(p.out) + at;
        if (p.accumulate) {
          const float2 old = load_bf16x2(o);
          v.x += old.x;
          v.y += old.y;
        }
        store_bf16x2(o, v.x, v.y);
      }
    }
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) weight_grad_kernel(const __grid_constant__ WeightGradParams<Cfg> p) {
  extern __shared__ __align__(1024) char smem[];
  const WeightGradSchedule schedule{p.expert_offset, p.expert_rows, p.experts, p.m_blocks, p.n_blocks, Cfg::TileM,
                                    Cfg::TileK};
  WeightGradHooks<Cfg> hooks{p};
  run_compute_role<Cfg>(p.mainloop, p.ext, schedule, hooks, blockIdx.x, gridDim.x, smem);
}

}  // namespace comet::kernels
