// CUDA error checking for host code that includes the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include "comet/common.hpp"

#define COMET_CUDA_CHECK(expr)                                                                  \
  do {                                                                                          \
    cudaError_t comet_err_ = (expr);                                                            \
    if (comet_err_ != cudaSuccess)                                                              \
      throw ::comet::CudaError(::comet::detail::concat(#expr, " failed: ",                      \
                                                       cudaGetErrorString(comet_err_), " at ", \
                                                       __FILE__, ":", __LINE__));               \
  } while (0)

// Checks the last launch error (call right after a <<<>>> launch).
#define COMET_CUDA_CHECK_LAUNCH() COMET_CUDA_CHECK(cudaGetLastError())
