// The IpcTeam barrier kernel. Its epoch lives in device memory and is bumped by the kernel itself, so
// the same launch can be captured in a CUDA graph and replayed: no host-side count is baked into it.
#include "comet/cuda_check.hpp"
#include "team/device_wait.cuh"
#include "team/ipc_barrier.hpp"

namespace comet::team_detail {
namespace {

__global__ void ipc_barrier_kernel(uint64_t* epoch_word, uint64_t* const* signal_areas, int barrier_offset,
                                   TeamDeviceView team) {
  __shared__ uint64_t epoch;
  if (threadIdx.x == 0) {
    // Only this rank's barrier kernels touch the word, and they are ordered on its stream.
    epoch = *epoch_word + 1;
    *epoch_word = epoch;
  }
  __syncthreads();
  // Arrive: the release store also publishes everything this rank's stream did before the barrier.
  for (int peer = threadIdx.x; peer < team.world; peer += blockDim.x) {
    dev::st_release_sys(signal_areas[peer] + barrier_offset + team.rank, epoch);
  }
  // Wait: peer p's arrival lands in word [p] of our own area.
  const uint64_t* mine = signal_areas[team.rank] + barrier_offset;
  for (int peer = threadIdx.x; peer < team.world; peer += blockDim.x) {
    if (!dev::wait_signal_sys(mine + peer, epoch, team, WaitSite::barrier, peer)) return;
  }
}

}  // namespace

void launch_ipc_barrier(cudaStream_t stream, uint64_t* epoch, uint64_t* const* signal_areas, int barrier_offset,
                        const TeamDeviceView& team) {
  const int threads = team.world <= 32 ? 32 : (team.world < 1024 ? (team.world + 31) / 32 * 32 : 1024);
  ipc_barrier_kernel<<<1, threads, 0, stream>>>(epoch, signal_areas, barrier_offset, team);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::team_detail
