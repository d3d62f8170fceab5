// The Hopper GEMM that the compute blocks of both fused layers run: CUTLASS's warp-specialized
// TMA + wgmma mainloop (cooperative: one producer warp group, two consumer warp groups on one tile),
// bf16 in, fp32 accumulate. We drive the collective from our own kernel (our tile order, our flag
// waits, our epilogue); CUTLASS gives the mainloop, the smem layouts and the pipeline.
//
// Operands, as the fused layers lay them out:
//   A: [rows_cap, K] row-major (the gathered tokens for layer 0, the hidden rows for layer 1);
//      one M-tile never straddles two experts (the plan pads every expert segment to TileM).
//   B: [L = local experts][N][K], K-major (nn.Linear layout); the tile's expert selects the L index.
// A is not batched: we view it with an L mode of stride 0, so one blk_coord (m, n, _, expert) serves
// both operands of the collective's load().
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>

namespace comet::kernels {

template <int TileM_, int TileN_>
struct GemmConfig {
  static constexpr int TileM = TileM_;
  static constexpr int TileN = TileN_;
  static constexpr int TileK = 64;
  static constexpr int kThreads = 384;  // producer warp group + two consumer warp groups
  static constexpr int kConsumerThreads = 256;

  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::bfloat16_t, cutlass::layout::RowMajor, 8,     // A: M x K, K contiguous
      cutlass::bfloat16_t, cutlass::layout::ColumnMajor, 8,  // B: K x N column-major == N x K, K contiguous
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<0>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using MainloopParams = typename Mainloop::Params;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
  };
  static constexpr int kSharedBytes = int(sizeof(SharedStorage));

  // Host: TMA descriptors for A [rows_cap, K] and B [experts][N][K].
  static MainloopParams make_params(const void* a, int rows_cap, int k, const void* b, int n, int experts) {
    using namespace cute;
    using StrideA = typename Mainloop::StrideA;
    using StrideB = typename Mainloop::StrideB;
    auto ptr_a = static_cast<const cutlass::bfloat16_t*>(a);
    auto ptr_b = static_cast<const cutlass::bfloat16_t*>(b);
    // A's descriptor is built for L = 1; B's for L = experts. (The A descriptor of the second call
    // describes a fake batched A and is discarded.)
    // Packed K-major strides (m or n, k, l).
    StrideA da1 = make_stride(int64_t(k), Int<1>{}, int64_t(rows_cap) * k);
    StrideA dal = da1;
    StrideB db = make_stride(int64_t(k), Int<1>{}, int64_t(n) * k);
    MainloopParams pa = Mainloop::to_underlying_arguments(make_shape(rows_cap, n, k, 1),
                                                          typename Mainloop::Arguments{ptr_a, da1, ptr_b, db}, nullptr);
    MainloopParams pb = Mainloop::to_underlying_arguments(make_shape(rows_cap, n, k, experts),
                                                          typename Mainloop::Arguments{ptr_a, dal, ptr_b, db}, nullptr);
    pb.tma_load_a = pa.tma_load_a;
    return pb;
  }

  // Device: the (gA_mkl, gB_nkl) tuple the collective's load() expects, A broadcast over L.
  CUTE_DEVICE static auto load_inputs(const MainloopParams& p, int rows_cap, int n, int k, int experts) {
    using namespace cute;
    using X = Underscore;
    Tensor mA1 = p.tma_load_a.get_tma_tensor(make_shape(rows_cap, k, 1));
    Tensor mA = make_tensor(mA1.data(), make_layout(make_shape(rows_cap, k, experts),
                                                    make_stride(get<0>(mA1.stride()), get<1>(mA1.stride()), Int<0>{})));
    Tensor mB = p.tma_load_b.get_tma_tensor(make_shape(n, k, experts));
    Tensor gA = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});  // (BM,BK,m,k,l)
    Tensor gB = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});  // (BN,BK,n,k,l)
    return make_tuple(gA, gB);
  }
};

}  // namespace comet::kernels
