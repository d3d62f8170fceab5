// comet-probe-grouped-gemm's own schedule (grouped_gemm_probe_multicast.cu says which and why).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/fused_layers.hpp"

namespace comet::bench {

void launch_160_multicast_a(const kernels::ExpertGemmLaunch& l, cudaStream_t stream);
size_t workspace_160_multicast_a(int experts);

}  // namespace comet::bench
