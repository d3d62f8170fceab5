#include "support/device_random.hpp"

#include <cuda_bf16.h>

#include "comet/cuda_check.hpp"

namespace comet::testing {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

}  // namespace

void fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::testing
