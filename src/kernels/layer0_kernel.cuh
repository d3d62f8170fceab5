// Fused layer 0: token dispatch overlapped inside the expert grouped GEMM (M-split).
//   blocks [0, n_comm)           comm blocks: pull remote rows into A, release tile_ready[m]   (dispatch_role)
//   blocks [n_comm, gridDim.x)   compute blocks: walk the tiles in plan order; the producer warp waits
//                                on tile_ready[m] >= epoch before loading a tile that has remote rows;
//                                the epilogue applies the activation and writes the hidden rows.
// The backward of layer 1 is this kernel with other operands: the comm blocks pull output-gradient rows,
// B is W1 read N-major and the epilogue is the activation's backward (epilogue.cuh).
// Local rows are in A before the launch (local_scatter), so local tiles (first in the order) start at once.
// n_comm is the host's, or, with an adaptive split, the one every block derives from the plan's counts
// at kernel start (adaptive_split.hpp).
#pragma once

#include "tune/adaptive_split.hpp"
#include "kernels/compute_role.cuh"
#include "kernels/dispatch_role.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/fused_layers.hpp"
#include "kernels/kernel_split.hpp"

namespace comet::kernels {

// Epi: what the compute blocks do with a finished tile: the forward's activation (epilogue.cuh:
// ActivationStore, B = W0), or for the backward of layer 1 (B = W1 read N-major) D stored as bf16
// (ActivationStore without activation) or the activation's backward (activation_grad_epilogue.cuh).
// Transport: how the comm blocks reach a peer's rows (transport.cuh).
template <class Cfg, class Epi, class Transport = PeerTransport>
struct Layer0Params {
  typename Cfg::MainloopParams mainloop;
  GemmExtents ext;  // rows_cap, n = W0 rows (backward: F/tp), k = H, experts
  DispatchArgs dispatch;
  Epi epi;
  KernelSplit split;  // roles, generation, groups (fused_launch.cuh: kernel_split)
  Transport transport;
};

// Work w -> (M-tile, N-block): groups of m_group consecutive entries of tile_order, and inside a group
// every N-block for each of its M-tiles, N-major, so that the group's A tiles and a few B slabs stay
// in L2 while the whole grid works on them. Groups follow tile_order, i.e. arrival order, when the
// tiles wait for rows; without waits (gemm_only: every row present), or where the launch asks for it
// (LaunchDecision::m_order), they follow m, the order the plan would have with all rows local, so that
// a group's tiles share one expert's weights.
struct Layer0Schedule {
  const PlanView& plan;
  int n_blocks;
  int m_group;
  bool arrival_order;
  __device__ int count() const { return *plan.num_tiles * n_blocks; }
  __device__ TileCoord at(int w) const {
    const int m_tiles = *plan.num_tiles;
    const int group = w / (m_group * n_blocks);
    const int base = group * m_group;
    const int size = min(m_group, m_tiles - base);
    const int r = w - group * m_group * n_blocks;
    const int m = arrival_order ? plan.tile_order[base + r % size] : base + r % size;
    return TileCoord{m, r / size, plan.tile_expert[m], plan.tile_rows[m]};
  }
};

template <class Cfg, class Epi, class Transport>
struct Layer0Hooks {
  const Layer0Params<Cfg, Epi, Transport>& p;
  Epoch epoch;

  // Whole producer warp: lane 0 waits for the tile's remote rows; then every lane orders its later
  // TMA (async proxy) reads after the rows the comm blocks wrote.
  __device__ void before_load(const TileCoord& tile, int lane) {
    if (lane == 0) p.dispatch.trace.wait_begin(tile.m_block, tile.n_block);
    if (p.split.waits && p.dispatch.plan.tile_remote_rows[tile.m_block] > 0) {
      if (lane == 0) {
        dev::wait_flag_gpu(&p.dispatch.tile_ready[tile.m_block], epoch, p.split.team, WaitSite::tile_ready, tile.m_block);
      }
      __syncwarp();
      dev::fence_proxy_async_global();
    }
    if (lane == 0) p.dispatch.trace.wait_end(tile.m_block, tile.n_block);
  }

  template <class Acc>
  __device__ void epilogue(const Acc& acc, const TileCoord& tile, int mma_thread, char* staging) {
    p.epi.template apply<Cfg>(acc, tile, mma_thread, staging);
  }
};

template <class Cfg, class Epi, class Transport = PeerTransport>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    layer0_kernel(const __grid_constant__ Layer0Params<Cfg, Epi, Transport> p) {
  static_assert(Cfg::kThreads / 32 >= dispatch::kWarpsUsed, "a comm block needs the dispatch role's warps");
  extern __shared__ __align__(1024) char smem[];
  if (threadIdx.x == 0) p.dispatch.trace.block_start();
  const Epoch epoch = *p.split.epoch;
  const int n_comm = adaptive_n_comm(p.split.adapt, p.dispatch.plan, p.split.n_comm, gridDim.x);
  if (p.split.adapt.enabled && blockIdx.x == 0 && threadIdx.x == 0) *p.split.adapt.chosen = n_comm;
  if (int(blockIdx.x) < n_comm) {
    run_dispatch_role<Transport>(p.dispatch, blockIdx.x, n_comm, epoch, smem, p.split.smem_bytes, p.split.team,
                                 p.transport);
    return;
  }
  const Layer0Schedule schedule{p.dispatch.plan, (p.ext.n + Cfg::TileN - 1) / Cfg::TileN, p.split.m_group,
                                p.split.arrival_order};
  Layer0Hooks<Cfg, Epi, Transport> hooks{p, epoch};
  run_compute_role<Cfg>(p.mainloop, p.ext, schedule, hooks, blockIdx.x - n_comm, gridDim.x - n_comm, smem);
  if (threadIdx.x % 32 == 0) p.dispatch.trace.block_end();
}

}  // namespace comet::kernels
