// Fused layers with 128x256x64 GEMM tiles (large problems).
#include "kernels/fused_launch.cuh"
COMET_DEFINE_FUSED_LAYERS(128, 256)
