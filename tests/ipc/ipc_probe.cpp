#include <cuda_runtime.h>

#include <cstdio>

#include "ipc/ipc_cases.hpp"

namespace comet::ipc_test {

int probe_gpu() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver || (err == cudaSuccess && count == 0)) {
    return kSkipExitCode;
  }
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpu probe: cudaGetDeviceCount failed: %s\n", cudaGetErrorString(err));
    return 1;
  }
  // A context, not just the driver: under MPS this is where a broken daemon shows.
  const cudaError_t ctx = cudaFree(nullptr);
  if (ctx != cudaSuccess) {
    std::fprintf(stderr, "gpu probe: creating a context failed: %s\n", cudaGetErrorString(ctx));
    return 1;
  }
  return 0;
}

}  // namespace comet::ipc_test
