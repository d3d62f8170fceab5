// Device builder, kernel 4 of 4: tile_order, the M-tiles sorted by (order wave, m) (plan.hpp), by
// merging rather than sorting. Inside one expert the tiles' keys never decrease (the all-local tiles,
// key -1, come first; after them each key is the unit of the tile's last row, and rows follow unit order
// with at most one row per unit and expert), the wave is a nondecreasing function of the key, and a
// tile's order wave is 0 or the wave of a tile at or after it in the same chunk, so the tiles' order
// waves form E_l sorted runs. A tile's place is the number
// of tiles before it in every run: in runs of earlier experts (smaller m) those with key <= its key,
// in runs of later experts those with key < its key, in its own run the tiles before it. One warp per
// tile, one lane per run, binary searches over the keys staged in shared memory.
#pragma once

#include "plan/device_build_layout.cuh"
#include "plan/wave_chunk_rule.hpp"

namespace comet::plan_dev {

inline constexpr int kOrderWarps = 8;
inline constexpr int kOrderTilesPerWarp = 4;
inline constexpr int kOrderTilesPerBlock = kOrderWarps * kOrderTilesPerWarp;
// Keys are staged in shared memory when they fit (every sm_90 part has 227 KB per block).
inline constexpr size_t kOrderSmemKeysMax = 160 * 1024;

__host__ __device__ inline size_t order_kernel_smem(const BuildGeometry& g) {
  const size_t bytes = size_t(g.max_tiles) * sizeof(int32_t);
  return bytes <= kOrderSmemKeysMax ? bytes : 0;
}

// Number of waves in [lo, hi) that are < wave (or <= wave when `inclusive`).
template <class WaveAt>
__device__ inline int count_below(WaveAt wave_at, int lo, int hi, int wave, bool inclusive) {
  const int start = lo;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    const int w = wave_at(mid);
    if (w < wave || (inclusive && w == wave)) lo = mid + 1;
    else hi = mid;
  }
  return lo - start;
}

__global__ void __launch_bounds__(kOrderWarps * 32) plan_order_kernel(BuildGeometry g, PlanView v, bool keys_in_smem) {
  extern __shared__ int32_t order_smem[];                  // [num_tiles] waves when keys_in_smem
  __shared__ int32_t s_first_tile[kMaxLocalExperts + 1];  // first tile of each expert's run
  __shared__ int32_t s_rows;                               // the rank's rows: its load class picks the chunk
  const int El = g.local_experts;
  const int tiles = *v.num_tiles;
  if (threadIdx.x == 0) s_rows = 0;
  __syncthreads();
  int rows = 0;
  for (int e = threadIdx.x; e <= El; e += blockDim.x) {
    s_first_tile[e] = v.expert_offset[e] / g.tile_m;
    if (e < El) rows += v.expert_rows[e];
  }
  atomicAdd(&s_rows, rows);
  __syncthreads();  // an order wave reads its expert's first and last tile, and the chunk
  const int chunk = plan_wave_chunk(g.wave_chunk, g.chunk_rule, s_rows);
  auto wave_of_tile = [&](int m) {
    const int e = segment_of(s_first_tile, El, m);
    return tile_order_wave(m, s_first_tile[e], s_first_tile[e + 1], chunk, v.tile_key, v.unit_src, g.world, g.rank,
                           g.pull_order);
  };
  if (keys_in_smem) {
    for (int m = threadIdx.x; m < tiles; m += blockDim.x) order_smem[m] = wave_of_tile(m);
  }
  auto wave_at = [&](int m) { return keys_in_smem ? order_smem[m] : wave_of_tile(m); };
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int q = 0; q < kOrderTilesPerWarp; ++q) {
    const int m = (blockIdx.x * kOrderWarps + warp) * kOrderTilesPerWarp + q;  // warp-uniform
    if (m >= g.max_tiles) break;
    if (m >= tiles) {
      if (lane == 0) v.tile_order[m] = -1;
      continue;
    }
    const int key = wave_at(m);
    const int own = segment_of(s_first_tile, El, m);
    int before = 0;
    for (int e = lane; e < El; e += 32) {
      const int lo = s_first_tile[e], hi = s_first_tile[e + 1];
      if (e < own) before += count_below(wave_at, lo, hi, key, true);
      else if (e > own) before += count_below(wave_at, lo, hi, key, false);
      else before += m - lo;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) before += __shfl_xor_sync(0xffffffffu, before, offset);
    if (lane == 0) v.tile_order[before] = m;
  }
}

}  // namespace comet::plan_dev
