// Fused layers with 128x128x64 GEMM tiles (small problems: more tiles to spread over the SMs).
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<128>();
template void launch_layer0_tile<128>(const Layer0Launch&, cudaStream_t);
template LaunchLimits layer1_limits_tile<128>();
template void launch_layer1_tile<128>(const Layer1Launch&, cudaStream_t);
}  // namespace comet::kernels
