// Layer 0's comm role: pull remote token rows into the gathered buffer A, in the plan's pull order,
// and publish each M-tile's readiness.
//
// Comm block b of n_comm takes units begin + b, begin + b + n_comm, ... so that all comm blocks
// advance through the pull order together (tiles become ready in tile_order). Three warps, joined by
// shared-memory rings whose slots are handed over with mbarriers (arrive = release, wait = acquire;
// every thread that touches a slot waits and arrives itself, so each access is ordered by a barrier):
//   prefetcher (warp 2)  loads the units' metadata (source row address, destination rows), 32 units
//       a slot, so the issuer never waits on a global load.
//   issuer (warp 0, one thread)  moves rows with Hopper bulk copies: the row crosses the link ONCE
//       (peer -> shared memory, `lookahead` rows in flight), then one shared -> global copy per
//       destination row (a token routed to several of this rank's experts has several rows). Units
//       whose stores have completed go to the publisher, 8 a slot.
//   publisher (warp 1)  counts completed units' rows into their tiles (tile_arrived, relaxed atomics,
//       lanes in parallel); the row that completes a tile resets its counter and releases
//       tile_ready[m] = epoch (generation counter, never cleared).
// Keeping loads, atomics and fences off the issuing thread keeps the link busy: it is latency-bound
// (docs/design-changes.md, Communication, has the per-block rates).
#pragma once

#include <cuda_bf16.h>

#include "ptx/bulk_copy.cuh"
#include "kernels/layer_args.hpp"
#include "team/device_wait.cuh"

