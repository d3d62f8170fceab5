// Fused layer 1: expert grouped GEMM overlapped with the top-k combine (N-split).
//   blocks [0, n_comm)           comm blocks: for each finished (M-tile, column block), weight, sum
//                                over this rank's slots of the token and ship the slice to the token's
//                                owner (combine_role)
//   blocks [n_comm, gridDim.x)   compute blocks: column groups in order; each tile's epilogue writes
//                                Y's rows and releases tile_done[m * n_blocks + n] = epoch.
// n_comm is the host's, or, with an adaptive split, the one every block derives from the plan's counts
// at kernel start (adaptive_split.hpp).
// One launch (split.one_launch, the sequential schedule): no comm blocks; every block is a compute block
// first and a comm block after its last tile, taking combine batches from a shared counter. All blocks
// are resident and a compute block never waits, so every tile a combine waits on gets made.
#pragma once

#include "kernels/combine_role.cuh"
#include "tune/adaptive_split.hpp"
#include "kernels/compute_role.cuh"
#include "kernels/epilogue.cuh"
#include "kernels/fused_layers.hpp"
#include "kernels/kernel_split.hpp"

namespace comet::kernels {

// Transport: how the comm blocks ship slices to their owners (transport.cuh).
template <class Cfg, class Transport = PeerTransport>
struct Layer1Params {
  typename Cfg::MainloopParams mainloop;
  GemmExtents ext;  // rows_cap, n = H, k = F shard, experts
  CombineArgs combine;
  __nv_bfloat16* y;
  Epoch* tile_done;
  KernelSplit split;  // roles, generation, groups (fused_launch.cuh: kernel_split)
  Transport transport;
};

// Work w -> (M-tile, N-block): column groups of n_group blocks, in order (the comm blocks ship column
// group g while group g+1 computes); inside a group, chunks of m_group M-tiles, N-major.
struct Layer1Schedule {
  const PlanView& plan;
  int n_blocks;
  int m_group;
  int n_group;
  __device__ int count() const { return *plan.num_tiles * n_blocks; }
  __device__ TileCoord at(int w) const {
    const int m_tiles = *plan.num_tiles;
    const int group = w / (n_group * m_tiles);
    const int group_blocks = min(n_group, n_blocks - group * n_group);
    int r = w - group * n_group * m_tiles;
    const int chunk = r / (m_group * group_blocks);
    const int base = chunk * m_group;
    const int size = min(m_group, m_tiles - base);
    r -= chunk * m_group * group_blocks;
    const int m = base + r % size;
    return TileCoord{m, group * n_group + r / size, plan.tile_expert[m], plan.tile_rows[m]};
  }
};

template <class Cfg, class Transport>
struct Layer1Hooks {
  const Layer1Params<Cfg, Transport>& p;
  Epoch epoch;
  int n_blocks;

  __device__ void before_load(const TileCoord&, int) {}

  template <class Acc>
  __device__ void epilogue(const Acc& acc, const TileCoord& tile, int mma_thread, char* staging) {
    store_tile<Cfg>(acc, mma_thread, tile, EpilogueOp::none, p.y, p.ext.n, p.ext.n, staging);
    consumer_barrier();  // every consumer thread's stores of this tile are issued
    if (mma_thread == 0) {
      __threadfence();
      dev::st_release_gpu(&p.tile_done[tile.m_block * n_blocks + tile.n_block], epoch);
    }
  }
};

// The compute role moves registers from the producer warp group to the consumers (setmaxnreg 40 / 232,
// compute_role.cuh); a role that runs in every warp after it needs the kernel's even share back:
// 168 = 65536 / 384 threads, rounded down to setmaxnreg's multiple of 8 (what ptxas allocates here).
constexpr int kEvenShareRegs = 168;
__device__ __forceinline__ void restore_even_registers() {
  if (threadIdx.x / 128 == 0) cutlass::arch::warpgroup_reg_alloc<kEvenShareRegs>();
  else cutlass::arch::warpgroup_reg_dealloc<kEvenShareRegs>();
}

template <class Cfg, class Transport = PeerTransport>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    layer1_kernel(const __grid_constant__ Layer1Params<Cfg, Transport> p) {
  extern __shared__ __align__(1024) char smem[];
  const Epoch epoch = *p.split.epoch;
  const bool one_launch = p.split.one_launch;
  const int n_comm = one_launch ? 0 : adaptive_n_comm(p.split.adapt, p.combine.plan, p.split.n_comm, gridDim.x);
  if (p.split.adapt.enabled && blockIdx.x == 0 && threadIdx.x == 0) *p.split.adapt.chosen = n_comm;
  // One call site per role: with two of the compute role (a layer-0 one-launch trial), ptxas outlined a
  // call inside a GEMM and serialised its wgmma (C7510).
  if (int(blockIdx.x) >= n_comm) {
    const int n_blocks = (p.ext.n + Cfg::TileN - 1) / Cfg::TileN;
    const Layer1Schedule schedule{p.combine.plan, n_blocks, p.split.m_group, p.split.n_group};
    Layer1Hooks<Cfg, Transport> hooks{p, epoch, n_blocks};
    run_compute_role<Cfg>(p.mainloop, p.ext, schedule, hooks, blockIdx.x - n_comm, gridDim.x - n_comm, smem);
    if (!one_launch) return;
    static_assert(Cfg::kThreads == 384, "the even register share assumes one producer and two consumer warp groups");
    // Every warp is past its last tile: the pipeline's stages are drained (load_tail), so the combine may
    // reuse their memory once the pipeline's barriers are ended, and each warp group changes its
    // registers together (setmaxnreg is aligned).
    __syncthreads();
    end_compute_role<Cfg>(smem);
    restore_even_registers();
    __syncthreads();
  }
  run_combine_role<Transport>(p.combine, blockIdx.x, one_launch ? gridDim.x : n_comm, epoch, p.split.waits, smem,
                              p.split.smem_bytes, p.split.team, p.transport, /*take_shared=*/one_launch);
}

}  // namespace comet::kernels
