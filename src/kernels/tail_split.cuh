// The device side of the tail split (tail_split.hpp): a split tile's part leaves its fp32 partial in
// the workspace, and the part that arrives last adds all parts in order 0, 1, ... into its
// accumulators, so the sum is the same whichever part finishes last.
#pragma once

#include <cute/tensor.hpp>

#include "kernels/compute_role.cuh"
#include "kernels/tail_split.hpp"

namespace comet::kernels {

// Called by the 256 consumer threads with a split tile's accumulators. Returns true (on every thread)
// for the last part, whose `acc` then holds the whole tile's sum; false for the others, which are done.
// Partial layout: element i of consumer thread t at float4 [(i / 4) * 256 + t], so that each store and
// load of a warp covers 512 contiguous bytes.
template <class Acc>
__device__ bool tail_split_reduce(Acc& acc, const TileCoord& tile, int mma_thread, const TailSplitArgs& args,
                                  int tile_elems) {
  using namespace cute;
  constexpr int kElems = decltype(size(acc))::value;
  static_assert(kElems % 4 == 0);
  constexpr int kThreads = 256;
  auto part_at = [&](int part) {
    return reinterpret_cast<float4*>(args.partials + size_t(tile.slot * tile.splits + part) * tile_elems) + mma_thread;
  };
  float4* mine = part_at(tile.split);
  CUTE_UNROLL
  for (int i = 0; i < kElems; i += 4) mine[(i / 4) * kThreads] = make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3));
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
  // Sum chunk by chunk: every load of a chunk and part is issued before any is used, so a part costs
  // one L2 latency per chunk, not one per float4 (a loop of dependent loads made the last part's sum
  // slower than the part's GEMM).
  constexpr int kChunk = 8;  // float4s per thread per chunk
  static_assert((kElems / 4) % kChunk == 0);
  CUTE_UNROLL
  for (int c = 0; c < kElems / 4; c += kChunk) {
    float4 sum[kChunk];
    for (int part = 0; part < tile.splits; ++part) {
      float4 p[kChunk];
      if (part == tile.split) {
        CUTE_UNROLL
        for (int q = 0; q < kChunk; ++q) {
          const int i = (c + q) * 4;
          p[q] = make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3));
        }
      } else {
        const float4* src = part_at(part) + c * kThreads;
        CUTE_UNROLL
        for (int q = 0; q < kChunk; ++q) p[q] = __ldcg(src + q * kThreads);
      }
      CUTE_UNROLL
      for (int q = 0; q < kChunk; ++q) {
        if (part == 0) {
          sum[q] = p[q];
        } else {
          sum[q].x += p[q].x, sum[q].y += p[q].y, sum[q].z += p[q].z, sum[q].w += p[q].w;
        }
      }
    }
    CUTE_UNROLL
    for (int q = 0; q < kChunk; ++q) {
      const int i = (c + q) * 4;
      acc(i) = sum[q].x, acc(i + 1) = sum[q].y, acc(i + 2) = sum[q].z, acc(i + 3) = sum[q].w;
    }
  }
  return true;
}

}  // namespace comet::kernels
