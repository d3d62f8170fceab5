// StandaloneGemm::grouped_160: the standalone expert GEMM (expert_gemm_grouped.cuh) on CUTLASS's
// cooperative 128 x 160 tiles, in a translation unit of its own so that it compiles beside the others.
#include "kernels/expert_gemm_grouped.cuh"

namespace comet::kernels::expert_grouped {

void launch_160(const ExpertGemmLaunch& l, cudaStream_t stream) {
  launch_schedule<grouped::Cooperative160Schedule>(l, stream);
}

size_t workspace_bytes_160(int experts) { return schedule_workspace_bytes<grouped::Cooperative160Schedule>(experts); }

}  // namespace comet::kernels::expert_grouped
