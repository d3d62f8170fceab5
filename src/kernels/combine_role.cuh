// Layer 1's comm role: as soon as column block n of an expert's output rows is done, weight each row
// by its gate, sum the rows this rank holds for the same token (in k-slot order), and write the
// partial row slice into the token owner's receive slot for this rank. The owner later sums the slots
// in rank order (final_reduce), so the result is bitwise reproducible whatever n_comm or timing is.
//
// Work items are (column chunk of 256 columns, unit), chunk-major, so early columns ship first while
// the compute blocks make the next ones; a chunk covers 256 / TileN GEMM column blocks, whose done
// flags are all checked. Each comm warp takes batches of items (batch x k row slices of 512 bytes).
// The combine is latency-bound (register loads left a block far below its share of the link:
// docs/design-changes.md, Communication), so the slices travel with cp.async into a per-warp double buffer: batch t+1's
// loads are in flight while batch t is summed, and no registers are held by loads in flight. Every
// lane only ever touches its own 16 bytes of each slice, so the buffer needs no cross-lane ordering.
#pragma once

#include <cuda_bf16.h>

#include "kernels/bf16x8.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/cp_async.cuh"
#include "kernels/layer_args.hpp"
#include "team/device_wait.cuh"

namespace comet::kernels {

// Shared memory of the combine: per warp, two buffers of up to kCombineSlices row slices of 512 bytes
// (as many as the kernel's shared memory holds for all warps of the block).
constexpr int kCombineSlices = 16;
constexpr int kCombineSliceBytes = 512;  // 256 columns of bf16: 32 lanes x 16 bytes

// Called by every thread of a comm block. wait_done = false skips the flag waits (comm-only timing).
// The launcher checks that smem_bytes holds at least k slices x 2 per warp.
__device__ inline void run_combine_role(const CombineArgs& c, int comm_index, int n_comm, Epoch epoch,
                                        bool wait_done, char* smem, int smem_bytes, const TeamDeviceView& team) {
  constexpr int kChunk = 256;  // columns per item
  const int k = c.topk;
  const int slices = min(kCombineSlices, smem_bytes / (int(blockDim.x / 32) * 2 * kCombineSliceBytes));
  const int batch = max(1, min(8, slices / k));  // items per batch: batch * k <= slices
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
  const long long n_batches = (items + batch - 1) / batch;
  char* buffers = smem + (threadIdx.x / 32) * 2 * slices * kCombineSliceBytes;

  // What a batch needs after its loads: per (item b, slot j) pair p = b * k + j, lane p holds row and
  // gate; lane b holds the item's owner, token and column chunk.
  struct Batch {
    long long first = 0;
    int count = 0;
    int row = -1, owner = 0, token = 0, chunk = 0;
    float gate = 0.f;
  };
  // Loads the batch's metadata, waits for its tiles, and starts its slice copies into buffer `buf`.
  auto issue = [&](long long t, int buf) {
    Batch b;
    b.first = t * batch;
    b.count = int(items - b.first < batch ? items - b.first : batch);
    auto unit_of = [&](int i) { return unit0 + int((b.first + i) % units); };
    if (lane < b.count) {
      b.owner = c.plan.unit_src[unit_of(lane)];
      b.token = c.plan.unit_token[unit_of(lane)];
      b.chunk = int((b.first + lane) / units);
    }
    if (lane < b.count * k) {
      const int u = unit_of(lane / k);
      b.row = c.plan.unit_rows[size_t(u) * k + lane % k];
      b.gate = c.unit_weights ? 1.f : c.plan.unit_gates[size_t(u) * k + lane % k];
    }
    if (wait_done) {  // lane p waits for the GEMM column blocks of its slice
      const int chunk = int((b.first + lane / k) / units);
      for (int q = 0; q < sub_blocks && b.row >= 0; ++q) {
        const int n = chunk * sub_blocks + q;
        if (n >= c.n_blocks) break;
        const int flag = (b.row / c.tile_m) * c.n_blocks + n;
        dev::wait_flag_gpu(&c.tile_done[flag], epoch, team, WaitSite::tile_done, flag);
      }
      __syncwarp();  // the lanes' acquires cover the whole warp's copies below
    }
    char* dst = buffers + buf * slices * kCombineSliceBytes + lane * 16;
    for (int p = 0; p < b.count * k; ++p) {
      const int row = __shfl_sync(0xffffffffu, b.row, p);
      const int col = __shfl_sync(0xffffffffu, b.chunk, p / k) * kChunk + lane * 8;
      if (row >= 0 && col < c.hidden) dev::cp_async_16(dst + p * kCombineSliceBytes, c.y + size_t(row) * c.hidden + col);
    }
    dev::cp_async_commit();
    return b;
  };
  // Sums the batch's slices (fp32, slot order) and ships the partial rows.
  auto finish = [&](const Batch& b, int buf) {
    const char* src = buffers + buf * slices * kCombineSliceBytes + lane * 16;
    for (int i = 0; i < b.count; ++i) {
      const int col = __shfl_sync(0xffffffffu, b.chunk, i) * kChunk + lane * 8;
      const int owner = __shfl_sync(0xffffffffu, b.owner, i);
      const int token = __shfl_sync(0xffffffffu, b.token, i);
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int j = 0; j < k; ++j) {
        const int row = __shfl_sync(0xffffffffu, b.row, i * k + j);
        const float gate = __shfl_sync(0xffffffffu, b.gate, i * k + j);
        if (row >= 0 && col < c.hidden)
          accumulate_bf16x8(acc, *reinterpret_cast<const uint4*>(src + (i * k + j) * kCombineSliceBytes), gate);
      }
      if (col >= c.hidden) continue;
      __nv_bfloat16* dst = owner == c.rank
                               ? c.self_partial + size_t(token) * c.hidden
                               : c.peer_recv[owner] + (size_t(c.rank) * c.max_tokens + token) * c.hidden;
      *reinterpret_cast<uint4*>(dst + col) = pack_bf16x8(acc);
    }
  };

  // Batches warp_id, warp_id + n_warps, ...: two in flight (double buffer).
  long long t = warp_id;
  if (t >= n_batches) return;
  Batch current = issue(t, 0);
  for (int buf = 0;; buf ^= 1) {
    const long long next = t + n_warps;
    Batch upcoming;
    if (next < n_batches) {
      upcoming = issue(next, buf ^ 1);
      dev::cp_async_wait<1>();  // the current batch's copies are done; the next one's stay in flight
    } else {
      dev::cp_async_wait<0>();
    }
    finish(current, buf);
    if (next >= n_batches) break;
    current = upcoming;
    t = next;
  }
}

}  // namespace comet::kernels
