// LaunchPlanner: the one place that decides how a fused layer is launched. It turns (layer, mode,
// tokens per rank, the caller's request) into a LaunchDecision: schedule (fused or sequential), tile,
// comm blocks, rasterisation groups, and whether the kernel may re-pick its split on the device
// (adaptive split). Each decision is made once and memoised by everything it depends on; the rest of
// comet only executes decisions.
//
//   request field set   -> obeyed (checked against the compiled tiles and this device's resident grid)
//   request field empty -> tuner table (TuneKey of the launch), else the cost model; m_group by the
//                          rasterisation rule below
#pragma once

#include <functional>
#include <map>
#include <string>
#include <tuple>

#include "comet/shape.hpp"
#include "comet/team.hpp"
#include "comet/tune.hpp"
#include "comet/variant.hpp"
#include "tune/adaptive_split.hpp"

namespace comet {

// What the planner knows of the device. resident_blocks(layer, tile_n): the largest grid of that
// compiled kernel that is entirely resident at once (queried from the kernels, once per tile).
struct DeviceCaps {
  std::string gpu;
  int sms = 0;
  size_t l2_bytes = 0;
  std::function<int(int layer, int tile_n)> resident_blocks;
};

// A decision and, for a fused launch whose split may adapt, what the kernel needs to re-pick it (the
// launcher fills in its per-rank `chosen` word).
struct PlannedLaunch {
  LaunchDecision decision;
  AdaptiveSplit adapt;
};

// What the caller lets the planner vary (MoeOptions).
struct PlannerPolicy {
  bool adaptive_split = true;  // the kernel may re-pick n_comm from the batch's plan
  bool batch_invariant = false;  // the tile shape depends on the layer's shape only (not the token count)
  DType layer0_dtype = DType::bf16;  // e4m3: layer 0 runs the fp8 kernel (its own tiles and table keys)
  // The weight gradients' narrow-N picks on 128 x 320 tiles (comet/variant.hpp: prefers_320_tiles;
  // MoeOptions::narrow_n_tiles); a request for grouped_320 is obeyed either way.
  bool narrow_n_tiles = true;
  // The transport has layer 0's 128 x 320 kernel (kernels/fused_layers.hpp; NVSHMEM's has not): off,
  // a request for it is refused and a table's pick of it runs 256-wide.
  bool layer0_tile_320 = true;
};

class LaunchPlanner {
 public:
  LaunchPlanner(const MoeShape& shape, const Parallel& par, Link link, DeviceCaps caps, TuneTable table,
                PlannerPolicy policy = {});

  // The decision for a launch of `layer` in `mode` with `tokens` on this rank (memoised). Raises
  // InvalidArgument for a request the compiled kernels or this device cannot run.
  const PlannedLaunch& plan(int layer, LayerMode mode, int tokens, const LayerRequest& request) const;

  // Which GEMM makes the weight gradients for `tokens` on this rank: `requested` unless automatic, else
  // the rule in launch_planner.cpp (from expected rows per local expert, the shard's F and H).
  // n: the GEMM's N (dW1: F / tp, dW0: H), where it decides the tile (0: unknown).
  WeightGradKernel weight_grad_kernel(int tokens, WeightGradKernel requested, int n = 0) const;
  // The kernel a picked (not requested) weight-gradient kernel runs for a GEMM of n columns: a cooperative
  // pick, either tile, runs 128 x 320 where n is narrow (variant.hpp: prefers_320_tiles) and the policy's
  // narrow_n_tiles is on, 128 x 256 elsewhere; the other kernels as they are. One table pick covers dW1
  // (n = F / tp) and dW0 (n = H), so a benchmark times a pick through this too.
  WeightGradKernel picked_weight_grad_tiles(WeightGradKernel k, int n) const;
  // Whether the backward's standalone GEMMs and weight gradients run cuBLAS (MoeOptions::cublas_backward):
  // the request, else the rule (launch_planner.cpp).
  bool cublas_backward(std::optional<bool> requested) const;

  // The tuner's key of a launch (load: the batch's load class, 1 for the host's own picks).
  TuneKey key(int layer, int tokens, int load = 1) const;
  const TuneTable& table() const { return table_; }
  const CostModel model() const { return table_.model(caps_.gpu, link_); }
  int resident_blocks(int layer, int tile_n) const;
  const DeviceCaps& caps() const { return caps_; }

 private:
  PlannedLaunch decide(int layer, LayerMode mode, int tokens, const LayerRequest& request) const;
  // A launch's GEMM inputs: layer 0's dtype is the policy's, the other launches are bf16.
  DType launch_dtype(int layer) const { return layer == 0 ? policy_.layer0_dtype : DType::bf16; }
  int m_group_rule(int layer, LayerMode mode, int tokens, const LaunchDecision& d) const;
  AdaptiveSplit adaptive_split(int layer, int tokens, const LaunchDecision& d) const;

  MoeShape shape_;
  Parallel par_;
  Link link_;
  DeviceCaps caps_;
  TuneTable table_;
  PlannerPolicy policy_;
  // (layer, mode, tokens, tile_n, n_comm, m_group, n_group, standalone_gemm, one_launch, m_order); an empty
  // request field is -1.
  using Key = std::tuple<int, int, int, int, int, int, int, int, int, int>;
  mutable std::map<Key, PlannedLaunch> memo_;
  mutable std::map<std::pair<int, int>, int> resident_;  // (layer, tile_n) -> blocks
};

}  // namespace comet
