// Plan configurations for the plan tests (host and device builders alike).
#pragma once

#include <vector>

#include "comet/plan.hpp"

namespace comet::testing {

inline PlanConfig make_config(int ep, int tp, int E, int k, int rank, int tile_m, int max_tokens, int max_rows) {
  PlanConfig cfg;
  cfg.shape = MoeShape{64, 128, E, k, Activation::swiglu};
  cfg.par = Parallel{ep, tp};
  cfg.rank = rank;
  cfg.tile_m = tile_m;
  cfg.cap = PlanCapacity{max_tokens, max_rows};
  return cfg;
}

// Rows enough for any routing: every slot of every token, plus a partial tile per expert.
inline int worst_rows(int W, int max_tokens, int k, int local_experts, int tile_m) {
  const long long rows = (long long)W * max_tokens * k + (long long)local_experts * (tile_m - 1);
  return int((rows + tile_m - 1) / tile_m * tile_m);
}

// The EP x TP splits of W ranks the plan tests cover.
struct Layout {
  int ep, tp;
};

inline std::vector<Layout> layouts_of(int W) {
  if (W == 1) return {{1, 1}};
  std::vector<Layout> out = {{W, 1}, {1, W}};
  if (W == 4) out.push_back({2, 2});
  if (W == 8) {
    out.push_back({2, 4});
    out.push_back({4, 2});
  }
  return out;
}

}  // namespace comet::testing
