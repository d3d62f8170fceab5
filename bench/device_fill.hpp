// Benchmark data made on the GPU: weights and activations are far too large to generate on the host
// (Mixtral's W0 alone is 940M values), and their values do not matter for timing as long as they are
// finite and of realistic magnitude.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace comet::bench {

// n bf16 values uniform in [-scale, scale] from a counter-based hash of (seed, index).
void fill_random_bf16(void* p, size_t n, float scale, uint64_t seed, cudaStream_t stream);

// Keeps the GPU busy for about `microseconds`, so that the host can enqueue what follows before the
// GPU reaches it (a timed region then never includes host launch latency).
void gpu_spin(double microseconds, cudaStream_t stream);

}  // namespace comet::bench
