// Fused layers with 128x256x64 GEMM tiles (large problems).
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<256>();
template void launch_layer0_tile<256>(const Layer0Launch&, cudaStream_t);
template LaunchLimits layer1_limits_tile<256>();
template void launch_layer1_tile<256>(const Layer1Launch&, cudaStream_t);
}  // namespace comet::kernels
