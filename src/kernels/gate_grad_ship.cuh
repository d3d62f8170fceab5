// The backward's gate-gradient ship (grad_rows.hpp: ship_gate_grads) over a transport (transport.cuh):
// each gathered row's gate-gradient partials summed and stored, one fp32, into its token owner's
// receive slot [rank][token][slot]. Written once for both transports: grad_rows.cu launches it with
// peer pointers, kernels/nvshmem/fused_nvshmem.cu with NVSHMEM's puts.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "comet/cuda_check.hpp"
#include "kernels/grad_rows.hpp"
#include "kernels/transport.cuh"

namespace comet::kernels {

template <class Transport>
__global__ void ship_gate_grads_kernel(ShipGateGradsArgs a, Transport tr) {
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < a.max_rows;
       row += int64_t(gridDim.x) * blockDim.x) {  // 64-bit: max_rows may lie within a grid stride of 2^31
    const int unit = a.plan.row_unit[row];  // -1: padding, or past the used rows
    if (unit < 0) continue;
    float sum = 0.f;
    for (int b = 0; b < a.blocks; ++b) sum += a.partials[size_t(row) * a.partial_ld + b];
    const int owner = a.plan.unit_src[unit];
    const size_t slot = (size_t(a.rank) * a.max_tokens + a.plan.unit_token[unit]) * a.topk + a.plan.row_slot[row];
    tr.put_float(a.peer_recv[owner] + slot, sum, owner);
  }
  tr.complete_puts();  // before the team barrier that follows on the stream
}

template <class Transport>
void launch_ship_gate_grads(const ShipGateGradsArgs& a, cudaStream_t stream, const Transport& tr) {
  if (a.max_rows == 0) return;
  constexpr int kThreads = 256;
  const int grid = int(std::min<int64_t>((int64_t(a.max_rows) + kThreads - 1) / kThreads, 4096));
  ship_gate_grads_kernel<Transport><<<grid, kThreads, 0, stream>>>(a, tr);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
