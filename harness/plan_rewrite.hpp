// Experiments on layer 0's order that the plan builders do not make (yet): the device plan's pull order
// and tile order rewritten on the host between prepare() and the launch. Both arrays are permutations
// that only the fused kernel's comm blocks (pull_unit) and compute blocks (tile_order) read, and any
// permutation gives the same results: every tile still waits for all of its rows, and every unit is
// pulled. Used by comet-bench --expert-order (bench/README.md) and its GPU test.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "comet/device_plan.hpp"

namespace comet::testing {

// Expert by expert, smallest expert first (PullOrder::expert takes the experts in index order). The
// local experts ranked by their rows (fewer first; ties by index); each remote unit is pulled at its
// row in its lowest-ranked expert, the units sorted by (that expert's rank, that row); the tiles with
// remote rows computed by (their expert's rank, m) after the all-local tiles in m order. Under skew a
// hot expert has rows from most units: taken first (as index order does when it is expert 0), its
// tiles wait for most of the pull, while a small expert's complete after a few units.
struct Layer0Order {
  std::vector<int32_t> pull_unit;   // [num_units]
  std::vector<int32_t> tile_order;  // [num_tiles]
};
// From a plan's arrays in host memory (HostPlan::view, or DevicePlan::to_host's).
Layer0Order smallest_expert_first(const PlanConfig& cfg, const PlanView& host_view);
// Reads the device plan back and writes its pull_unit and tile_order (synchronises `stream`).
void order_smallest_expert_first(const DevicePlan& plan, cudaStream_t stream);

}  // namespace comet::testing
