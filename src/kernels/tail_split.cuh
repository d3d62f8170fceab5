// The device side of the tail split (tail_split.hpp): a split tile's part leaves its fp32 partial in
// the workspace, and the part that arrives last adds all parts in order 0, 1, ... into its
// accumulators, so the sum is the same whichever part finishes last.
//
// The work runs in a function that is not inlined, on a copy of the accumulators in local memory:
// inlined, its loads in flight next to the 128 accumulator registers of a 128 x 256 tile pushed the
// whole kernel past its register budget (ptxas spilled 456 bytes, into the mainloop too), and an
// unsplit tile must not pay for the split path.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/compute_role.cuh"
#include "kernels/tail_split.hpp"

namespace comet::kernels {

// The 256 consumer threads with one split tile's part in `acc` (kElems fp32 each). Returns true (on
// every thread) for the last part, whose `acc` then holds the whole tile's sum; false for the others.
// Partial layout: element i of consumer thread t at float4 [(i / 4) * 256 + t], so that each store and
// load of a warp covers 512 contiguous bytes.
template <int kElems>
__device__ __noinline__ bool tail_split_sum(float (&acc)[kElems], const TileCoord& tile, int mma_thread,
                                            const TailSplitArgs& args, int tile_elems) {
  constexpr int kThreads = 256;
  constexpr int kVecs = kElems / 4;
  static_assert(kElems % 4 == 0);
  auto part_at = [&](int part) {
    return reinterpret_cast<float4*>(args.partials + size_t(tile.slot * tile.splits + part) * tile_elems) + mma_thread;
  };
  auto acc4 = reinterpret_cast<float4(&)[kVecs]>(acc);
  float4* mine = part_at(tile.split);
#pragma unroll
  for (int v = 0; v < kVecs; ++v) mine[v * kThreads] = acc4[v];
  consumer_barrier();  // every thread's partial is stored
  bool last = false;
  if (mma_thread == 0) {
    __threadfence();  // release the block's partial before counting it
    last = atomicAdd(&args.arrivals[tile.slot], 1) == tile.splits - 1;
    if (last) {
      args.arrivals[tile.slot] = 0;  // for the next call; every part of this one has counted
      __threadfence();               // acquire the other parts' partials
    }
  }
  if (!dev::named_barrier_or<12, kThreads>(last)) return false;
  // Chunk by chunk, every load of a chunk and part in flight before any is used: a part costs one
  // L2 latency per chunk, not one per float4. The own part is read back too (it is in L2 now).
  constexpr int kChunk = 8;  // float4s per thread per chunk
  static_assert(kVecs % kChunk == 0 || kVecs < kChunk);
  constexpr int kStep = kVecs < kChunk ? kVecs : kChunk;
#pragma unroll 1
  for (int c = 0; c < kVecs; c += kStep) {
    float4 sum[kStep];
#pragma unroll 1
    for (int part = 0; part < tile.splits; ++part) {
      const float4* src = part_at(part) + c * kThreads;
      float4 p[kStep];
#pragma unroll
      for (int q = 0; q < kStep; ++q) p[q] = __ldcg(src + q * kThreads);
#pragma unroll
      for (int q = 0; q < kStep; ++q) {
        if (part == 0) {
          sum[q] = p[q];
        } else {
          sum[q].x += p[q].x, sum[q].y += p[q].y, sum[q].z += p[q].z, sum[q].w += p[q].w;
        }
      }
    }
#pragma unroll
    for (int q = 0; q < kStep; ++q) acc4[c + q] = sum[q];
  }
  return true;
}

// A split tile's epilogue step: false where this part is not the last (the tile is then done here).
template <class Acc>
__device__ bool tail_split_reduce(Acc& acc, const TileCoord& tile, int mma_thread, const TailSplitArgs& args,
                                  int tile_elems) {
  constexpr int kElems = decltype(cute::size(acc))::value;
  float copy[kElems];
#pragma unroll
  for (int i = 0; i < kElems; ++i) copy[i] = acc(i);
  if (!tail_split_sum<kElems>(copy, tile, mma_thread, args, tile_elems)) return false;
#pragma unroll
  for (int i = 0; i < kElems; ++i) acc(i) = copy[i];
  return true;
}

}  // namespace comet::kernels
