// The body of the team's device barrier, written once for both ways a rank reaches its peers' words:
// through peer pointers (ipc_barrier.cu: a release store) and through NVSHMEM (nvshmem_signals.cu: a
// signal operation, for peers no pointer reaches). Its epoch lives in device memory and is bumped by
// the kernel itself, so the same launch can be captured in a CUDA graph and replayed: no host-side
// count is baked into it.
#pragma once

#include <cstdint>

#include "team/device_wait.cuh"

namespace comet::team_detail {

// One block. `arrive(peer, epoch)` writes `epoch` into word [team.rank] of peer's barrier area; peer
// p's arrival lands in word [p] of `mine` (this rank's own barrier area), which is waited on, bounded.
template <class Arrive>
__device__ void barrier_body(uint64_t* epoch_word, const uint64_t* mine, const TeamDeviceView& team, Arrive arrive) {
  __shared__ uint64_t epoch;
  if (threadIdx.x == 0) {
    // Only this rank's barrier kernels touch the word, and they are ordered on its stream.
    epoch = *epoch_word + 1;
    *epoch_word = epoch;
  }
  __syncthreads();
  // Arrive: everything this rank's stream did before the barrier is published first.
  __threadfence_system();
  for (int peer = threadIdx.x; peer < team.world; peer += blockDim.x) arrive(peer, epoch);
  for (int peer = threadIdx.x; peer < team.world; peer += blockDim.x) {
    if (!dev::wait_signal_sys(mine + peer, epoch, team, WaitSite::barrier, peer)) return;
  }
}

// Threads of the barrier's one block: a warp per 32 ranks, at most 1024.
inline int barrier_threads(int world) {
  return world <= 32 ? 32 : (world < 1024 ? (world + 31) / 32 * 32 : 1024);
}

}  // namespace comet::team_detail
