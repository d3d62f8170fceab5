// e4m3 quantisation kernels (fp8_quantize.hpp).
//   quantize_rows_e4m3     half a warp per (row, 128-column block): one 16-byte bf16 load per lane, the
//                          block's amax by shuffles within the half warp, 8 codes (8 bytes) per lane. The
//                          two halves of a warp take consecutive blocks of a row, so a warp reads 512
//                          contiguous bytes; grid-stride over all blocks.
//   quantize_weights_e4m3  one CTA of 256 threads per 128 x 128 block: the block's 32 KiB stay in
//                          registers (8 x 16 bytes a thread) between the amax and the conversion, so the
//                          weights are read once.
// Both are bitwise the CPU oracle (comet/fp8.hpp): bf16 -> float is exact, amax is a max of |v| (exact),
// s = __fdiv_rn(amax, 448) and v / s = __fdiv_rn(v, s) are IEEE float divisions as the CPU's float `/`,
// and __nv_cvt_float_to_fp8(..., __NV_SATFINITE, __NV_E4M3) rounds to nearest even and saturates to
// +-448 as fp8::to_e4m3 does. Non-finite input is not checked (fp8_quantize.hpp).
#include "kernels/fp8_quantize.hpp"

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "kernels/grid_size.hpp"

namespace comet::kernels {
namespace {

constexpr int kThreads = 256;

// 8 bf16 values (one 16-byte load, element 0 in the low half of .x) as floats: exact.
__device__ inline void unpack_bf16x8(const uint4& u, float (&v)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

__device__ inline float block_scale(float amax) { return amax > 0.0f ? __fdiv_rn(amax, fp8::kE4m3Max) : 1.0f; }

__device__ inline uint32_t e4m3_of(float v, float s) {
  return uint32_t(__nv_cvt_float_to_fp8(__fdiv_rn(v, s), __NV_SATFINITE, __NV_E4M3));
}

// The 8 codes of v / s, code 0 in the lowest byte (memory order).
__device__ inline uint2 encode_e4m3x8(const float (&v)[8], float s) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo |= e4m3_of(v[i], s) << (8 * i);
    hi |= e4m3_of(v[4 + i], s) << (8 * i);
  }
  return make_uint2(lo, hi);
}

__device__ inline float abs_max8(const float (&v)[8], float amax) {
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
  return amax;
}

// Task t = row * blocks_per_row + j is (row, column block j); warp w takes tasks 2w (lanes 0-15) and
// 2w + 1 (lanes 16-31). The loop condition is uniform over the warp, so every lane reaches the shuffles.
// (Measured on the H200 at 16384 x 7168: 0.15 ms, 2.4 TB/s of reads and writes; issuing 4 loads per
// pass first made no difference.)
__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const uint4* __restrict__ x, int rows, int hidden,
                                                                 uint8_t* __restrict__ records) {
  const int blocks_per_row = hidden / fp8::kBlock;
  const long long tasks = (long long)rows * blocks_per_row;
  const int half = (threadIdx.x / 16) & 1;
  const int l = threadIdx.x % 16;
  const size_t rb = size_t(fp8::record_bytes(hidden));
  const int scales_end = hidden + 4 * blocks_per_row;  // padding: [scales_end, record_bytes), <= 12 bytes
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long w = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; 2 * w < tasks; w += warps) {
    const long long t = 2 * w + half;
    const bool live = t < tasks;
    long long row = 0;
    int j = 0;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (live) {
      row = t / blocks_per_row;
      j = int(t % blocks_per_row);
      unpack_bf16x8(x[(size_t(row) * hidden + size_t(j) * fp8::kBlock) / 8 + l], v);
    }
    float amax = abs_max8(v, 0.0f);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));  // within the half
    if (!live) continue;
    const float s = block_scale(amax);
    uint8_t* rec = records + size_t(row) * rb;
    *reinterpret_cast<uint2*>(rec + size_t(j) * fp8::kBlock + 8 * l) = encode_e4m3x8(v, s);
    if (l == 0) *reinterpret_cast<float*>(rec + hidden + 4 * j) = s;
    if (j == 0 && l >= 1 && l <= 3 && scales_end + 4 * (l - 1) < int(rb))
      *reinterpret_cast<uint32_t*>(rec + scales_end + 4 * (l - 1)) = 0u;
  }
}

