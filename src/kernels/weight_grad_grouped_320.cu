// WeightGradKernel::grouped_320: the weight gradients' grouped GEMM (weight_grad_grouped.cuh) on
// CUTLASS's cooperative 128 x 320 tiles, in a translation unit of its own so that it compiles beside the others.
#include "kernels/weight_grad_grouped.cuh"

namespace comet::kernels {

using grouped::Bf16;
using grouped::Cooperative320Schedule;
using wgrad_grouped::GroupedWeightGrad;

size_t weight_grad_grouped_320_workspace_bytes(int experts) {
  return grouped::max_workspace_bytes<GroupedWeightGrad<float, Cooperative320Schedule>,
                                      GroupedWeightGrad<Bf16, Cooperative320Schedule>>(experts);
}

void launch_weight_grad_grouped_320(const WeightGradLaunch& l, cudaStream_t stream) {
  if (l.out_f32)
    wgrad_grouped::launch<float, Cooperative320Schedule>(l, stream);
  else
    wgrad_grouped::launch<Bf16, Cooperative320Schedule>(l, stream);
}

}  // namespace comet::kernels
