// An expert GEMM with no comm blocks beside it (the sequential schedule's GEMM launch, or gemm_only
// mode) as CUTLASS's grouped GEMM: out rows of expert e = its rows of A times W_e. Where the link is as
// fast as HBM the planner runs the communication on the whole GPU and the GEMM after it (or before it);
// that GEMM then competes with the sequential baseline's cuBLAS GEMMs alone, and CUTLASS's ping-pong
// schedule (one warp group's epilogue under the other's mainloop), its cooperative 2 x 1 clusters or its
// 160-wide tiles (no padded columns where N is a multiple of 160) are nearer cuBLAS than our cooperative
// kernel at short K, at small M per expert and at narrow N.
//
// Only a plain product qualifies: layer 1 (Y = h W1_e^T, combined afterwards), the backward of layer 1
// when its activation backward is a second pass (D = G W1_e) and the backward of layer 0
// (dA = dPre W0_e). Layer 0 applies the activation in its epilogue and keeps our kernel.
//
// As in weight_grad_grouped.cu a setup kernel writes the groups from the plan's expert_offset /
// expert_rows on the device. M is an expert's real rows: padding rows of `out` are not written (no
// reader of these outputs looks at them: the combine reads its units' rows, the activation backward
// skips padding).
//
// The schedules are compiled in two translation units (each of CUTLASS's kernels takes about a minute):
// expert_gemm_grouped.cu (ping-pong, cooperative), expert_gemm_grouped_160.cu (cooperative 128 x 160) and
// expert_gemm_grouped_320.cu (cooperative 128 x 320).
#pragma once

#include <type_traits>

#include "kernels/cutlass_grouped.cuh"
#include "kernels/fused_layers.hpp"

namespace comet::kernels::expert_grouped {

using grouped::Bf16;
using grouped::Problem;
using Row = cutlass::layout::RowMajor;
using Col = cutlass::layout::ColumnMajor;

// A is an expert's rows [rows][k] (K contiguous); W_e is [k][n] (N contiguous: RowMajor B) or [n][k]
// (K contiguous: ColumnMajor B); D [rows][n].
template <class LayoutB, class Sched>
using ExpertGemm = grouped::GroupedGemm<Row, LayoutB, Bf16, Sched>;

template <class G>
__global__ void setup_expert_groups(grouped::GroupArrays<G> g, ExpertGemmLaunch l, typename G::StrideA sa,
                                    typename G::StrideB sb, typename G::StrideD sd) {
  for (int e = threadIdx.x; e < l.experts; e += blockDim.x) {
    const int rows = l.expert_rows[e], first = l.expert_offset[e];
    grouped::write_group<G>(g, e, Problem::UnderlyingProblemShape{rows, l.n, l.k},
                            static_cast<const Bf16*>(l.a) + size_t(first) * l.k,
                            static_cast<const Bf16*>(l.w) + size_t(e) * l.k * l.n,
                            static_cast<Bf16*>(l.out) + size_t(first) * l.n, sa, sb, sd);
  }
}

template <class LayoutB, class Sched>
void launch(const ExpertGemmLaunch& l, cudaStream_t stream) {
  using G = ExpertGemm<LayoutB, Sched>;
  const int64_t K = l.k, N = l.n;
  constexpr bool w_kn = std::is_same_v<LayoutB, Row>;
  const auto sa = grouped::make_group_stride<typename G::StrideA>(K, 1);  // A (m, k) at m K + k
  // B (n, k): at n + k N for W_e [k][n], at n K + k for W_e [n][k]
  const auto sb = w_kn ? grouped::make_group_stride<typename G::StrideB>(1, N)
                       : grouped::make_group_stride<typename G::StrideB>(K, 1);
  const auto sd = grouped::make_group_stride<typename G::StrideD>(N, 1);  // D (m, n) at m N + n
  grouped::launch_groups<G>(l.experts, l.workspace, l.workspace_bytes, /*beta_one=*/false,
                            l.raster, "expert GEMM (grouped)",
                            stream, [&](const grouped::GroupArrays<G>& g, int) {
                              setup_expert_groups<G><<<1, 256, 0, stream>>>(g, l, sa, sb, sd);
                            });
}

// One schedule with W_e in either layout.
template <class Sched>
void launch_schedule(const ExpertGemmLaunch& l, cudaStream_t stream) {
  if (l.w_kn)
    launch<Row, Sched>(l, stream);
  else
    launch<Col, Sched>(l, stream);
}

// The workspace of one schedule's two layouts over `experts` groups.
template <class Sched>
size_t schedule_workspace_bytes(int experts) {
  return grouped::max_workspace_bytes<ExpertGemm<Row, Sched>, ExpertGemm<Col, Sched>>(experts);
}

// expert_gemm_grouped_160.cu: StandaloneGemm::grouped_160; expert_gemm_grouped_320.cu: grouped_320.
void launch_160(const ExpertGemmLaunch& l, cudaStream_t stream);
size_t workspace_bytes_160(int experts);
void launch_320(const ExpertGemmLaunch& l, cudaStream_t stream);
size_t workspace_bytes_320(int experts);

}  // namespace comet::kernels::expert_grouped
