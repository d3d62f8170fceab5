// The compute role shared by both fused layers: a persistent, warp-specialized GEMM over a tile list
// that WE order. Warp group 0, warp 0 is the TMA producer; warp groups 1 and 2 are the wgmma consumers
// that share each 128-row tile (CUTLASS's cooperative schedule). The layer supplies three things:
//   schedule.count() / schedule.at(w)  which tile is the w-th of this call (plan order, rasterised)
//   hooks.before_load(tile, lane)      called by the whole producer warp before a tile's TMA loads
//                                      (layer 0 waits there for the tile's rows to land)
//   hooks.epilogue(acc, tile, tid, staging)
//                                      called by the 256 consumer threads with the fp32 accumulators and
//                                      the block's epilogue staging memory (kEpilogueStagingBytes)
//                                      (activation + store; layer 1 also publishes the tile's done flag)
// Compute block c of n_compute takes tiles c, c + n_compute, ... so that all blocks walk the list
// together, in its order.
// With block-scaled fp8 (Cfg::kScaleWarp, fp8_gemm_config.cuh), warp 1 of the producer warp group walks
// the same tiles and loads their scales with cp.async into the same pipeline stages, after the same
// before_load wait (the scales of a record land with its codes).
#pragma once

#include <type_traits>

#include <cutlass/arch/reg_reconfig.h>

#include "kernels/gemm_config.cuh"
#include "ptx/barrier.cuh"
#include "ptx/bulk_copy.cuh"

