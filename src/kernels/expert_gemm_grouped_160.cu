// StandaloneGemm::grouped_160: the standalone expert GEMM (expert_gemm_grouped.cuh) on CUTLASS's
// cooperative 128 x 160 tiles, in a translation unit of its own so that it compiles beside the others.
// CuTe's wgmma selector takes only N = 256, 192, 128, 96, 64, 32, 16 and 8 unless this is defined before
// its headers: a 160-wide tile then runs 32-wide wgmmas and a 320-wide one 64-wide ones (the same
// products in more instructions, each reading its A slice from shared memory again). Defined per
// translation unit where it compiles: here, and in layer 0's 320-wide tile (our own epilogue). CUTLASS's
// epilogues on 320-wide tiles (the grouped expert GEMM's and the weight gradients') fail a layout
// divisibility assertion with 160-wide atoms, so those keep 64-wide ones; the other widths are in the list.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1
#include "kernels/expert_gemm_grouped.cuh"

namespace comet::kernels::expert_grouped {

void launch_160(const ExpertGemmLaunch& l, cudaStream_t stream) {
  launch_schedule<grouped::Cooperative160Schedule>(l, stream);
}

size_t workspace_bytes_160(int experts) { return schedule_workspace_bytes<grouped::Cooperative160Schedule>(experts); }

}  // namespace comet::kernels::expert_grouped
