#include "harness/gpu_presence.hpp"

#include <cuda_runtime.h>

namespace comet::testing {
bool has_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return false;
  return n > 0;
}
}  // namespace comet::testing
