// Layer 0's comm role: pull remote token rows into the gathered buffer A, in the plan's pull order
// (plan.pull_unit: source by source, or expert by expert), and publish each M-tile's readiness.
//
// Comm block b of n_comm takes pull positions begin + b, begin + b + n_comm, ... so that all comm
// blocks advance through the pull order together (tiles become ready in tile_order). A block's units are
// dealt round-robin to up to kIssuers pipelines (unit i of the block goes to pipeline i % issuers).
// Warps, joined by shared-memory rings whose slots are handed over with mbarriers (arrive = release,
// wait = acquire; every thread that touches a slot waits and arrives itself):
//   prefetchers (2 warps, alternate slots)  load the units' metadata (source row address, destination
//       rows), 32 units a slot, so that no issuer waits on a global load.
//   issuer q (lane 0 of warp q)  moves its rows with Hopper bulk copies: the row crosses the link ONCE
//       (peer -> shared memory, stages - 1 loads in flight), then one shared -> global copy per
//       destination row (a token routed to several of this rank's experts has several rows). A stage
//       is reused as soon as its stores have read it (wait_group.read). The issuer writes each unit's
//       destination rows into its own publish ring as it issues them (a slot closes at 8 units or 24
//       rows) and hands a slot over once the stores of its last unit have completed (store_lag groups
//       later: wait_group).
//   publisher q (warp kIssuers + q)  counts a slot's rows into their tiles (one relaxed atomic per
//       distinct tile of the slot, lanes in parallel); the row that completes a tile resets its counter
//       and releases tile_ready[m] = epoch (generation counter, never cleared).
// Why several issuers: one issuing thread is bound by its own instruction latency (~200 dependent
// instructions a unit, ~0.6 us: ncu on the H200), not by the link, whatever the row size; four of them
// run on the SM's four schedulers (docs/design-changes.md, Communication, has the per-block rates).
#pragma once

#include <cuda_bf16.h>

#include "ptx/bulk_copy.cuh"
#include "kernels/layer_args.hpp"
#include "kernels/transport.cuh"
#include "team/device_wait.cuh"

