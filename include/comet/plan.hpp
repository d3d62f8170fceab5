// Routing plan: from every rank's top-k expert ids to the layout of one rank's gathered ("shared")
// buffer, the pull list of layer 0, the combine list of layer 1 and the tile schedule.
//
// Definitions (rank r, W ranks, E_l local experts, tile size tile_m):
//  * Source position j = 0..W-1 names source rank s = (r + j) % W. Position 0 is r itself (local).
//  * Unit: one (source rank s, token t) pair whose top-k has at least one expert held by r.
//    Units are numbered in pull order: by source position j, then by token t ascending.
//    Units with j == 0 are the local units: [0, num_local_units). The others are pulled over the link.
//    A unit crosses the link once, however many of r's experts the token chose.
//  * Rows: the gathered buffer holds one row per (unit, slot) whose expert is on r. Expert segment e
//    starts at expert_offset[e] (a multiple of tile_m); inside it the rows of source position j come
//    before those of position j+1, and rows of one (e, j) come in increasing token order. Each
//    segment is padded with unused rows (row_unit == -1) to a multiple of tile_m, so every M-tile
//    belongs to exactly one expert.
//  * M-tile m covers rows [m*tile_m, (m+1)*tile_m). tile_key[m] is -1 when all of its rows are local,
//    otherwise the largest unit index among its remote rows (the tile is complete once the pull
//    reaches that unit). The tile's wave is 0 when all of its rows are local, else the source
//    position of unit tile_key (the last source it waits for). tile_order lists the M-tiles sorted by
//    (order wave, m): local tiles first, then wave by wave in arrival order, and inside a wave expert by
//    expert, so that tiles computed together share their expert's weights in L2 (sorting by the
//    exact key interleaves the experts and thrashes L2: docs/design-changes.md, Schedules).
//    A tile's order wave: 0 when all of its rows are local; else the wave of the last tile of its
//    chunk, where an expert's M-tiles are cut into chunks of wave_chunk consecutive tiles from its
//    first tile. With wave_chunk 1 that is the tile's own wave; with more, a wave holds each expert's
//    tiles in runs of wave_chunk (or the expert's last few), so that a pass over an expert's weights
//    serves at least that many tiles (docs/design-changes.md, "Layer 0's tile order under skew").
//  * Pull position p: the comm blocks' p-th pull is unit pull_unit[p]. Positions [0, num_local_units)
//    are the local units (never pulled: scatter_local copies them). The remote positions follow the
//    config's pull_order:
//      source  unit order (pull_unit[p] = p): source by source, so each expert's tiles complete over
//              all W - 1 waves;
//      expert  the remote units sorted by their first row (the row of their smallest local expert):
//              expert by expert, so that an expert's tiles complete together, in m order. Every tile
//              with remote rows then has order wave 1 (all-local tiles 0): tile_order is the
//              all-local tiles in m order, then the others in m order (chunks as above).
//    Units keep their numbering either way (unit_begin/unit_end ranges, tile_key, layer 1).
//  * Indexing: segment arrays are [e * W + j] (expert-major); tile_expert holds the LOCAL expert index
//    (0..E_l-1, global id = first_local_expert() + e), like every other per-expert array here.
//  * Every array is filled up to its capacity: entries past the used counts (units >= num_units,
//    rows that are padding or past expert_offset[E_l], tiles >= num_tiles) hold -1 in int arrays and
//    0 in unit_gates, so two plans compare bitwise as whole arrays.
//
// The host builder and the device builder produce bitwise identical plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comet/hd.hpp"
#include "comet/shape.hpp"

namespace comet {

struct PlanCapacity {
  int max_tokens_per_rank = 0;  // T_cap: most tokens any rank may own in one call
  int max_rows = 0;             // rows of the gathered buffer, padding included (a multiple of tile_m)
};

// A per-batch wave chunk: the rank's load class (its rows against expected_rows, rounded to 1, 2, 4 or 8:
// load_class in src/tune/cost_model_eval.hpp) picks by_load[0..3] where that is > 0, else the config's
// wave_chunk stands. expected_rows 0: no rule. The tuner's table fills it (LaunchPlanner::wave_chunk_rule)
// with the chunk measured beside the n_comm that the fused kernel re-picks for the same class.
struct WaveChunkRule {
  double expected_rows = 0;
  int by_load[4] = {};  // classes 1, 2, 4, 8 (kLoadClasses, comet/tune.hpp)
  bool operator==(const WaveChunkRule& o) const {
    return expected_rows == o.expected_rows && by_load[0] == o.by_load[0] && by_load[1] == o.by_load[1] &&
           by_load[2] == o.by_load[2] && by_load[3] == o.by_load[3];
  }
};

// Which order the comm blocks pull the remote units in (see "Pull position" above).
enum class PullOrder : int { source = 0, expert = 1 };

struct PlanConfig {
  MoeShape shape;
  Parallel par;
  int rank = 0;
  int tile_m = 128;
  PlanCapacity cap;
  int wave_chunk = 1;  // M-tiles of one expert scheduled together in tile_order (see above), >= 1
  WaveChunkRule chunk_rule;  // replaces wave_chunk by the batch's load class where it has an entry
  PullOrder pull_order = PullOrder::source;