namespace comet::kernels {

namespace dispatch {

constexpr int kMaxStages = 32;       // row stages (bulk loads in flight + stores not yet complete)
constexpr int kMetaSlots = 4;        // metadata ring: 4 slots x 32 units
constexpr int kMetaSlotUnits = 32;
constexpr int kMetaWords = 2 + kMaxTopK;  // source row address (2 words), destination rows
constexpr int kPubSlots = 64;        // publish ring: 64 slots x 8 units
constexpr int kPubSlotUnits = 8;

// Shared memory layout (bytes).
constexpr int kLoadBars = 0;                          // kMaxStages mbarriers
constexpr int kMetaBars = kLoadBars + 8 * kMaxStages;  // full[kMetaSlots], empty[kMetaSlots]
constexpr int kPubBars = kMetaBars + 16 * kMetaSlots;  // full[kPubSlots], empty[kPubSlots]
constexpr int kPubData = kPubBars + 16 * kPubSlots;    // per slot: count, unit ids
constexpr int kMetaData = 4096;
constexpr int kRowsOffset = 16384;
static_assert(kPubData + kPubSlots * (1 + kPubSlotUnits) * 4 <= kMetaData);
static_assert(kMetaData + kMetaSlots * kMetaSlotUnits * kMetaWords * 4 <= kRowsOffset);

struct Smem {
  char* base;
  __device__ uint64_t* load_bar(int s) const { return reinterpret_cast<uint64_t*>(base + kLoadBars) + s; }
  __device__ uint64_t* meta_full(int s) const { return reinterpret_cast<uint64_t*>(base + kMetaBars) + s; }
  __device__ uint64_t* meta_empty(int s) const {
    return reinterpret_cast<uint64_t*>(base + kMetaBars) + kMetaSlots + s;
  }
  __device__ uint64_t* pub_full(int s) const { return reinterpret_cast<uint64_t*>(base + kPubBars) + s; }
  __device__ uint64_t* pub_empty(int s) const { return reinterpret_cast<uint64_t*>(base + kPubBars) + kPubSlots + s; }
  __device__ int32_t* pub_slot(int s) const { return reinterpret_cast<int32_t*>(base + kPubData) + s * (1 + kPubSlotUnits); }
  // Metadata of unit i (its slot is i / kMetaSlotUnits).
  __device__ int32_t* meta(int i) const {
    return reinterpret_cast<int32_t*>(base + kMetaData) + (i % (kMetaSlots * kMetaSlotUnits)) * kMetaWords;
  }
  __device__ char* rows() const { return base + kRowsOffset; }
};

// Bounded wait for an mbarrier phase; the index names the stalled unit or slot in the report.
__device__ inline bool wait_phase(uint64_t* bar, uint32_t phase, const TeamDeviceView& team, int index) {
  return dev::wait_until_ge([&] { return dev::mbarrier_try_wait(bar, phase) ? 1 : 0; }, 1, team,
                            WaitSite::bulk_copy, index);
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

// The issuing thread. Returns false if a wait stalled (reported in the status word).
__device__ inline bool issue_pulls(const DispatchArgs& d, int first, int stride, int count, int smem_bytes,
                                   const dispatch::Smem& sm, const TeamDeviceView& team) {
  using namespace dispatch;
  const uint32_t row_bytes = uint32_t(d.hidden) * sizeof(__nv_bfloat16);
  const int stages = min(kMaxStages, int((smem_bytes - kRowsOffset) / row_bytes));
  const int lag = d.store_lag;  // 1, 2, 4 or 8 (the launcher checks stages > lag)
  const int lookahead = stages - lag;
  auto unit_at = [&](int i) { return first + i * stride; };

  int meta_slots_held = 0;  // metadata slots [0, meta_slots_held) have been waited for
  auto meta_ready = [&](int i) {
    for (; meta_slots_held <= i / kMetaSlotUnits; ++meta_slots_held) {
      const int slot = meta_slots_held;
      if (!wait_phase(sm.meta_full(slot % kMetaSlots), (slot / kMetaSlots) & 1, team, -1 - slot)) return false;
    }
    return true;
  };
  auto pull = [&](int i) {
    const int s = i % stages;
    const int32_t* meta = sm.meta(i);
    const auto* src = reinterpret_cast<const __nv_bfloat16*>(uint64_t(uint32_t(meta[0])) |
                                                             (uint64_t(uint32_t(meta[1])) << 32));
    dev::mbarrier_arrive_expect_tx(sm.load_bar(s), row_bytes);
    dev::bulk_load(sm.rows() + size_t(s) * row_bytes, src, row_bytes, sm.load_bar(s));
  };
  // Unit i's stores are complete: into the publish ring (a slot goes over when full or at the end).
  auto hand_over = [&](int i) {
    const int slot = i / kPubSlotUnits, s = slot % kPubSlots;
    if (i % kPubSlotUnits == 0 && slot >= kPubSlots) {
      if (!wait_phase(sm.pub_empty(s), ((slot / kPubSlots) - 1) & 1, team, -1000 - slot)) return false;
    }
    int32_t* data = sm.pub_slot(s);
    data[1 + i % kPubSlotUnits] = unit_at(i);
    if (i % kPubSlotUnits == kPubSlotUnits - 1 || i == count - 1) {
      data[0] = i % kPubSlotUnits + 1;
      dev::fence_proxy_async_global();  // rows written by the bulk-copy proxy, counted by the generic one
      dev::mbarrier_arrive(sm.pub_full(s));
    }
    return true;
  };

  for (int i = 0; i < min(lookahead, count); ++i) {
    if (!meta_ready(i)) return false;
    pull(i);
  }
  for (int i = 0; i < count; ++i) {
    const int s = i % stages;
    if (!wait_phase(sm.load_bar(s), (i / stages) & 1, team, unit_at(i))) return false;
    const int32_t* meta = sm.meta(i);
    for (int j = 0; j < d.topk; ++j) {
      const int row = meta[2 + j];
      if (row >= 0) dev::bulk_store(d.a + size_t(row) * d.hidden, sm.rows() + size_t(s) * row_bytes, row_bytes);
    }
    dev::bulk_commit_group();
    wait_stores(lag);  // units <= i - lag are fully written
    if (i >= lag && !hand_over(i - lag)) return false;
    if (i + lookahead < count) {  // reuses the stage of unit i - lag
      if (!meta_ready(i + lookahead)) return false;
      pull(i + lookahead);
    }
    if (i % kMetaSlotUnits == kMetaSlotUnits - 1) dev::mbarrier_arrive(sm.meta_empty((i / kMetaSlotUnits) % kMetaSlots));
  }
  dev::bulk_wait_group<0>();
  for (int i = max(0, count - lag); i < count; ++i)
    if (!hand_over(i)) return false;
  return true;
}

// The prefetcher warp: metadata of units [0, count), a slot of 32 units at a time, ahead of the issuer.
__device__ inline void prefetch_metadata(const DispatchArgs& d, int first, int stride, int count,
                                         const dispatch::Smem& sm, const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  for (int slot = 0; slot * kMetaSlotUnits < count; ++slot) {
    const int s = slot % kMetaSlots;
    // Every lane waits and arrives itself: each lane's own accesses are ordered by the barrier.
    bool ok = slot < kMetaSlots || wait_phase(sm.meta_empty(s), ((slot / kMetaSlots) - 1) & 1, team, -100 - slot);
    if (!__all_sync(0xffffffffu, ok)) return;
    const int i = slot * kMetaSlotUnits + lane;
    if (i < count) {
      const int u = first + i * stride;
      int32_t* meta = sm.meta(i);
      const uint64_t src =
          reinterpret_cast<uint64_t>(d.peer_x[d.plan.unit_src[u]] + size_t(d.plan.unit_token[u]) * d.hidden);
      meta[0] = int32_t(uint32_t(src));
      meta[1] = int32_t(uint32_t(src >> 32));
      for (int j = 0; j < d.topk; ++j) meta[2 + j] = d.plan.unit_rows[size_t(u) * d.topk + j];
    }
    dev::mbarrier_arrive(sm.meta_full(s));  // 32 arrivals complete the phase
  }
}

// The publisher warp: counts rows of completed units into their tiles, releases complete tiles.
__device__ inline void publish_rows(const DispatchArgs& d, int count, Epoch epoch, const dispatch::Smem& sm,
                                    const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  const int k = d.topk;
  for (int slot = 0; slot * kPubSlotUnits < count; ++slot) {
    const int s = slot % kPubSlots;
    const bool ok = wait_phase(sm.pub_full(s), (slot / kPubSlots) & 1, team, -2000 - slot);  // every lane
    if (!__all_sync(0xffffffffu, ok)) return;  // the issuer stalled or the rank aborted
    const int32_t* data = sm.pub_slot(s);
    const int n = data[0];
    __threadfence();  // the rows (visible to the generic proxy since the issuer's fence) before our counts
    for (int idx = lane; idx < n * k; idx += 32) {
      const int u = data[1 + idx / k];
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
    dev::mbarrier_arrive(sm.pub_empty(s));  // 32 arrivals complete the phase
  }
}

// Called by every thread of a comm block.
__device__ inline void run_dispatch_role(const DispatchArgs& d, int comm_index, int n_comm, Epoch epoch,
                                         char* smem, int smem_bytes, const TeamDeviceView& team) {
  using namespace dispatch;
  const Smem sm{smem};
  const int warp = threadIdx.x / 32;
  // Never the local units (scatter_local copies them): their rows are not in tile_remote_rows, and
  // counting them would release tiles early.
  const int begin = max(d.unit_begin, *d.plan.num_local_units);
  const int end = d.unit_end >= 0 ? min(d.unit_end, *d.plan.num_units) : *d.plan.num_units;
  const int first = begin + comm_index;
  const int count = max(0, (end - first + n_comm - 1) / n_comm);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kMaxStages; ++s) dev::mbarrier_init(sm.load_bar(s), 1);
    for (int s = 0; s < kMetaSlots; ++s) {
      dev::mbarrier_init(sm.meta_full(s), 32);  // the prefetcher's lanes
      dev::mbarrier_init(sm.meta_empty(s), 1);  // the issuer
    }
    for (int s = 0; s < kPubSlots; ++s) {
      dev::mbarrier_init(sm.pub_full(s), 1);    // the issuer
      dev::mbarrier_init(sm.pub_empty(s), 32);  // the publisher's lanes
    }
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  if (warp == 0) {
    if (threadIdx.x == 0) issue_pulls(d, first, n_comm, count, smem_bytes, sm, team);
  } else if (warp == 1) {
    publish_rows(d, count, epoch, sm, team);
  } else if (warp == 2) {
    prefetch_metadata(d, first, n_comm, count, sm, team);
  }
}

}  // namespace comet::kernels
