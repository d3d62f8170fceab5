// The weight gradients as CUTLASS's own grouped GEMM (WeightGradKernel::grouped: ping-pong schedule;
// grouped_cooperative: cooperative in 2 x 1 clusters): one group per local expert, out_e = P_e^T Q_e
// with K = the expert's rows. Where our persistent kernel (weight_grad_kernel.cuh) runs its epilogue in
// the same warp groups as its mainloop, the ping-pong schedule lets one consumer warp group store a tile
// while the other computes the next, which is what short K (an expert's rows at 1024 tokens) needs: there the fp32 store took a quarter
// of the tile's time and our kernel ran at 0.77-0.80 of cuBLAS (bench/results/SUMMARY_backward.md).
//
// Everything the kernel reads about the groups lives on the device (the plan's expert_offset /
// expert_rows): a setup kernel writes the per-group problem shapes and pointers into the workspace, so
// the host never waits for the routing. An expert without rows gets an M of 0 (no tiles); without
// accumulate its gradient is then zeroed by the setup kernel, as the persistent kernel's K of 0 does.
#include <cuda_bf16.h>

#include <algorithm>
#include <utility>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "comet/common.hpp"
#include "comet/cuda_check.hpp"
#include "kernels/fused_layers.hpp"

namespace comet::kernels {
namespace {

using namespace cute;
using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using Bf16 = cutlass::bfloat16_t;
// out_e = P_e^T Q_e: A = P_e^T is M x K with M (P's columns) contiguous, B = Q_e is K x N with N
// contiguous, D is M x N with N contiguous.
using LayoutA = cutlass::layout::ColumnMajor;
using LayoutB = cutlass::layout::RowMajor;
using LayoutD = cutlass::layout::RowMajor;
// The two schedules offered (WeightGradKernel::grouped, grouped_cooperative): ping-pong, one warp group's epilogue under the other's
// mainloop, for short K; cooperative 128 x 256 as our persistent kernel but in 2 x 1 clusters (TMA
// multicast of the shared operand), to see what the clusters are worth at long K.
struct PingpongSchedule {
  using TileShape = Shape<_128, _128, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};
struct CooperativeSchedule {
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

template <class Out, class Sched>
struct GroupedWeightGrad {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Sched::TileShape, typename Sched::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      Out, LayoutD*, 16 / sizeof(Out), Out, LayoutD*, 16 / sizeof(Out), typename Sched::Epilogue,
      cutlass::epilogue::fusion::LinearCombination<Out, float, Out, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA*, 8, Bf16, LayoutB*, 8, float,
      typename Sched::TileShape, typename Sched::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      typename Sched::Kernel>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Problem, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
};

// A stride of CUTLASS's (outer, inner, batch) form: its dynamic modes set to (s0, s1, 0) (one matrix
// per group); a static mode must already hold its value.
template <class Stride>
Stride make_group_stride(int64_t s0, int64_t s1) {
  Stride s{};
  const int64_t want[3] = {s0, s1, 0};
  cute::for_each(cute::make_seq<3>{}, [&](auto i) {
    using Mode = cute::remove_cvref_t<decltype(cute::get<i>(s))>;
    if constexpr (cute::is_static<Mode>::value) {
      static_assert(i == 2 || Mode::value == 1, "a static stride mode other than the unit one");
    } else {
      cute::get<i>(s) = want[i];
    }
  });
  return s;
}

// The per-group arguments, laid out at the front of the workspace (CUTLASS's own workspace follows).
template <class Out, class Sched>
struct GroupArrays {
  using G = GroupedWeightGrad<Out, Sched>;
  Problem::UnderlyingProblemShape* shapes;
  const Bf16** a;
  const Bf16** b;
  const Out** c;
  Out** d;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
  size_t bytes;  // of the arrays, rounded to 256
};

template <class Out, class Sched>
GroupArrays<Out, Sched> carve(void* workspace, int experts) {
  using G = GroupedWeightGrad<Out, Sched>;
  GroupArrays<Out, Sched> g{};
  auto* at = static_cast<char*>(workspace);
  size_t used = 0;
  auto take = [&](auto*& ptr, size_t each) {
    used = (used + 15) / 16 * 16;
    ptr = workspace ? reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(at + used) : nullptr;
    used += each * size_t(experts);
  };
  take(g.shapes, sizeof(Problem::UnderlyingProblemShape));
  take(g.a, sizeof(void*));
  take(g.b, sizeof(void*));
  take(g.c, sizeof(void*));
  take(g.d, sizeof(void*));
  take(g.stride_a, sizeof(typename G::StrideA));
  take(g.stride_b, sizeof(typename G::StrideB));
  take(g.stride_c, sizeof(typename G::StrideC));
  take(g.stride_d, sizeof(typename G::StrideD));
  g.bytes = (used + 255) / 256 * 256;
  return g;
}

// One thread per expert writes its group; the blocks after the first zero the outputs of experts
// without rows when the gradient is overwritten (accumulate keeps them: a zero gradient adds nothing).
template <class Out, class Sched, class G = GroupedWeightGrad<Out, Sched>>
__global__ void setup_groups(GroupArrays<Out, Sched> g, WeightGradLaunch l, typename G::StrideA sa,
                             typename G::StrideB sb, typename G::StrideD sd) {
  const int M = l.p_cols, N = l.q_cols;
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e < l.experts; e += blockDim.x) {
      const int rows = l.expert_rows[e], first = l.expert_offset[e];
      g.shapes[e] = Problem::UnderlyingProblemShape{rows > 0 ? M : 0, N, rows};
      g.a[e] = static_cast<const Bf16*>(l.p) + size_t(first) * M;
      g.b[e] = static_cast<const Bf16*>(l.q) + size_t(first) * N;
      Out* out = static_cast<Out*>(l.out) + size_t(e) * M * N;
      g.c[e] = out;
      g.d[e] = out;
      g.stride_a[e] = sa;
      g.stride_b[e] = sb;
      g.stride_c[e] = sd;
      g.stride_d[e] = sd;
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
typename GroupedWeightGrad<Out, Sched>::Gemm::Arguments arguments(const WeightGradLaunch& l,
                                                                const GroupArrays<Out, Sched>& g, int sms,
                                                                int device = 0) {
  using G = GroupedWeightGrad<Out, Sched>;
  typename G::Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.f;
  fusion.beta = l.accumulate ? 1.f : 0.f;
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sms;
  args = typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {l.experts, g.shapes, nullptr},
                                     {g.a, g.stride_a, g.b, g.stride_b},
                                     {fusion, g.c, g.stride_c, g.d, g.stride_d},
                                     hw};
  return args;
}

// The current device and its multiprocessors.
std::pair<int, int> device_and_sms() {
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return {device, sms};
}

// CUTLASS sizes its workspace (tensor maps per multiprocessor) by the grid's SMs; we size it for this
// many, so that the footprint is known without a GPU, and refuse a GPU with more.
constexpr int kMaxWorkspaceSms = 256;

template <class Out, class Sched>
size_t workspace_bytes(int experts) {
  using G = GroupedWeightGrad<Out, Sched>;
  WeightGradLaunch l;
  l.experts = experts;
  const GroupArrays<Out, Sched> g = carve<Out, Sched>(nullptr, experts);
  return g.bytes + G::Gemm::get_workspace_size(arguments<Out, Sched>(l, g, kMaxWorkspaceSms));
}

template <class Out, class Sched>
void launch(const WeightGradLaunch& l, cudaStream_t stream) {
  using G = GroupedWeightGrad<Out, Sched>;
  const GroupArrays<Out, Sched> g = carve<Out, Sched>(l.workspace, l.experts);
  const size_t need = workspace_bytes<Out, Sched>(l.experts);
  COMET_REQUIRE(l.workspace && l.workspace_bytes >= need, "weight gradient (grouped): the workspace holds ",
                l.workspace_bytes, " bytes, ", need, " needed");
  COMET_REQUIRE(reinterpret_cast<uintptr_t>(l.workspace) % 256 == 0,
                "weight gradient (grouped): the workspace must be 256-byte aligned");
  const int64_t M = l.p_cols, N = l.q_cols;
  const auto sa = make_group_stride<typename G::StrideA>(1, M);  // A (m, k) at m + k M
  const auto sb = make_group_stride<typename G::StrideB>(1, N);  // B (n, k) at n + k N
  const auto sd = make_group_stride<typename G::StrideD>(N, 1);  // D (m, n) at m N + n
  const auto [device, sms] = device_and_sms();
  COMET_REQUIRE(sms <= kMaxWorkspaceSms, "weight gradient (grouped): ", sms, " multiprocessors, the workspace is sized for ",
                kMaxWorkspaceSms);
  setup_groups<Out, Sched><<<l.accumulate ? 1 : 1 + sms, 256, 0, stream>>>(g, l, sa, sb, sd);
  COMET_CUDA_CHECK_LAUNCH();
  typename G::Gemm gemm;
  const auto args = arguments<Out, Sched>(l, g, sms, device);
  void* cutlass_workspace = static_cast<char*>(l.workspace) + g.bytes;
  COMET_REQUIRE(gemm.can_implement(args) == cutlass::Status::kSuccess,
                "weight gradient (grouped): CUTLASS cannot run this problem (P ", l.p_cols, " x Q ", l.q_cols, ")");
  COMET_REQUIRE(gemm.initialize(args, cutlass_workspace, stream) == cutlass::Status::kSuccess,
                "weight gradient (grouped): CUTLASS's initialize failed");
  COMET_REQUIRE(gemm.run(stream) == cutlass::Status::kSuccess, "weight gradient (grouped): CUTLASS's launch failed");
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t weight_grad_grouped_workspace_bytes(int experts) {
  // A multiple of 256: the engine puts two workspaces back to back, and CUTLASS's tensor maps in each
  // need 128-byte alignment.
  const size_t bytes = std::max({workspace_bytes<float, PingpongSchedule>(experts), workspace_bytes<Bf16, PingpongSchedule>(experts),
                   workspace_bytes<float, CooperativeSchedule>(experts),
                   workspace_bytes<Bf16, CooperativeSchedule>(experts)});
  return (bytes + 255) / 256 * 256;
}

void launch_weight_grad_grouped(const WeightGradLaunch& l, cudaStream_t stream) {
  COMET_REQUIRE(l.p_cols % 8 == 0 && l.q_cols % 8 == 0 && l.p_cols > 0 && l.q_cols > 0,
                "weight gradient: operand widths (", l.p_cols, ", ", l.q_cols, ") must be positive multiples of 8");
  COMET_REQUIRE(l.experts > 0, "weight gradient: no experts");
  const bool coop = l.kernel == WeightGradKernel::grouped_cooperative;
  COMET_REQUIRE(coop || l.kernel == WeightGradKernel::grouped, "weight gradient (grouped): not a grouped GEMM");
  if (l.out_f32) {
    coop ? launch<float, CooperativeSchedule>(l, stream) : launch<float, PingpongSchedule>(l, stream);
  } else {
    coop ? launch<Bf16, CooperativeSchedule>(l, stream) : launch<Bf16, PingpongSchedule>(l, stream);
  }
}

}  // namespace comet::kernels
