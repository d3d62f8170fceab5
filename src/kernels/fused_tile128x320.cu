// The fused layer 0 with 128x320x64 GEMM tiles (layer 0 only; peer transport). For the TP 8 shards
// that 320 divides and 256 does not (Qwen2-57B: N = 2 F / 8 = 640; Phi-3.5: 1600): the layer-0 GEMM
// there is bound by A's loads, one pass over the gathered rows per column block, and 320-wide tiles make
// 2 passes where 256-wide ones make 3 (5 against 7). cuBLASLt picks exact-fit tiles of 320 for those
// shapes too. CUTLASS's cooperative builder takes two 64 x 160 wgmma atoms across N; each consumer thread
// holds 160 fp32 accumulators. The tuner's table picks it from measured sweeps only.
// CuTe's wgmma selector takes only N = 256, 192, 128, 96, 64, 32, 16 and 8 unless this is defined before
// its headers: a 160-wide tile then runs 32-wide wgmmas and a 320-wide one 64-wide ones (the same
// products in more instructions, each reading its A slice from shared memory again). Defined per
// translation unit where it compiles: here, and in layer 0's 320-wide tile (our own epilogue). CUTLASS's
// epilogues on 320-wide tiles (the grouped expert GEMM's and the weight gradients') fail a layout
// divisibility assertion with 160-wide atoms, so those keep 64-wide ones; the other widths are in the list.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_limits_tile<320>();
template void launch_layer0_tile<320>(const Layer0Launch&, cudaStream_t);
}  // namespace comet::kernels
