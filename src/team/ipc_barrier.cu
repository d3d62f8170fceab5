// The team's device barrier through peer pointers (barrier_body.cuh has the schedule).
#include "comet/cuda_check.hpp"
#include "team/barrier_body.cuh"
#include "team/ipc_barrier.hpp"

namespace comet::team_detail {
namespace {

__global__ void ipc_barrier_kernel(uint64_t* epoch_word, uint64_t* const* signal_areas, int barrier_offset,
                                   TeamDeviceView team) {
  // The release store publishes everything this rank's stream did before the barrier.
  barrier_body(epoch_word, signal_areas[team.rank] + barrier_offset, team, [&](int peer, uint64_t epoch) {
    dev::st_release_sys(signal_areas[peer] + barrier_offset + team.rank, epoch);
  });
}

}  // namespace

void launch_ipc_barrier(cudaStream_t stream, uint64_t* epoch, uint64_t* const* signal_areas, int barrier_offset,
                        const TeamDeviceView& team) {
  ipc_barrier_kernel<<<1, barrier_threads(team.world), 0, stream>>>(epoch, signal_areas, barrier_offset, team);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::team_detail
