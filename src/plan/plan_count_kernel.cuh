// Device builder, kernel 1 of 4: one block per (source position j, chunk c of kChunk tokens).
// Pulls the chunk's expert ids and gates from the source's routing buffer once (coalesced, 16 bytes
// per access, several requests in flight per thread: the buffer may sit behind PCIe), checks the ids,
// and counts, without any order that depends on timing:
//  * per local expert e, the chunk's rows (chunk_rows) and each (token, slot)'s rank among them in
//    token order (slot_code), from per-warp lane masks: bit `lane` of holders[warp][e] says that the
//    warp's token `lane` chose e (a token holds an expert at most once), so popc of the mask below the
//    lane ranks the token inside its warp, and a prefix over the block's warps ranks it in the chunk;
//  * the chunk's units (tokens routed here at all) and each token's rank among them (token_unit).
#pragma once

#include <cstdint>

#include "plan/device_build_layout.cuh"

namespace comet::plan_dev {

// Most 16-byte vectors one thread moves per array: kChunk tokens * kMaxTopK words / 4 / kChunk threads.
inline constexpr int kVectorsPerThread = kMaxTopK / 4;

__device__ inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Copies `words` 4-byte words of two arrays with the whole block. Each array goes 16 bytes at a time
// when its source is 16-byte aligned (the destinations always are); every load of both arrays is
// issued before the first store so that a thread has up to 2 * kVectorsPerThread requests in flight.
// words <= kChunk * kMaxTopK.
__device__ inline void block_copy_two(uint32_t* dst_a, const uint32_t* src_a, uint32_t* dst_b, const uint32_t* src_b,
                                      int words) {
  const bool vec_a = aligned16(src_a), vec_b = aligned16(src_b);
  const int vectors = words / 4;
  int4 reg_a[kVectorsPerThread], reg_b[kVectorsPerThread];
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = threadIdx.x + i * kChunk;
    if (v < vectors) {
      if (vec_a) reg_a[i] = reinterpret_cast<const int4*>(src_a)[v];
      if (vec_b) reg_b[i] = reinterpret_cast<const int4*>(src_b)[v];
    }
  }
#pragma unroll
  for (int i = 0; i < kVectorsPerThread; ++i) {
    const int v = threadIdx.x + i * kChunk;
    if (v < vectors) {
      if (vec_a) reinterpret_cast<int4*>(dst_a)[v] = reg_a[i];
      if (vec_b) reinterpret_cast<int4*>(dst_b)[v] = reg_b[i];
    }
  }
  // Tails (and whole arrays whose source is misaligned), one word per thread.
  for (int w = (vec_a ? vectors * 4 : 0) + threadIdx.x; w < words; w += kChunk) dst_a[w] = src_a[w];
  for (int w = (vec_b ? vectors * 4 : 0) + threadIdx.x; w < words; w += kChunk) dst_b[w] = src_b[w];
}

__device__ inline void block_copy_one(uint32_t* dst, const uint32_t* src, int words) {
  const int vectors = aligned16(src) && aligned16(dst) ? words / 4 : 0;
  for (int v = threadIdx.x; v < vectors; v += kChunk)
    reinterpret_cast<int4*>(dst)[v] = reinterpret_cast<const int4*>(src)[v];
  for (int w = vectors * 4 + threadIdx.x; w < words; w += kChunk) dst[w] = src[w];
}

// Dynamic shared memory of the count kernel.
__host__ __device__ inline size_t count_kernel_smem(const BuildGeometry& g) {
  return size_t(kChunk) * g.topk * sizeof(int32_t)                        // ids, then slot codes
         + 2 * size_t(kChunkWarps) * g.local_experts * sizeof(uint32_t);  // holders, warp_rows_before
}