  COMET_HD int world() const { return par.ep * par.tp; }
  COMET_HD int topk() const { return shape.topk; }
  COMET_HD int local_experts() const { return shape.num_experts / par.ep; }
  COMET_HD int first_local_expert() const { return (rank / par.tp) * local_experts(); }
  COMET_HD int max_units() const { return world() * cap.max_tokens_per_rank; }
  COMET_HD int max_tiles() const { return cap.max_rows / tile_m; }
  COMET_HD int source_at(int position) const { return (rank + position) % world(); }
  COMET_HD int position_of(int source) const { return (source - rank + world()) % world(); }
};

// The wave of a tile with key `key` (see above); unit_src is the plan's array, `world`/`rank` its config.
// Pulled expert by expert, every tile that waits for a pull is in wave 1.
COMET_HD inline int tile_wave(int key, const int32_t* unit_src, int world, int rank, PullOrder pull_order) {
  if (key < 0) return 0;
  return pull_order == PullOrder::expert ? 1 : (unit_src[key] - rank + world) % world;
}

// The order wave of M-tile m (see above), whose expert's tiles are [first, end); tile_key and unit_src
// are the plan's arrays. Nondecreasing in m over one expert's tiles, as the wave is.
COMET_HD inline int tile_order_wave(int m, int first, int end, int wave_chunk, const int32_t* tile_key,
                                    const int32_t* unit_src, int world, int rank, PullOrder pull_order) {
  if (tile_key[m] < 0) return 0;
  const int chunk_end = first + ((m - first) / wave_chunk + 1) * wave_chunk;
  const int last = (chunk_end < end ? chunk_end : end) - 1;
  return tile_wave(tile_key[last], unit_src, world, rank, pull_order);
}

// Throws InvalidArgument if the configuration is unusable: wave_chunk < 1, a pull_order that is not
// a PullOrder, a chunk rule with a negative chunk or expected_rows negative or not finite, rank outside
// [0, W), tile_m not in {16, 32, 64, 128, 256} (16 and 32 only serve small hand-made tests; the GEMM
// kernels use 64..256), non-positive capacities, max_rows not a multiple of tile_m, more than 1024 local
// experts (the device builder keeps per-expert tables in shared memory) or 65536 ranks, row counts that
// could overflow int32, or a shape / layout that validate(MoeShape, Parallel) rejects.
void validate(const PlanConfig& cfg);
void validate(const WaveChunkRule& rule);  // the chunk rule's part of the above

// Codes of the plan's status word. status[0] holds the first error's code, status[1..4] its details.
// "First" is an order, not a race, so both builders name the same error: token counts by source rank,
// then each slot by (source rank, token, slot; its id out of range, then a duplicate id, then a gate
// weight that is NaN or infinite), then the row count.
enum class PlanError : int32_t {
  ok = 0,
  expert_out_of_range = 1,   // details: source rank, token, slot, expert id
  duplicate_expert = 2,      // details: source rank, token, slot, expert id
  rows_over_capacity = 3,    // details: rows needed (padded), capacity, -, -
  tokens_over_capacity = 4,  // details: source rank, tokens, capacity, -
  gate_not_finite = 5,       // details: source rank, token, slot, the gate's float bits
};
inline constexpr int kPlanStatusWords = 5;

// Human-readable message for a status word (used by both builders' error paths). num_experts, when
// given (> 0), lets an out-of-range message name the valid range [0, E).
std::string describe_plan_error(const int32_t* status, int num_experts = 0);

// One rank's routing as the plan reads it. ids and gates are [tokens][k], row-major.
struct RoutingView {
  int tokens = 0;
  const int32_t* ids = nullptr;
  const float* gates = nullptr;
};

// Layout of one rank's routing inside a (symmetric) byte buffer, so peers can read it:
//   int32 tokens, 3 words of padding, int32 ids[T_cap][k], float gates[T_cap][k].
struct RoutingBufferLayout {
  int max_tokens = 0;
  int topk = 0;
  COMET_HD size_t ids_offset() const { return 16; }
  COMET_HD size_t gates_offset() const { return 16 + size_t(max_tokens) * topk * sizeof(int32_t); }
  COMET_HD size_t bytes() const { return gates_offset() + size_t(max_tokens) * topk * sizeof(float); }
  COMET_HD RoutingView view(const void* buffer) const {
    const char* b = static_cast<const char*>(buffer);
    return RoutingView{*reinterpret_cast<const int32_t*>(b), reinterpret_cast<const int32_t*>(b + ids_offset()),
                       reinterpret_cast<const float*>(b + gates_offset())};
  }
};

// Non-owning view of a plan's arrays (host or device memory). Sizes in brackets; E_l = local experts,
// U = max_units, R = max_rows, M = max_tiles, k = top-k.
struct PlanView {
  int32_t* status = nullptr;            // [kPlanStatusWords] this build's result (0: ok; else the empty plan)
  int32_t* first_error = nullptr;       // [kPlanStatusWords] the first failed build's status since the last
                                        //   DevicePlan::check (sticky: a later good build keeps it)
  int32_t* src_tokens = nullptr;        // [W]        tokens owned by each source rank
  int32_t* expert_rows = nullptr;       // [E_l]      rows of each local expert
  int32_t* expert_offset = nullptr;     // [E_l + 1]  first row of each expert segment; [E_l] = padded total
  int32_t* segment_offset = nullptr;    // [E_l * W]  first row of (expert e, source position j)
  int32_t* segment_rows = nullptr;      // [E_l * W]  rows of (e, j)
  int32_t* num_units = nullptr;         // [1]
  int32_t* num_local_units = nullptr;   // [1]
  int32_t* unit_src = nullptr;          // [U]
  int32_t* unit_token = nullptr;        // [U]
  int32_t* unit_rows = nullptr;         // [U * k]    row of slot j, -1 if slot j's expert is elsewhere
  float* unit_gates = nullptr;          // [U * k]    gate of slot j, 0 if slot j's expert is elsewhere
  int32_t* row_unit = nullptr;          // [R]        unit filling the row, -1 for padding
  int32_t* row_slot = nullptr;          // [R]        its k-slot, -1 for padding
  int32_t* num_tiles = nullptr;         // [1]        M-tiles = expert_offset[E_l] / tile_m
  int32_t* tile_expert = nullptr;       // [M]
  int32_t* tile_rows = nullptr;         // [M]        valid rows of the tile
  int32_t* tile_remote_rows = nullptr;  // [M]        rows pulled from other ranks
  int32_t* tile_key = nullptr;          // [M]
  int32_t* tile_order = nullptr;        // [M]        schedule order
  int32_t* pull_unit = nullptr;         // [U]        unit of pull position p (see above), -1 past num_units
};

// Byte size of all arrays of a plan with this configuration, and how they are carved from one block.
size_t plan_bytes(const PlanConfig& cfg);
PlanView carve_plan(const PlanConfig& cfg, void* base);  // base aligned to 256 bytes

// A plan held in host memory.
class HostPlan {
 public:
  HostPlan() = default;
  explicit HostPlan(const PlanConfig& cfg);
  // view() points into storage_, so copies re-carve their own storage and moves leave the source empty.
  HostPlan(const HostPlan& other);
  HostPlan& operator=(const HostPlan& other);
  HostPlan(HostPlan&& other) noexcept;
  HostPlan& operator=(HostPlan&& other) noexcept;
  const PlanConfig& config() const { return cfg_; }
  const PlanView& view() const { return view_; }
  size_t bytes() const { return storage_.size(); }

 private:
  PlanConfig cfg_{};
  std::vector<std::byte> storage_;
  PlanView view_{};
};

// Builds rank cfg.rank's plan on the host from all W ranks' routing (routing.size() == W).
// Throws InvalidArgument for bad routing (expert id out of range or negative, duplicate expert in a
// token's top-k, more tokens than T_cap, more rows than max_rows) with a message naming the place.
HostPlan build_plan_host(const PlanConfig& cfg, const std::vector<RoutingView>& routing);

}  // namespace comet
