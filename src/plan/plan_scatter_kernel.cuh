// Device builder, kernel 3 of 4. Two kinds of blocks, writing disjoint entries:
//  * token blocks (one per count-kernel chunk, one token per thread): each unit writes its own
//    entries (unit_src, unit_token, unit_rows, unit_gates) and its rows' (row_unit, row_slot); a row
//    that is the last valid row of its M-tile and comes from another rank writes the tile's key
//    (rows of an expert segment follow unit order, so the last row's unit is the largest).
//  * fill blocks (grid-stride over capacity): everything else — units >= num_units, padding rows and
//    rows past the plan, and per tile its expert, valid rows, remote rows and, for all-local tiles
//    and tiles >= num_tiles, the key -1.
// On a build error the token blocks do nothing, and the empty plan the scan kernel published makes
// the fill blocks write every entry.
#pragma once

#include "plan/device_build_layout.cuh"

namespace comet::plan_dev {

inline constexpr int kFillItemsPerThread = 8;

__device__ inline void scatter_chunk(const BuildGeometry& g, const BuildScratch& sc, const PlanView& v, int block) {
  if (v.status[0] != 0) return;
  const int W = g.world, El = g.local_experts, k = g.topk, tm = g.tile_m;
  const int j = block / g.chunks, c = block % g.chunks;
  // Compared before adding: c * kChunk + threadIdx.x may pass INT_MAX in the last chunk.
  if (int(threadIdx.x) >= sc.position_tokens[j] - c * kChunk) return;
  const int token = c * kChunk + threadIdx.x;
  const int unit_rank = sc.token_unit[size_t(j) * g.max_tokens + token];
  if (unit_rank < 0) return;
  const int u = sc.chunk_units[block] + unit_rank;
  v.unit_src[u] = g.source_at(j);
  v.unit_token[u] = token;
  const size_t slot_base = size_t(j) * g.slot_stride + size_t(token) * k;
  const int32_t* chunk_first_row = sc.chunk_rows + size_t(block) * El;
  for (int slot = 0; slot < k; ++slot) {
    const int32_t code = sc.slot_code[slot_base + slot];
    const size_t entry = size_t(u) * k + slot;
    if (code < 0) {
      v.unit_rows[entry] = -1;
      v.unit_gates[entry] = 0.0f;
      continue;
    }
    const int e = code / kChunk, rank = code % kChunk;
    const int row = v.segment_offset[e * W + j] + chunk_first_row[e] + rank;
    v.unit_rows[entry] = row;
    v.unit_gates[entry] = sc.slot_gate[slot_base + slot];
    v.row_unit[row] = u;
    v.row_slot[row] = slot;
    if (j > 0) {
      const int expert_end = v.expert_offset[e] + v.expert_rows[e];
      if (row + 1 == expert_end || (row + 1) % tm == 0) v.tile_key[row / tm] = u;
    }
  }
}

__device__ inline void fill_unused(const BuildGeometry& g, const PlanView& v, int fill_block, int fill_blocks) {
  __shared__ int s_offset[kMaxLocalExperts + 1];  // expert_offset
  __shared__ int s_end[kMaxLocalExperts];         // end of the expert's valid rows
  __shared__ int s_local_end[kMaxLocalExperts];   // end of its position-0 (local) rows
  const int W = g.world, El = g.local_experts, k = g.topk, tm = g.tile_m;
  for (int e = threadIdx.x; e <= El; e += blockDim.x) {
    const int offset = v.expert_offset[e];
    s_offset[e] = offset;
    if (e < El) {
      s_end[e] = offset + v.expert_rows[e];
      s_local_end[e] = offset + v.segment_rows[e * W];
    }
  }
  __syncthreads();
  const int units = *v.num_units, tiles = *v.num_tiles, total_rows = s_offset[El];

  const int64_t U = g.max_units, slots = int64_t(g.max_units) * k, R = g.max_rows, M = g.max_tiles;
  const int64_t items = U + slots + R + M;
  for (int64_t i = int64_t(fill_block) * blockDim.x + threadIdx.x; i < items; i += int64_t(fill_blocks) * blockDim.x) {
    if (i < U) {
      if (i >= units) v.unit_src[i] = v.unit_token[i] = -1;
      continue;
    }
    int64_t x = i - U;
    if (x < slots) {
      if (x / k >= units) {
        v.unit_rows[x] = -1;
        v.unit_gates[x] = 0.0f;
      }
      continue;
    }
    x -= slots;
    if (x < R) {
      const int row = int(x);
      const bool valid = row < total_rows && row < s_end[segment_of(s_offset, El, row)];
      if (!valid) v.row_unit[row] = v.row_slot[row] = -1;
      continue;
    }
    const int m = int(x - R);
    if (m >= tiles) {
      v.tile_expert[m] = v.tile_rows[m] = v.tile_remote_rows[m] = v.tile_key[m] = -1;
      continue;
    }
    const int first = m * tm, e = segment_of(s_offset, El, first);
    const int rows = min(first + tm, s_end[e]) - first;
    const int local = min(max(s_local_end[e] - first, 0), rows);
    v.tile_expert[m] = e;
    v.tile_rows[m] = rows;
    v.tile_remote_rows[m] = rows - local;
    if (local == rows) v.tile_key[m] = -1;  // otherwise the token blocks write it
  }
}

__global__ void __launch_bounds__(kChunk) plan_scatter_kernel(BuildGeometry g, BuildScratch sc, PlanView v,
                                                               int token_blocks) {
  if (int(blockIdx.x) < token_blocks) scatter_chunk(g, sc, v, blockIdx.x);
  else fill_unused(g, v, blockIdx.x - token_blocks, gridDim.x - token_blocks);
}

}  // namespace comet::plan_dev
