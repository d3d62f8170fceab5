// Layer 0 in fp8 (e4m3, block scales) with 128x128x128 GEMM tiles (fp8_gemm_config.cuh).
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_fp8_limits_tile<128>();
template void launch_layer0_fp8_tile<128>(const Layer0Launch&, cudaStream_t);
}  // namespace comet::kernels
