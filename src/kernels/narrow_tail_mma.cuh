// The consumer mainloop of a tile's last column block where N leaves it mostly empty: its wgmmas are
// NarrowN wide (128, or 64 in 128-wide tiles) instead of the tile's TileN (issue 16, the padded TP shards).
//
// Why: a shard's N is rarely a multiple of the tile width (Phi-3.5 TP 8 layer 0: N = 1600 in 256-wide
// blocks is 6 full blocks and one of 64 columns, computed 128 wide here; Qwen2-57B TP 8: 640 = 2 x 256
// + 128). The producer's
// TMA fills the missing B rows with zeros, and the cooperative wgmma (m64n256k16) multiplies them anyway:
// the last block costs a full block's tensor time for a quarter of its columns. cuBLAS avoids it with an
// exact-fit tile (320 x 128 for those shapes, comet_cublas_algo_probe); narrower tiles of ours run slower
// per FLOP (docs/design-changes.md, "The tail wave"). Here only the last block narrows, where its valid
// columns fit in NarrowN: the same stages,
// the same TMA loads, the same pipeline and operand descriptors (a narrow wgmma reads the first NarrowN
// rows of the stage's B tile, a prefix of its swizzle atoms, from the wide descriptor). The first K-tile
// runs the wide wgmmas, which define every accumulator of the thread's fragment (the columns past N from
// B's zero-filled rows, as in a wide tile); the other K-tiles run NarrowN-wide wgmmas into the first
// NarrowN / 2 of them, a view whose register order the narrow fragment shares (values (2, 2, N / 8) per
// thread of a warp group, the column groups last). Every epilogue sees the wide tile's accumulators: the
// same bits. (Defining the upper accumulators any other way, by moves after the loop or not at all, made
// ptxas serialise every wgmma of layer 0's kernel for want of registers: C7511.)
//
// The loop is CUTLASS's MainloopSm90TmaGmmaWarpSpecialized::mma (one wgmma batch in flight, stage
// release one behind); run_compute_role calls the collective's mma_tail after it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>

#include "comet/tile_columns.hpp"

namespace comet::kernels {

// Whether column block n_block of a GEMM with n columns runs narrow_block_width(TileN)-wide wgmmas
// (comet/tile_columns.hpp, the rule the cost model counts columns by).
template <int TileN>
__device__ __forceinline__ bool narrow_tail(int n_block, int n) {
  const int valid = n - n_block * TileN;
  return valid < TileN && tail_block_width(TileN, valid) < TileN;
}

// The cooperative TiledMma of Cfg (two consumer warp groups along M, as CUTLASS's builder makes it)
// with NarrowN-wide wgmma atoms.
template <class Cfg, int NarrowN>
using NarrowTiledMma = decltype(cute::make_tiled_mma(
    cute::GMMA::ss_op_selector<
        cutlass::bfloat16_t, cutlass::bfloat16_t, float,
        cute::Shape<cute::Int<Cfg::TileM>, cute::Int<NarrowN>, cute::Int<Cfg::TileK>>,
        cutlass::gemm::collective::detail::gmma_ss_tag_to_major_A<cutlass::bfloat16_t, typename Cfg::LayoutA>(),
        cutlass::gemm::collective::detail::gmma_ss_tag_to_major_B<cutlass::bfloat16_t, typename Cfg::LayoutB>()>(),
    cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));

template <class Cfg, int NarrowN, class Acc>
__device__ void narrow_tail_mma(typename Cfg::Pipeline& pipeline, typename Cfg::PipelineState read_state, Acc& acc,
                                int k_tiles, int thread_idx, typename Cfg::Mainloop::TensorStorage& tensors) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using Mma = NarrowTiledMma<Cfg, NarrowN>;
  static_assert(NarrowN == narrow_block_width(Cfg::TileN) && NarrowN < Cfg::TileN, "the kernel's one narrow width");
  constexpr int kPipeMmas = 1;  // wgmma batches in flight: the collective's K_PIPE_MMAS (mma_tail counts on it)
  static_assert(Cfg::Mainloop::K_PIPE_MMAS == kPipeMmas);

  // The wide tile's operand descriptors, computed as the collective's mma computes them (so the
  // compiler keeps one set for both loops): a narrow wgmma reads the first NarrowN rows of the same
  // B tile, whose descriptor (start, strides, swizzle) is the wide one's.
  Tensor sA = make_tensor(make_smem_ptr(tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});  // (BM, BK, PIPE)
  Tensor sB = make_tensor(make_smem_ptr(tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});  // (BN, BK, PIPE)
  typename Cfg::TiledMma wide_mma;
  const int warp_group = __shfl_sync(0xffffffff, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
  auto wide_thread = wide_mma.get_slice(warp_group * cutlass::NumThreadsPerWarpGroup);
  Tensor tCrA = wide_thread.make_fragment_A(wide_thread.partition_A(sA));  // (MMA, MMA_M, MMA_K, PIPE) descriptors
  Tensor tCrB = wide_thread.make_fragment_B(wide_thread.partition_B(sB));  // (MMA, MMA_N, MMA_K, PIPE)
  static_assert(decltype(size<1>(tCrB))::value == 1, "one wgmma atom spans the tile's width");
  Mma tiled_mma;

  // The narrow accumulators: the first NarrowN / 2 registers of the wide fragment.
  const auto narrow_layout = partition_fragment_C(tiled_mma, Shape<Int<Cfg::TileM>, Int<NarrowN>>{}).layout();
  static_assert(decltype(cosize(narrow_layout))::value == NarrowN / 2 &&
                decltype(size(acc))::value == Cfg::TileN / 2, "a thread holds N / 2 accumulators of its warp group's m64 rows");
  Tensor accum = make_tensor(acc.data(), narrow_layout);

  // The first K-tile starts the accumulators from zero; its stage goes back one K-tile later.
  auto release_state = read_state;
  warpgroup_fence_operand(acc);
  {
    pipeline.consumer_wait(read_state, pipeline.consumer_try_wait(read_state));
    const int stage = read_state.index();
    warpgroup_arrive();
    wide_mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTE_UNROLL
    for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
      cute::gemm(wide_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), acc);
      wide_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    ++read_state;
  }
  warpgroup_fence_operand(acc);
  tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  CUTE_NO_UNROLL
  for (int k = k_tiles - kPipeMmas; k > 0; --k) {
    pipeline.consumer_wait(read_state, pipeline.consumer_try_wait(read_state));
    const int stage = read_state.index();
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    cute::gemm(tiled_mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), accum);
    warpgroup_commit_batch();
    warpgroup_wait<kPipeMmas>();  // the batch before this one is done: its stage goes back
    warpgroup_fence_operand(accum);
    pipeline.consumer_release(release_state);
    ++read_state;
    ++release_state;
  }
  warpgroup_fence_operand(accum);
}

}  // namespace comet::kernels
