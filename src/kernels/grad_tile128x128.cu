// The backward's fused kernels with 128x128x64 GEMM tiles (fused_launch.cuh: GradConfig).
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits grad_layer1_limits_tile<128>();
template void launch_grad_layer1_tile<128>(const GradLayer1Launch&, cudaStream_t);
template LaunchLimits grad_layer0_limits_tile<128>();
template void launch_grad_layer0_tile<128>(const GradLayer0Launch&, cudaStream_t);
}  // namespace comet::kernels
