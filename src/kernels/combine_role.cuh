// Layer 1's comm role: as soon as column block n of an expert's output rows is done, weight each row
// by its gate, sum the rows this rank holds for the same token (in k-slot order), and write the
// partial row slice into the token owner's receive slot for this rank. The owner later sums the slots
// in rank order (final_reduce), so the result is bitwise reproducible whatever n_comm or timing is.
//
// Work items are (column chunk of 256 columns, unit), chunk-major, so early columns ship first while
// the compute blocks make the next ones; a chunk covers 256 / TileN GEMM column blocks, whose done
// flags are all checked. Each comm warp takes batches of items (batch x k row slices of 512 bytes).
// The combine is latency-bound (register loads left a block far below its share of the link:
// docs/design-changes.md, Communication), so the slices travel with cp.async into a per-warp double buffer: batch t+1's
// loads are in flight while batch t is summed, and no registers are held by loads in flight. Every
// lane only ever touches its own 16 bytes of each slice, so the buffer needs no cross-lane ordering.
// Per item the warp does a few shuffles and one 16-byte store a lane; nothing in an item's path waits
// on memory (a batch's metadata is loaded one batch ahead, its destinations come with it), and only slots
// that have a row on this rank are copied (ncu on the H200 showed the combine instruction-bound).
#pragma once

#include <cuda_bf16.h>

#include "kernels/bf16x8.cuh"
#include "ptx/bulk_copy.cuh"
#include "ptx/cp_async.cuh"
#include "kernels/layer_args.hpp"
#include "kernels/transport.cuh"
#include "team/device_wait.cuh"

