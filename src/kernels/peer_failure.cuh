// The publish kernel of peer_failure.hpp over a transport (transport.cuh): written once, launched with
// peer pointers by peer_failure.cu and with NVSHMEM's puts by kernels/nvshmem/fused_nvshmem.cu.
#pragma once

#include <cuda_runtime.h>

#include "comet/cuda_check.hpp"
#include "kernels/peer_failure.hpp"
#include "kernels/transport.cuh"

namespace comet::kernels {

template <class Transport>
__global__ void publish_failure_kernel(PublishFailureArgs a, Transport tr) {
  if (!call_failed(a.failure)) return;
  for (int q = 0; q < a.world; ++q)
    if (q != a.rank) tr.put_int(a.peer_words[q] + a.rank, 1, q);
  tr.complete_puts();
  __threadfence_system();  // before the barrier's arrival, which follows on the stream
}

template <class Transport>
void launch_publish_failure(const PublishFailureArgs& args, cudaStream_t stream, const Transport& tr) {
  publish_failure_kernel<Transport><<<1, 1, 0, stream>>>(args, tr);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
