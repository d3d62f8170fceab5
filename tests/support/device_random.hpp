// Random bf16 data generated on the device (benchmarks: model weights are far too large for the host).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace comet::testing {

// p[i] = bf16 of a uniform value in [-scale, scale], from a hash of (seed, i).
void fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t stream = nullptr);

}  // namespace comet::testing
