// Weight gradients of the local experts: out_e = P_e^T Q_e, where P_e and Q_e are expert e's rows of
// two gathered buffers (dW1_e = G_e^T (g h)_e and dW0_e = dPre_e^T A_e). The GEMM's M runs over P's
// columns, N over Q's, and K over the expert's rows: both operands are read MN-major, and every tile
// has its own K range (the expert's segment of the plan). No comm role: the rows are all here.
//   tiles        (expert, M-block, N-block), N-block fastest: a block's successive tiles share P's slab
//   K range      K-tiles [expert_offset[e] / TileK, + ceil(expert_rows[e] / TileK)); the last one
//                reaches into the segment's padding rows, which the callers keep zero
//   epilogue     fp32 accumulators -> staged per warp in shared memory -> out (fp32 or bf16), overwritten
//                or added to; each element is written by one tile, so the result is bitwise reproducible
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

// The epilogue stages each consumer warp's 16 rows through its slab of the block's staging memory (as
// store_tile in epilogue.cuh does for the forward), 32 fp32 columns at a time, and then writes whole row
// segments: 8 columns per lane, 16-byte bf16 or 2 x 16-byte fp32 stores (and loads, to accumulate).
// Straight from the wgmma registers every store covered 8 rows x 8 or 16 bytes; with the short K of a
// weight gradient (an expert's rows: 250 at DeepSeek-V3 EP 8, 1024 tokens) those stores held the kernel
// to 58 % of cuBLAS's rate. The sum with the old value is formed in fp32 and rounded once, as before.
template <class Cfg>
struct WeightGradHooks {
  static constexpr int kChunkCols = 32;  // fp32 columns per staged slab row (128 of its 144 bytes)
  static_assert(kChunkCols * 4 <= kEpiloguePitch && Cfg::TileN % kChunkCols == 0);
  static_assert(Cfg::TileM == kEpilogueWarps * kEpilogueRows);
  const WeightGradParams<Cfg>& p;

  __device__ void before_load(const TileCoord&, int) {}

  template <class Acc>
  __device__ void epilogue(const Acc& acc, const TileCoord& tile, int mma_thread, char* staging) {
    using namespace cute;
    typename Cfg::TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(mma_thread);
    Tensor coords = thread_mma.partition_C(make_identity_tensor(take<0, 2>(typename Cfg::TileShape{})));
    const int M = p.ext.rows_cap, N = p.ext.n;
    const int warp = mma_thread / 32, lane = mma_thread % 32;
    const int row0 = tile.m_block * Cfg::TileM + warp * kEpilogueRows;  // the warp's first output row
    const int rows = min(kEpilogueRows, M - row0);
    if (rows <= 0) return;
    char* slab = staging + warp * kEpilogueRows * kEpiloguePitch;
    const size_t base = size_t(tile.expert) * M * N + size_t(row0) * N;
    const int c_first = get<1>(coords(0));  // every element's column is c_first + a multiple of 8

    CUTE_UNROLL
    for (int q = 0; q < Cfg::TileN / kChunkCols; ++q) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 2) {  // (i, i+1): two adjacent columns of one row
        const int off = get<1>(coords(i)) - c_first;  // a multiple of 8, known once unrolled
        if (off / kChunkCols != q) continue;          // folds away
        const int r = get<0>(coords(i)) - warp * kEpilogueRows;
        *reinterpret_cast<float2*>(slab + r * kEpiloguePitch + (c_first + off % kChunkCols) * 4) =
            float2{acc(i), acc(i + 1)};
      }
      __syncwarp();
      constexpr int kUnits = kChunkCols / 8;  // 8-column units per staged row
      for (int u = lane; u < kEpilogueRows * kUnits; u += 32) {
        const int r = u / kUnits, col = tile.n_block * Cfg::TileN + q * kChunkCols + (u % kUnits) * 8;
        if (r >= rows || col >= N) continue;  // N is a multiple of 8: a unit is all in or all out
        const float4* from = reinterpret_cast<const float4*>(slab + r * kEpiloguePitch + (u % kUnits) * 32);
        float4 lo = from[0], hi = from[1];
        const size_t at = base + size_t(r) * N + col;
        if (p.out_f32) {
          float4* o = reinterpret_cast<float4*>(static_cast<float*>(p.out) + at);
          if (p.accumulate) {
            const float4 a = o[0], b = o[1];
            lo = float4{lo.x + a.x, lo.y + a.y, lo.z + a.z, lo.w + a.w};
            hi = float4{hi.x + b.x, hi.y + b.y, hi.z + b.z, hi.w + b.w};
          }
          o[0] = lo;
          o[1] = hi;
        } else {
          uint4* o = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p.out) + at);
          if (p.accumulate) {
            const uint4 old = *o;
            const float2 a = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(old.x));
            const float2 b = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(old.y));
            const float2 c = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(old.z));
            const float2 d = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162&>(old.w));
            lo = float4{lo.x + a.x, lo.y + a.y, lo.z + b.x, lo.w + b.y};
            hi = float4{hi.x + c.x, hi.y + c.y, hi.z + d.x, hi.w + d.y};
          }
          uint4 v;
          reinterpret_cast<__nv_bfloat162&>(v.x) = __floats2bfloat162_rn(lo.x, lo.y);
          reinterpret_cast<__nv_bfloat162&>(v.y) = __floats2bfloat162_rn(lo.z, lo.w);
          reinterpret_cast<__nv_bfloat162&>(v.z) = __floats2bfloat162_rn(hi.x, hi.y);
          reinterpret_cast<__nv_bfloat162&>(v.w) = __floats2bfloat162_rn(hi.z, hi.w);
          *o = v;
        }
      }
      __syncwarp();  // the slab is read before the next chunk overwrites it
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
