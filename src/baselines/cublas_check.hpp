// cuBLAS error checking for the baselines (raises comet::CudaError with the library's status name).
#pragma once

#include <cublas_v2.h>

#include "comet/common.hpp"

#define COMET_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                \
    cublasStatus_t comet_status_ = (expr);                                                            \
    if (comet_status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      throw ::comet::CudaError(::comet::detail::concat(#expr, " failed: ",                            \
                                                       cublasGetStatusString(comet_status_), " at ", \
                                                       __FILE__, ":", __LINE__));                     \
  } while (0)
