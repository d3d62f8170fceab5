// The layer-1 combine sizes its batches by the slots a unit is expected to have on its rank
// (kernels::expected_slots_per_unit, combine_role.cuh). Checked against a simulation: tokens draw k
// distinct experts uniformly, and we count the slots of rank 0's group for the tokens that have one.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/layer_args.hpp"

namespace {

double simulated_slots(int experts, int ep, int k, int tokens, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int> ids(experts);
  const int here = experts / ep;  // rank 0's group holds experts [0, here)
  long long units = 0, slots = 0;
  for (int t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int j = 0; j < k; ++j) std::swap(ids[j], ids[j + std::uniform_int_distribution<int>(0, experts - 1 - j)(rng)]);
    const int n = int(std::count_if(ids.begin(), ids.begin() + k, [&](int e) { return e < here; }));
    units += n > 0;
    slots += n;
  }
  return double(slots) / double(units);
}

TEST(CombineBatch, ExpectedSlotsPerUnitMatchesSimulatedRouting) {
  EXPECT_EQ(comet::kernels::expected_slots_per_unit(8, 1, 64), 0.f);  // TP: every slot (the dense batches)
  struct Shape { int experts, ep, k; } shapes[] = {
      {8, 8, 2},    // Mixtral EP 8: one expert per rank, so exactly one slot
      {64, 8, 4},   // Qwen2-MoE EP 8
      {256, 8, 8},  // DeepSeek-V3 EP 8
      {64, 8, 8},   // Qwen2-57B EP 8
      {8, 4, 2},    // the tests' small shapes
      {16, 8, 8},
      {16, 2, 8},
  };
  for (const Shape& s : shapes) {
    const double want = simulated_slots(s.experts, s.ep, s.k, 200000, 7u + s.experts + s.ep * 31 + s.k * 17);
    const double got = comet::kernels::expected_slots_per_unit(s.k, s.ep, s.experts);
    EXPECT_NEAR(got, want, 0.01 * want) << "E " << s.experts << " ep " << s.ep << " k " << s.k;
  }
  EXPECT_FLOAT_EQ(comet::kernels::expected_slots_per_unit(2, 8, 8), 1.f);
}

}  // namespace