namespace comet::kernels {

namespace dispatch {

constexpr int kIssuers = 4;          // bulk-copy pipelines per comm block (at most; fewer for long rows)
constexpr int kPrefetchers = 2;      // metadata warps, alternate slots
constexpr int kMaxStages = 64;       // row stages of all pipelines (loads in flight + stores reading)
constexpr int kMetaSlots = 4;        // metadata ring: 4 slots x 32 units, shared by the issuers
constexpr int kMetaSlotUnits = 32;
constexpr int kMetaRows = 3;              // metadata words before a unit's destination rows:
constexpr int kMetaWords = kMetaRows + kMaxTopK;  // source row address (2 words), source rank, rows
constexpr int kPubSlots = 12;        // publish ring of each issuer: 12 slots
constexpr int kPubSlotRows = 24;     // of up to 24 destination rows
constexpr int kPubSlotUnits = 8;     // or 8 units, whichever comes first (tiles wait for their slot)
constexpr int kPubSlotWords = 2 + kPubSlotRows;  // row count, last unit of the slot, rows
constexpr int kMaxStoreLag = 8;
// An issuer waits for a slot to come back before it fills it again, while it still holds the slots
// issued since: every slot holds >= 1 unit, so the slot kPubSlots back was handed over by then.
static_assert(kPubSlots - 1 > kMaxStoreLag);
static_assert(kMaxTopK <= kPubSlotRows);  // a unit's rows always fit in an empty slot
static_assert(kMetaSlotUnits % kIssuers == 0);
constexpr int kWarpsUsed = 2 * kIssuers + kPrefetchers;

// Shared memory layout (bytes).
constexpr int kLoadBars = 0;                          // kMaxStages mbarriers
constexpr int kMetaBars = kLoadBars + 8 * kMaxStages;  // full[kMetaSlots], empty[kMetaSlots]
constexpr int kPubBars = kMetaBars + 16 * kMetaSlots;  // per issuer: full[kPubSlots], empty[kPubSlots]
constexpr int kPubData = kPubBars + 16 * kPubSlots * kIssuers;  // per issuer: kPubSlots x kPubSlotWords
constexpr int kMetaData = (kPubData + kIssuers * kPubSlots * kPubSlotWords * 4 + 127) / 128 * 128;
constexpr int kRowsOffset = 16384;
static_assert(kMetaData + kMetaSlots * kMetaSlotUnits * kMetaWords * 4 <= kRowsOffset);

struct Smem {
  char* base;
  __device__ uint64_t* load_bar(int s) const { return reinterpret_cast<uint64_t*>(base + kLoadBars) + s; }
  __device__ uint64_t* meta_full(int s) const { return reinterpret_cast<uint64_t*>(base + kMetaBars) + s; }
  __device__ uint64_t* meta_empty(int s) const {
    return reinterpret_cast<uint64_t*>(base + kMetaBars) + kMetaSlots + s;
  }
  __device__ uint64_t* pub_full(int q, int s) const {
    return reinterpret_cast<uint64_t*>(base + kPubBars) + (2 * q) * kPubSlots + s;
  }
  __device__ uint64_t* pub_empty(int q, int s) const {
    return reinterpret_cast<uint64_t*>(base + kPubBars) + (2 * q + 1) * kPubSlots + s;
  }
  __device__ int32_t* pub_slot(int q, int s) const {
    return reinterpret_cast<int32_t*>(base + kPubData) + (q * kPubSlots + s) * kPubSlotWords;
  }
  // Metadata of unit i (its slot is i / kMetaSlotUnits).
  __device__ int32_t* meta(int i) const {
    return reinterpret_cast<int32_t*>(base + kMetaData) + (i % (kMetaSlots * kMetaSlotUnits)) * kMetaWords;
  }
  __device__ char* rows() const { return base + kRowsOffset; }
};

// Row stages in `smem_bytes` of shared memory, and how many pipelines share them (each needs >= 2).
__host__ __device__ constexpr int row_stages(int smem_bytes, int hidden) {
  const int s = (smem_bytes - kRowsOffset) / (hidden * 2);
  return s < kMaxStages ? s : kMaxStages;
}
// 1, 2 or 4 pipelines (a divisor of kMetaSlotUnits: each takes the same share of every metadata slot).
__host__ __device__ constexpr int issuers_for(int stages) { return stages >= 8 ? 4 : stages >= 4 ? 2 : 1; }
static_assert(issuers_for(kMaxStages) <= kIssuers);  // the role has warps for every pipeline

// What a stalled ring wait reports as its index (a unit's row wait reports the unit, >= 0): negative,
// decodable as -1 - (slot * 16 + pipeline * 4 + ring).
enum class Ring : int { meta_full = 0, meta_empty = 1, pub_empty = 2, pub_full = 3 };
__device__ inline int ring_wait_index(Ring ring, int pipeline, int slot) {
  return -1 - (slot * 16 + pipeline * 4 + int(ring));
}

// Bounded wait for an mbarrier phase; the index names the stalled unit or ring slot in the report.
__device__ inline bool wait_phase(uint64_t* bar, uint32_t phase, const TeamDeviceView& team, int index) {
  return dev::wait_until_ge([&] { return dev::mbarrier_try_wait(bar, phase) ? 1 : 0; }, 1, team,
                            WaitSite::bulk_copy, index);
}

// The source row address a prefetcher stored in a unit's metadata.
__device__ inline const __nv_bfloat16* source_row(const int32_t* meta) {
  return reinterpret_cast<const __nv_bfloat16*>(uint64_t(uint32_t(meta[0])) | (uint64_t(uint32_t(meta[1])) << 32));
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

// The work of one pipeline: units q, q + issuers, ... of the block's `count` (t-th: q + t * issuers).
struct Pipeline {
  int q;
  int issuers;
  int count;  // units of this pipeline
  __device__ static Pipeline of(int q, int issuers, int block_units) {
    return Pipeline{q, issuers, block_units > q ? (block_units - q + issuers - 1) / issuers : 0};
  }
};

}  // namespace dispatch

// Issuer q (one thread). Returns false if a wait stalled (reported in the status word).
__device__ inline bool issue_pulls(const DispatchArgs& d, int first, int stride, const dispatch::Pipeline pipe,
                                   int stages, const dispatch::Smem& sm, const TeamDeviceView& team) {
  using namespace dispatch;
  const int q = pipe.q, step = pipe.issuers, count = pipe.count;
  const uint32_t row_bytes = uint32_t(d.hidden) * sizeof(__nv_bfloat16);
  const int lag = d.store_lag;  // 1, 2, 4 or 8
  uint64_t* const bars = sm.load_bar(q * stages);
  char* const stage_rows = sm.rows() + size_t(q) * stages * row_bytes;

  int meta_held = 0;  // metadata slots [0, meta_held) have been waited for
  auto meta_ready = [&](int i) {
    for (; meta_held <= i / kMetaSlotUnits; ++meta_held)
      if (!wait_phase(sm.meta_full(meta_held % kMetaSlots), (meta_held / kMetaSlots) & 1, team,
                      ring_wait_index(Ring::meta_full, q, meta_held)))
        return false;
    return true;
  };
  // Loads are issued in order into stages 0, 1, ..., stages - 1, 0, ...
  int load_t = 0, load_s = 0, load_i = q;
  auto pull = [&] {
    if (!meta_ready(load_i)) return false;
    const __nv_bfloat16* src = source_row(sm.meta(load_i));
    dev::mbarrier_arrive_expect_tx(bars + load_s, row_bytes);
    dev::bulk_load(stage_rows + size_t(load_s) * row_bytes, src, row_bytes, bars + load_s);
    ++load_t;
    load_i += step;
    if (++load_s == stages) load_s = 0;
    return true;
  };

  // The publish ring, filled at issue time: slot `fill` takes the destination rows of the units being
  // issued; slots [handed, fill) are closed and wait for their last unit's stores.
  int fill = 0, fill_rows = 0, fill_units = 0, handed = 0;
  auto open_fill = [&] {  // the slot's previous round must have been counted by the publisher
    return fill < kPubSlots ||
           wait_phase(sm.pub_empty(q, fill % kPubSlots), ((fill / kPubSlots) - 1) & 1, team,
                      ring_wait_index(Ring::pub_empty, q, fill));
  };
  auto close_fill = [&](int last_t) {
    int32_t* data = sm.pub_slot(q, fill % kPubSlots);
    data[0] = fill_rows;
    data[1] = last_t;
    ++fill;
    fill_rows = fill_units = 0;
  };
  // Units t <= done are fully written: hand over the closed slots they complete.
  auto hand_over = [&](int done) {
    for (; handed < fill && sm.pub_slot(q, handed % kPubSlots)[1] <= done; ++handed) {
      dev::fence_proxy_async_global();  // rows written by the bulk-copy proxy, counted by the generic one
      dev::mbarrier_arrive(sm.pub_full(q, handed % kPubSlots));
    }
  };

  while (load_t < min(stages - 1, count))
    if (!pull()) return false;
  int s = 0;
  uint32_t phase = 0;
  for (int t = 0, i = q; t < count; ++t, i += step) {
    if (!wait_phase(bars + s, phase, team, first + i * stride)) return false;
    const int32_t* meta = sm.meta(i);
    if (fill_units == kPubSlotUnits || fill_rows + d.topk > kPubSlotRows) close_fill(t - 1);
    if (fill_units == 0 && !open_fill()) return false;
    int32_t* slot_rows = sm.pub_slot(q, fill % kPubSlots) + 2;
    for (int j = 0; j < d.topk; ++j) {
      const int row = meta[kMetaRows + j];
      if (row < 0) continue;
      dev::bulk_store(d.a + size_t(row) * d.hidden, stage_rows + size_t(s) * row_bytes, row_bytes);
      slot_rows[fill_rows++] = row;
    }
    ++fill_units;
    dev::bulk_commit_group();
    // This pipeline's last unit of the metadata slot: the slot may be refilled once every issuer is past it.
    if (i % kMetaSlotUnits >= kMetaSlotUnits - step) dev::mbarrier_arrive(sm.meta_empty((i / kMetaSlotUnits) % kMetaSlots));
    dev::bulk_wait_group_read<1>();  // unit t - 1's stores have read its stage: the next load may reuse it
    if (load_t < count && !pull()) return false;
    wait_stores(lag);  // units <= t - lag are fully written
    hand_over(t - lag);
    if (++s == stages) {
      s = 0;
      phase ^= 1;
    }
  }
  dev::bulk_wait_group<0>();
  if (count > 0) {  // the last slot ends at the last unit: that is how the publisher knows it is the last
    if (fill_units == 0 && !open_fill()) return false;
    close_fill(count - 1);
    hand_over(count - 1);
  }
  return true;
}

// Issuer q as a whole warp, for transports whose remote reads are calls (Transport::kWarpPulls; e.g.
// NVSHMEM gets across nodes): per publish slot, the warp starts one get per unit into the unit's first
// destination row, completes them all (one quiet), copies each row to the unit's other destination
// rows, then hands the slot to publisher q. Same rings, same publish slots (<= 8 units, <= 24 rows,
// the last slot ending at the pipeline's last unit) and the same tile counting as issue_pulls; a
// metadata slot is released once the publish slot that read its last unit of this pipeline is done.
template <class Transport>
__device__ inline bool issue_gets(const DispatchArgs& d, int first, int stride, const dispatch::Pipeline pipe,
                                  const dispatch::Smem& sm, const TeamDeviceView& team, Transport& tr) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  const int q = pipe.q, step = pipe.issuers, count = pipe.count;
  const uint32_t row_bytes = uint32_t(d.hidden) * sizeof(__nv_bfloat16);
  const int vectors = d.hidden / 8;  // 16-byte vectors of a row

