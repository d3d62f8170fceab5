// Whether a stream is being captured into a CUDA graph: the engine's host-side reads (HostPlanCounts)
// and the schedule check's event queries stay out of a capture.
#pragma once

#include <cuda_runtime.h>

#include "comet/cuda_check.hpp"

namespace comet {

inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  COMET_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace comet
