#include "harness/plan_rewrite.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "comet/cuda_check.hpp"

namespace comet::testing {

Layer0Order smallest_expert_first(const PlanConfig& cfg, const PlanView& v) {
  const int experts = cfg.local_experts(), k = cfg.topk(), tile_m = cfg.tile_m;
  const int units = *v.num_units, local = *v.num_local_units, tiles = *v.num_tiles;

  std::vector<int> by_size(experts), rank(experts);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [&](int a, int b) { return v.expert_rows[a] < v.expert_rows[b]; });
  for (int r = 0; r < experts; ++r) rank[by_size[r]] = r;
  auto expert_of_row = [&](int row) { return v.tile_expert[row / tile_m]; };

  // Remote units by (rank of their lowest-ranked expert, their row there).
  std::vector<std::tuple<int, int, int>> keyed;  // rank, row, unit
  for (int u = local; u < units; ++u) {
    std::tuple<int, int, int> key{experts, 0, u};
    for (int j = 0; j < k; ++j) {
      const int row = v.unit_rows[size_t(u) * k + j];
      if (row >= 0) key = std::min(key, std::tuple<int, int, int>{rank[expert_of_row(row)], row, u});
    }
    keyed.push_back(key);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int32_t> pull_unit(v.pull_unit, v.pull_unit + units);
  for (size_t i = 0; i < keyed.size(); ++i) pull_unit[local + i] = std::get<2>(keyed[i]);

  std::vector<int32_t> order(tiles);
  std::iota(order.begin(), order.end(), 0);
  // All-local tiles first, in m order; then the waiting ones by (their expert's rank, m).
  auto tile_key = [&](int m) {
    const bool waits = v.tile_remote_rows[m] > 0;
    return std::tuple<bool, int, int>{waits, waits ? rank[v.tile_expert[m]] : 0, m};
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return tile_key(a) < tile_key(b); });
  return Layer0Order{std::move(pull_unit), std::move(order)};
}

void order_smallest_expert_first(const DevicePlan& plan, cudaStream_t stream) {
  const HostPlan host = plan.to_host(stream);
  const Layer0Order o = smallest_expert_first(plan.config(), host.view());
  const PlanView& d = plan.view();
  COMET_CUDA_CHECK(cudaMemcpyAsync(d.pull_unit, o.pull_unit.data(), o.pull_unit.size() * 4, cudaMemcpyHostToDevice,
                                   stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(d.tile_order, o.tile_order.data(), o.tile_order.size() * 4, cudaMemcpyHostToDevice,
                                   stream));
  COMET_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace comet::testing