// One CTA (kThreads = 256) per 128 x 128 block b = (mat * row_blocks + rb) * col_blocks + cb, grid-stride.
// Thread t holds the 16-byte chunks t + 256 i (i < 8) of the block: row chunk / 16, columns 8 (chunk % 16).
__global__ void __launch_bounds__(kThreads) quantize_weights_kernel(const uint4* __restrict__ w, int mats, int rows,
                                                                    int cols, uint8_t* __restrict__ codes,
                                                                    float* __restrict__ scales) {
  constexpr int kChunks = fp8::kBlock * fp8::kBlock / 8 / kThreads;  // 8
  __shared__ float warp_max[kThreads / 32];
  __shared__ float shared_scale;
  const int row_blocks = (rows + fp8::kBlock - 1) / fp8::kBlock, col_blocks = cols / fp8::kBlock;
  const long long n_blocks = (long long)mats * row_blocks * col_blocks;
  for (long long b = blockIdx.x; b < n_blocks; b += gridDim.x) {
    const int cb = int(b % col_blocks);
    const long long rest = b / col_blocks;
    const int rblk = int(rest % row_blocks);
    const long long mat = rest / row_blocks;
    const int r0 = rblk * fp8::kBlock, nr = min(fp8::kBlock, rows - r0);
    uint4 u[kChunks] = {};
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int idx = threadIdx.x + kThreads * i, r = idx / 16, c = idx % 16;
      if (r < nr) {
        u[i] = w[((size_t(mat) * rows + r0 + r) * cols + size_t(cb) * fp8::kBlock) / 8 + c];
        float v[8];
        unpack_bf16x8(u[i], v);
        amax = abs_max8(v, amax);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, warp_max[i]);
      shared_scale = block_scale(m);
      scales[b] = shared_scale;
    }
    __syncthreads();
    const float s = shared_scale;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int idx = threadIdx.x + kThreads * i, r = idx / 16, c = idx % 16;
      if (r < nr) {
        float v[8];
        unpack_bf16x8(u[i], v);
        *reinterpret_cast<uint2*>(codes + (size_t(mat) * rows + r0 + r) * cols + size_t(cb) * fp8::kBlock + 8 * c) =
            encode_e4m3x8(v, s);
      }
    }
    __syncthreads();  // warp_max and shared_scale are reused by the next block
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }


}  // namespace

void quantize_rows_e4m3(const void* x_bf16, int rows, int hidden, void* records, cudaStream_t stream) {
  COMET_REQUIRE(rows >= 0, "quantize_rows_e4m3: rows must be >= 0, got ", rows);
  COMET_REQUIRE(hidden > 0 && hidden % fp8::kBlock == 0, "quantize_rows_e4m3: hidden must be a positive multiple of ",
                fp8::kBlock, ", got ", hidden);
  COMET_REQUIRE(aligned16(x_bf16) && aligned16(records), "quantize_rows_e4m3: x and records must be 16-byte aligned");
  if (rows == 0) return;
  COMET_REQUIRE(x_bf16 != nullptr && records != nullptr, "quantize_rows_e4m3: null pointer");
  const long long tasks = (long long)rows * (hidden / fp8::kBlock);
  quantize_rows_kernel<<<grid_for(tasks * 16, kThreads), kThreads, 0, stream>>>(static_cast<const uint4*>(x_bf16), rows, hidden,
                                                                      static_cast<uint8_t*>(records));
  COMET_CUDA_CHECK_LAUNCH();
}

void quantize_weights_e4m3(const void* w_bf16, int mats, int rows, int cols, void* codes, float* scales,
                           cudaStream_t stream) {
  COMET_REQUIRE(mats >= 0 && rows >= 0, "quantize_weights_e4m3: mats and rows must be >= 0, got ", mats, ", ", rows);
  COMET_REQUIRE(cols > 0 && cols % fp8::kBlock == 0, "quantize_weights_e4m3: cols must be a positive multiple of ",
                fp8::kBlock, ", got ", cols);
  COMET_REQUIRE(aligned16(w_bf16) && aligned16(codes) && aligned16(scales),
                "quantize_weights_e4m3: w, codes and scales must be 16-byte aligned");
  if (mats == 0 || rows == 0) return;
  COMET_REQUIRE(w_bf16 != nullptr && codes != nullptr && scales != nullptr, "quantize_weights_e4m3: null pointer");
  const long long n_blocks =
      (long long)mats * ((rows + fp8::kBlock - 1) / fp8::kBlock) * (cols / fp8::kBlock);
  quantize_weights_kernel<<<grid_for(n_blocks * kThreads, kThreads), kThreads, 0, stream>>>(
      static_cast<const uint4*>(w_bf16), mats, rows, cols, static_cast<uint8_t*>(codes), scales);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
