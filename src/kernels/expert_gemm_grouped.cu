// The standalone expert GEMM's entry points (fused_layers.hpp) and its ping-pong and cooperative
// schedules; expert_gemm_grouped.cuh says what the GEMM is and where it runs.
#include <algorithm>

#include "kernels/expert_gemm_grouped.cuh"

namespace comet::kernels {

size_t expert_gemm_grouped_workspace_bytes(int experts) {
  using namespace expert_grouped;
  return std::max({schedule_workspace_bytes<grouped::PingpongSchedule>(experts),
                   schedule_workspace_bytes<grouped::CooperativeSchedule>(experts), workspace_bytes_160(experts),
                   workspace_bytes_320(experts)});
}

void launch_expert_gemm_grouped(const ExpertGemmLaunch& l, cudaStream_t stream) {
  COMET_REQUIRE(l.k % 8 == 0 && l.n % 8 == 0 && l.k > 0 && l.n > 0, "expert GEMM (grouped): K ", l.k, " and N ", l.n,
                " must be positive multiples of 8");
  COMET_REQUIRE(l.experts > 0, "expert GEMM (grouped): no experts");
  switch (l.kernel) {
    case StandaloneGemm::grouped:
      return expert_grouped::launch_schedule<grouped::PingpongSchedule>(l, stream);
    case StandaloneGemm::grouped_cooperative:
      return expert_grouped::launch_schedule<grouped::CooperativeSchedule>(l, stream);
    case StandaloneGemm::grouped_160:
      return expert_grouped::launch_160(l, stream);
    case StandaloneGemm::grouped_320:
      return expert_grouped::launch_320(l, stream);
    case StandaloneGemm::comet:
    case StandaloneGemm::cublas:  // MoeEngine::standalone_gemm runs it
      break;
  }
  throw InvalidArgument("expert GEMM (grouped): not a grouped GEMM");
}

}  // namespace comet::kernels
