// The fused layer 0 with 128x320x64 GEMM tiles (layer 0 only; peer transport). For the TP 8 shards
// that 320 divides and 256 does not (Qwen2-57B: N = 2 F / 8 = 640; Phi-3.5: 1600): the layer-0 GEMM
// there is bound by A's loads, one pass over the gathered rows per column block, and 320-wide tiles make
// 2 passes where 256-wide ones make 3 (5 against 7). cuBLASLt picks exact-fit tiles of 320 for those
// shapes too. CUTLASS's cooperative builder takes two 64 x 160 wgmma atoms across N; each consumer thread
// holds 160 fp32 accumulators. The tuner's table picks it from measured sweeps only.
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<320>();
template void launch_layer0_tile<320>(const Layer0Launch&, cudaStream_t);
}  // namespace comet::kernels
