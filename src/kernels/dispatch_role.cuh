// Layer 0's comm role: pull remote token rows into the gathered buffer A, in the plan's pull order,
// and publish each M-tile's readiness.
//
// Comm block b of n_comm takes units begin + b, begin + b + n_comm, ... so that all comm blocks
// advance through the pull order together (tiles become ready in tile_order). Three roles per block:
//   prefetcher (warp 2)          loads the units' metadata (source, token, destination rows) 32 units
//       at a time into a shared-memory ring, so the issuer never waits on a global load.
//   issuer (warp 0, one thread)  moves rows with Hopper bulk copies: the row crosses the link ONCE
//       (peer -> shared memory, `lookahead` rows in flight), then one shared -> global copy per
//       destination row (a token routed to several of this rank's experts has several rows).
//       When a unit's stores have completed it goes into a shared-memory ring.
//   publisher (warp 1, 32 lanes) counts completed units' rows into their tiles (tile_arrived, relaxed
//       atomics, lanes in parallel); the row that completes a tile resets its counter and releases
//       tile_ready[m] = epoch (generation counter, never cleared).
// Keeping loads, atomics and fences off the issuing thread keeps the link busy (it is latency-bound:
// measured on the H200, an issuer that loaded its own metadata moved ~8 GB/s per block, over HBM or PCIe).
#pragma once

#include <cuda_bf16.h>

#include "kernels/bulk_copy.cuh"
#include "kernels/layer_args.hpp"
#include "team/device_wait.cuh"

