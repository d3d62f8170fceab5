// RAII device memory for tests and benchmarks.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "comet/cuda_check.hpp"

namespace comet::testing {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    COMET_CUDA_CHECK(cudaMalloc(&ptr_, bytes ? bytes : 16));
  }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host);
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

  // Complete on return. A cudaMemcpy from pageable memory may return before its DMA lands, and the
  // ranks' non-blocking streams are not ordered after the legacy stream that carries it: a kernel
  // enqueued next could read the old bytes (a test that changed a rank's routing once saw its previous,
  // refused routing again under load).
  template <class T>
  void upload(const std::vector<T>& host) {
    COMET_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  template <class T>
  std::vector<T> download(size_t count) const {
    std::vector<T> host(count);
    COMET_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills every byte with `value` (0xFF on bf16 data gives NaNs: unwritten outputs cannot pass).
  void fill_bytes(int value) { COMET_CUDA_CHECK(cudaMemset(ptr_, value, bytes_)); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace comet::testing
