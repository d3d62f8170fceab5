// Random bf16 data generated on the device (benchmarks: model weights are far too large for the
// host; Mixtral's W0 alone is 940M values). Values only need to be finite and of realistic magnitude.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace comet::testing {

// n bf16 values uniform in [-scale, scale] from a counter-based hash of (seed, index); p 16-byte aligned.
void fill_random_bf16(void* p, size_t n, float scale, uint64_t seed, cudaStream_t stream = nullptr);

}  // namespace comet::testing
