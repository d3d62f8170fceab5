// The backward's small kernels (grad_rows.hpp): plain grid-stride loops, one thread per element.
#include "kernels/grad_rows.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "comet/cuda_check.hpp"

namespace comet::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPadRows = 127;  // a segment is padded to a multiple of 128 rows

// Block (e, p) zeroes padding row p of expert e, if the segment has one, 16 bytes per thread.
__global__ void zero_padding_rows_kernel(uint4* rows, int chunks, PlanView plan) {
  const int e = blockIdx.x / kPadRows, p = blockIdx.x % kPadRows;
  const int row = plan.expert_offset[e] + plan.expert_rows[e] + p;
  if (row >= plan.expert_offset[e + 1]) return;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) rows[size_t(row) * chunks + c] = make_uint4(0, 0, 0, 0);
}

__global__ void ship_gate_grads_kernel(ShipGateGradsArgs a) {
  for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < a.max_rows; row += gridDim.x * blockDim.x) {
    const int unit = a.plan.row_unit[row];  // -1: padding, or past the used rows
    if (unit < 0) continue;
    float sum = 0.f;
    for (int b = 0; b < a.blocks; ++b) sum += a.partials[size_t(row) * a.partial_ld + b];
    const int owner = a.plan.unit_src[unit];
    const size_t slot = (size_t(a.rank) * a.max_tokens + a.plan.unit_token[unit]) * a.topk + a.plan.row_slot[row];
    a.peer_recv[owner][slot] = sum;
  }
}

__global__ void reduce_gate_grads_kernel(ReduceGateGradsArgs a) {
  const long long n = (long long)a.tokens * a.topk;
  const bool failed = call_failed(a.failure);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    if (failed) {
      a.dgates[i] = __int_as_float(0x7FC00000);  // quiet NaN
      continue;
    }
    const long long e = a.ids_64 ? static_cast<const int64_t*>(a.ids)[i] : static_cast<const int32_t*>(a.ids)[i];
    float sum = 0.f;
    if (e >= 0 && e < a.num_experts) {  // bad ids: the plan reports them
      const int first = int(e / a.local_experts) * a.tp;
      for (int q = first; q < first + a.tp; ++q) sum += a.recv[size_t(q) * a.max_tokens * a.topk + i];
    }
    a.dgates[i] = sum;
  }
}

int grid_for(long long n) { return int(std::min<long long>((n + kThreads - 1) / kThreads, 4096)); }

}  // namespace

void zero_padding_rows(void* rows, int width, int local_experts, const PlanView& plan, cudaStream_t stream) {
  COMET_REQUIRE(width % 8 == 0, "zero_padding_rows: width must be a multiple of 8");
  zero_padding_rows_kernel<<<local_experts * kPadRows, 128, 0, stream>>>(static_cast<uint4*>(rows), width / 8, plan);
  COMET_CUDA_CHECK_LAUNCH();
}

void ship_gate_grads(const ShipGateGradsArgs& args, cudaStream_t stream) {
  if (args.max_rows == 0) return;
  ship_gate_grads_kernel<<<grid_for(args.max_rows), kThreads, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

void reduce_gate_grads(const ReduceGateGradsArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  reduce_gate_grads_kernel<<<grid_for((long long)args.tokens * args.topk), kThreads, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
