// Device builder, kernels 4a-4c: pull_unit, the comm blocks' pull positions (plan.hpp, "Pull
// position"). They read only what the scatter kernel wrote (row_unit, unit_rows, the counts).
//  * source order: the place kernel alone, p at position p < num_units.
//  * expert order: the remote units sorted by their first row, i.e. each remote unit at the first of
//    its rows, in row order:
//      count  one warp per M-tile counts its rows that are a remote unit's first row -> tile_pulls[m];
//      scan   one block turns tile_pulls into each tile's first position (from num_local_units on);
//      place  one warp per M-tile writes its units at those positions, in row order (ballot ranks).
//    Local positions are the identity, as in source order.
// Every grid is sized by capacity; the place kernel's grid-stride loop also writes -1 past num_units
// (an error build's empty plan has num_units = num_tiles = 0, so it writes -1 everywhere).
#pragma once

#include <cub/block/block_scan.cuh>

#include "plan/device_build_layout.cuh"

namespace comet::plan_dev {

inline constexpr int kPullWarps = 8;           // M-tiles per block of the count and place kernels
inline constexpr int kPullScanThreads = 1024;  // the scan kernel's one block

__host__ __device__ inline int pull_tile_blocks(const BuildGeometry& g) {
  return (g.max_tiles + kPullWarps - 1) / kPullWarps;
}

// Row `row` is the first row of a remote unit: a pulled unit, none of whose rows comes before it.
__device__ inline bool first_remote_row(const PlanView& v, int row, int local_units, int k) {
  const int u = v.row_unit[row];
  if (u < local_units) return false;  // padding (-1) or a local unit
  for (int slot = 0; slot < k; ++slot) {
    const int r = v.unit_rows[size_t(u) * k + slot];
    if (r >= 0 && r < row) return false;
  }
  return true;
}

__global__ void __launch_bounds__(kPullWarps * 32) plan_pull_count_kernel(BuildGeometry g, PlanView v, BuildScratch sc) {
  const int m = blockIdx.x * kPullWarps + threadIdx.x / 32, lane = threadIdx.x % 32;  // warp-uniform
  if (m >= *v.num_tiles) return;
  const int local_units = *v.num_local_units;
  int count = 0;
  for (int r = lane; r < g.tile_m; r += 32) count += first_remote_row(v, m * g.tile_m + r, local_units, g.topk);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_xor_sync(0xffffffffu, count, offset);
  if (lane == 0) sc.tile_pulls[m] = count;
}

__global__ void __launch_bounds__(kPullScanThreads) plan_pull_scan_kernel(PlanView v, BuildScratch sc) {
  using BlockScan = cub::BlockScan<int, kPullScanThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const int tiles = *v.num_tiles;
  int run = *v.num_local_units;
  for (int base = 0; base < tiles; base += kPullScanThreads) {
    const int m = base + threadIdx.x;
    const int count = m < tiles ? sc.tile_pulls[m] : 0;
    int first = 0, sum = 0;
    BlockScan(scan_storage).ExclusiveSum(count, first, sum);
    if (m < tiles) sc.tile_pulls[m] = run + first;
    run += sum;
    __syncthreads();  // scan_storage is reused
  }
}

__global__ void __launch_bounds__(kPullWarps * 32) plan_pull_place_kernel(BuildGeometry g, PlanView v, BuildScratch sc) {
  const int units = *v.num_units;
  const int local_units = *v.num_local_units;
  const bool by_expert = g.pull_order == PullOrder::expert;
  // Positions that are not a tile's: the identity (local units; every unit in source order), -1 past the units.
  const int fixed_end = by_expert ? local_units : units;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < g.max_units; p += gridDim.x * blockDim.x) {
    if (p < fixed_end) v.pull_unit[p] = p;
    else if (p >= units) v.pull_unit[p] = -1;
  }
  if (!by_expert) return;
  const int m = blockIdx.x * kPullWarps + threadIdx.x / 32, lane = threadIdx.x % 32;  // warp-uniform
  if (m >= *v.num_tiles) return;
  int position = sc.tile_pulls[m];
  for (int r0 = 0; r0 < g.tile_m; r0 += 32) {
    const int row = m * g.tile_m + r0 + lane;
    const bool first = r0 + lane < g.tile_m && first_remote_row(v, row, local_units, g.topk);
    const unsigned firsts = __ballot_sync(0xffffffffu, first);
    if (first) v.pull_unit[position + __popc(firsts & ((1u << lane) - 1))] = v.row_unit[row];
    position += __popc(firsts);
  }
}

}  // namespace comet::plan_dev
