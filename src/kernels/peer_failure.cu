// The two one-thread kernels of peer_failure.hpp (the publish over peer pointers; peer_failure.cuh).
#include "kernels/peer_failure.hpp"
#include "kernels/peer_failure.cuh"

#include "comet/cuda_check.hpp"

namespace comet::kernels {
namespace {

__global__ void gather_peer_failures_kernel(GatherFailuresArgs a) {
  for (int s = 0; s < a.team.world; ++s) {
    volatile int32_t* word = a.words + s;
    if (*word == 0) continue;
    *word = 0;
    DeviceStatus* st = a.team.status;
    if (atomicCAS(&st->code, 0, 2) == 0) {  // the first failure of the call wins, as with timeouts
      st->rank = a.team.rank;
      st->site = static_cast<int32_t>(WaitSite::peer_failed);
      st->index = s;
      st->expected = 0;
      st->seen = 1;
    }
  }
  __threadfence_system();
}

}  // namespace

void publish_failure(const PublishFailureArgs& args, cudaStream_t stream) {
  launch_publish_failure(args, stream, PeerTransport{});
}

void gather_peer_failures(const GatherFailuresArgs& args, cudaStream_t stream) {
  gather_peer_failures_kernel<<<1, 1, 0, stream>>>(args);
  COMET_CUDA_CHECK(cudaGetLastError());
}

}  // namespace comet::kernels
