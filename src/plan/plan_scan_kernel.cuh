// Device builder, kernel 2 of 4: one block turns the count kernel's per-chunk counts into offsets.
//  * rows: per (e, j) a prefix over chunks (chunk_rows becomes the chunk's first row inside the
//    (e, j) sub-segment) giving segment_rows; per expert a prefix over positions giving
//    segment_offset (relative) and expert_rows; a block scan of the padded sizes gives expert_offset.
//  * units: a block scan over (position, chunk) in pull order gives each chunk's first unit,
//    num_units and num_local_units.
//  * status: the smallest error key (reset here for the next build), or rows over capacity. On any
//    error it publishes the empty plan (all counts and offsets 0), which the next kernels then fill,
//    and keeps the status in first_error unless an earlier error not yet read is there (the first
//    error survives later good builds until DevicePlan::check reads it).
// The problem is small (W * chunks * E_l counts), so one block of 1024 threads does it all; the
// per-thread loops load in batches so that their global loads overlap.
#pragma once

#include <cub/block/block_scan.cuh>

#include "plan/device_build_layout.cuh"

namespace comet::plan_dev {

inline constexpr int kScanThreads = 1024;
static_assert(kMaxLocalExperts <= kScanThreads, "one thread per local expert");
inline constexpr int kScanBatch = 8;

// In place: a[i * stride] becomes the sum of a[0 .. i-1]; returns the total. Loads are batched.
__device__ inline int exclusive_prefix_strided(int32_t* a, int n, size_t stride) {
  int run = 0;
  for (int i0 = 0; i0 < n; i0 += kScanBatch) {
    int v[kScanBatch];
#pragma unroll
    for (int b = 0; b < kScanBatch; ++b) v[b] = i0 + b < n ? a[(i0 + b) * stride] : 0;
#pragma unroll
    for (int b = 0; b < kScanBatch; ++b) {
      if (i0 + b < n) a[(i0 + b) * stride] = run;
      run += v[b];
    }
  }
  return run;
}

__global__ void __launch_bounds__(kScanThreads) plan_scan_kernel(const void* const* peer_routing, BuildGeometry g,
                                                                  BuildScratch sc, PlanView v) {
  using BlockScan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  __shared__ int s_expert_offset[kMaxLocalExperts + 1];
  __shared__ int s_status[kPlanStatusWords];
  __shared__ int s_local_units;
  const int tid = threadIdx.x, W = g.world, El = g.local_experts, C = g.chunks, tm = g.tile_m;

  // Rows: per (e, j) over chunks. Segment (e, j) is p = e * W + j; chunk c of j is block j * C + c.
  for (int p = tid; p < El * W; p += kScanThreads) {
    const int e = p / W, j = p % W;
    v.segment_rows[p] = exclusive_prefix_strided(sc.chunk_rows + size_t(j) * C * El + e, C, size_t(El));
  }
  __syncthreads();

  // Per expert over positions (segment_offset relative to the expert for now), then the padded sizes.
  int padded = 0;
  if (tid < El) {
    int run = 0;
    for (int j0 = 0; j0 < W; j0 += kScanBatch) {
      int rows[kScanBatch];
#pragma unroll
      for (int b = 0; b < kScanBatch; ++b) rows[b] = j0 + b < W ? v.segment_rows[tid * W + j0 + b] : 0;
#pragma unroll
      for (int b = 0; b < kScanBatch; ++b) {
        if (j0 + b < W) v.segment_offset[tid * W + j0 + b] = run;
        run += rows[b];
      }
    }
    v.expert_rows[tid] = run;
    padded = (run + tm - 1) / tm * tm;
  }
  int expert_first = 0, total_rows = 0;
  BlockScan(scan_storage).ExclusiveSum(padded, expert_first, total_rows);
  if (tid < El) s_expert_offset[tid] = expert_first;
  if (tid == 0) s_expert_offset[El] = total_rows;
  __syncthreads();  // scan_storage is reused below

  // Units: first unit of each chunk in pull order (position-major, as the blocks are numbered).
  const int blocks = W * C;
  int units = 0;
  for (int base = 0; base < blocks; base += kScanThreads) {
    const int b = base + tid;
    const int count = b < blocks ? sc.chunk_units[b] : 0;
    int first = 0, sum = 0;
    BlockScan(scan_storage).ExclusiveSum(count, first, sum);
    if (b < blocks) sc.chunk_units[b] = units + first;
    if (b == C) s_local_units = units + first;  // position 1's first unit (W > 1, so b < blocks)
    units += sum;
    __syncthreads();
  }
  if (W == 1 && tid == 0) s_local_units = units;

  // Status: the first bad routing (re-reading the offending value from its buffer), else the rows.
  if (tid == 0) {
    int st[kPlanStatusWords] = {0, 0, 0, 0, 0};
    const unsigned long long key = *sc.error_key;
    *sc.error_key = kNoError;  // ready for the next build (stream order: it starts after this kernel)
    if (key != kNoError) {
      const int s = error_source(key);
      const char* buffer = static_cast<const char*>(peer_routing[s]);
      if (error_stage(key) == 0) {
        st[0] = static_cast<int>(PlanError::tokens_over_capacity);
        st[1] = s;
        st[2] = *reinterpret_cast<const int32_t*>(buffer);
        st[3] = g.max_tokens;
      } else {
        const int t = error_token(key), slot = error_slot(key);
        const RoutingBufferLayout layout = g.routing_layout();
        const SlotError kind = error_kind(key);
        st[0] = static_cast<int>(kind == kIdOutOfRange   ? PlanError::expert_out_of_range
                                 : kind == kIdDuplicate ? PlanError::duplicate_expert
                                                        : PlanError::gate_not_finite);
        st[1] = s;
        st[2] = t;
        st[3] = slot;
        // The offending id, or the gate's float bits.
        const size_t at = size_t(t) * g.topk + slot;
        st[4] = kind == kGateNotFinite ? reinterpret_cast<const int32_t*>(buffer + layout.gates_offset())[at]
                                       : reinterpret_cast<const int32_t*>(buffer + layout.ids_offset())[at];
      }
    } else if (total_rows > g.max_rows) {
      st[0] = static_cast<int>(PlanError::rows_over_capacity);
      st[1] = total_rows;
      st[2] = g.max_rows;
    }
    for (int i = 0; i < kPlanStatusWords; ++i) v.status[i] = s_status[i] = st[i];
    if (st[0] != 0 && v.first_error[0] == 0)
      for (int i = 0; i < kPlanStatusWords; ++i) v.first_error[i] = st[i];
  }
  __syncthreads();
  const bool ok = s_status[0] == 0;

  // Publish; on error, the empty plan.
  for (int e = tid; e <= El; e += kScanThreads) v.expert_offset[e] = ok ? s_expert_offset[e] : 0;
  for (int e = tid; e < El; e += kScanThreads)
    if (!ok) v.expert_rows[e] = 0;
  for (int p = tid; p < El * W; p += kScanThreads) {
    if (ok) {
      v.segment_offset[p] += s_expert_offset[p / W];
    } else {
      v.segment_offset[p] = 0;
      v.segment_rows[p] = 0;
    }
  }
  for (int s = tid; s < W; s += kScanThreads) v.src_tokens[s] = ok ? sc.position_tokens[g.position_of(s)] : 0;
  if (tid == 0) {
    *v.num_units = ok ? units : 0;
    *v.num_local_units = ok ? s_local_units : 0;
    *v.num_tiles = ok ? total_rows / tm : 0;
  }
}

}  // namespace comet::plan_dev
