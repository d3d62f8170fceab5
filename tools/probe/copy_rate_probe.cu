// How fast one comm block can gather token rows on this GPU (issue 16: "per-block GB/s against n_comm").
// Each block copies rows src[perm[i]] -> dst[i] for i = block, block + blocks, ... (a gather, as layer 0's
// pull is) in one of these ways, and the probe prints GB/s per block for 1..132 blocks:
//   tma     one thread, bulk loads into `stages` shared-memory stages (mbarrier per stage), each row then
//           stored with a bulk store; a stage is reused once its store has been read out of shared memory
//           (cp.async.bulk.wait_group.read); loads in flight = stages - store lag.
//   tmaN    N threads of warp 0 each run the `tma` pipeline over their own stages and rows.
//   warp    every warp of a 384-thread block copies whole rows with 16-byte loads, `unroll` rows in
//           registers per lane at a time (plain ld/st, as the sequential baseline's copy kernel does).
// Usage: comet_copy_rate_probe [row_bytes=8192] [rows=65536] [host] ; "host" puts src in mapped pinned
// host memory (the one-GPU host link).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comet/cuda_check.hpp"
#include "ptx/bulk_copy.cuh"

namespace {

constexpr int kSmem = 200 * 1024;

__device__ __forceinline__ void wait_read_group(int lag) {  // stage reuse: the store has read it
  switch (lag) {
    case 0: comet::dev::bulk_wait_group_read<0>(); break;
    case 1: comet::dev::bulk_wait_group_read<1>(); break;
    case 2: comet::dev::bulk_wait_group_read<2>(); break;
    default: comet::dev::bulk_wait_group_read<4>(); break;
  }
}

// One bulk-copy pipeline: rows first, first + step, ... of this block, stages [s0, s0 + stages).
__device__ void tma_pipeline(const char* src, char* dst, const int* perm, int rows, int row_bytes, int first,
                             int step, char* stage_mem, uint64_t* bars, int stages, int lag) {
  using namespace comet::dev;
  const int lookahead = stages - lag;
  const int count = first < rows ? (rows - first + step - 1) / step : 0;
  auto load = [&](int i) {
    const int s = i % stages;
    mbarrier_arrive_expect_tx(&bars[s], row_bytes);
    bulk_load(stage_mem + size_t(s) * row_bytes, src + size_t(perm[first + i * step]) * row_bytes, row_bytes, &bars[s]);
  };
  for (int i = 0; i < min(lookahead, count); ++i) load(i);
  for (int i = 0; i < count; ++i) {
    const int s = i % stages;
    while (!mbarrier_try_wait(&bars[s], (i / stages) & 1)) {
    }
    bulk_store(dst + size_t(first + i * step) * row_bytes, stage_mem + size_t(s) * row_bytes, row_bytes);
    bulk_commit_group();
    if (i + lookahead < count) {
      wait_read_group(lag);  // the stage of unit i - lag is free
      load(i + lookahead);
    }
  }
  bulk_wait_group<0>();
}

__global__ void tma_kernel(const char* src, char* dst, const int* perm, int rows, int row_bytes, int pipes,
                           int lag) {
  extern __shared__ __align__(128) char smem[];
  auto* bars = reinterpret_cast<uint64_t*>(smem);
  char* stage_mem = smem + 1024;
  const int stages_total = min(64, (kSmem - 1024) / row_bytes);  // 64 mbarriers in the first 1 KB
  const int per_pipe = stages_total / pipes;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages_total; ++s) comet::dev::mbarrier_init(&bars[s], 1);
    comet::dev::fence_mbarrier_init();
  }
  __syncthreads();
  const int p = threadIdx.x;
  if (p < pipes && per_pipe > lag)
    tma_pipeline(src, dst, perm, rows, row_bytes, blockIdx.x * pipes + p, gridDim.x * pipes,
                 stage_mem + size_t(p) * per_pipe * row_bytes, bars + p * per_pipe, per_pipe, lag);
}

