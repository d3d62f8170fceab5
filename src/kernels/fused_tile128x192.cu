// The fused layers with 128x192x64 GEMM tiles. Layer 0: for W0 shards whose N pads badly to 256 (Qwen2
// TP 8: N = 352 is 512 with 256-wide tiles, 384 with 192-wide ones, at nearly the wide tile's rate).
// Layer 1: for batches whose 256-wide tiles leave a last wave mostly idle (Phi-3.5 EP 8 at 1024 tokens:
// 288 tiles of 256 take 3 waves of 132 SMs for 2.2 waves of work; 396 tiles of 192 fill 3 waves of
// three-quarter tiles). The tuner's table picks it from measured sweeps only.
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<192>();
template void launch_layer0_tile<192>(const Layer0Launch&, cudaStream_t);
template LaunchLimits layer1_limits_tile<192>();
template void launch_layer1_tile<192>(const Layer1Launch&, cudaStream_t);
}  // namespace comet::kernels
