// Fused layers with 128x128x64 GEMM tiles (small problems: more tiles to spread over the SMs).
#include "kernels/fused_launch.cuh"
COMET_DEFINE_FUSED_LAYERS(128, 128)
