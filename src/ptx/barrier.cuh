// PTX: named barriers (a subset of a block's threads synchronises; id 0 is __syncthreads).
#pragma once

namespace comet::dev {

template <int Id, int Threads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(Id), "n"(Threads) : "memory");
}

}  // namespace comet::dev