__global__ void __launch_bounds__(kChunk) plan_count_kernel(const void* const* peer_routing, BuildGeometry g,
                                                             BuildScratch sc) {
  extern __shared__ int4 count_smem[];
  const int k = g.topk, El = g.local_experts, e0 = g.first_expert;
  int32_t* ids = reinterpret_cast<int32_t*>(count_smem);                          // [kChunk][k]
  uint32_t* holders = reinterpret_cast<uint32_t*>(ids + kChunk * k);              // [kChunkWarps][El]
  int32_t* warp_rows_before = reinterpret_cast<int32_t*>(holders + kChunkWarps * El);  // [kChunkWarps][El]
  __shared__ int s_tokens;
  __shared__ int s_warp_units[kChunkWarps];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int block = blockIdx.x, j = block / g.chunks, c = block % g.chunks;
  const int s = g.source_at(j);
  const RoutingBufferLayout layout = g.routing_layout();
  const char* buffer = static_cast<const char*>(peer_routing[s]);

  if (tid == 0) {
    int n = *reinterpret_cast<const int32_t*>(buffer);
    if (n < 0 || n > g.max_tokens) {
      if (c == 0) atomicMin(sc.error_key, token_count_error_key(s));
      n = n < 0 ? 0 : g.max_tokens;  // keep reading in bounds; the plan will come out empty
    }
    s_tokens = n;
    if (c == 0) sc.position_tokens[j] = n;
  }
  for (int i = tid; i < kChunkWarps * El; i += kChunk) holders[i] = 0;
  __syncthreads();

  const int first = c * kChunk;
  const int count = max(0, min(s_tokens - first, kChunk));
  const size_t slot_base = size_t(j) * g.slot_stride + size_t(first) * k;
  block_copy_two(reinterpret_cast<uint32_t*>(ids),
                 reinterpret_cast<const uint32_t*>(buffer + layout.ids_offset()) + size_t(first) * k,
                 reinterpret_cast<uint32_t*>(sc.slot_gate + slot_base),
                 reinterpret_cast<const uint32_t*>(buffer + layout.gates_offset()) + size_t(first) * k, count * k);
  __syncthreads();

  // Check this thread's token and mark the local experts it chose.
  const bool active = tid < count;
  const int token = first + (active ? tid : 0);  // first + tid may pass INT_MAX in the last chunk
  int32_t* my_ids = ids + tid * k;
  bool routed_here = false;
  if (active) {
    for (int slot = 0; slot < k; ++slot) {
      const int32_t id = my_ids[slot];
      if (id < 0 || id >= g.num_experts) {
        atomicMin(sc.error_key, slot_error_key(s, token, slot, kIdOutOfRange));
        break;
      }
      bool duplicate = false;
      for (int earlier = 0; earlier < slot; ++earlier) duplicate |= my_ids[earlier] == id;
      if (duplicate) {
        atomicMin(sc.error_key, slot_error_key(s, token, slot, kIdDuplicate));
        break;
      }
      // A NaN or infinite gate would make the token's output NaN in silence: refuse it by name.
      if (!isfinite(sc.slot_gate[slot_base + size_t(tid) * k + slot])) {
        atomicMin(sc.error_key, slot_error_key(s, token, slot, kGateNotFinite));
        break;
      }
      if (id >= e0 && id < e0 + El) {
        atomicOr(&holders[warp * El + (id - e0)], 1u << lane);
        routed_here = true;
      }
    }
  }
  const uint32_t unit_lanes = __ballot_sync(0xffffffffu, routed_here);
  if (lane == 0) s_warp_units[warp] = __popc(unit_lanes);
  __syncthreads();

  // Per expert: rows of the earlier warps of the chunk, and the chunk's rows.
  for (int e = tid; e < El; e += kChunk) {
    int rows = 0;
#pragma unroll
    for (int w = 0; w < kChunkWarps; ++w) {
      warp_rows_before[w * El + e] = rows;
      rows += __popc(holders[w * El + e]);
    }
    sc.chunk_rows[size_t(block) * El + e] = rows;
  }
  int units_before = 0, units = 0;
#pragma unroll
  for (int w = 0; w < kChunkWarps; ++w) {
    units_before += w < warp ? s_warp_units[w] : 0;
    units += s_warp_units[w];
  }
  if (tid == 0) sc.chunk_units[block] = units;
  __syncthreads();

  // Ranks inside the chunk, in token order; the codes replace the ids (each thread its own k words).
  if (active) {
    const uint32_t below = (1u << lane) - 1u;
    sc.token_unit[size_t(j) * g.max_tokens + token] = routed_here ? units_before + __popc(unit_lanes & below) : -1;
    for (int slot = 0; slot < k; ++slot) {
      const int32_t id = my_ids[slot];
      int32_t code = -1;
      if (id >= e0 && id < e0 + El) {
        const int e = id - e0;
        code = e * kChunk + warp_rows_before[warp * El + e] + __popc(holders[warp * El + e] & below);
      }
      my_ids[slot] = code;
    }
  }
  __syncthreads();
  block_copy_one(reinterpret_cast<uint32_t*>(sc.slot_code + slot_base), reinterpret_cast<const uint32_t*>(ids),
                 count * k);
}

}  // namespace comet::plan_dev
