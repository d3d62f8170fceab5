// What comet's two uses of CUTLASS's sm90 pointer-array grouped GEMM share (weight_grad_grouped.cu: the
// weight gradients; expert_gemm_grouped.cuh: an expert GEMM with no comm blocks beside it): the
// schedules we compile, the kernel type for a pair of operand layouts, CUTLASS's stride form, and how
// the workspace is sized. One group is one local expert; its shape and pointers are written on the
// device from the plan, so the host never waits for the routing.
#pragma once

#include <algorithm>
#include <cstdint>
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

namespace comet::kernels::grouped {

using namespace cute;
using Problem = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using Bf16 = cutlass::bfloat16_t;

// Ping-pong: two consumer warp groups on alternate tiles, one's epilogue under the other's mainloop
// (short K, where the store is a large share of a tile). Cooperative: both warp groups on one 128 x 256
// tile, as our own kernels, in 2 x 1 clusters (TMA multicast of the shared operand).
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
// Cooperative on 128 x 160 tiles: a TP 8 shard's narrow N (F / 8 = 320 and 800, 2 F / 8 = 640 and 1600
// in Qwen2-57B and Phi-3.5) in whole tiles, where 256-wide tiles compute up to 1.6 times the columns.
// cuBLAS runs 160- or 320-wide tiles there (bench/results/h100_cublas_algo_probe_95bc2db.txt). The 2 x 1
// clusters share W_e's tile between two M-tiles of an expert. Measured (H100): 17-29 % faster than ours
// on Qwen2-57B TP 8's launch 2 (N = 320), no faster than 128 x 256 at N = 800, slower wherever N is wide
// (H, or F in EP 8): a table pick (bench/results/h100_bwd_entries_0f9afce/).
struct Cooperative160Schedule {
  using TileShape = Shape<_128, _160, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// Cooperative on 128 x 320 tiles (two 64 x 160 wgmma atoms per warp group across N): a narrow N whole in
// one or a few tiles, each M-tile of A read once per 320 columns. Measured on the H100
// (bench/results/h100_probe_tiles_b37ed5d/): Qwen2-57B TP 8 (N = F / 8 = 320), launch 2 at 16384 tokens
// 4.04 ms against 4.91 for 128 x 160 (cuBLAS 3.86), its dW1 3.74 against 6.79 for 128 x 256 (cuBLAS 4.87);
// Phi-3.5 TP 8 (N = 800) gains 4-21 %. Where N is a multiple of 256 it loses 5-25 %: prefers_320_tiles()
// (comet/variant.hpp) says where the planner runs it.
struct Cooperative320Schedule {
  using TileShape = Shape<_128, Int<320>, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using Kernel = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using Epilogue = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// D_e = alpha A_e B_e + beta C_e in bf16 operands, fp32 accumulation, Out output; D row-major.
template <class LayoutA, class LayoutB, class Out, class Sched>
struct GroupedGemm {
  using LayoutD = cutlass::layout::RowMajor;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Sched::TileShape, typename Sched::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Out, LayoutD*, 16 / sizeof(Out), Out, LayoutD*,
      16 / sizeof(Out), typename Sched::Epilogue,
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
  using Output = Out;
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

// The per-group arguments, laid out at the front of a workspace (CUTLASS's own workspace follows).
template <class G>
struct GroupArrays {
  using Out = typename G::Output;
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

// The arrays of `groups` groups in `workspace` (null: only their size).
template <class G>
GroupArrays<G> carve(void* workspace, int groups) {
  GroupArrays<G> g{};
  auto* at = static_cast<char*>(workspace);
  size_t used = 0;
  auto take = [&](auto*& ptr, size_t each) {
    used = (used + 15) / 16 * 16;
    ptr = workspace ? reinterpret_cast<std::remove_reference_t<decltype(ptr)>>(at + used) : nullptr;
    used += each * size_t(groups);
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

// Group e of the arrays: its shape, operands and output (also C: beta 1 accumulates into D in place),
// and the strides every group shares. Called by the setup kernels, one thread per group.
template <class G>
__device__ void write_group(const GroupArrays<G>& g, int e, Problem::UnderlyingProblemShape shape, const Bf16* a,
                            const Bf16* b, typename G::Output* out, const typename G::StrideA& sa,
                            const typename G::StrideB& sb, const typename G::StrideD& sd) {
  g.shapes[e] = shape;
  g.a[e] = a;
  g.b[e] = b;
  g.c[e] = out;
  g.d[e] = out;
  g.stride_a[e] = sa;
  g.stride_b[e] = sb;
  g.stride_c[e] = sd;
  g.stride_d[e] = sd;
}

// CUTLASS's arguments for the groups in `g` (beta 1: D += A B, C = D; else D = A B), its tiles walked in
// `raster` order (fused_layers.hpp). CUTLASS's grouped scheduler walks down M unless told, and applies
// no swizzle (that needs the groups' shapes on the host): where a group has many M-tiles, down M streams
// its A from HBM once per column block, along N once while the group's few B tiles stay in L2.
template <class G>
typename G::Gemm::Arguments arguments(const GroupArrays<G>& g, int groups, bool beta_one, int sms, int device = 0,
                                      GroupRaster raster = GroupRaster::along_m) {
  typename G::Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion{};
  fusion.alpha = 1.f;
  fusion.beta = beta_one ? 1.f : 0.f;
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
                                     {groups, g.shapes, nullptr},
                                     {g.a, g.stride_a, g.b, g.stride_b},
                                     {fusion, g.c, g.stride_c, g.d, g.stride_d},
                                     hw};
  using RasterOptions = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = raster == GroupRaster::along_n ? RasterOptions::AlongN : RasterOptions::AlongM;
  return args;
}

// CUTLASS sizes its workspace (tensor maps per multiprocessor) by the grid's SMs; we size it for this
// many, so that the footprint is known without a GPU, and refuse a GPU with more.
constexpr int kMaxWorkspaceSms = 256;

// The workspace one launch of G over `groups` groups needs: the arrays, then CUTLASS's.
template <class G>
size_t workspace_bytes(int groups) {
  const GroupArrays<G> g = carve<G>(nullptr, groups);
  return g.bytes + G::Gemm::get_workspace_size(arguments<G>(g, groups, false, kMaxWorkspaceSms));
}

// The largest workspace of the kernels Gs over `groups` groups, rounded up to 256 bytes: the engine puts
// workspaces back to back, and CUTLASS's tensor maps in each need 128-byte alignment.
template <class... Gs>
size_t max_workspace_bytes(int groups) {
  const size_t bytes = std::max({workspace_bytes<Gs>(groups)...});
  return (bytes + 255) / 256 * 256;
}

// The current device and its multiprocessors.
inline std::pair<int, int> device_and_sms() {
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return {device, sms};
}

// Refuses a workspace that cannot hold a launch of G over `groups` groups on this device (`what` names
// the caller); before the setup kernel writes into it. Returns the device and its multiprocessors.
template <class G>
std::pair<int, int> check_workspace(int groups, const void* workspace, size_t bytes, const char* what) {
  const size_t need = workspace_bytes<G>(groups);
  COMET_REQUIRE(workspace && bytes >= need, what, ": the workspace holds ", bytes, " bytes, ", need, " needed");
  // CUTLASS's tensor maps need 128-byte alignment; the arrays in front are a multiple of 256.
  COMET_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 256 == 0, what, ": the workspace must be 256-byte aligned");
  const auto [device, sms] = device_and_sms();
  COMET_REQUIRE(sms <= kMaxWorkspaceSms, what, ": ", sms, " multiprocessors, the workspace is sized for ",
                kMaxWorkspaceSms);
  return {device, sms};
}

// Runs G over the groups the setup kernel (already launched on `stream`) wrote into g's arrays; the
// workspace passed check_workspace.
template <class G>
void run(const GroupArrays<G>& g, int groups, bool beta_one, GroupRaster raster, void* workspace, int device, int sms,
         cudaStream_t stream, const char* what) {
  typename G::Gemm gemm;
  const auto args = arguments<G>(g, groups, beta_one, sms, device, raster);
  void* cutlass_workspace = static_cast<char*>(workspace) + g.bytes;
  COMET_REQUIRE(gemm.can_implement(args) == cutlass::Status::kSuccess, what, ": CUTLASS cannot run this problem");
  COMET_REQUIRE(gemm.initialize(args, cutlass_workspace, stream) == cutlass::Status::kSuccess, what,
                ": CUTLASS's initialize failed");
  COMET_REQUIRE(gemm.run(stream) == cutlass::Status::kSuccess, what, ": CUTLASS's launch failed");
  COMET_CUDA_CHECK_LAUNCH();
}

// One launch of G over `groups` groups: checks the workspace, carves the group arrays from it, has
// `setup(g, sms)` launch the kernel that writes them on `stream`, then runs G (beta_one: D += A B) in
// `raster` order.
template <class G, class Setup>
void launch_groups(int groups, void* workspace, size_t workspace_bytes, bool beta_one, GroupRaster raster, const char* what,
                   cudaStream_t stream, Setup&& setup) {
  const auto [device, sms] = check_workspace<G>(groups, workspace, workspace_bytes, what);
  const GroupArrays<G> g = carve<G>(workspace, groups);
  setup(g, sms);
  COMET_CUDA_CHECK_LAUNCH();
  run<G>(g, groups, beta_one, raster, workspace, device, sms, stream, what);
}

}  // namespace comet::kernels::grouped
