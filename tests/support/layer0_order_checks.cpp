#include "support/layer0_order_checks.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace comet::testing {

void expect_smallest_expert_first(const PlanConfig& cfg, const PlanView& v, const std::vector<int32_t>& pulled,
                                  const std::vector<int32_t>& order) {
  const int units = *v.num_units, local = *v.num_local_units, tiles = *v.num_tiles, k = cfg.topk();
  const int experts = cfg.local_experts(), tile_m = cfg.tile_m;
  ASSERT_EQ(int(pulled.size()), units);
  ASSERT_EQ(int(order.size()), tiles);
  std::vector<int32_t> sorted_pulled = pulled, sorted_order = order;
  std::sort(sorted_pulled.begin(), sorted_pulled.end());
  std::sort(sorted_order.begin(), sorted_order.end());
  for (int u = 0; u < units; ++u) ASSERT_EQ(sorted_pulled[u], u) << "pull_unit is not a permutation";
  for (int u = 0; u < local; ++u) ASSERT_EQ(pulled[u], u) << "a local position moved";
  for (int m = 0; m < tiles; ++m) ASSERT_EQ(sorted_order[m], m) << "tile_order is not a permutation";

  std::vector<int> rank(experts), key_rank(units, experts), position(units);
  for (int e = 0; e < experts; ++e)
    for (int f = 0; f < experts; ++f)
      rank[e] += v.expert_rows[f] < v.expert_rows[e] || (v.expert_rows[f] == v.expert_rows[e] && f < e);
  for (int p = 0; p < units; ++p) position[pulled[p]] = p;
  for (int u = local; u < units; ++u)
    for (int j = 0; j < k; ++j) {
      const int row = v.unit_rows[size_t(u) * k + j];
      if (row >= 0) key_rank[u] = std::min(key_rank[u], rank[v.tile_expert[row / tile_m]]);
    }
  std::vector<int> first_of_rank(experts + 1, units);  // first position keyed at this rank or later
  for (int u = local; u < units; ++u) first_of_rank[key_rank[u]] = std::min(first_of_rank[key_rank[u]], position[u]);
  for (int e = experts - 1; e >= 0; --e) first_of_rank[e] = std::min(first_of_rank[e], first_of_rank[e + 1]);
  int last_rank = -1;
  bool waiting_seen = false;
  for (int m : order) {
    const bool waits = v.tile_remote_rows[m] > 0;
    EXPECT_TRUE(waits || !waiting_seen) << "all-local tile " << m << " after a waiting one";
    if (!waits) continue;
    waiting_seen = true;
    const int r = rank[v.tile_expert[m]];
    EXPECT_GE(r, last_rank) << "tile " << m << " before a smaller expert's";
    last_rank = r;
    for (int row = m * tile_m; row < (m + 1) * tile_m; ++row) {
      const int u = v.row_unit[row];
      if (u >= local) EXPECT_LT(position[u], first_of_rank[r + 1]) << "tile " << m << " waits for a later expert's pull";
    }
  }
}

}  // namespace comet::testing
