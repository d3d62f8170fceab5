// Layer 1's comm role: as soon as column block n of an expert's output rows is done, weight each row
// by its gate, sum the rows this rank holds for the same token (in k-slot order), and write the
// partial row slice into the token owner's receive slot for this rank. The owner later sums the slots
// in rank order (final_reduce), so the result is bitwise reproducible whatever n_comm or timing is.
//
// Work items are (column chunk n of 256 columns, unit u), n-major, so early columns ship first while
// the compute blocks make the next ones. A chunk covers 256 / TileN GEMM column blocks, whose done
// flags are all checked. Each comm warp takes kBatch consecutive items at a time: lanes first load the
// batch's metadata in parallel (rows, gates, owners: no chains of dependent loads), then every lane
// loads its 8 columns (16 bytes) of all the batch's rows for one slot at a time, so kBatch loads are
// in flight per lane.
#pragma once

#include <cuda_bf16.h>

#include "kernels/layer_args.hpp"
#include "team/device_wait.cuh"

namespace comet::kernels {

__device__ __forceinline__ void accumulate_bf16x8(float (&acc)[8], const uint4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] += w * f.x;
    acc[2 * i + 1] += w * f.y;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&acc)[8]) {
  uint4 out;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return out;
}

// Called by every thread of a comm block. wait_done = false skips the flag waits (comm-only timing).
__device__ inline void run_combine_role(const CombineArgs& c, int comm_index, int n_comm, int32_t epoch,
                                        bool wait_done, const TeamDeviceView& team) {
  constexpr int kBatch = 8;    // items per warp iteration (all in one column chunk or two)
  constexpr int kChunk = 256;  // columns per item: 32 lanes x 8
  const int sub_blocks = kChunk / c.tile_n;
  const int n_chunks = (c.hidden + kChunk - 1) / kChunk;
  const int lane = threadIdx.x % 32;
  const int warps_per_block = blockDim.x / 32;
  const int n_warps = n_comm * warps_per_block;
  const int warp_id = comm_index * warps_per_block + threadIdx.x / 32;
  const int unit0 = c.unit_begin >= 0 ? c.unit_begin : 0;
  const int units = (c.unit_end >= 0 ? min(c.unit_end, *c.plan.num_units) : *c.plan.num_units) - unit0;
  if (units <= 0) return;
  const long long items = (long long)units * n_chunks;
  const int k = c.topk;

  for (long long first = (long long)warp_id * kBatch; first < items; first += (long long)n_warps * kBatch) {
    const int batch = int(items - first < kBatch ? items - first : kBatch);
    // 1. Metadata of the batch: lane b holds item b's unit, owner, token and column chunk.
    int my_unit = 0, my_owner = 0, my_token = 0, my_chunk = 0;
    if (lane < batch) {
      const long long item = first + lane;
      my_chunk = int(item / units);
      my_unit = unit0 + int(item % units);
      my_owner = c.plan.unit_src[my_unit];
      my_token = c.plan.unit_token[my_unit];
    }
    // 2. Wait until every row slice of the batch is done (lanes poll different flags in parallel).
    if (wait_done) {
      for (int idx = lane; idx < batch * k * sub_blocks; idx += 32) {
        const long long item = first + idx / (k * sub_blocks);
        const int chunk = int(item / units), u = unit0 + int(item % units);
        const int row = c.plan.unit_rows[size_t(u) * k + (idx / sub_blocks) % k];
        const int n = chunk * sub_blocks + idx % sub_blocks;
        if (row < 0 || n >= c.n_blocks) continue;
        const int flag = (row / c.tile_m) * c.n_blocks + n;
        dev::wait_flag_gpu(&c.tile_done[flag], epoch, team, WaitSite::tile_done, flag);
      }
      __syncwarp();  // lanes' acquires now cover the whole warp's reads below
    }
    // 3. Weighted sum over each unit's slots, fp32, fixed slot order; kBatch loads in flight.
    float acc[kBatch][8];
    int col[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[b][i] = 0.f;
      col[b] = __shfl_sync(0xffffffffu, my_chunk, b) * kChunk + lane * 8;
      if (b >= batch) col[b] = c.hidden;  // inactive
    }
    for (int j = 0; j < k; ++j) {
      // Lane b fetches slot j's row and gate of item b; everybody gets them by shuffle.
      int my_row = -1;
      float my_gate = 0.f;
      if (lane < batch) {
        my_row = c.plan.unit_rows[size_t(my_unit) * k + j];
        my_gate = c.plan.unit_gates[size_t(my_unit) * k + j];
      }
      uint4 v[kBatch];
      int row[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        row[b] = __shfl_sync(0xffffffffu, my_row, b);
        if (row[b] >= 0 && col[b] < c.hidden)
          v[b] = *reinterpret_cast<const uint4*>(c.y + size_t(row[b]) * c.hidden + col[b]);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const float gate = __shfl_sync(0xffffffffu, my_gate, b);
        if (row[b] >= 0 && col[b] < c.hidden) accumulate_bf16x8(acc[b], v[b], gate);
      }
    }
    // 4. Ship: the owner's slot for this rank (or this rank's own partial buffer).
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int owner = __shfl_sync(0xffffffffu, my_owner, b);
      const int token = __shfl_sync(0xffffffffu, my_token, b);
      if (col[b] >= c.hidden) continue;
      __nv_bfloat16* dst = owner == c.rank
                               ? c.self_partial + size_t(token) * c.hidden
                               : c.peer_recv[owner] + (size_t(c.rank) * c.max_tokens + token) * c.hidden;
      *reinterpret_cast<uint4*>(dst + col[b]) = pack_bf16x8(acc[b]);
    }
  }
}

}  // namespace comet::kernels
