// Layer 0 with 128x192x64 GEMM tiles: for W0 shards whose N pads badly to 256 (Qwen2 TP 8: N = 352
// is 512 with 256-wide tiles, 384 with 192-wide ones, at nearly the wide tile's rate).
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<192>();
template void launch_layer0_tile<192>(const Layer0Launch&, cudaStream_t);
}  // namespace comet::kernels
