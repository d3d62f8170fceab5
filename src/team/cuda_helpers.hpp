// Small host-side CUDA helpers used by the Team backends (internal to src/team).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "comet/cuda_check.hpp"

namespace comet::team_detail {

// Makes `device` current for the scope and restores the caller's device after, so that a Team never
// leaves the process pointed at another GPU than the caller chose.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    COMET_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ == device) {
      previous_ = -1;
    } else {
      COMET_CUDA_CHECK(cudaSetDevice(device));
    }
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// Zeroes device memory and waits for it. The ranks' streams are non-blocking, so they are NOT ordered
// after work on the legacy default stream: setup writes must be complete before the call returns.
inline void zero_device_sync(void* p, size_t bytes) {
  COMET_CUDA_CHECK(cudaMemset(p, 0, bytes));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

// Host -> device copy that is complete on return (a pageable-source cudaMemcpy may return before the
// DMA lands, and the non-blocking rank streams would not wait for it).
inline void upload_sync(void* dst, const void* src, size_t bytes) {
  COMET_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

// Bytes of the signal allocation of one rank: kNumSignals words, then one barrier word per peer.
inline size_t signal_area_bytes(int num_signals, int world) {
  return static_cast<size_t>(num_signals + world) * sizeof(uint64_t);
}

}  // namespace comet::team_detail
