// The backward's small kernels (grad_rows.hpp): plain grid-stride loops, one thread per element.
#include "kernels/grad_rows.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "comet/cuda_check.hpp"
#include "kernels/activation_math.cuh"
#include "kernels/bf16x8.cuh"
#include "kernels/gate_grad_ship.cuh"

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

// One warp per row of the plan's segments, 8 columns per lane at a time (16-byte accesses); the warp
// sums the row's gate partial.
constexpr int kActWarps = 8;

__global__ void activation_grad_kernel(ActivationGradArgs a) {
  const int lane = threadIdx.x % 32;
  const int used = a.plan.expert_offset[a.local_experts];  // the segments' rows, padding included
  const int groups = a.ffn_shard / 8;
  const bool gated = a.act == EpilogueOp::swiglu;
  const __nv_bfloat16* d = static_cast<const __nv_bfloat16*>(a.d);
  __nv_bfloat16* pre = static_cast<__nv_bfloat16*>(a.pre);
  __nv_bfloat16* hid = static_cast<__nv_bfloat16*>(a.hid);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  // 64-bit row counter: used may lie within one grid stride of 2^31, where an int step would wrap.
  for (int64_t r = blockIdx.x * kActWarps + int(threadIdx.x) / 32; r < used; r += int64_t(gridDim.x) * kActWarps) {
    const size_t row = size_t(r);
    uint4* h_row = reinterpret_cast<uint4*>(hid + row * a.ffn_shard);
    uint4* z_row = reinterpret_cast<uint4*>(pre + row * a.pre_ld);
    const int unit = a.plan.row_unit[row];
    if (unit < 0) {  // padding
      for (int q = lane; q < groups; q += 32) h_row[q] = zero;
      for (int q = lane; q < a.pre_ld / 8; q += 32) z_row[q] = zero;
      continue;
    }
    const float g = a.plan.unit_gates[size_t(unit) * a.topk + a.plan.row_slot[row]];
    const uint4* d_row = reinterpret_cast<const uint4*>(d + row * a.ffn_shard);
    float dgate = 0.0f;
    for (int q = lane; q < groups; q += 32) {
      float dh[8], h[8];
      unpack_bf16x8(d_row[q], dh);
      unpack_bf16x8(h_row[q], h);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        dgate += h[v] * dh[v];  // D before the gate scales it
        dh[v] *= g;
        h[v] *= g;
      }
      h_row[q] = pack_bf16x8(h);
      if (gated) {  // gate columns [16q, 16q + 8), their up partners 8 further
        float zg[8], zu[8];
        unpack_bf16x8(z_row[2 * q], zg);
        unpack_bf16x8(z_row[2 * q + 1], zu);
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const float gate = zg[v];
          zg[v] = dh[v] * zu[v] * silu_grad(gate);
          zu[v] = dh[v] * silu(gate);
        }
        z_row[2 * q] = pack_bf16x8(zg);
        z_row[2 * q + 1] = pack_bf16x8(zu);
      } else {
        float z[8];
        unpack_bf16x8(z_row[q], z);
#pragma unroll
        for (int v = 0; v < 8; ++v) z[v] = dh[v] * (a.act == EpilogueOp::gelu ? gelu_tanh_grad(z[v]) : silu_grad(z[v]));
        z_row[q] = pack_bf16x8(z);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dgate += __shfl_xor_sync(0xffffffffu, dgate, off);
    if (lane == 0) a.gate_partials[row * a.gate_ld] = dgate;
  }
}

__global__ void reduce_gate_grads_kernel(ReduceGateGradsArgs a) {
  const long long n = (long long)a.tokens * a.topk;
  const bool failed = block_call_failed(a.failure);
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

void activation_grad(const ActivationGradArgs& args, cudaStream_t stream) {
  COMET_REQUIRE(args.ffn_shard % 8 == 0 && args.pre_ld % 8 == 0, "activation_grad: F/tp must be a multiple of 8");
  COMET_REQUIRE(args.gate_ld >= 1, "activation_grad: the gate partials need at least one column");
  if (args.rows_cap <= 0) return;
  int device = 0, sms = 0;
  COMET_CUDA_CHECK(cudaGetDevice(&device));
  COMET_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int blocks = std::min((args.rows_cap + kActWarps - 1) / kActWarps, 8 * sms);
  activation_grad_kernel<<<blocks, kActWarps * 32, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

void ship_gate_grads(const ShipGateGradsArgs& args, cudaStream_t stream) {
  launch_ship_gate_grads(args, stream, PeerTransport{});
}

void reduce_gate_grads(const ReduceGateGradsArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  reduce_gate_grads_kernel<<<grid_for((long long)args.tokens * args.topk), kThreads, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
