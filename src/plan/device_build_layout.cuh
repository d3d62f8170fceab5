// What the device builder's kernels share: the plan's sizes as plain ints (BuildGeometry), the
// builder's scratch arrays (BuildScratch) and the encoding of the first-error key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "comet/plan.hpp"

namespace comet::plan_dev {

// Tokens per block of the count and scatter kernels: one token per thread, 32 tokens per warp.
inline constexpr int kChunk = 256;
inline constexpr int kChunkWarps = kChunk / 32;
// validate(PlanConfig) caps the local experts, so per-expert tables fit one block's shared memory.
inline constexpr int kMaxLocalExperts = 1024;

struct BuildGeometry {
  int world = 0, rank = 0;
  int num_experts = 0, local_experts = 0, first_expert = 0;
  int topk = 0, tile_m = 0, wave_chunk = 1;
  WaveChunkRule chunk_rule;  // the order kernel's per-batch chunk (plan/wave_chunk_rule.hpp)
  PullOrder pull_order = PullOrder::source;
  int max_tokens = 0, max_rows = 0, max_units = 0, max_tiles = 0;
  int chunks = 0;       // kChunk-token chunks per source position: ceil(max_tokens / kChunk)
  int slot_stride = 0;  // words per source position in per-slot scratch (max_tokens * k rounded up to 4)

  __host__ __device__ int source_at(int position) const { return (rank + position) % world; }
  __host__ __device__ int position_of(int source) const { return (source - rank + world) % world; }
  __host__ __device__ RoutingBufferLayout routing_layout() const { return RoutingBufferLayout{max_tokens, topk}; }
};

inline BuildGeometry make_geometry(const PlanConfig& cfg) {
  BuildGeometry g;
  g.world = cfg.world();
  g.rank = cfg.rank;
  g.num_experts = cfg.shape.num_experts;
  g.local_experts = cfg.local_experts();
  g.first_expert = cfg.first_local_expert();
  g.topk = cfg.topk();
  g.tile_m = cfg.tile_m;
  g.wave_chunk = cfg.wave_chunk;
  g.chunk_rule = cfg.chunk_rule;
  g.pull_order = cfg.pull_order;
  g.max_tokens = cfg.cap.max_tokens_per_rank;
  g.max_rows = cfg.cap.max_rows;
  g.max_units = cfg.max_units();
  g.max_tiles = cfg.max_tiles();
  g.chunks = int((int64_t(g.max_tokens) + kChunk - 1) / kChunk);  // T_cap + 255 may pass INT_MAX
  g.slot_stride = (g.max_tokens * g.topk + 3) / 4 * 4;  // keeps every position's slice 16-byte aligned
  return g;
}

// Scratch of one build. "Position j" is source position j (source rank (rank + j) % W), "chunk c"
// its tokens [c * kChunk, (c + 1) * kChunk); block b = j * chunks + c of the count kernel owns it.
struct BuildScratch {
  unsigned long long* error_key = nullptr;  // [1] smallest error key (kNoError between builds)
  int32_t* position_tokens = nullptr;       // [W] tokens of each position, clamped to [0, T_cap]
  int32_t* chunk_rows = nullptr;            // [W * chunks * E_l] rows of (block b, expert e) at b * E_l + e;
                                            //   the scan turns them into the first row inside segment (e, j)
  int32_t* chunk_units = nullptr;           // [W * chunks] units of block b; the scan makes it b's first unit
  int32_t* token_unit = nullptr;            // [W * T_cap] the token's unit rank inside its chunk, -1 if none
  int32_t* slot_code = nullptr;             // [W * slot_stride] e * kChunk + rank inside (chunk, e), -1 if the
                                            //   slot's expert is elsewhere
  float* slot_gate = nullptr;               // [W * slot_stride] a device copy of the gates
  int32_t* tile_pulls = nullptr;            // [M] remote units whose first row is in the tile; the pull
                                            //   kernels' scan makes it the tile's first remote position
};

inline size_t carve_scratch(const BuildGeometry& g, char* base, BuildScratch* out) {
  const size_t W = size_t(g.world), C = size_t(g.chunks), El = size_t(g.local_experts);
  size_t offset = 0;
  auto take = [&](auto*& ptr, size_t count) {
    using T = std::remove_reference_t<decltype(*ptr)>;
    ptr = base ? reinterpret_cast<T*>(base + offset) : nullptr;
    offset = (offset + count * sizeof(T) + 255) / 256 * 256;
  };
  BuildScratch s;
  take(s.error_key, 1);  // first: the constructor sets it with one memset at offset 0
  take(s.position_tokens, W);
  take(s.chunk_rows, W * C * El);
  take(s.chunk_units, W * C);
  take(s.token_unit, W * size_t(g.max_tokens));
  take(s.slot_code, W * size_t(g.slot_stride));
  take(s.slot_gate, W * size_t(g.slot_stride));
  take(s.tile_pulls, size_t(g.max_tiles));
  if (out) *out = s;
  return offset;
}

// ---- first-error key ---------------------------------------------------------------------------
// Every thread that finds bad routing atomicMin's a key; the smallest key is the first error in
// plan.hpp's order, so the device names the same error as the host whatever the timing.
//   bits 62-63 stage (0: token count, 1: a slot) | 40-61 source rank | 8-38 token | 2-5 slot |
//   bits 0-1 kind (SlotError)
inline constexpr unsigned long long kNoError = ~0ull;
enum SlotError : int { kIdOutOfRange = 0, kIdDuplicate = 1, kGateNotFinite = 2 };

__host__ __device__ inline unsigned long long token_count_error_key(int source) {
  return (0ull << 62) | (static_cast<unsigned long long>(source) << 40);
}
__host__ __device__ inline unsigned long long slot_error_key(int source, int token, int slot, SlotError kind) {
  return (1ull << 62) | (static_cast<unsigned long long>(source) << 40) | (static_cast<unsigned long long>(token) << 8) |
         (static_cast<unsigned long long>(slot) << 2) | static_cast<unsigned long long>(kind);
}
__host__ __device__ inline int error_stage(unsigned long long key) { return int(key >> 62); }
__host__ __device__ inline int error_source(unsigned long long key) { return int((key >> 40) & 0x3FFFFF); }
__host__ __device__ inline int error_token(unsigned long long key) { return int((key >> 8) & 0x7FFFFFFF); }
__host__ __device__ inline int error_slot(unsigned long long key) { return int((key >> 2) & 0xF); }
__host__ __device__ inline SlotError error_kind(unsigned long long key) { return SlotError(key & 3); }

// Largest e in [0, n) with first[e] <= x, for non-decreasing first[] with first[0] <= x < first[n]:
// the expert (or expert's tile run) that contains row (tile) x, skipping empty ones.
__host__ __device__ inline int segment_of(const int32_t* first, int n, int x) {
  int lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= x) lo = mid;
    else hi = mid;
  }
  return lo;
}

}  // namespace comet::plan_dev
