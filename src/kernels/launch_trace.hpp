// A timeline of one fused layer-0 launch (comet-bench --trace, bench/trace_timeline.py): global-timer
// stamps (ns) of the roles' events, to see where an overlap loses its time: whether the comm blocks
// pull slower beside the GEMM than alone, or the compute blocks wait for rows they could not have.
// Off (stamps == nullptr) in every launch but a traced one: each stamp site is then one branch.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#include "ptx/memory_order.cuh"
#endif

namespace comet::kernels {

struct LaunchTrace {
  unsigned long long* stamps = nullptr;  // words(); the host zeroes it before the launch (0: no event)
  int max_blocks = 0;                    // blocks of the grid recorded (comm and compute alike)
  int max_tiles = 0;                     // M-tiles recorded
  int n_blocks = 0;                      // N-blocks of an M-tile (the layer's columns / TileN)

  // Layout, one 64-bit word each:
  //   block_start(b), block_end(b)   [2b], [2b + 1]: the block's first instruction; its last warp's end
  //                                  (the largest stamp of its warps: atomicMax)
  //   ready(m)                       the comm role's release of M-tile m (tile_ready = epoch)
  //   wait(m, n) x 3                 (M-tile m, N-block n): the producer's wait begin and end (its loads
  //                                  start at the end), and the block that ran it
  __host__ __device__ size_t ready_at(int m) const { return size_t(2) * max_blocks + m; }
  __host__ __device__ size_t wait_at(int m, int n) const {
    return size_t(2) * max_blocks + max_tiles + size_t(3) * (size_t(m) * n_blocks + n);
  }
  __host__ __device__ size_t words() const { return wait_at(max_tiles, 0); }

#ifdef __CUDACC__
  __device__ bool on() const { return stamps != nullptr; }
  __device__ void block_start() const {
    if (on() && blockIdx.x < unsigned(max_blocks)) stamps[2 * blockIdx.x] = dev::global_timer_ns();
  }
  __device__ void block_end() const {  // by one lane of each warp that ends
    if (on() && blockIdx.x < unsigned(max_blocks)) atomicMax(&stamps[2 * blockIdx.x + 1], dev::global_timer_ns());
  }
  __device__ void ready(int m) const {
    if (on() && m < max_tiles) stamps[ready_at(m)] = dev::global_timer_ns();
  }
  __device__ void wait_begin(int m, int n) const {
    if (on() && m < max_tiles && n < n_blocks) stamps[wait_at(m, n)] = dev::global_timer_ns();
  }
  __device__ void wait_end(int m, int n) const {
    if (on() && m < max_tiles && n < n_blocks) {
      stamps[wait_at(m, n) + 1] = dev::global_timer_ns();
      stamps[wait_at(m, n) + 2] = blockIdx.x;
    }
  }
#endif
};

}  // namespace comet::kernels
