// The small kernels around the fused layers (see local_rows.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "comet/plan.hpp"

namespace comet::kernels {

// The rank's call generation + 1, on the stream (kernels/layer_sync.hpp).
void advance_epoch(uint64_t* epoch, cudaStream_t stream);

// Where a rank learns that its call failed: the plan build's status (routing refused: the plan is
// empty) and the rank's team status (a bounded wait timed out, the rank aborted). The kernels that
// write the layer's outputs read both and write NaN instead of stale or partial sums.
struct CallFailure {
  const int32_t* plan_status = nullptr;  // PlanView::status[0] of the call's plan
  const int32_t* team_code = nullptr;    // DeviceStatus::code of the rank (1: a wait timed out)
  // The rank's failure area [world]: word s raised by peer s in this call (kernels/peer_failure.hpp).
  const int32_t* peer_words = nullptr;
  int world = 0;
};
#ifdef __CUDACC__
// Whether this call failed here or on a peer. A peer's failure (code 2 in the status, kept for the
// report) fails only the call it happened in: the words are cleared at the end of the call.
__device__ inline bool call_failed(const CallFailure& f) {
  if (f.plan_status && *f.plan_status != 0) return true;
  if (f.team_code && *(volatile const int32_t*)f.team_code == 1) return true;
  for (int s = 0; f.peer_words && s < f.world; ++s)
    if (*(volatile const int32_t*)(f.peer_words + s) != 0) return true;
  return false;
}
// call_failed, read by one thread of the block and shared: the words may sit in mapped host memory (a
// host-link team), where a read per thread cost a forward ~65 ms of PCIe round trips. Every thread of
// the block must call it.
__device__ inline bool block_call_failed(const CallFailure& f) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = call_failed(f) ? 1 : 0;
  __syncthreads();
  return failed != 0;
}
#endif

// *word = value, on the stream (a host value into device or mapped memory without a host sync).
void store_word(int32_t* word, int32_t value, cudaStream_t stream);

// Copies rows of the rank's own tokens x [T][H] into A per the plan's local units.
// max_local_items bounds num_local_units * topk (sizes the grid without reading the plan on the host).
void scatter_local(const void* x, void* a, int hidden, int topk, int max_local_items, const PlanView& plan,
                   cudaStream_t stream);

// dst[i] = src[i] for expert ids given as int64 (torch.topk); an id outside int32 becomes -1, which the
// plan's validation reports as out of range.
void narrow_ids(const int64_t* src, int32_t* dst, size_t n, cudaStream_t stream);

struct FinalReduceArgs {
  const __nv_bfloat16* recv;          // this rank's receive buffer [W][T_cap][H] (slot q from rank q)
  const __nv_bfloat16* self_partial;  // [T_cap][H] this rank's own partials
  const void* ids;                    // this rank's routing [tokens][k] (device), int32 or int64
  bool ids_64;
  __nv_bfloat16* out;                 // [tokens][H]
  int tokens, hidden, topk, max_tokens;
  int world, tp, rank, local_experts, num_experts;
  CallFailure failure;  // a failed call's out is NaN
};
void final_reduce(const FinalReduceArgs& args, cudaStream_t stream);

}  // namespace comet::kernels
