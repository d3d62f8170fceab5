// The fp8 baseline's data movers (fp8_expert_gemm.hpp): the records' codes and scales split into the
// buffers cuBLASLt reads, and the 128 x 128 weight scales padded to cuBLASLt's stride.
#include <algorithm>
#include <cstdint>

#include "baselines/fp8_expert_gemm.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "kernels/grid_size.hpp"

namespace comet::baselines {
namespace {

constexpr int kThreads = 256;
constexpr int kBatch = 128;  // blocks per launch, passed by value (2 KiB of kernel parameters)

struct UnpackBatch {
  Fp8UnpackBlock block[kBatch];
  int count;
  int first_dst;  // block[0].dst_row
  int total;      // padded rows of the batch: [first_dst, first_dst + total)
};

// One warp per padded scratch row: 16-byte copies of the codes, the row's k / 128 scales scattered to
// their N-major places (lane j takes block j).
__global__ void __launch_bounds__(kThreads) unpack_kernel(const uint8_t* __restrict__ records, int k,
                                                          UnpackBatch batch, uint8_t* __restrict__ codes,
                                                          float* __restrict__ scales) {
  const int lane = threadIdx.x % 32;
  const int blocks_k = k / fp8::kBlock, chunks = k / 16;
  const size_t rb = size_t(fp8::record_bytes(k));
  const int warps = gridDim.x * blockDim.x / 32;
  for (int p = (blockIdx.x * blockDim.x + threadIdx.x) / 32; p < batch.total; p += warps) {
    const int dst = batch.first_dst + p;
    int lo = 0, hi = batch.count - 1;  // the last block with dst_row <= dst
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (batch.block[mid].dst_row <= dst) lo = mid;
      else hi = mid - 1;
    }
    const Fp8UnpackBlock b = batch.block[lo];
    const int local = dst - b.dst_row;
    uint4* out = reinterpret_cast<uint4*>(codes + size_t(dst) * k);
    float* sc = scales + size_t(b.dst_row) * blocks_k + local;
    if (local < b.rows) {
      const uint8_t* rec = records + size_t(b.src_row + local) * rb;
      const uint4* in = reinterpret_cast<const uint4*>(rec);
      for (int c = lane; c < chunks; c += 32) out[c] = in[c];
      const float* rs = reinterpret_cast<const float*>(rec + fp8::record_scales_offset(k));
      for (int j = lane; j < blocks_k; j += 32) sc[size_t(j) * b.rows_pad] = rs[j];
    } else {
      for (int c = lane; c < chunks; c += 32) out[c] = make_uint4(0, 0, 0, 0);
      for (int j = lane; j < blocks_k; j += 32) sc[size_t(j) * b.rows_pad] = 0.0f;
    }
  }
}

__global__ void pad_scales_kernel(const float* __restrict__ src, long long rows, int cols, int cols4,
                                  float* __restrict__ dst) {
  const long long n = rows * cols4;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / cols4;
    const int c = int(i % cols4);
    dst[i] = c < cols ? src[r * cols + c] : 0.0f;
  }
}


}  // namespace

void unpack_fp8_records(const void* records, int k, const std::vector<Fp8UnpackBlock>& blocks, void* codes,
                        float* scales, cudaStream_t stream) {
  COMET_REQUIRE(k > 0 && k % fp8::kBlock == 0, "unpack_fp8_records: k must be a positive multiple of 128, got ", k);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Fp8UnpackBlock& b = blocks[i];
    COMET_REQUIRE(b.rows > 0 && b.rows_pad >= b.rows && b.rows_pad % 4 == 0 && b.dst_row % 4 == 0 && b.src_row >= 0,
                  "unpack_fp8_records: bad block ", i);
    COMET_REQUIRE(i == 0 || b.dst_row == blocks[i - 1].dst_row + blocks[i - 1].rows_pad,
                  "unpack_fp8_records: blocks must follow each other in the scratch");
  }
  for (size_t first = 0; first < blocks.size(); first += kBatch) {
    UnpackBatch batch{};
    batch.count = int(std::min(blocks.size() - first, size_t(kBatch)));
    for (int i = 0; i < batch.count; ++i) batch.block[i] = blocks[first + i];
    batch.first_dst = batch.block[0].dst_row;
    batch.total = batch.block[batch.count - 1].dst_row + batch.block[batch.count - 1].rows_pad - batch.first_dst;
    unpack_kernel<<<kernels::grid_for(32LL * batch.total, kThreads), kThreads, 0, stream>>>(static_cast<const uint8_t*>(records), k,
                                                                          batch, static_cast<uint8_t*>(codes), scales);
    COMET_CUDA_CHECK_LAUNCH();
  }
}

void pad_fp8_weight_scales(const float* src, int experts, int row_blocks, int col_blocks, float* dst,
                           cudaStream_t stream) {
  const long long rows = (long long)experts * row_blocks;
  const int cols4 = (col_blocks + 3) / 4 * 4;
  if (rows <= 0 || col_blocks <= 0) return;
  pad_scales_kernel<<<kernels::grid_for(rows * cols4, kThreads), kThreads, 0, stream>>>(src, rows, col_blocks, cols4, dst);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::baselines
