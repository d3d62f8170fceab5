// WeightGradKernel::grouped (ping-pong) and grouped_cooperative (cooperative in 2 x 1 clusters), and the
// entry point of grouped_320 (weight_grad_grouped_320.cu): weight_grad_grouped.cuh says what the GEMM is.
#include <algorithm>

#include "kernels/weight_grad_grouped.cuh"

namespace comet::kernels {

using grouped::Bf16;
using grouped::CooperativeSchedule;
using grouped::PingpongSchedule;
using wgrad_grouped::GroupedWeightGrad;
using wgrad_grouped::launch;

size_t weight_grad_grouped_workspace_bytes(int experts) {
  return std::max(grouped::max_workspace_bytes<GroupedWeightGrad<float, PingpongSchedule>, GroupedWeightGrad<Bf16, PingpongSchedule>,
                                               GroupedWeightGrad<float, CooperativeSchedule>,
                                               GroupedWeightGrad<Bf16, CooperativeSchedule>>(experts),
                  weight_grad_grouped_320_workspace_bytes(experts));
}

void launch_weight_grad_grouped(const WeightGradLaunch& l, cudaStream_t stream) {
  COMET_REQUIRE(l.p_cols % 8 == 0 && l.q_cols % 8 == 0 && l.p_cols > 0 && l.q_cols > 0,
                "weight gradient: operand widths (", l.p_cols, ", ", l.q_cols, ") must be positive multiples of 8");
  COMET_REQUIRE(l.experts > 0, "weight gradient: no experts");
  if (l.kernel == WeightGradKernel::grouped_320) return launch_weight_grad_grouped_320(l, stream);
  const bool coop = l.kernel == WeightGradKernel::grouped_cooperative;
  COMET_REQUIRE(coop || l.kernel == WeightGradKernel::grouped, "weight gradient (grouped): not a grouped GEMM");
  if (l.out_f32) {
    coop ? launch<float, CooperativeSchedule>(l, stream) : launch<float, PingpongSchedule>(l, stream);
  } else {
    coop ? launch<Bf16, CooperativeSchedule>(l, stream) : launch<Bf16, PingpongSchedule>(l, stream);
  }
}

}  // namespace comet::kernels
