// The grid of a grid-stride kernel: enough blocks of `threads` for `work` threads' worth of items,
// at least 1 and at most 8 per multiprocessor (more only adds scheduling; the loop covers the rest).
#pragma once

#include <cuda_runtime.h>

#include "comet/cuda_check.hpp"

namespace comet::kernels {

inline int grid_for(long long work, int threads) {
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const long long blocks = (work + threads - 1) / threads;
  return int(blocks < 1 ? 1 : (blocks > 8LL * sms ? 8LL * sms : blocks));
}

}  // namespace comet::kernels
