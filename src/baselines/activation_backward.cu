// One warp per row, each lane a group of 8 hidden columns at a time (16-byte loads and stores); the
// warp sums the row's gate-gradient partial. Block row y is local expert y, whose rows are contiguous.
#include "baselines/activation_backward.hpp"

#include <cuda_bf16.h>

#include <cstdint>

#include "baselines/activation_math.cuh"
#include "comet/cuda_check.hpp"
#include "kernels/bf16x8.cuh"

namespace comet::baselines {
namespace {

constexpr int kWarps = 8;  // rows per block at a time

__device__ __forceinline__ uint4 load8(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = kernels::pack_bf16x8(v);
}

__global__ void activation_backward_kernel(GradActivationArgs a) {
  const int e = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int row0 = a.expert_offset[e], rows = a.expert_rows[e];
  const int groups = a.ffn_shard / 8;
  const __nv_bfloat16* d = static_cast<const __nv_bfloat16*>(a.d);
  __nv_bfloat16* pre = static_cast<__nv_bfloat16*>(a.pre);
  __nv_bfloat16* hid = static_cast<__nv_bfloat16*>(a.hidden);
  // 64-bit row counter: an expert's rows may lie within one grid stride of 2^31.
  for (int64_t i = blockIdx.x * kWarps + int(threadIdx.x) / 32; i < rows; i += int64_t(gridDim.x) * kWarps) {
    const size_t row = size_t(row0) + size_t(i);
    const float g = a.unit_gates[size_t(a.row_unit[row]) * a.topk + a.row_slot[row]];
    float dgate = 0.0f;
    for (int q = lane; q < groups; q += 32) {
      float dh[8], h[8];
      kernels::unpack_bf16x8(load8(d + row * a.ffn_shard + 8 * q), dh);
      kernels::unpack_bf16x8(load8(hid + row * a.ffn_shard + 8 * q), h);
#pragma unroll
      for (int v = 0; v < 8; ++v) {
        dgate += h[v] * dh[v];  // D before the gate scales it
        dh[v] *= g;
        h[v] *= g;
      }
      store8(hid + row * a.ffn_shard + 8 * q, h);
      if (a.act == Activation::swiglu) {
        __nv_bfloat16* z = pre + row * a.ld_pre + 16 * q;
        float zg[8], zu[8];
        kernels::unpack_bf16x8(load8(z), zg);
        kernels::unpack_bf16x8(load8(z + 8), zu);
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const float gate = zg[v];
          zg[v] = dh[v] * zu[v] * silu_grad(gate);
          zu[v] = dh[v] * silu(gate);
        }
        store8(z, zg);
        store8(z + 8, zu);
      } else {
        __nv_bfloat16* zp = pre + row * a.ld_pre + 8 * q;
        float z[8];
        kernels::unpack_bf16x8(load8(zp), z);
#pragma unroll
        for (int v = 0; v < 8; ++v) z[v] = dh[v] * (a.act == Activation::gelu ? gelu_grad(z[v]) : silu_grad(z[v]));
        store8(zp, z);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dgate += __shfl_xor_sync(0xffffffffu, dgate, off);
    if (lane == 0) a.gate_partials[row * a.gate_ld] = dgate;
  }
}

}  // namespace

void launch_activation_backward(const GradActivationArgs& args, int max_rows, cudaStream_t stream) {
  COMET_REQUIRE(args.ffn_shard % 8 == 0 && args.ld_pre % 8 == 0, "activation backward: F/tp must be a multiple of 8");
  COMET_REQUIRE(args.gate_ld >= 1, "activation backward: the gate partials need at least one column");
  if (max_rows <= 0 || args.local_experts <= 0) return;
  const int blocks = (max_rows + kWarps - 1) / kWarps;
  const dim3 grid(unsigned(blocks < 1024 ? blocks : 1024), unsigned(args.local_experts));
  activation_backward_kernel<<<grid, kWarps * 32, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::baselines
