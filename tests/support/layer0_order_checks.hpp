// What comet-bench --expert-order size's rewrite (harness/plan_rewrite.hpp) must give, from its
// definition, for the CPU test (host plans) and the GPU test (device plans read back).
#pragma once

#include <cstdint>
#include <vector>

#include "comet/plan.hpp"

namespace comet::testing {

// pull_unit and tile_order are permutations, the local positions unmoved; the tiles with remote rows
// follow the all-local ones, by their expert's rank (fewer rows first, ties by index); and a tile's
// units are all pulled before the first unit keyed in a later-ranked expert (a unit's key: its
// lowest-ranked expert). Plan arrays in host memory.
void expect_smallest_expert_first(const PlanConfig& cfg, const PlanView& v, const std::vector<int32_t>& pull_unit,
                                  const std::vector<int32_t>& tile_order);

}  // namespace comet::testing
