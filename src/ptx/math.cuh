// PTX: fast math the epilogue uses.
#pragma once

namespace comet::dev {

__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace comet::dev
