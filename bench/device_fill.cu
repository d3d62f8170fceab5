#include "device_fill.hpp"

#include <cuda_bf16.h>

#include "comet/cuda_check.hpp"

namespace comet::bench {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

void gpu_spin(double microseconds, cudaStream_t stream) {
  static int khz = 0;
  if (khz == 0) {
    int device = 0;
    COMET_CUDA_CHECK(cudaGetDevice(&device));
    COMET_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    if (khz <= 0) khz = 1980000;  // H200's boost clock, if the attribute is not reported
  }
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<long long>(microseconds * 1e-3 * khz));
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::bench
