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
// tma_b: the descriptor B's tiles are loaded with (GemmConfig: CUTLASS's, or the two-box one).
template <class TileShape, class TmaA, class TmaB>
CUTE_DEVICE auto tiled_ab_views(const TmaA& tma_a, const TmaB& tma_b, int m, int n, int k, int experts) {
  using namespace cute;
  using X = Underscore;
  Tensor mA1 = tma_a.get_tma_tensor(make_shape(m, k, 1));
  Tensor mA = make_tensor(mA1.data(), make_layout(make_shape(m, k, experts),
                                                  make_stride(get<0>(mA1.stride()), get<1>(mA1.stride()), Int<0>{})));
  Tensor mB = tma_b.get_tma_tensor(make_shape(n, k, experts));
  Tensor gA = local_tile(mA, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
  Tensor gB = local_tile(mB, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
  return make_tuple(gA, gB);
}

// B's tile rows in two TMA boxes (GemmConfig::kSplitB): the descriptor make_tma_copy_B_sm90 builds for
// a cluster of two blocks along M, where each block loads half of the rows (and multicasts them). Here
// there is no cluster: the one producer issues both halves into each stage (GemmConfig::load).
template <class Mainloop, class TileShape>
struct TwoBoxB {
  using HalvesCluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  template <class GTensor>
  static auto make(const GTensor& b) {
    using namespace cute;
    return make_tma_copy_B_sm90(SM90_TMA_LOAD{}, b, typename Mainloop::SmemLayoutB{}(_, _, Int<0>{}), TileShape{},
                                HalvesCluster{});
  }
  using Tma = decltype(make(cute::make_tensor(static_cast<typename Mainloop::InternalElementB const*>(nullptr),
                                              cute::repeat_like(typename Mainloop::StrideB{}, int32_t(0)),
                                              typename Mainloop::StrideB{})));
  // CUTLASS's parameters (A's descriptor, the stage's transaction bytes) and B's two-box descriptor;
  // CUTLASS's own B descriptor stays empty (it would be one box of all the rows).
  struct Params : Mainloop::Params {
    Tma tma_load_b_halves;
  };
};

template <bool TwoBoxes, class Mainloop, class TileShape>
struct MainloopParamsOf {
  using type = typename Mainloop::Params;
};
template <class Mainloop, class TileShape>
struct MainloopParamsOf<true, Mainloop, TileShape> {
  using type = typename TwoBoxB<Mainloop, TileShape>::Params;
};

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
  // clusters, where each block loads half of B's rows (160) and multicasts them; a K-major B wider than
  // 256 is loaded the same way here, both halves by our producer (kSplitB, TwoBoxB).
  static_assert(AMajor == Major::mn || TileM <= 256, "a K-major A tile is wider than one TMA box (256 rows)");
  static_assert(BMajor == Major::mn || TileN <= 512, "a K-major B tile is wider than two TMA boxes (2 x 256 rows)");
  static constexpr bool kSplitB = BMajor == Major::k && TileN > 256;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::bfloat16_t, LayoutA, 8,
      cutlass::bfloat16_t, LayoutB, 8,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueStagingBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using MainloopParams = typename MainloopParamsOf<kSplitB, Mainloop, TileShape>::type;
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
    const StrideA da = packed_stride<StrideA, AMajor>(m, k);
    const StrideB db = packed_stride<StrideB, BMajor>(n, k);
    if constexpr (kSplitB) {
      // A's descriptor as CUTLASS's to_underlying_arguments builds it, B's in two boxes; CUTLASS's one-box
      // B descriptor is not built (its encoding fails: more than 256 rows).
      MainloopParams p{};  // the transaction bytes: CUTLASS's defaults (the whole stage, A and B)
      auto raw_a = reinterpret_cast<typename Mainloop::InternalElementA const*>(a);
      auto raw_b = reinterpret_cast<typename Mainloop::InternalElementB const*>(b);
      p.tma_load_a = make_tma_copy_A_sm90(typename Mainloop::GmemTiledCopyA{},
                                          make_tensor(raw_a, make_layout(make_shape(m, k, 1), da)),
                                          typename Mainloop::SmemLayoutA{}(_, _, Int<0>{}), TileShape{}, ClusterShape{});
      p.tma_load_b_halves =
          TwoBoxB<Mainloop, TileShape>::make(make_tensor(raw_b, make_layout(make_shape(n, k, experts), db)));
      return p;
    } else {
      auto ptr_a = static_cast<const cutlass::bfloat16_t*>(a);
      auto ptr_b = static_cast<const cutlass::bfloat16_t*>(b);
      // A's descriptor is built for L = 1; B's for L = experts. (The A descriptor of the second call
      // describes a fake batched A and is discarded.)
      MainloopParams pa = Mainloop::to_underlying_arguments(make_shape(m, n, k, 1),
                                                            typename Mainloop::Arguments{ptr_a, da, ptr_b, db}, nullptr);
      MainloopParams pb = Mainloop::to_underlying_arguments(make_shape(m, n, k, experts),
                                                            typename Mainloop::Arguments{ptr_a, da, ptr_b, db}, nullptr);
      pb.tma_load_a = pa.tma_load_a;
      return pb;
    }
  }

  // Device: the (gA_mkl, gB_nkl) tuple the collective's load() expects, A broadcast over L.
  CUTE_DEVICE static auto load_inputs(const MainloopParams& p, int m, int n, int k, int experts) {
    if constexpr (kSplitB) return tiled_ab_views<TileShape>(p.tma_load_a, p.tma_load_b_halves, m, n, k, experts);
    else return tiled_ab_views<TileShape>(p.tma_load_a, p.tma_load_b, m, n, k, experts);
  }

  // Device, the producer warp: the stages of one tile, k_tiles K-tiles from k_iter (CUTLASS's load()
  // unless B is in two boxes: then the same loop, B's two halves issued into each stage against the
  // stage's one barrier, whose transaction bytes are the whole stage's either way).
  template <class Pipeline, class State, class Inputs, class Coord, class KIter>
  CUTE_DEVICE static void load(Mainloop& mainloop, const MainloopParams& p, Pipeline& pipeline, State state,
                               const Inputs& inputs, const Coord& coord, KIter k_iter, int k_tiles, int lane,
                               typename Mainloop::TensorStorage& tensors) {
    using namespace cute;
    if constexpr (!kSplitB) {
      mainloop.load(p, pipeline, state, inputs, coord, k_iter, k_tiles, lane, 0u, tensors);
    } else {
      if (!elect_one_sync()) return;
      Tensor sA = make_tensor(make_smem_ptr(tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
      Tensor sB = make_tensor(make_smem_ptr(tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
      Tensor gA = get<0>(inputs)(_, _, get<0>(coord), _, get<3>(coord));  // (BLK_M, BLK_K, k)
      Tensor gB = get<1>(inputs)(_, _, get<1>(coord), _, get<3>(coord));  // (BLK_N, BLK_K, k)
      auto a = p.tma_load_a.get_slice(0);
      auto b0 = p.tma_load_b_halves.get_slice(0), b1 = p.tma_load_b_halves.get_slice(1);
      Tensor tAgA = a.partition_S(gA);
      Tensor tAsA = a.partition_D(sA);
      Tensor tB0g = b0.partition_S(gB);
      Tensor tB0s = b0.partition_D(sB);
      Tensor tB1g = b1.partition_S(gB);
      Tensor tB1s = b1.partition_D(sB);
      for (; k_tiles > 0; --k_tiles) {
        pipeline.producer_acquire(state);
        auto* barrier = pipeline.producer_get_barrier(state);
        const int stage = state.index();
        copy(p.tma_load_a.with(*barrier), tAgA(_, _, _, *k_iter), tAsA(_, _, _, stage));
        copy(p.tma_load_b_halves.with(*barrier), tB0g(_, _, _, *k_iter), tB0s(_, _, _, stage));
        copy(p.tma_load_b_halves.with(*barrier), tB1g(_, _, _, *k_iter), tB1s(_, _, _, stage));
        ++k_iter;
        ++state;
      }
    }
  }

  // Device: the descriptors' prefetch (CUTLASS's, or A's and B's two-box one).
  CUTE_DEVICE static void prefetch_descriptors(const MainloopParams& p) {
    if constexpr (kSplitB) {
      cute::prefetch_tma_descriptor(p.tma_load_a.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_load_b_halves.get_tma_descriptor());
    } else {
      Mainloop::prefetch_tma_descriptors(p);
    }
  }
};

}  // namespace comet::kernels
