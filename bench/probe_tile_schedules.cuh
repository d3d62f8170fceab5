// The probe's extra schedules (probe_tiles.hpp): CUTLASS's cooperative kernel on tiles the library does
// not compile. Included by the probe_tiles_*.cu translation units only.
#pragma once

#include "kernels/cutlass_grouped.cuh"
#include "kernels/expert_gemm_grouped.cuh"
#include "kernels/weight_grad_grouped.cuh"
#include "probe_tiles.hpp"

namespace comet::bench::probe_tiles {

using namespace cute;

template <int M, int N>
struct CooperativeTile {
  using TileShape = Shape<Int<M>, Int<N>, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

template <class Sched>
ExpertSchedule expert_schedule(const char* name) {
  return {name, [](const kernels::ExpertGemmLaunch& l, cudaStream_t s) { kernels::expert_grouped::launch_schedule<Sched>(l, s); },
          [](int experts) { return kernels::expert_grouped::schedule_workspace_bytes<Sched>(experts); }};
}

template <class Sched>
WgradSchedule wgrad_schedule(const char* name) {
  using namespace kernels::wgrad_grouped;
  return {name,
          [](const kernels::WeightGradLaunch& l, cudaStream_t s) {
            COMET_REQUIRE(!l.out_f32, "the probe's weight gradients are bf16");
            launch<Bf16, Sched>(l, s);
          },
          [](int experts) { return kernels::grouped::max_workspace_bytes<GroupedWeightGrad<Bf16, Sched>>(experts); }};
}

}  // namespace comet::bench::probe_tiles
