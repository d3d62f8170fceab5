// Timing helper on the GPU (the benchmark's random data comes from tests/support/device_random.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace comet::bench {

// Keeps the GPU busy for about `microseconds`, so that the host can enqueue what follows before the
// GPU reaches it (a timed region then never includes host launch latency).
void gpu_spin(double microseconds, cudaStream_t stream);

}  // namespace comet::bench
