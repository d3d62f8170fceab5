#include "harness/device_random.hpp"

#include <cuda_bf16.h>

#include "comet/cuda_check.hpp"

namespace comet::testing {
namespace {

__device__ __forceinline__ uint64_t hash64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Each thread writes 8 values (one 16-byte store) per step; the tail is written one value at a time.
__global__ void fill_kernel(__nv_bfloat16* p, size_t n, float scale, uint64_t seed) {
  const size_t vectors = n / 8;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t v = size_t(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors + 8; v += stride) {
    if (v < vectors) {
      __align__(16) __nv_bfloat16 vals[8];
#pragma unroll
      for (int i = 0; i < 8; i += 2) {
        const uint64_t h = hash64(seed ^ ((v * 8 + i) * 0xD6E8FEB86659FD93ull));
        const float a = float(uint32_t(h)) * (2.0f / 4294967296.0f) - 1.0f;
        const float b = float(uint32_t(h >> 32)) * (2.0f / 4294967296.0f) - 1.0f;
        vals[i] = __float2bfloat16(a * scale);
        vals[i + 1] = __float2bfloat16(b * scale);
      }
      reinterpret_cast<uint4*>(p)[v] = *reinterpret_cast<const uint4*>(vals);
    } else {
      const size_t i = vectors * 8 + (v - vectors);
      if (i < n) {
        const uint64_t h = hash64(seed ^ (i * 0xD6E8FEB86659FD93ull));
        p[i] = __float2bfloat16((float(uint32_t(h)) * (2.0f / 4294967296.0f) - 1.0f) * scale);
      }
    }
  }
}

}  // namespace

void fill_random_bf16(void* p, size_t n, float scale, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  COMET_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "fill_random_bf16: pointer must be 16-byte aligned");
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  fill_kernel<<<sms * 8, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, scale, seed);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::testing
