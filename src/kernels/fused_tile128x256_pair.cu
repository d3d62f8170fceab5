// Fused forward layers with 128x256x64 GEMM tiles, compute blocks in 1 x 2 clusters that share the A
// tile (TMA multicast): half of A's L2 reads for the large GEMMs.
#include "kernels/fused_launch.cuh"

namespace comet::kernels {
template LaunchLimits layer0_pair_limits_tile<256>();
template void launch_layer0_pair_tile<256>(const Layer0Launch&, cudaStream_t);
template LaunchLimits layer1_pair_limits_tile<256>();
template void launch_layer1_pair_tile<256>(const Layer1Launch&, cudaStream_t);
}  // namespace comet::kernels
