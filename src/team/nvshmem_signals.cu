// nvshmem_signals.hpp: a signal store and the team barrier as NVSHMEM signal operations. The team's
// ranks are PEs 0..W-1 (NvshmemHeap::init checks it).
#include "team/nvshmem_signals.hpp"

#include "comet/cuda_check.hpp"
#include "team/nvshmem_heap.hpp"

#if COMET_HAVE_NVSHMEM_KERNELS
#include "team/barrier_body.cuh"
#include "team/nvshmem_device.cuh"
#endif

namespace comet::team_detail::nvshmem_signals {

#if COMET_HAVE_NVSHMEM_KERNELS

namespace {

__global__ void signal_set_kernel(uint64_t* word, uint64_t value, int pe) {
  __threadfence_system();  // what this rank's stream wrote before, first (as the peer-pointer store's release)
  nvshmemx_signal_op(word, value, NVSHMEM_SIGNAL_SET, pe);
  nvshmem_quiet();
}

__global__ void nvshmem_barrier_kernel(uint64_t* epoch_word, uint64_t* area, TeamDeviceView team) {
  barrier_body(epoch_word, area, team, [&](int peer, uint64_t epoch) {
    nvshmemx_signal_op(area + team.rank, epoch, NVSHMEM_SIGNAL_SET, peer);
  });
  nvshmem_quiet();  // the signals are delivered before the kernel ends
}

}  // namespace

bool built() { return true; }

void bind() { NvshmemHeap::bind_module(reinterpret_cast<const void*>(nvshmem_barrier_kernel)); }

void launch_set(cudaStream_t stream, uint64_t* word, uint64_t value, int pe) {
  signal_set_kernel<<<1, 1, 0, stream>>>(word, value, pe);
  COMET_CUDA_CHECK_LAUNCH();
}

void launch_barrier(cudaStream_t stream, uint64_t* epoch, uint64_t* barrier_area, const TeamDeviceView& team) {
  nvshmem_barrier_kernel<<<1, barrier_threads(team.world), 0, stream>>>(epoch, barrier_area, team);
  COMET_CUDA_CHECK_LAUNCH();
}

#else

namespace {
[[noreturn]] void absent() {
  throw InvalidArgument("comet was built without NVSHMEM's headers: no NVSHMEM signals (scripts/setup-deps)");
}
}  // namespace

bool built() { return false; }
void bind() { absent(); }
void launch_set(cudaStream_t, uint64_t*, uint64_t, int) { absent(); }
void launch_barrier(cudaStream_t, uint64_t*, uint64_t*, const TeamDeviceView&) { absent(); }

#endif

}  // namespace comet::team_detail::nvshmem_signals
