// The weight gradients as CUTLASS's own grouped GEMM, for any schedule (weight_grad_grouped.cu compiles
// WeightGradKernel::grouped, ping-pong, and grouped_cooperative, cooperative in 2 x 1 clusters;
// comet-probe-grouped-gemm may compile others to measure them): one group per local expert, out_e = P_e^T Q_e
// with K = the expert's rows. Where our persistent kernel (weight_grad_kernel.cuh) runs its epilogue in
// the same warp groups as its mainloop, the ping-pong schedule lets one consumer warp group store a tile
// while the other computes the next, which is what short K (an expert's rows at 1024 tokens) needs: there the fp32 store took a quarter
// of the tile's time and our kernel ran at 0.77-0.80 of cuBLAS (bench/results/SUMMARY_backward.md).
//
// Everything the kernel reads about the groups lives on the device (the plan's expert_offset /
// expert_rows): a setup kernel writes the per-group problem shapes and pointers into the workspace, so
// the host never waits for the routing. An expert without rows gets an M of 0 (no tiles); without
// accumulate its gradient is then zeroed by the setup kernel, as the persistent kernel's K of 0 does.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cutlass_grouped.cuh"
#include "kernels/fused_layers.hpp"

namespace comet::kernels::wgrad_grouped {

using grouped::Bf16;
using grouped::Problem;

// out_e = P_e^T Q_e: A = P_e^T is M x K with M (P's columns) contiguous, B = Q_e is K x N with N
// contiguous, D is M x N with N contiguous.
template <class Out, class Sched>
using GroupedWeightGrad = grouped::GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, Out, Sched>;

// One thread per expert writes its group; the blocks after the first zero the outputs of experts
// without rows when the gradient is overwritten (accumulate keeps them: a zero gradient adds nothing).
template <class G>
__global__ void setup_groups(grouped::GroupArrays<G> g, WeightGradLaunch l, typename G::StrideA sa,
                             typename G::StrideB sb, typename G::StrideD sd) {
  using Out = typename G::Output;
  const int M = l.p_cols, N = l.q_cols;
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e < l.experts; e += blockDim.x) {
      const int rows = l.expert_rows[e], first = l.expert_offset[e];
      grouped::write_group<G>(g, e, Problem::UnderlyingProblemShape{rows > 0 ? M : 0, N, rows},
                              static_cast<const Bf16*>(l.p) + size_t(first) * M,
                              static_cast<const Bf16*>(l.q) + size_t(first) * N,
                              static_cast<Out*>(l.out) + size_t(e) * M * N, sa, sb, sd);
    }
    return;
  }
  if (l.accumulate) return;
  const size_t per_expert = size_t(M) * N;
  for (int e = 0; e < l.experts; ++e) {
    if (l.expert_rows[e] > 0) continue;
    Out* out = static_cast<Out*>(l.out) + size_t(e) * per_expert;
    for (size_t i = size_t(blockIdx.x - 1) * blockDim.x + threadIdx.x; i < per_expert;
         i += size_t(gridDim.x - 1) * blockDim.x)
      out[i] = Out(0.f);
  }
}

template <class Out, class Sched>
void launch(const WeightGradLaunch& l, cudaStream_t stream) {
  using G = GroupedWeightGrad<Out, Sched>;
  const int64_t M = l.p_cols, N = l.q_cols;
  const auto sa = grouped::make_group_stride<typename G::StrideA>(1, M);  // A (m, k) at m + k M
  const auto sb = grouped::make_group_stride<typename G::StrideB>(1, N);  // B (n, k) at n + k N
  const auto sd = grouped::make_group_stride<typename G::StrideD>(N, 1);  // D (m, n) at m N + n
  grouped::launch_groups<G>(l.experts, l.workspace, l.workspace_bytes, l.accumulate, l.raster,
                            "weight gradient (grouped)",
                            stream, [&](const grouped::GroupArrays<G>& g, int sms) {
                              setup_groups<G><<<l.accumulate ? 1 : 1 + sms, 256, 0, stream>>>(g, l, sa, sb, sd);
                            });
}

}  // namespace comet::kernels::wgrad_grouped
