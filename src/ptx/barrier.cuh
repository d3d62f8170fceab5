// PTX: named barriers (a subset of a block's threads synchronises; id 0 is __syncthreads).
#pragma once

#include <cstdint>

namespace comet::dev {

template <int Id, int Threads>
__device__ __forceinline__ void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(Id), "n"(Threads) : "memory");
}

// The same barrier, returning whether any participating thread passed a true `value` (bar.red.or).
template <int Id, int Threads>
__device__ __forceinline__ bool named_barrier_or(bool value) {
  uint32_t any;
  asm volatile(
      "{\n\t.reg .pred p, q;\n\t"
      "setp.ne.u32 p, %1, 0;\n\t"
      "bar.red.or.pred q, %2, %3, p;\n\t"
      "selp.u32 %0, 1, 0, q;\n\t}"
      : "=r"(any)
      : "r"(uint32_t(value)), "n"(Id), "n"(Threads)
      : "memory");
  return any != 0;
}

}  // namespace comet::dev
