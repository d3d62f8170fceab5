// The grid split as the fused kernels read it (built on the host from the engine's GridSplit).
#pragma once

#include "kernels/fused_layers.hpp"

namespace comet::kernels {

// GridSplit as the kernel reads it: the blocks launched in each role. Compute blocks take the SMs the
// comm blocks leave (grid = resident capacity, one block per SM); in fused mode they wait on the comm
// role's flags, in gemm_only / comm_only mode one role runs alone.
struct KernelSplit {
  const Epoch* epoch;
  int n_comm;     // the host's; with adapt.enabled the kernel re-picks it (adaptive_split.hpp)
  int n_compute;  // grid = n_comm + n_compute
  AdaptiveSplit adapt;
  int m_group;
  int n_group;
  int smem_bytes;
  bool waits;  // fused: compute waits for arrivals (layer 0) / comm waits for finished tiles (layer 1)
  bool one_launch;  // layer 1: every block computes its tiles, then combines (n_comm 0, n_compute the grid)
  bool arrival_order;  // layer 0: waiting compute blocks take tiles in tile_order (else in m order)
  TeamDeviceView team;
};

inline KernelSplit kernel_split(const GridSplit& s, const LaunchLimits& lim, int smem_bytes) {
  KernelSplit k{};
  k.epoch = s.epoch;
  k.n_comm = s.mode == Mode::gemm_only ? 0 : s.n_comm;
  k.n_compute = s.mode == Mode::comm_only ? 0 : s.mode == Mode::gemm_only ? lim.max_blocks : lim.max_blocks - k.n_comm;
  k.adapt = s.adapt;
  k.adapt.enabled = s.adapt.enabled && s.mode == Mode::fused && k.n_comm > 0;
  k.m_group = s.m_group;
  k.n_group = s.n_group;
  k.smem_bytes = smem_bytes;
  k.waits = s.mode == Mode::fused;
  k.one_launch = s.one_launch && s.mode == Mode::fused && k.n_comm == 0;
  k.arrival_order = k.waits && !s.m_order;
  k.team = s.team;
  return k;
}

}  // namespace comet::kernels
