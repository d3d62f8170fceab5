// comet::FusedMoe: the distributed MoE layer with communication hidden inside the expert GEMMs.
//
//   layer 0  dispatch + GEMM0 + activation  (one persistent kernel: comm blocks pull remote token rows,
//            compute blocks run the GEMM on M-tiles as their rows land; local tiles first)
//   layer 1  GEMM1 + top-k combine          (one persistent kernel: compute blocks make column blocks,
//            comm blocks weight, pre-reduce and ship finished slices to the tokens' owners)
//   finish   each rank sums its tokens' partial rows in rank order (bitwise reproducible)
//
// One FusedMoe serves every rank this process drives (LocalTeam: all W; IpcTeam: one). Device memory
// is sized once by MoeCapacity; a call never synchronises with the host, so forward() can be captured
// in a CUDA graph. Routing is validated on the device: errors surface at sync_and_check() (at once
// with MoeOptions::checking or COMET_CHECK=1).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comet/device_plan.hpp"
#include "comet/shape.hpp"
#include "comet/team.hpp"
#include "comet/tune.hpp"
#include "comet/variant.hpp"

namespace comet {

struct MoeCapacity {
  int max_tokens_per_rank = 0;  // T_cap: most tokens one rank may pass in a call
  // Rows of each rank's gathered buffer (padding to 128 rows per expert included). 0: the worst case,
  // W * T_cap * min(k, E_l) + E_l * 127 rounded up (safe, but large for big shapes).
  int max_rows_per_rank = 0;
};

// A layer variant with n_comm < 0 is chosen per call by the tuner (table, else cost model).
struct MoeOptions {
  // n_comm -1: the tuner picks it per call (table, else cost model); tile_n 0: it picks the compiled
  // tile shape as well; set both to force a variant.
  LayerVariant layer0{0, -1, 0, 1};
  LayerVariant layer1{0, -1, 0, 1};
  // Fused launches whose n_comm the tuner picked re-pick it on the device from the plan's row and unit
  // counts: a skewed batch takes the table's entry for its load class, else the cost model's pick for
  // its counts (kernels/adaptive_split.hpp has the rule). No host synchronisation; the grid is
  // unchanged; a uniform batch keeps the host's pick. Off: the host's pick for uniform routing always.
  bool adaptive_split = true;
  bool checking = false;  // synchronise and raise device-reported errors after every call
  // Layer 0's comm blocks: bulk-store groups in flight before a unit's rows are published (1, 2, 4, 8).
  int dispatch_store_lag = 4;
  std::string tune_table;  // the tuner's table; empty: TuneTable::default_path()
};

// One rank's inputs and output for a call (device pointers, bf16 activations).
struct RankBatch {
  int tokens = 0;
  const void* x = nullptr;        // [tokens][H] bf16
  const int32_t* ids = nullptr;   // [tokens][k] expert ids
  const float* gates = nullptr;   // [tokens][k] gate weights
  void* out = nullptr;            // [tokens][H] bf16
};

// A sub-range of the plan's units (baselines that pipeline the layer in chunks); {-1, -1}: all.
struct UnitRange {
  int begin = -1;
  int end = -1;
  bool all() const { return begin < 0 && end < 0; }
};

class FusedMoe {
 public:
  FusedMoe(Team& team, const MoeShape& shape, const Parallel& par, const MoeCapacity& cap,
           const MoeOptions& options = {});
  ~FusedMoe();
  FusedMoe(const FusedMoe&) = delete;
  FusedMoe& operator=(const FusedMoe&) = delete;

  // Expert weights of a local rank, in the layout of weight_layout.hpp (device pointers, bf16):
  // w0 [E_l][w0 rows of the shard][H], w1 [E_l][H][F/tp].
  void set_weights(int rank, const void* w0, const void* w1);

  // The whole layer for every local rank; batches[i] belongs to team.local_ranks()[i].
  void forward(const std::vector<RankBatch>& batches);

  // ---- the steps of forward(), per local rank (tests and benchmarks) --------------------------------
  void stage(int rank, const RankBatch& batch);  // x and routing into the rank's exported buffers
  void prepare(int rank);                        // device plan, new epoch, local rows into A
  // A unit range (comm_only only) restricts which units are pulled (layer 0) or shipped (layer 1).
  // A variant with n_comm < 0 is resolved by the tuner for the rank's staged token count.
  void layer0(int rank, LayerMode mode, const LayerVariant& v, UnitRange units = {});
  void layer1(int rank, LayerMode mode, const LayerVariant& v, UnitRange units = {});
  // What the tuner picks for a layer of `rank`'s staged batch (n_comm >= 0 in v: v itself, "forced").
  TunedVariant resolve(int layer, int rank, const LayerVariant& v) const;
  TuneKey tune_key(int layer, int tokens_per_rank) const;
  const TuneTable& tune_table() const { return table_; }
  void finish(int rank, const RankBatch& batch);  // sum of partials -> batch.out (after a barrier)
  void advance_epoch(int rank);                  // a new generation for flags (benchmarks re-running a layer)

  // Synchronises the local ranks and raises what the device reported (timeouts, bad routing).
  void sync_and_check();

  // ---- introspection -----------------------------------------------------------------------------
  const MoeShape& shape() const { return shape_; }
  const Parallel& parallel() const { return par_; }
  const MoeCapacity& capacity() const { return cap_; }
  const MoeOptions& options() const { return options_; }
  MoeOptions& options() { return options_; }
  Team& team() const { return team_; }
  const DevicePlan& plan(int rank) const;
  // Per-rank device buffers (rows laid out by the plan); baselines write them with their own GEMMs.
  void* gathered(int rank) const;    // A [rows_cap][H]
  void* hidden(int rank) const;      // layer 0 output [rows_cap][F/tp]
  void* expert_out(int rank) const;  // layer 1 GEMM output [rows_cap][H]
  // Resident grid capacity of a fused kernel (comm + compute blocks cannot exceed it).
  int max_blocks(int layer, int tile_n) const;
  // The comm blocks the last launch of a layer on `rank` ran with: the adaptive pick when it adapted,
  // else the variant's n_comm. Synchronises the rank's stream.
  int last_n_comm(int rank, int layer) const;
  // The table's n_comm for a layer's launch in each load class (TuneKey::load 1, 2, 4, 8) measured with
  // tile_n; 0 where it has none, and for class 1 (the host's own pick). The adaptive split's input
  // (built once per launch shape; the rank keeps it).
  std::array<int, kLoadClasses> load_picks(int layer, int tokens_per_rank, int tile_n) const;

 private:
  struct RankState;
  RankState& state(int rank) const;
  // The variant a launch runs with: resolved by the tuner, validated, leaving compute blocks.
  LayerVariant launch_variant(int layer, int rank, LayerMode mode, const LayerVariant& requested,
                              UnitRange units) const;

  Team& team_;
  MoeShape shape_;
  Parallel par_;
  MoeCapacity cap_;
  MoeOptions options_;
  SymmetricId x_sym_, routing_sym_, recv_sym_;
  TuneTable table_;
  std::string gpu_name_;
  int sms_ = 0;
  size_t l2_bytes_ = 0;
  mutable int max_blocks_[2][3] = {};  // [layer][tile_n 128, 192, 256]: resident grid, queried once
  // Tuner picks by (layer, tokens bucket, tile_n): a launch re-resolves in a hash lookup.
  mutable std::unordered_map<uint64_t, TunedVariant> picks_;
  std::vector<std::unique_ptr<RankState>> ranks_;  // by local slot
};

}  // namespace comet