namespace comet::kernels {

namespace dispatch {

constexpr int kMaxStages = 32;
constexpr int kRing = 512;          // completed units waiting for the publisher
constexpr int kPublishBatch = 4;    // the issuer hands over units in batches (one proxy fence each)
constexpr int kMeta = 128;          // metadata ring entries (> the largest lookahead)
constexpr int kMetaWords = 2 + kMaxTopK;  // source row address (2 words), destination rows
// Shared memory: [0, 256) mbarriers, [256, 264) pushed/published, [264, 2312) publish ring,
// [2560, 2568) meta filled/consumed, [4096, 13312) metadata ring, [16384, ...) row stages.
constexpr int kMetaOffset = 4096;
constexpr int kRowsOffset = 16384;

__device__ __forceinline__ volatile int32_t* ring_word(char* smem, int i) {
  return reinterpret_cast<volatile int32_t*>(smem + 256) + 2 + (i % kRing);
}
__device__ __forceinline__ volatile int32_t& pushed(char* smem) { return reinterpret_cast<volatile int32_t*>(smem + 256)[0]; }
__device__ __forceinline__ volatile int32_t& published(char* smem) {
  return reinterpret_cast<volatile int32_t*>(smem + 256)[1];
}
__device__ __forceinline__ volatile int32_t& meta_filled(char* smem) {
  return reinterpret_cast<volatile int32_t*>(smem + 2560)[0];
}
__device__ __forceinline__ volatile int32_t& meta_consumed(char* smem) {
  return reinterpret_cast<volatile int32_t*>(smem + 2560)[1];
}
__device__ __forceinline__ int32_t* meta_entry(char* smem, int i) {
  return reinterpret_cast<int32_t*>(smem + kMetaOffset) + (i % kMeta) * kMetaWords;
}

// Bulk-store groups left in flight before a unit counts as complete; a run-time choice among
// instantiated values because cp.async.bulk.wait_group takes an immediate.
__device__ __forceinline__ void wait_stores(int lag) {
  switch (lag) {
    case 1: dev::bulk_wait_group<1>(); break;
    case 2: dev::bulk_wait_group<2>(); break;
    case 4: dev::bulk_wait_group<4>(); break;
    default: dev::bulk_wait_group<8>(); break;
  }
}

}  // namespace dispatch

// The issuing thread. Returns false if a copy stalled (reported in the status word).
__device__ inline bool issue_pulls(const DispatchArgs& d, int first, int stride, int count, int32_t epoch,
                                   char* smem, int smem_bytes, const TeamDeviceView& team) {
  using namespace dispatch;
  const uint32_t row_bytes = uint32_t(d.hidden) * sizeof(__nv_bfloat16);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  char* rows = smem + kRowsOffset;
  const int stages = min(kMaxStages, int((smem_bytes - kRowsOffset) / row_bytes));
  const int lag = d.store_lag;  // 1, 2, 4 or 8 (launcher checks stages > lag)
  const int lookahead = stages - lag;
  auto unit_at = [&](int i) { return first + i * stride; };

  auto meta_ready = [&](int i) {
    const bool ok = dev::wait_until_ge([&] { return meta_filled(smem); }, i + 1, team, WaitSite::bulk_copy, -3);
    __threadfence_block();  // the entries after the count that published them
    return ok;
  };
  auto pull = [&](int i) {
    const int s = i % stages;
    const volatile int32_t* meta = meta_entry(smem, i);
    const auto* src = reinterpret_cast<const __nv_bfloat16*>(uint64_t(uint32_t(meta[0])) | (uint64_t(uint32_t(meta[1])) << 32));
    dev::mbarrier_arrive_expect_tx(&full[s], row_bytes);
    dev::bulk_load(rows + size_t(s) * row_bytes, src, row_bytes, &full[s]);
  };
  // Unit i's stores are complete: give it to the publisher (batched; one proxy fence per batch).
  auto hand_over = [&](int i, bool flush) {
    *ring_word(smem, i) = unit_at(i);
    if (flush || (i + 1) % kPublishBatch == 0) {
      dev::fence_proxy_async_global();  // rows written by the bulk-copy proxy, flags by the generic one
      __threadfence_block();
      pushed(smem) = i + 1;
    }
  };
  auto wait_ring_space = [&](int i) {
    return dev::wait_until_ge([&] { return published(smem) + kRing; }, i + 1, team, WaitSite::bulk_copy, -1);
  };

  for (int i = 0; i < min(lookahead, count); ++i) {
    if (!meta_ready(i)) return false;
    pull(i);
  }
  for (int i = 0; i < count; ++i) {
    const int s = i % stages;
    const uint32_t phase = (i / stages) & 1;
    if (!dev::wait_until_ge([&] { return dev::mbarrier_try_wait(&full[s], phase) ? 1 : 0; }, 1, team,
                            WaitSite::bulk_copy, unit_at(i))) {
      return false;
    }
    const volatile int32_t* meta = meta_entry(smem, i);
    for (int j = 0; j < d.topk; ++j) {
      const int row = meta[2 + j];
      if (row >= 0) dev::bulk_store(d.a + size_t(row) * d.hidden, rows + size_t(s) * row_bytes, row_bytes);
    }
    dev::bulk_commit_group();
    dispatch::wait_stores(lag);  // units <= i - lag are fully written
    if (i >= lag) {
      if (!wait_ring_space(i - lag)) return false;
      hand_over(i - lag, false);
    }
    if (i + lookahead < count) {  // reuses the stage of unit i - lag
      if (!meta_ready(i + lookahead)) return false;
      pull(i + lookahead);
    }
    meta_consumed(smem) = i + 1;  // entries < i + 1 are no longer read
  }
  dev::bulk_wait_group<0>();
  for (int i = max(0, count - lag); i < count; ++i) {
    if (!wait_ring_space(i)) return false;
    hand_over(i, i == count - 1);
  }
  return true;
}

// The prefetcher warp: metadata of units [0, count) into the ring, 32 at a time, ahead of the issuer.
__device__ inline void prefetch_metadata(const DispatchArgs& d, int first, int stride, int count, char* smem,
                                         const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  for (int base = 0; base < count; base += 32) {
    bool ok = true;
    if (lane == 0) {  // room for entries [base, base + 32): the issuer is past base + 32 - kMeta
      ok = dev::wait_until_ge([&] { return meta_consumed(smem) + kMeta; }, base + 32, team, WaitSite::bulk_copy, -4);
    }
    if (!__shfl_sync(0xffffffffu, ok, 0)) return;
    const int i = base + lane;
    if (i < count) {
      const int u = first + i * stride;
      int32_t* meta = meta_entry(smem, i);
      const uint64_t src = reinterpret_cast<uint64_t>(d.peer_x[d.plan.unit_src[u]] + size_t(d.plan.unit_token[u]) * d.hidden);
      meta[0] = int32_t(uint32_t(src));
      meta[1] = int32_t(uint32_t(src >> 32));
      for (int j = 0; j < d.topk; ++j) meta[2 + j] = d.plan.unit_rows[size_t(u) * d.topk + j];
    }
    __syncwarp();
    __threadfence_block();
    if (lane == 0) meta_filled(smem) = min(base + 32, count);
  }
}

// The publisher warp: counts rows of completed units into their tiles, releases complete tiles.
__device__ inline void publish_rows(const DispatchArgs& d, int count, int32_t epoch, char* smem,
                                    const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  const int k = d.topk;
  int done = 0;
  while (done < count) {
    int avail = 0;
    if (lane == 0) {
      dev::wait_until_ge([&] { return pushed(smem); }, done + 1, team, WaitSite::bulk_copy, -2);
      avail = pushed(smem);
    }
    avail = __shfl_sync(0xffffffffu, avail, 0);
    if (avail <= done) return;  // the issuer stalled or the rank aborted: nothing more will come
    __threadfence_block();
    __threadfence();  // the rows (made visible by the issuer's proxy fence) before our counts
    for (int idx = lane; idx < (avail - done) * k; idx += 32) {
      const int u = *ring_word(smem, done + idx / k);
      const int row = d.plan.unit_rows[size_t(u) * k + idx % k];
      if (row < 0) continue;
      const int m = row / d.tile_m;
      const int landed = atomicAdd(&d.tile_arrived[m], 1) + 1;
      if (landed == d.plan.tile_remote_rows[m]) {
        d.tile_arrived[m] = 0;  // nobody else touches it before the next call
        __threadfence();        // every count (and so every row) before the release
        dev::st_release_gpu(&d.tile_ready[m], epoch);
      }
    }
    __syncwarp();
    done = avail;
    if (lane == 0) published(smem) = done;
  }
}

// Called by every thread of a comm block.
__device__ inline void run_dispatch_role(const DispatchArgs& d, int comm_index, int n_comm, int32_t epoch,
                                         char* smem, int smem_bytes, const TeamDeviceView& team) {
  using namespace dispatch;
  const int warp = threadIdx.x / 32;
  const int begin = d.unit_begin >= 0 ? d.unit_begin : *d.plan.num_local_units;
  const int end = d.unit_end >= 0 ? min(d.unit_end, *d.plan.num_units) : *d.plan.num_units;
  const int first = begin + comm_index;
  const int count = max(0, (end - first + n_comm - 1) / n_comm);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMaxStages; ++s) dev::mbarrier_init(reinterpret_cast<uint64_t*>(smem) + s, 1);
    pushed(smem) = 0;
    published(smem) = 0;
    meta_filled(smem) = 0;
    meta_consumed(smem) = 0;
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    if (threadIdx.x == 0) issue_pulls(d, first, n_comm, count, epoch, smem, smem_bytes, team);
  } else if (warp == 1) {
    publish_rows(d, count, epoch, smem, team);
  } else if (warp == 2) {
    prefetch_metadata(d, first, n_comm, count, smem, team);
  }
}

}  // namespace comet::kernels