template <int kUnroll>
__global__ void warp_kernel(const uint4* src, uint4* dst, const int* perm, int rows, int row_vecs) {
  const int lane = threadIdx.x % 32;
  const int warp = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int warps = gridDim.x * (blockDim.x / 32);
  // Each lane copies its 16-byte columns of kUnroll rows at a time: kUnroll loads in flight per lane.
  for (int r0 = warp * kUnroll; r0 < rows; r0 += warps * kUnroll) {
    for (int c = lane; c < row_vecs; c += 32) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r0 + u < rows) v[u] = src[size_t(perm[r0 + u]) * row_vecs + c];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r0 + u < rows) dst[size_t(r0 + u) * row_vecs + c] = v[u];
    }
  }
}

__global__ void fill_kernel(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i * 2654435761u);
}

template <class Launch>
float time_ms(Launch&& launch) {
  cudaEvent_t a, b;
  COMET_CUDA_CHECK(cudaEventCreate(&a));
  COMET_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int rep = 0; rep < 7; ++rep) {
    COMET_CUDA_CHECK(cudaEventRecord(a));
    launch();
    COMET_CUDA_CHECK(cudaEventRecord(b));
    COMET_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    COMET_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep >= 2) t.push_back(ms);
  }
  COMET_CUDA_CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int row_bytes = argc > 1 ? std::atoi(argv[1]) : 8192;
  const int rows = argc > 2 ? std::atoi(argv[2]) : 65536;
  const bool host = argc > 3 && std::string(argv[3]) == "host";
  const size_t bytes = size_t(rows) * row_bytes;
  char *src = nullptr, *dst = nullptr;
  int* perm = nullptr;
  if (host) {
    COMET_CUDA_CHECK(cudaHostAlloc(&src, bytes, cudaHostAllocMapped));
  } else {
    COMET_CUDA_CHECK(cudaMalloc(&src, bytes));
  }
  fill_kernel<<<264, 256>>>(reinterpret_cast<uint32_t*>(src), bytes / 4);
  COMET_CUDA_CHECK(cudaMalloc(&dst, bytes));
  COMET_CUDA_CHECK(cudaMalloc(&perm, rows * sizeof(int)));
  std::vector<int> p(rows);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), std::mt19937(7));
  COMET_CUDA_CHECK(cudaMemcpy(perm, p.data(), rows * sizeof(int), cudaMemcpyHostToDevice));
  COMET_CUDA_CHECK(cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  std::printf("row %d bytes, %d rows (%.1f MB), source in %s memory\n", row_bytes, rows, bytes / 1e6,
              host ? "mapped host" : "device");
  const int block_counts[] = {1, 4, 16, 32, 66, 132};
  auto report = [&](const char* what, int blocks, float ms) {
    std::printf("%-22s blocks %3d  %8.3f ms  %7.1f GB/s  %6.2f GB/s per block\n", what, blocks, ms,
                bytes / (ms * 1e6), bytes / (ms * 1e6) / blocks);
  };
  for (int blocks : block_counts) {
    for (int pipes : {1, 2, 4}) {
      for (int lag : {1, 4}) {
        const float ms = time_ms([&] { tma_kernel<<<blocks, 128, kSmem>>>(src, dst, perm, rows, row_bytes, pipes, lag); });
        char name[64];
        std::snprintf(name, sizeof name, "tma x%d lag %d", pipes, lag);
        report(name, blocks, ms);
      }
    }
    const int vecs = row_bytes / 16;
    auto* s4 = reinterpret_cast<const uint4*>(src);
    auto* d4 = reinterpret_cast<uint4*>(dst);
    report("warp x12 unroll 2", blocks, time_ms([&] { warp_kernel<2><<<blocks, 384>>>(s4, d4, perm, rows, vecs); }));
    report("warp x12 unroll 8", blocks, time_ms([&] { warp_kernel<8><<<blocks, 384>>>(s4, d4, perm, rows, vecs); }));
  }
  // The copy must be right: a row of dst equals its source row.
  std::vector<char> a(row_bytes), b(row_bytes);
  COMET_CUDA_CHECK(cudaMemcpy(a.data(), dst + size_t(rows / 2) * row_bytes, row_bytes, cudaMemcpyDeviceToHost));
  COMET_CUDA_CHECK(cudaMemcpy(b.data(), src + size_t(p[rows / 2]) * row_bytes, row_bytes, host ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost));
  std::printf("check: %s\n", a == b ? "dst rows equal their source rows" : "MISMATCH");
  return a == b ? 0 : 1;
}
