// Steps of the layer around the two fused kernels, each a plain grid-wide kernel:
//   advance_epoch   one thread bumps the rank's epoch (the generation the fused kernels' flags use),
//                   on the stream, so the layer can be replayed from a CUDA graph.
//   scatter_local   copies the rank's own token rows into their rows of A at HBM speed before layer 0,
//                   so that local tiles can start at once (remote rows are the comm blocks' job).
//   final_reduce    after the team barrier, sums every source rank's partial row of each own token in
//                   rank order (deterministic), producing the layer's output.
#include "kernels/local_rows.hpp"

#include <cuda_bf16.h>

#include <cstdint>

#include "comet/cuda_check.hpp"
#include "kernels/bf16x8.cuh"
#include "kernels/grid_size.hpp"

namespace comet::kernels {
namespace {

__global__ void advance_epoch_kernel(uint64_t* epoch) { *epoch += 1; }
__global__ void store_word_kernel(int32_t* word, int32_t value) { *word = value; }

// One warp per (local unit, slot): 16-byte copies of the token's row.
__global__ void scatter_local_kernel(const __nv_bfloat16* x, __nv_bfloat16* a, int hidden, int topk, PlanView plan) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * blockDim.x / 32;
  const int n_items = *plan.num_local_units * topk;
  const int chunks = hidden / 8;
  // 64-bit item counter: n_items (< 2^31) may lie within one step of 2^31, where an int step would wrap.
  for (int64_t item = (blockIdx.x * blockDim.x + threadIdx.x) / 32; item < n_items; item += warps) {
    const int unit = int(item / topk);
    const int row = plan.unit_rows[item];
    if (row < 0) continue;
    const uint4* src = reinterpret_cast<const uint4*>(x + size_t(plan.unit_token[unit]) * hidden);
    uint4* dst = reinterpret_cast<uint4*>(a + size_t(row) * hidden);
    for (int c = lane; c < chunks; c += 32) dst[c] = src[c];
  }
}

// One thread per (token, 8 columns). Rank q sent a partial for token t iff q's EP group holds one of
// t's experts (all TP ranks of that group did).
// A failed call (CallFailure) writes NaN rows: never the previous call's partials as a result.
__global__ void final_reduce_kernel(FinalReduceArgs r) {
  const int chunks = r.hidden / 8;
  const long long n = (long long)r.tokens * chunks;
  const bool failed = block_call_failed(r.failure);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int t = int(i / chunks), c = int(i % chunks);
    if (failed) {
      const uint4 nan8 = make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u);  // bf16 quiet NaN x 8
      reinterpret_cast<uint4*>(r.out + size_t(t) * r.hidden)[c] = nan8;
      continue;
    }
    uint32_t groups = 0;  // bit g: EP group g holds one of t's experts (ep <= 32, checked on the host)
    for (int j = 0; j < r.topk; ++j) {
      const size_t slot = size_t(t) * r.topk + j;
      const long long e = r.ids_64 ? static_cast<const int64_t*>(r.ids)[slot] : static_cast<const int32_t*>(r.ids)[slot];
      if (e >= 0 && e < r.num_experts) groups |= 1u << (e / r.local_experts);  // bad ids: the plan reports them
    }
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int q = 0; q < r.world; ++q) {
      if (!(groups >> (q / r.tp) & 1u)) continue;
      const __nv_bfloat16* part = q == r.rank ? r.self_partial + size_t(t) * r.hidden
                                              : r.recv + (size_t(q) * r.max_tokens + t) * r.hidden;
      accumulate_bf16x8(acc, reinterpret_cast<const uint4*>(part)[c], 1.0f);
    }
    reinterpret_cast<uint4*>(r.out + size_t(t) * r.hidden)[c] = pack_bf16x8(acc);
  }
}

__global__ void narrow_ids_kernel(const int64_t* src, int32_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int64_t id = src[i];
    dst[i] = id >= INT32_MIN && id <= INT32_MAX ? int32_t(id) : -1;
  }
}

}  // namespace

void advance_epoch(uint64_t* epoch, cudaStream_t stream) {
  advance_epoch_kernel<<<1, 1, 0, stream>>>(epoch);
  COMET_CUDA_CHECK_LAUNCH();
}

void store_word(int32_t* word, int32_t value, cudaStream_t stream) {
  store_word_kernel<<<1, 1, 0, stream>>>(word, value);
  COMET_CUDA_CHECK_LAUNCH();
}

void scatter_local(const void* x, void* a, int hidden, int topk, int max_local_items, const PlanView& plan,
                   cudaStream_t stream) {
  const int threads = 256;
  scatter_local_kernel<<<grid_for(32LL * max_local_items, threads), threads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(a), hidden, topk, plan);
  COMET_CUDA_CHECK_LAUNCH();
}

void narrow_ids(const int64_t* src, int32_t* dst, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  narrow_ids_kernel<<<grid_for((long long)n, threads), threads, 0, stream>>>(src, dst, n);
  COMET_CUDA_CHECK_LAUNCH();
}

void final_reduce(const FinalReduceArgs& args, cudaStream_t stream) {
  if (args.tokens == 0) return;
  const int threads = 256;
  final_reduce_kernel<<<grid_for((long long)args.tokens * (args.hidden / 8), threads), threads, 0, stream>>>(args);
  COMET_CUDA_CHECK_LAUNCH();
}

}  // namespace comet::kernels
