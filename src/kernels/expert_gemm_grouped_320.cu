// StandaloneGemm::grouped_320: the standalone expert GEMM (expert_gemm_grouped.cuh) on CUTLASS's
// cooperative 128 x 320 tiles, in a translation unit of its own so that it compiles beside the others.
#include "kernels/expert_gemm_grouped.cuh"

namespace comet::kernels::expert_grouped {

void launch_320(const ExpertGemmLaunch& l, cudaStream_t stream) {
  launch_schedule<grouped::Cooperative320Schedule>(l, stream);
}

size_t workspace_bytes_320(int experts) { return schedule_workspace_bytes<grouped::Cooperative320Schedule>(experts); }

}  // namespace comet::kernels::expert_grouped
