// Layer 0's comm role: pull remote token rows into the gathered buffer A, in the plan's pull order,
// and publish each M-tile's readiness.
//
// Comm block b of n_comm takes remote units first + b, first + b + n_comm, ... so that all comm blocks
// advance through the pull order together (tiles become ready in tile_order). One thread per block
// issues everything with Hopper bulk copies: the row crosses the link ONCE (peer -> shared memory),
// then one shared -> global copy per destination row (a token routed to several of this rank's
// experts has several rows). `stages` rows are in flight; after a unit's stores complete, the unit's
// rows are counted into their tiles (tile_arrived), and the unit that completes a tile's remote rows
// resets the counter and releases tile_ready[m] = epoch (generation counter, never cleared).
#pragma once

#include <cuda_bf16.h>

#include "kernels/layer_args.hpp"
#include "kernels/bulk_copy.cuh"
#include "team/device_wait.cuh"

namespace comet::kernels {


// Rows a unit's destination tiles are waiting for: count them, release completed tiles.
__device__ inline void publish_unit_rows(const DispatchArgs& d, int unit, int32_t epoch) {
  dev::fence_proxy_async_global();  // the rows were written by the bulk-copy (async) proxy
  for (int j = 0; j < d.topk; ++j) {
    const int row = d.plan.unit_rows[size_t(unit) * d.topk + j];
    if (row < 0) continue;
    const int m = row / d.tile_m;
    const int landed = dev::atomic_add_release_gpu(&d.tile_arrived[m], 1) + 1;
    if (landed == d.plan.tile_remote_rows[m]) {
      d.tile_arrived[m] = 0;  // nobody else touches it before the next call
      dev::st_release_gpu(&d.tile_ready[m], epoch);
    }
  }
}

// Called by every thread of a comm block; thread 0 does the work.
__device__ inline void run_dispatch_role(const DispatchArgs& d, int comm_index, int n_comm, int32_t epoch,
                                         char* smem, int smem_bytes, const TeamDeviceView& team) {
  if (threadIdx.x != 0) return;
  constexpr int kMaxStages = 16;
  constexpr int kStoreLag = 2;  // bulk-store groups left in flight before a unit is published
  const uint32_t row_bytes = uint32_t(d.hidden) * sizeof(__nv_bfloat16);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  char* rows = smem + 256;
  const int stages = min(kMaxStages, int((smem_bytes - 256) / row_bytes));
  const int lookahead = stages - kStoreLag;  // >= 1: the launcher checks stages > kStoreLag

  const int begin = d.unit_begin >= 0 ? d.unit_begin : *d.plan.num_local_units;
  const int end = d.unit_end >= 0 ? min(d.unit_end, *d.plan.num_units) : *d.plan.num_units;
  const int first = begin + comm_index;
  const int count = max(0, (end - first + n_comm - 1) / n_comm);
  auto unit_at = [&](int i) { return first + i * n_comm; };

  for (int s = 0; s < stages; ++s) dev::mbarrier_init(&full[s], 1);
  dev::fence_mbarrier_init();

  auto pull = [&](int i) {
    const int u = unit_at(i);
    const int s = i % stages;
    const __nv_bfloat16* src = d.peer_x[d.plan.unit_src[u]] + size_t(d.plan.unit_token[u]) * d.hidden;
    dev::mbarrier_arrive_expect_tx(&full[s], row_bytes);
    dev::bulk_load(rows + size_t(s) * row_bytes, src, row_bytes, &full[s]);
  };

  for (int i = 0; i < min(lookahead, count); ++i) pull(i);
  bool failed = false;
  for (int i = 0; i < count; ++i) {
    const int u = unit_at(i);
    const int s = i % stages;
    const uint32_t phase = (i / stages) & 1;
    if (!failed) {
      failed = !dev::wait_until_ge([&] { return dev::mbarrier_try_wait(&full[s], phase) ? 1 : 0; }, 1, team,
                                   WaitSite::bulk_copy, u);
    }
    if (failed) break;  // the status word names the stalled unit; compute blocks see the abort
    for (int j = 0; j < d.topk; ++j) {
      const int row = d.plan.unit_rows[size_t(u) * d.topk + j];
      if (row >= 0) dev::bulk_store(d.a + size_t(row) * d.hidden, rows + size_t(s) * row_bytes, row_bytes);
    }
    dev::bulk_commit_group();
    dev::bulk_wait_group<kStoreLag>();  // units <= i - kStoreLag are fully written
    if (i >= kStoreLag) publish_unit_rows(d, unit_at(i - kStoreLag), epoch);
    if (i + lookahead < count) pull(i + lookahead);  // reuses the stage of unit i - kStoreLag
  }
  dev::bulk_wait_group<0>();
  if (failed) return;
  for (int i = max(0, count - kStoreLag); i < count; ++i) publish_unit_rows(d, unit_at(i), epoch);
}

}  // namespace comet::kernels
