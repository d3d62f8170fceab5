// The fp8 GEMM of layer 0 (issue 17): CUTLASS's sm90 blockwise-scaled mainloop (e4m3 in, fp32
// accumulate, each 128-wide K block's partial sums promoted with its scales), driven by our compute
// role exactly as the bf16 GemmConfig is (same TileCoord loop, flag waits and epilogue).
//
// Operands:
//   A: the gathered token records [rows_cap][record_bytes(H)] (comet/fp8.hpp): codes at byte 0 of a
//      record, 1 x 128 scales (fp32) at byte H. The mainloop sees two strided views of the one buffer:
//      the codes as a TMA tensor [rows_cap][H] with row stride record_bytes, and the scales as
//      [rows_cap][H / 128] with row stride record_bytes / 4 floats. Both broadcast over L (stride 0).
//   B: W0 codes [experts][N][H] e4m3, K-major, with 128 x 128 block scales [experts][ceil(N/128)][H/128].
// Scales are K-major here (the records keep a token's scales with its codes), so CUTLASS loads them
// with cp.async from one producer warp of its own (the collective's load_auxiliary), not by TMA: a
// stage's full barrier then counts 33 arrivals (the TMA thread + 32 cp.async lanes), kProducerArrivals.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>

#include "kernels/gemm_config.cuh"

namespace comet::kernels {

template <int TileM_, int TileN_>
struct Fp8GemmConfig {
  static constexpr int TileM = TileM_;
  static constexpr int TileN = TileN_;
  static constexpr int TileK = 128;  // one scale block of K per stage
  static constexpr int kScaleBlock = 128;
  static constexpr Major AMajor = Major::k;
  static constexpr Major BMajor = Major::k;
  static constexpr int kThreads = 384;
  static constexpr int kConsumerThreads = 256;

  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleBlock, kScaleBlock, cute::GMMA::Major::K,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());  // ((1, rows), (128, H/128), L)
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());  // ((128, N/128), (128, H/128), L)
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, 16,
      cutlass::float_e4m3_t, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, 16,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueStagingBytes>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
  using MainloopParams = typename Mainloop::Params;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  static_assert(!Mainloop::IsTmaLoadSFA && !Mainloop::IsTmaLoadSFB, "K-major scales go by cp.async");

  // Producer warp 1 runs the collective's load_auxiliary (the scales); a stage is full after the TMA
  // thread's arrival and one per lane of that warp.
  static constexpr bool kScaleWarp = true;
  static constexpr int kProducerArrivals = Mainloop::NumProducerThreadEvents;

  struct SharedStorage {
    typename Mainloop::TensorStorage tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    alignas(16) char epilogue_staging[kEpilogueStagingBytes];
  };
  static constexpr int kSharedBytes = int(sizeof(SharedStorage));
  static_assert(kSharedBytes <= 227 * 1024, "the tile's stages and the epilogue's staging exceed shared memory");

  // Host: A = records [m][row_bytes] holding k codes and k / 128 scales each; B = codes [experts][n][k]
  // with scales [experts][ceil(n / 128)][k / 128]. k must be a multiple of 128, row_bytes of 16.
  static MainloopParams make_params(const void* a, int m, int k, int row_bytes, const void* b, const float* b_scales,
                                    int n, int experts) {
    using namespace cute;
    using StrideA = typename Mainloop::StrideA;
    using StrideB = typename Mainloop::StrideB;
    auto ptr_a = static_cast<const cutlass::float_e4m3_t*>(a);
    auto ptr_b = static_cast<const cutlass::float_e4m3_t*>(b);
    const auto* a_scales = reinterpret_cast<const float*>(static_cast<const char*>(a) + k);
    const int kb = k / kScaleBlock, nb = (n + kScaleBlock - 1) / kScaleBlock;
    const StrideA da = make_stride(int64_t(row_bytes), Int<1>{}, int64_t(m) * row_bytes);
    const StrideB db = make_stride(int64_t(k), Int<1>{}, int64_t(n) * k);
    // A's scales: row r's block j at a_scales[r * row_bytes / 4 + j], the same for every expert (L stride 0).
    const LayoutSFA sfa(make_shape(make_shape(Int<1>{}, int32_t(m)), make_shape(Int<kScaleBlock>{}, int32_t(kb)),
                                   int32_t(experts)),
                        make_stride(make_stride(Int<0>{}, int32_t(row_bytes / 4)), make_stride(Int<0>{}, Int<1>{}),
                                    int32_t(0)));
    const LayoutSFB sfb(make_shape(make_shape(Int<kScaleBlock>{}, int32_t(nb)), make_shape(Int<kScaleBlock>{}, int32_t(kb)),
                                   int32_t(experts)),
                        make_stride(make_stride(Int<0>{}, int32_t(kb)), make_stride(Int<0>{}, Int<1>{}),
                                    int32_t(nb * kb)));
    const typename Mainloop::Arguments args{ptr_a, da, ptr_b, db, a_scales, sfa, b_scales, sfb};
    // As in GemmConfig: A's TMA descriptor for L = 1, B's for L = experts.
    MainloopParams pa = Mainloop::to_underlying_arguments(make_shape(m, n, k, 1), args, nullptr);
    MainloopParams pb = Mainloop::to_underlying_arguments(make_shape(m, n, k, experts), args, nullptr);
    pb.tma_load_a = pa.tma_load_a;
    return pb;
  }

  // Device: (gA, gB, mSFA, mSFB), what the collective's load() and load_auxiliary() expect; A broadcast
  // over L as in GemmConfig (its scales' layout already has L stride 0).
  CUTE_DEVICE static auto load_inputs(const MainloopParams& p, int m, int n, int k, int experts) {
    using namespace cute;
    auto ab = tiled_ab_views<TileShape>(p.tma_load_a, p.tma_load_b, m, n, k, experts);
    Tensor mSFA = make_tensor(make_gmem_ptr(p.ptr_SFA), p.layout_SFA);
    Tensor mSFB = make_tensor(make_gmem_ptr(p.ptr_SFB), p.layout_SFB);
    return make_tuple(get<0>(ab), get<1>(ab), mSFA, mSFB);
  }
};

}  // namespace comet::kernels
