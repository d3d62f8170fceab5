// Eight bf16 values in one 16-byte vector, the unit every copy and reduction kernel here moves per thread.
#pragma once

#include <cuda_bf16.h>

namespace comet::kernels {

__device__ __forceinline__ void unpack_bf16x8(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&f)[8]) {
  uint4 v;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// acc += w * v, in fp32 (w = 1 adds exactly).
__device__ __forceinline__ void accumulate_bf16x8(float (&acc)[8], const uint4& v, float w) {
  float f[8];
  unpack_bf16x8(v, f);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += w * f[i];
}

}  // namespace comet::kernels
