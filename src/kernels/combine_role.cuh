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
// smem: kCombineSmemPerWarp bytes per warp of the block.
constexpr int kCombineBatch = 8;  // items per warp iteration
constexpr int kCombineSmemPerWarp = kCombineBatch * kMaxTopK * 8;

__device__ inline void run_combine_role(const CombineArgs& c, int comm_index, int n_comm, int32_t epoch,
                                        bool wait_done, char* smem, const TeamDeviceView& team) {
  constexpr int kBatch = kCombineBatch;
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
  // This warp's staging of the batch's rows and gates: [b][j].
  int32_t* rows_s = reinterpret_cast<int32_t*>(smem + (threadIdx.x / 32) * kCombineSmemPerWarp);
  float* gates_s = reinterpret_cast<float*>(rows_s + kBatch * kMaxTopK);

  for (long long first = (long long)warp_id * kBatch; first < items; first += (long long)n_warps * kBatch) {
    const int batch = int(items - first < kBatch ? items - first : kBatch);
    auto unit_of = [&](int b) { return unit0 + int((first + b) % units); };
    auto chunk_of = [&](int b) { return int((first + b) / units); };
    // 1. Metadata, all loads independent: lane b: owner and token of item b; lanes over (b, j):
    //    slot j's row and gate.
    int my_owner = 0, my_token = 0;
    if (lane < batch) {
      my_owner = c.plan.unit_src[unit_of(lane)];
      my_token = c.plan.unit_token[unit_of(lane)];
    }
    for (int p = lane; p < batch * k; p += 32) {
      const int b = p / k, j = p % k;
      rows_s[b * kMaxTopK + j] = c.plan.unit_rows[size_t(unit_of(b)) * k + j];
      gates_s[b * kMaxTopK + j] = c.plan.unit_gates[size_t(unit_of(b)) * k + j];
    }
    __syncwarp();
    // 2. Wait until every row slice of the batch is done (lanes poll different flags in parallel).
    if (wait_done) {
      for (int idx = lane; idx < batch * k * sub_blocks; idx += 32) {
        const int b = idx / (k * sub_blocks), j = (idx / sub_blocks) % k;
        const int row = rows_s[b * kMaxTopK + j];
        const int n = chunk_of(b) * sub_blocks + idx % sub_blocks;
        if (row < 0 || n >= c.n_blocks) continue;
        const int flag = (row / c.tile_m) * c.n_blocks + n;
        dev::wait_flag_gpu(&c.tile_done[flag], epoch, team, WaitSite::tile_done, flag);
      }
      __syncwarp();  // lanes' acquires now cover the whole warp's reads below
    }
    // 3. Weighted sum over each unit's slots, fp32, fixed slot order; two slots' loads in flight.
    float acc[kBatch][8];
    int col[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[b][i] = 0.f;
      col[b] = b < batch ? chunk_of(b) * kChunk + lane * 8 : c.hidden;  // c.hidden: inactive
    }
    for (int j = 0; j < k; j += 2) {
      uint4 v0[kBatch], v1[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (col[b] >= c.hidden) continue;
        const int r0 = rows_s[b * kMaxTopK + j];
        const int r1 = j + 1 < k ? rows_s[b * kMaxTopK + j + 1] : -1;
        if (r0 >= 0) v0[b] = *reinterpret_cast<const uint4*>(c.y + size_t(r0) * c.hidden + col[b]);
        if (r1 >= 0) v1[b] = *reinterpret_cast<const uint4*>(c.y + size_t(r1) * c.hidden + col[b]);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (col[b] >= c.hidden) continue;
        if (rows_s[b * kMaxTopK + j] >= 0) accumulate_bf16x8(acc[b], v0[b], gates_s[b * kMaxTopK + j]);
        if (j + 1 < k && rows_s[b * kMaxTopK + j + 1] >= 0)
          accumulate_bf16x8(acc[b], v1[b], gates_s[b * kMaxTopK + j + 1]);
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
    __syncwarp();  // the staging is rewritten by the next batch
  }
}

}  // namespace comet::kernels