  int meta_held = 0;
  auto meta_ready = [&](int i) {  // every lane waits: each reads the slot itself
    for (; meta_held <= i / kMetaSlotUnits; ++meta_held) {
      const bool ok = wait_phase(sm.meta_full(meta_held % kMetaSlots), (meta_held / kMetaSlots) & 1, team,
                                 ring_wait_index(Ring::meta_full, q, meta_held));
      if (!__all_sync(0xffffffffu, ok)) return false;
    }
    return true;
  };

  for (int slot = 0, t0 = 0; t0 < count; ++slot) {
    const bool open = slot < kPubSlots || wait_phase(sm.pub_empty(q, slot % kPubSlots), ((slot / kPubSlots) - 1) & 1,
                                                     team, ring_wait_index(Ring::pub_empty, q, slot));
    if (!__all_sync(0xffffffffu, open)) return false;
    int32_t* data = sm.pub_slot(q, slot % kPubSlots);
    // Units [t0, t1) of this pipeline: gets into each unit's first destination row.
    int t1 = t0, rows = 0;
    for (; t1 < count && t1 - t0 < kPubSlotUnits; ++t1) {
      const int i = q + t1 * step;
      if (!meta_ready(i)) return false;
      const int32_t* meta = sm.meta(i);
      int n = 0, first_row = -1;
      for (int j = 0; j < d.topk; ++j) {
        const int row = meta[kMetaRows + j];
        if (row < 0) continue;
        if (first_row < 0) first_row = row;
        ++n;
      }
      if (rows + n > kPubSlotRows) break;  // the unit opens the next slot
      tr.get_row(d.a + size_t(first_row) * d.hidden, source_row(meta), row_bytes, meta[2]);
      if (lane == 0)
        for (int j = 0; j < d.topk; ++j)
          if (meta[kMetaRows + j] >= 0) data[2 + rows++] = meta[kMetaRows + j];
      rows = __shfl_sync(0xffffffffu, rows, 0);
    }
    tr.complete_gets();
    // A token routed to several of this rank's experts: its other rows are copies of the first.
    for (int t = t0; t < t1; ++t) {
      const int32_t* meta = sm.meta(q + t * step);
      int first_row = -1;
      for (int j = 0; j < d.topk; ++j) {
        const int row = meta[kMetaRows + j];
        if (row < 0) continue;
        if (first_row < 0) {
          first_row = row;
          continue;
        }
        const uint4* from = reinterpret_cast<const uint4*>(d.a + size_t(first_row) * d.hidden);
        uint4* to = reinterpret_cast<uint4*>(d.a + size_t(row) * d.hidden);
        for (int v = lane; v < vectors; v += 32) to[v] = from[v];
      }
    }
    __threadfence();  // every lane's rows before the hand-over (the publisher's counts release them)
    __syncwarp();
    // This pipeline's last unit of a metadata slot: the prefetchers may refill the slot.
    for (int t = t0; t < t1; ++t) {
      const int i = q + t * step;
      if (lane == 0 && i % kMetaSlotUnits >= kMetaSlotUnits - step)
        dev::mbarrier_arrive(sm.meta_empty((i / kMetaSlotUnits) % kMetaSlots));
    }
    if (lane == 0) {
      data[0] = rows;
      data[1] = t1 - 1;
      dev::mbarrier_arrive(sm.pub_full(q, slot % kPubSlots));
    }
    __syncwarp();
    t0 = t1;
  }
  return true;
}

// A prefetcher warp: metadata of the slots p, p + kPrefetchers, ... (32 units each), ahead of the issuers.
__device__ inline void prefetch_metadata(const DispatchArgs& d, int first, int stride, int count, int p,
                                         const dispatch::Smem& sm, const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  for (int slot = p; slot * kMetaSlotUnits < count; slot += kPrefetchers) {
    const int s = slot % kMetaSlots;
    // Every lane waits and arrives itself: each lane's own accesses are ordered by the barrier.
    bool ok = slot < kMetaSlots || wait_phase(sm.meta_empty(s), ((slot / kMetaSlots) - 1) & 1, team,
                                              ring_wait_index(Ring::meta_empty, p, slot));
    if (!__all_sync(0xffffffffu, ok)) return;
    const int i = slot * kMetaSlotUnits + lane;
    if (i < count) {
      const int position = first + i * stride;
      const int u = d.unit_begin >= 0 ? position : d.plan.pull_unit[position];
      int32_t* meta = sm.meta(i);
      const uint64_t src =
          reinterpret_cast<uint64_t>(d.peer_x[d.plan.unit_src[u]] + size_t(d.plan.unit_token[u]) * d.hidden);
      meta[0] = int32_t(uint32_t(src));
      meta[1] = int32_t(uint32_t(src >> 32));
      meta[2] = d.plan.unit_src[u];
      for (int j = 0; j < d.topk; ++j) meta[kMetaRows + j] = d.plan.unit_rows[size_t(u) * d.topk + j];
    }
    dev::mbarrier_arrive(sm.meta_full(s));  // 32 arrivals complete the phase
  }
}

// Publisher q: counts the rows of each slot issuer q hands over into their tiles, releases complete tiles.
__device__ inline void publish_rows(const DispatchArgs& d, const dispatch::Pipeline pipe, Epoch epoch,
                                    const dispatch::Smem& sm, const TeamDeviceView& team) {
  using namespace dispatch;
  const int lane = threadIdx.x % 32;
  for (int slot = 0; pipe.count > 0; ++slot) {
    const int s = slot % kPubSlots;
    const bool ok = wait_phase(sm.pub_full(pipe.q, s), (slot / kPubSlots) & 1, team,
                               ring_wait_index(Ring::pub_full, pipe.q, slot));  // every lane
    if (!__all_sync(0xffffffffu, ok)) return;  // the issuer stalled or the rank aborted
    const int32_t* data = sm.pub_slot(pipe.q, s);
    const int n = data[0];
    const bool last = data[1] == pipe.count - 1;
    // The rows (visible to the generic proxy since the issuer's fence, observed through the mbarrier)
    // before our counts: with the relaxed atomics below, a release at GPU scope.
    dev::fence_acq_rel_gpu();
    for (int base = 0; base < n; base += 32) {
      const int idx = base + lane;
      const int m = idx < n ? data[2 + idx] / d.tile_m : -1 - lane;  // distinct keys for idle lanes
      const unsigned same = __match_any_sync(0xffffffffu, m);
      if (idx < n && lane == __ffs(same) - 1) {  // one atomic per distinct tile of these 32 rows
        const int add = __popc(same);
        const int need = d.plan.tile_remote_rows[m];
        const int landed = atomicAdd(&d.tile_arrived[m], add) + add;
        if (landed == need) {
          d.tile_arrived[m] = 0;    // nobody else touches it before the next call
          dev::fence_acq_rel_gpu();  // acquires every block's counts (and so their rows) before the release
          dev::st_release_gpu(&d.tile_ready[m], epoch);
          d.trace.ready(m);
        }
      }
    }
    dev::mbarrier_arrive(sm.pub_empty(pipe.q, s));  // 32 arrivals complete the phase
    if (last) return;
  }
}

// Called by every thread of a comm block (at least kWarpsUsed warps). The transport (transport.cuh)
// decides how the issuers reach a peer's rows.
template <class Transport = PeerTransport>
__device__ inline void run_dispatch_role(const DispatchArgs& d, int comm_index, int n_comm, Epoch epoch,
                                         char* smem, int smem_bytes, const TeamDeviceView& team,
                                         Transport tr = {}) {
  using namespace dispatch;
  const Smem sm{smem};
  const int warp = threadIdx.x / 32;
  // Never the local units (scatter_local copies them): their rows are not in tile_remote_rows, and
  // counting them would release tiles early.
  const int begin = max(d.unit_begin, *d.plan.num_local_units);
  const int end = d.unit_end >= 0 ? min(d.unit_end, *d.plan.num_units) : *d.plan.num_units;
  const int first = begin + comm_index;
  const int count = max(0, (end - first + n_comm - 1) / n_comm);
  // Warp issuers stage nothing in shared memory: all kIssuers pipelines run, one (unused) stage each.
  // Bulk-copy issuers: >= 1 pipeline, as the launcher checks all_stages >= 2.
  const int all_stages = Transport::kWarpPulls ? kIssuers : row_stages(smem_bytes, d.hidden);
  const int issuers = Transport::kWarpPulls ? kIssuers : issuers_for(all_stages);
  const int stages = all_stages / issuers;
  if (threadIdx.x == 0) {
    for (int s = 0; s < issuers * stages; ++s) dev::mbarrier_init(sm.load_bar(s), 1);
    for (int s = 0; s < kMetaSlots; ++s) {
      dev::mbarrier_init(sm.meta_full(s), 32);       // a prefetcher's lanes
      dev::mbarrier_init(sm.meta_empty(s), issuers);  // each issuer, past its last unit of the slot
    }
    for (int q = 0; q < issuers; ++q) {
      for (int s = 0; s < kPubSlots; ++s) {
        dev::mbarrier_init(sm.pub_full(q, s), 1);    // the issuer
        dev::mbarrier_init(sm.pub_empty(q, s), 32);  // the publisher's lanes
      }
    }
    dev::fence_mbarrier_init();
  }
  __syncthreads();
  if (warp < kIssuers) {
    if constexpr (Transport::kWarpPulls) {
      if (warp < issuers) issue_gets(d, first, n_comm, Pipeline::of(warp, issuers, count), sm, team, tr);
    } else if (warp < issuers && threadIdx.x % 32 == 0) {
      issue_pulls(d, first, n_comm, Pipeline::of(warp, issuers, count), stages, sm, team);
    }
  } else if (warp < 2 * kIssuers) {
    if (warp - kIssuers < issuers) publish_rows(d, Pipeline::of(warp - kIssuers, issuers, count), epoch, sm, team);
  } else if (warp < kWarpsUsed) {
    prefetch_metadata(d, first, n_comm, count, warp - 2 * kIssuers, sm, team);
  }
  if (threadIdx.x % 32 == 0) d.trace.block_end();
}

}  // namespace comet::kernels
