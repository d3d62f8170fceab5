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
  CUTE_UNROLL
  for (int i = 0; i < kElems; i += 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int part = 0; part < tile.splits; ++part) {
      const float4 p = part == tile.split ? make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3))
                                          : __ldcg(part_at(part) + (i / 4) * kThreads);
      if (part == 0) {
        sum = p;
      } else {
        sum.x += p.x, sum.y += p.y, sum.z += p.z, sum.w += p.w;
      }
    }
    acc(i) = sum.x, acc(i + 1) = sum.y, acc(i + 2) = sum.z, acc(i + 3) = sum.w;
  }
  return true;
}

}  // namespace comet::kernels
