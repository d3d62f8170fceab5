// The Hopper GEMM that the compute blocks of both fused layers run: CUTLASS's warp-specialized
// TMA + wgmma mainloop (cooperative: one producer warp group, two consumer warp groups on one tile),
// bf16 in, fp32 accumulate. We drive the collective from our own kernel (our tile order, our flag
// waits, our epilogue); CUTLASS gives the mainloop, the smem layouts and the pipeline.
//
// Operands, as the fused layers lay them out:
//   A: [rows_cap, K] row-major (the gathered tokens for layer 0, the hidden rows for layer 1);
//      one M-tile never straddles two experts (the plan pads every expert segment to TileM).
//   B: [L = local experts][N][K], K-major (nn.Linear layout); the tile's expert selects the L index.
//      (The backward's operands differ in which dimension is contiguous: Major below.)
// A is not batched: we view it with an L mode of stride 0, so one blk_coord (m, n, _, expert) serves
// both operands of the collective's load().
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>

namespace comet::kernels {

// Which dimension of an operand is contiguous in memory. The forward reads A and B K-major; the
// backward reads the weights N-major (W1 [E_l][H][F_s] as the B of G W1, W0 [E_l][N0_s][H] as the B of
// dPre W0) and, in the weight gradients (P^T Q over a row range), both operands MN-major.
enum class Major { k, mn };

// Shared memory the epilogue stages its output rows in (epilogue.cuh: store_tile): per consumer warp
// (8 of them) 16 rows x 64 columns of bf16 at a row pitch of 144 bytes. Carved out of the mainloop's
// stage count (128x256 and 128x192 tiles keep theirs; 128x128 goes from 7 stages to 6).
constexpr int kEpilogueWarps = 8;
constexpr int kEpilogueRows = 16;      // rows of the tile each consumer warp holds (wgmma m64: 16 per warp)
constexpr int kEpilogueCols = 64;      // columns staged at a time
constexpr int kEpiloguePitch = 144;    // bytes per staged row: 128 + 16, so 8 rows hit 8 different bank groups
constexpr int kEpilogueStagingBytes = kEpilogueWarps * kEpilogueRows * kEpiloguePitch;

// Device: the tiled TMA views (gA (BM,BK,m,k,l), gB (BN,BK,n,k,l)) that a collective's load() expects,
// A broadcast over L (stride 0: the tile's expert selects only B), shared by GemmConfig and
// Fp8GemmConfig.
template <class TileShape, class Params>
CUTE_DEVICE auto tiled_ab_views(const Params& p, int m, int n, int k, int experts) {
  using namespace cute;
  using X = Underscore;
  Tensor mA1 = p.tma_load_a.get_tma_tensor(make_shape(m, k, 1));
  Tensor mA = make_tensor(mA1.data(), make_layout(make_shape(m, k, experts),
                                                  make_stride(get<0>(mA1.stride()), get<1>(mA1.stride()), Int<0>{})));
  Tensor mB = p.tma_load_b.get_tma_tensor(make_shape(n, k, experts));
  Tensor gA = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
  Tensor gB = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
  return make_tuple(gA, gB);
}

template <int TileM_, int TileN_, Major AMajor_ = Major::k, Major BMajor_ = Major::k>
struct GemmConfig {
  static constexpr int TileM = TileM_;
  static constexpr int TileN = TileN_;
  static constexpr int TileK = 64;
  static constexpr Major AMajor = AMajor_;
  static constexpr Major BMajor = BMajor_;
  static constexpr int kThreads = 384;  // producer warp group + two consumer warp groups
  static constexpr int kConsumerThreads = 256;

  // CUTLASS's layout tags: A is M x K (RowMajor: K contiguous), B is K x N (ColumnMajor: K contiguous).
  using LayoutA = std::conditional_t<AMajor == Major::k, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using LayoutB = std::conditional_t<BMajor == Major::k, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  // In a 1 x 1 cluster this collective loads a K-major operand's tile rows with one TMA box, which holds
  // at most 256 rows: wider, the descriptor fails to build (CUTLASS prints an error and goes on) and the
  // first load never lands. Layer 0 on 128 x 320 tiles hung that way on the H100 (docs/design-changes.md,
  // "Tried on 2026-12-06 (sixteenth session)"). CUTLASS's grouped kernels run 128 x 320 in 2 x 1
  // clusters, where each block loads half of B's rows (160) and multicasts them.
  static_assert((AMajor == Major::mn || TileM <= 256) && (BMajor == Major::mn || TileN <= 256),
                "a K-major operand's tile is wider than one TMA box (256 rows)");
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::bfloat16_t, LayoutA, 8,
      cutlass::bfloat16_t, LayoutB, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueStagingBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using MainloopParams = typename Mainloop::Params;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  // The TMA thread alone fills a stage (Fp8GemmConfig adds a scale-loading warp).
  static constexpr bool kScaleWarp = false;
  static constexpr int kProducerArrivals = 1;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) char epilogue_staging[kEpilogueStagingBytes];  // epilogue.cuh: store_tile
  };
  static constexpr int kSharedBytes = int(sizeof(SharedStorage));
  static_assert(kSharedBytes <= 227 * 1024, "the tile's stages and the epilogue's staging exceed shared memory");

  // Packed strides (m or n, k, l) of an operand with `outer` rows of the non-K dimension and k of K:
  // K-major [l][outer][k], MN-major [l][k][outer].
  template <class Stride, Major M>
  static Stride packed_stride(int outer, int k) {
    using namespace cute;
    if constexpr (M == Major::k) {
      return make_stride(int64_t(k), Int<1>{}, int64_t(outer) * k);
    } else {
      return make_stride(Int<1>{}, int64_t(outer), int64_t(outer) * k);
    }
  }

  // Host: TMA descriptors for A [m, k] (not batched: one L for all experts) and B [experts] x (n, k).
  static MainloopParams make_params(const void* a, int m, int k, const void* b, int n, int experts) {
    using namespace cute;
    using StrideA = typename Mainloop::StrideA;
    using StrideB = typename Mainloop::StrideB;
    auto ptr_a = static_cast<const cutlass::bfloat16_t*>(a);
    auto ptr_b = static_cast<const cutlass::bfloat16_t*>(b);
    // A's descriptor is built for L = 1; B's for L = experts. (The A descriptor of the second call
    // describes a fake batched A and is discarded.)
    const StrideA da = packed_stride<StrideA, AMajor>(m, k);
    const StrideB db = packed_stride<StrideB, BMajor>(n, k);
    MainloopParams pa = Mainloop::to_underlying_arguments(make_shape(m, n, k, 1),
                                                          typename Mainloop::Arguments{ptr_a, da, ptr_b, db}, nullptr);
    MainloopParams pb = Mainloop::to_underlying_arguments(make_shape(m, n, k, experts),
                                                          typename Mainloop::Arguments{ptr_a, da, ptr_b, db}, nullptr);
    pb.tma_load_a = pa.tma_load_a;
    return pb;
  }

  // Device: the (gA_mkl, gB_nkl) tuple the collective's load() expects, A broadcast over L.
  CUTE_DEVICE static auto load_inputs(const MainloopParams& p, int m, int n, int k, int experts) {
    return tiled_ab_views<TileShape>(p, m, n, k, experts);
  }
};

}  // namespace comet::kernels