namespace comet::kernels {

// Shared memory of the combine: per warp, two buffers of up to kCombineSlices row slices of 512 bytes
// (as many as the kernel's shared memory holds for all warps of the block).
constexpr int kCombineSlices = 16;
constexpr int kCombineSliceBytes = 512;  // 256 columns of bf16: 32 lanes x 16 bytes

// Called by every thread of a comm block. wait_done = false skips the flag waits (comm-only timing).
// The launcher checks that smem_bytes holds at least k slices x 2 per warp. The transport
// (transport.cuh) ships each partial slice to its owner.
// Batches: warp w of the n_comm blocks' warps takes w, w + warps, ... (a fixed share), or, with
// take_shared (c.batch_counter), the next untaken one from the counter each time (blocks that arrive
// early take more). Which warp sums an item never changes its sum.
template <class Transport = PeerTransport>
__device__ inline void run_combine_role(const CombineArgs& c, int comm_index, int n_comm, Epoch epoch,
                                        bool wait_done, char* smem, int smem_bytes, const TeamDeviceView& team,
                                        Transport tr = {}, bool take_shared = false) {
  constexpr int kChunk = 256;  // columns per item
  const int k = c.topk;
  const int slices = min(kCombineSlices, smem_bytes / (int(blockDim.x / 32) * 2 * kCombineSliceBytes));
  // Items per batch. Every slot of a batch fits its buffer with slices / k items; where most slots have
  // no row here (EP: about k / ep of a unit's k are), that left most of the buffer empty and a warp
  // with a few hundred bytes in flight. Sparse slots take items for about 3/4 of the buffer on average,
  // up to 32 slot lanes; the rare batch with more valid slots than slices reads the rest from global
  // memory in `finish` (the same values, summed in the same order).
  int batch = max(1, min(8, slices / k));
  if (c.expected_slots > 0.f)
    batch = max(batch, min(32 / k, int(0.75f * float(slices) / c.expected_slots)));
  const int n_chunks = (c.hidden + kChunk - 1) / kChunk;
  const int lane = threadIdx.x % 32;
  const int warps_per_block = blockDim.x / 32;
  const int n_warps = n_comm * warps_per_block;
  const int warp_id = comm_index * warps_per_block + threadIdx.x / 32;
  const int unit0 = c.unit_begin >= 0 ? c.unit_begin : 0;
  const int units = (c.unit_end >= 0 ? min(c.unit_end, *c.plan.num_units) : *c.plan.num_units) - unit0;
  if (units <= 0) return;
  const long long items = (long long)units * n_chunks;
  const long long n_batches = (items + batch - 1) / batch;
  char* buffers = smem + (threadIdx.x / 32) * 2 * slices * kCombineSliceBytes;

  // Every lane holds one rank's receive buffer (ranks < 32), so that an item's destination is a
  // shuffle, not a dependent global load: loading it per item put one memory latency into every
  // item's store (ncu on the H200: the combine was bound by it).
  const auto* peer_recv = reinterpret_cast<const uint64_t*>(c.peer_recv);
  const uint64_t lane_peer = lane < c.world ? peer_recv[lane] : 0;

  // A batch's metadata as loaded from the plan: per (item b, slot j) pair p = b * k + j, lane p holds the
  // slice's row, gate and first column; lane b holds item b's owner, token and first column. It is
  // loaded one batch ahead of its copies (`fetch`), so that the loads' latency passes under the previous
  // batch's sums and stores rather than in front of every batch.
  struct Meta {
    int count = 0;
    int row = -1, col = 0;
    float gate = 0.f;
    int owner = 0, token = 0, chunk_col = 0;
  };
  // What a batch needs after its copies: lane b holds item b's destination (column 0 of its chunk), and
  // `valid` has bit p set where slot p has a row here: only those slices are copied and summed, packed
  // in slot order (with top-8 over many experts most slots have no row on this rank).
  struct Batch : Meta {
    unsigned valid = 0;
    __nv_bfloat16* dst = nullptr;
  };
  static_assert(kChunk == 256, "a slice is 32 lanes x 8 columns (transport.cuh: ship)");
  const bool narrow = items < (1ll << 31);  // 32-bit item arithmetic (the usual case)
  auto locate = [&](long long item, int& chunk, int& u) {
    if (narrow) {
      chunk = int(unsigned(item) / unsigned(units));
      u = unit0 + int(unsigned(item) - unsigned(chunk) * unsigned(units));
    } else {
      chunk = int(item / units);
      u = unit0 + int(item - (long long)chunk * units);
    }
  };
  auto fetch = [&](long long t) {
    Meta m;
    const long long first = t * batch;
    m.count = int(items - first < batch ? items - first : batch);
    if (lane < m.count * k) {  // one division per lane and batch, none per slice
      const int i = lane / k, j = lane - i * k;
      int chunk, u;
      locate(first + i, chunk, u);
      m.row = c.plan.unit_rows[size_t(u) * k + j];
      m.gate = c.unit_weights ? 1.f : c.plan.unit_gates[size_t(u) * k + j];
      m.col = chunk * kChunk;
    }
    if (lane < m.count) {
      int chunk, u;
      locate(first + lane, chunk, u);
      m.owner = c.plan.unit_src[u];
      m.token = c.plan.unit_token[u];
      m.chunk_col = chunk * kChunk;
    }
    return m;
  };
  // From a batch's metadata: its destinations, its tiles' waits, and its slice copies started into
  // buffer `buf`.
  auto issue = [&](const Meta& m, int buf) {
    Batch b;
    static_cast<Meta&>(b) = m;
    const int owner = m.owner;
    const uint64_t via_lane = __shfl_sync(0xffffffffu, lane_peer, owner & 31);
    if (lane < b.count) {
      const size_t offset =
          (owner == c.rank ? size_t(m.token) : size_t(c.rank) * c.max_tokens + m.token) * c.hidden + m.chunk_col;
      auto* base = owner == c.rank ? c.self_partial
                                   : reinterpret_cast<__nv_bfloat16*>(owner < 32 ? via_lane : peer_recv[owner]);
      b.dst = base + offset;
    }
    b.valid = __ballot_sync(0xffffffffu, b.row >= 0);
    if (wait_done) {  // lane p waits for the GEMM column blocks of its slice
      // The GEMM column blocks that hold columns [col, col + kChunk) (two for a 192-wide tile).
      const int n_last = b.row >= 0 ? min(c.n_blocks - 1, (b.col + kChunk - 1) / c.tile_n) : -1;
      for (int n = b.col / c.tile_n; n <= n_last; ++n) {
        const int flag = (b.row / c.tile_m) * c.n_blocks + n;
        dev::wait_flag_gpu(&c.tile_done[flag], epoch, team, WaitSite::tile_done, flag);
      }
      __syncwarp();  // the lanes' acquires cover the whole warp's copies below
    }
    char* dst = buffers + buf * slices * kCombineSliceBytes + lane * 16;
    int copied = 0;  // the first `slices` valid slices go to the buffer; any more, finish reads in place
    for (unsigned mask = b.valid; mask != 0 && copied < slices; mask &= mask - 1, dst += kCombineSliceBytes, ++copied) {
      const int p = __ffs(mask) - 1;
      const int row = __shfl_sync(0xffffffffu, b.row, p);
      const int col = __shfl_sync(0xffffffffu, b.col, p) + lane * 8;
      if (col < c.hidden) dev::cp_async_16(dst, c.y + size_t(row) * c.hidden + col);
    }
    dev::cp_async_commit();
    return b;
  };
  // Sums the batch's slices (fp32, slot order) and ships the partial rows.
  auto finish = [&](const Batch& b, int buf) {
    const char* src = buffers + buf * slices * kCombineSliceBytes + lane * 16;
    const unsigned slot_mask = (1u << k) - 1;  // k <= 16
    int s = 0;  // the slice's place among the batch's valid slices (warp-uniform)
    for (int i = 0; i < b.count; ++i) {
      const int chunk_col = __shfl_sync(0xffffffffu, b.col, i * k);
      const int col = chunk_col + lane * 8;
      auto* dst = reinterpret_cast<__nv_bfloat16*>(__shfl_sync(0xffffffffu, reinterpret_cast<uint64_t>(b.dst), i));
      const int owner = Transport::kShipsByRank ? __shfl_sync(0xffffffffu, b.owner, i) : -1;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (unsigned m = (b.valid >> (i * k)) & slot_mask; m != 0; m &= m - 1, src += kCombineSliceBytes, ++s) {
        const int p = i * k + __ffs(m) - 1;
        const float gate = __shfl_sync(0xffffffffu, b.gate, p);
        if (s < slices) {
          if (col < c.hidden) accumulate_bf16x8(acc, *reinterpret_cast<const uint4*>(src), gate);
        } else {  // past the buffer (a batch denser than expected): the slice in place
          const int row = __shfl_sync(0xffffffffu, b.row, p);
          if (col < c.hidden)
            accumulate_bf16x8(acc, *reinterpret_cast<const uint4*>(c.y + size_t(row) * c.hidden + col), gate);
        }
      }
      tr.ship(dst, owner, owner == c.rank, pack_bf16x8(acc), min(kChunk, c.hidden - chunk_col));
    }
  };

  // The warp's batches in the order it takes them: a fixed share, or runs of `run` consecutive batches
  // from the shared counter (one atomic per run: one per batch made the counter a hot spot, top-8 layers
  // up to 7 % slower on the H100; a run is at most 1/32 of a warp's fair share, so the last runs stay
  // small against the whole). A warp takes until it is given a batch past the end, then counts itself
  // done; the last warp done resets the counter for the next launch (every warp's takes are over then).
  int32_t* const counter = take_shared ? c.batch_counter : nullptr;
  const int run = counter ? int(max(1ll, min(8ll, n_batches / (32ll * n_warps)))) : 1;
  long long run_end = 0;  // the warp's current run is [.., run_end)
  auto take = [&](long long after) -> long long {
    if (!counter) return after < 0 ? warp_id : after + n_warps;
    if (after >= 0 && after + 1 < run_end) return after + 1;
    int got = 0;
    if (lane == 0) got = atomicAdd(counter, run);
    got = __shfl_sync(0xffffffffu, got, 0);
    run_end = (long long)got + run;
    return got;
  };
  auto done_taking = [&] {
    if (!counter || lane != 0) return;
    __threadfence();  // this warp's last take is ordered before its count
    if (atomicAdd(counter + 1, 1) == n_warps - 1) {
      atomicExch(counter, 0);
      atomicExch(counter + 1, 0);
    }
  };

  // Two batches in flight (double buffer), the metadata of a third loading.
  const long long t = take(-1);
  if (t >= n_batches) {
    done_taking();
    return;
  }
  tr.begin_combine(warp_id);
  Batch current = issue(fetch(t), 0);
  long long next = take(t);
  Meta ahead;
  if (next < n_batches) ahead = fetch(next);
  for (int buf = 0;; buf ^= 1) {
    Batch upcoming;
    long long after = n_batches;
    if (next < n_batches) {
      upcoming = issue(ahead, buf ^ 1);
      after = take(next);
      if (after < n_batches) ahead = fetch(after);
      dev::cp_async_wait<1>();  // the current batch's copies are done; the next one's stay in flight
    } else {
      dev::cp_async_wait<0>();
    }
    finish(current, buf);
    if (next >= n_batches) break;
    current = upcoming;
    next = after;
  }
  done_taking();
  tr.end_combine();
}

}  // namespace comet::kernels