namespace comet::kernels {

// One unit of compute-block work: an (M-tile, N-block) of one expert's GEMM.
struct TileCoord {
  int m_block;  // M-tile index into A's rows (rows m_block * TileM ...)
  int n_block;  // N-block index into B's rows / the output's columns
  int expert;   // local expert (the L index of B, unless batch says otherwise)
  int rows;     // valid rows of the M-tile
  // The weight gradients run K over one expert's rows of an unbatched pair of operands: their tiles
  // name the K-tiles and load with L = 0. Defaults: all of K, L = expert.
  int k_begin = 0;   // first K-tile
  int k_tiles = -1;  // K-tiles; -1: all of ext.k; 0: the tile's product is zero (no loads)
  int batch = -1;    // L index of the loads; -1: expert
};

// Problem extents the TMA views are built with.
struct GemmExtents {
  int rows_cap;  // rows of A (capacity); M of the GEMM
  int n;         // rows of each expert's B (= output columns before any gating)
  int k;
  int experts;
};

// A config with its own load and prefetch (GemmConfig: B in two TMA boxes) uses them; the others
// (Fp8GemmConfig) CUTLASS's collective's.
template <class Cfg, class = void>
struct HasOwnLoad : std::false_type {};
template <class Cfg>
struct HasOwnLoad<Cfg, std::void_t<decltype(Cfg::kSplitB)>> : std::true_type {};

template <class Cfg, class Mainloop, class Params>
__device__ void prefetch_descriptors(const Params& mp) {
  if constexpr (HasOwnLoad<Cfg>::value) Cfg::prefetch_descriptors(mp);
  else Mainloop::prefetch_tma_descriptors(mp);
}
template <class Cfg, class Mainloop, class Params, class Pipeline, class State, class Inputs, class Coord, class KIter,
          class Tensors>
__device__ void load_tile(Mainloop& mainloop, const Params& mp, Pipeline& pipeline, State state, const Inputs& inputs,
                          const Coord& coord, KIter k_iter, int k_tiles, int lane, Tensors& tensors) {
  if constexpr (HasOwnLoad<Cfg>::value) Cfg::load(mainloop, mp, pipeline, state, inputs, coord, k_iter, k_tiles, lane, tensors);
  else mainloop.load(mp, pipeline, state, inputs, coord, k_iter, k_tiles, lane, 0u, tensors);
}

template <class Cfg, class Schedule, class Hooks>
__device__ void run_compute_role(const typename Cfg::MainloopParams& mp, const GemmExtents& ext,
                                 const Schedule& schedule, Hooks& hooks, int compute_index, int n_compute,
                                 char* smem) {
  using namespace cute;
  using Mainloop = typename Cfg::Mainloop;
  using Pipeline = typename Cfg::Pipeline;
  auto& storage = *reinterpret_cast<typename Cfg::SharedStorage*>(smem);

  const int warp_group = threadIdx.x / 128;
  const int warp_in_group = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;

  typename Pipeline::Params pipe_params;
  const bool scale_warp = Cfg::kScaleWarp && warp_group == 0 && warp_in_group == 1;
  if (warp_group == 0 && (warp_in_group == 0 || scale_warp)) pipe_params.role = Pipeline::ThreadCategory::Producer;
  if (warp_group > 0) pipe_params.role = Pipeline::ThreadCategory::Consumer;
  pipe_params.is_leader = (threadIdx.x % 128) == 0;
  pipe_params.num_consumers = Cfg::kConsumerThreads;
  pipe_params.num_producers = Cfg::kProducerArrivals;
  pipe_params.transaction_bytes = mp.tma_transaction_bytes;
  Pipeline pipeline(storage.pipeline, pipe_params, typename Cfg::ClusterShape{});
  __syncthreads();  // barrier initialisation visible to every warp

  Mainloop mainloop;
  auto load_inputs = Cfg::load_inputs(mp, ext.rows_cap, ext.n, ext.k, ext.experts);
  const int k_tiles = (ext.k + Cfg::TileK - 1) / Cfg::TileK;
  const int n_work = schedule.count();

  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    // A producer warp's walk over this block's tiles: the tile's wait, then load_tiles(state, coord,
    // k_iter, k_tiles) fills its stages. Returns the pipeline state after the last tile.
    auto walk_tiles = [&](auto&& load_tiles) {
      auto write_state = cutlass::make_producer_start_state<Pipeline>();
      Tensor gA = get<0>(load_inputs);
      for (int w = compute_index; w < n_work; w += n_compute) {
        const TileCoord tile = schedule.at(w);
        const int tile_k = tile.k_tiles >= 0 ? tile.k_tiles : k_tiles;
        if (tile_k == 0) continue;
        hooks.before_load(tile, lane);
        auto k_iter = make_coord_iterator(idx2crd(tile.k_begin, shape<3>(gA)), shape<3>(gA));
        const int l = tile.batch >= 0 ? tile.batch : tile.expert;
        load_tiles(write_state, make_coord(tile.m_block, tile.n_block, _, l), k_iter, tile_k);
        write_state.advance(tile_k);
      }
      return write_state;
    };
    if constexpr (Cfg::kScaleWarp) {
      if (scale_warp) {
        walk_tiles([&](auto& state, auto coord, auto k_iter, int tile_k) {
          mainloop.load_auxiliary(mp, pipeline, state, load_inputs, coord, k_iter, tile_k, lane, 0u, storage.tensors);
        });
        return;
      }
    }
    if (warp_in_group != 0) return;
    if (lane == 0) prefetch_descriptors<Cfg, Mainloop>(mp);
    const auto write_state = walk_tiles([&](auto& state, auto coord, auto k_iter, int tile_k) {
      load_tile<Cfg>(mainloop, mp, pipeline, state, load_inputs, coord, k_iter, tile_k, lane, storage.tensors);
    });
    mainloop.load_tail(pipeline, write_state);
  } else {
    cutlass::arch::warpgroup_reg_alloc<232>();
    const int mma_thread = threadIdx.x % Cfg::kConsumerThreads;  // same numbering as CUTLASS's kernel
    typename Cfg::TiledMma tiled_mma;
    typename Cfg::PipelineState read_state;
    for (int w = compute_index; w < n_work; w += n_compute) {
      const TileCoord tile = schedule.at(w);
      const int tile_k = tile.k_tiles >= 0 ? tile.k_tiles : k_tiles;
      auto acc = partition_fragment_C(tiled_mma, take<0, 2>(typename Cfg::TileShape{}));
      if (tile_k == 0) {
        clear(acc);
      } else {
        mainloop.mma(pipeline, read_state, acc, tile_k, mma_thread, storage.tensors, mp);
        mainloop.mma_tail(pipeline, read_state, tile_k);
        read_state.advance(tile_k);
      }
      hooks.epilogue(acc, tile, mma_thread, storage.epilogue_staging);
    }
  }
}

// After run_compute_role in every thread of the block and a __syncthreads: one thread ends the
// pipeline's mbarriers, so that a role that runs next in the same block may reuse shared memory
// (layer1_kernel's one launch). The pipeline's storage is its full and empty barriers, 8 bytes each.
template <class Cfg>
__device__ void end_compute_role(char* smem) {
  auto& storage = *reinterpret_cast<typename Cfg::SharedStorage*>(smem);
  static_assert(sizeof(storage.pipeline) % sizeof(uint64_t) == 0, "the pipeline's storage is its mbarriers");
  if (threadIdx.x == 0) {
    auto* bars = reinterpret_cast<uint64_t*>(&storage.pipeline);
    for (size_t i = 0; i < sizeof(storage.pipeline) / sizeof(uint64_t); ++i) dev::mbarrier_inval(bars + i);
  }
}

// Named barrier over the 256 consumer threads (id 0 is __syncthreads; CUTLASS's epilogues, which we
// do not use here, reserve low ids, so we take a high one).
__device__ __forceinline__ void consumer_barrier() { dev::named_barrier_sync<12, 256>(); }

}  // namespace comet::kernels
