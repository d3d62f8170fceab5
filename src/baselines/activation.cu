// One thread per (row, group of 8 hidden columns): 16-byte loads and stores. Block row y is expert y;
// its rows are the contiguous range of its (e, j) sub-segments for j in [pos_begin, pos_end).
#include "baselines/activation.hpp"

#include <cuda_bf16.h>

#include "baselines/activation_math.cuh"
#include "comet/cuda_check.hpp"
#include "kernels/bf16x8.cuh"

namespace comet::baselines {
namespace {

__global__ void activation_kernel(ActivationArgs a) {
  const int e = blockIdx.y;
  const int first = e * a.world + a.pos_begin, last = e * a.world + a.pos_end - 1;
  const int row0 = a.segment_offset[first];
  const int rows = a.segment_offset[last] + a.segment_rows[last] - row0;
  const int groups = a.ffn_shard / 8;
  const long long items = (long long)rows * groups;
  const __nv_bfloat16* c = static_cast<const __nv_bfloat16*>(a.c);
  __nv_bfloat16* hid = static_cast<__nv_bfloat16*>(a.hidden);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < items;
       i += (long long)gridDim.x * blockDim.x) {
    const size_t row = size_t(row0) + size_t(i / groups);
    const int g = int(i % groups);
    const __nv_bfloat16* in = c + row * a.ldc;
    float x[8], out[8];
    if (a.act == Activation::swiglu) {
      float up[8];
      kernels::unpack_bf16x8(*reinterpret_cast<const uint4*>(in + 16 * g), x);
      kernels::unpack_bf16x8(*reinterpret_cast<const uint4*>(in + 16 * g + 8), up);
#pragma unroll
      for (int q = 0; q < 8; ++q) out[q] = silu(x[q]) * up[q];
    } else {
      kernels::unpack_bf16x8(*reinterpret_cast<const uint4*>(in + 8 * g), x);
#pragma unroll
      for (int q = 0; q < 8; ++q) out[q] = a.act == Activation::gelu ? gelu_tanh(x[q]) : silu(x[q]);
    }
    *reinterpret_cast<uint4*>(hid + row * a.ffn_shard + 8 * g) = kernels::pack_bf16x8(out);
  }
}

}  // namespace

void launch_activation(const ActivationArgs& args, int max_rows, cudaStream_t stream) {
  COMET_REQUIRE(args.ffn_shard % 8 == 0 && args.ldc % 8 == 0, "activation: F/tp must be a multiple of 8");
  COMET_REQUIRE(args.pos_begin >= 0 && args.pos_end > args.pos_begin && args.pos_end <= args.world,
                "activation: bad source position range [", args.pos_begin, ", ", args.pos_end, ")");
  if (max_rows <= 0 || args.local_experts <= 0) return;
  const int threads = 256;
  const long long items = (long long)max_rows * (args.ffn_shard / 8);
  const long long blocks = (items + threads - 1) / threads;
  const dim3 grid(unsigned(blocks < 1024 ? blocks : 1024), unsigned(args.local_experts));
  activation_kernel<<<grid, threads, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::baselines
