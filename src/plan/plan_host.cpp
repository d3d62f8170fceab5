// The host builder: plan.hpp's definitions written out as plainly as possible. It is the specification
// the device builder is tested against, so it favours obviousness over speed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comet/plan.hpp"
#include "plan/wave_chunk_rule.hpp"

namespace comet {

namespace {

[[noreturn]] void throw_plan_error(PlanError code, int a, int b, int c, int d, int num_experts) {
  const int32_t status[kPlanStatusWords] = {static_cast<int32_t>(code), a, b, c, d};
  throw InvalidArgument(describe_plan_error(status, num_experts));
}

// Bad routing, reported in the order plan.hpp fixes: token counts by source rank, then slots by (source
// rank, token, slot): an id out of range, a duplicate id, a gate that is not finite. The row count is
// checked by the caller.
void check_routing(const PlanConfig& cfg, const std::vector<RoutingView>& routing) {
  const int W = cfg.world(), E = cfg.shape.num_experts, k = cfg.topk(), cap = cfg.cap.max_tokens_per_rank;
  for (int s = 0; s < W; ++s) {
    const int n = routing[s].tokens;
    if (n < 0 || n > cap) throw_plan_error(PlanError::tokens_over_capacity, s, n, cap, 0, E);
    COMET_REQUIRE(n == 0 || routing[s].ids != nullptr, "routing: rank ", s, " has ", n, " tokens but no ids");
    COMET_REQUIRE(n == 0 || routing[s].gates != nullptr, "routing: rank ", s, " has ", n, " tokens but no gates");
  }
  for (int s = 0; s < W; ++s) {
    for (int t = 0; t < routing[s].tokens; ++t) {
      const int32_t* ids = routing[s].ids + size_t(t) * k;
      for (int slot = 0; slot < k; ++slot) {
        if (ids[slot] < 0 || ids[slot] >= E) throw_plan_error(PlanError::expert_out_of_range, s, t, slot, ids[slot], E);
        for (int earlier = 0; earlier < slot; ++earlier)
          if (ids[earlier] == ids[slot]) throw_plan_error(PlanError::duplicate_expert, s, t, slot, ids[slot], E);
        const float gate = routing[s].gates[size_t(t) * k + slot];
        if (!std::isfinite(gate)) {
          int32_t bits = 0;
          std::memcpy(&bits, &gate, sizeof(bits));
          throw_plan_error(PlanError::gate_not_finite, s, t, slot, bits, E);
        }
      }
    }
  }
}

// Every entry of every array, up to capacity, starts as "unused": -1, gates 0, counts 0.
void fill_unused(const PlanConfig& cfg, const PlanView& v) {
  const size_t W = cfg.world(), El = cfg.local_experts(), k = cfg.topk();
  const size_t U = cfg.max_units(), R = cfg.cap.max_rows, M = cfg.max_tiles();
  std::fill_n(v.status, kPlanStatusWords, 0);
  std::fill_n(v.first_error, kPlanStatusWords, 0);
  std::fill_n(v.src_tokens, W, 0);
  std::fill_n(v.expert_rows, El, 0);
  std::fill_n(v.expert_offset, El + 1, 0);
  std::fill_n(v.segment_offset, El * W, 0);
  std::fill_n(v.segment_rows, El * W, 0);
  *v.num_units = 0;
  *v.num_local_units = 0;
  std::fill_n(v.unit_src, U, -1);
  std::fill_n(v.unit_token, U, -1);
  std::fill_n(v.unit_rows, U * k, -1);
  std::fill_n(v.unit_gates, U * k, 0.0f);
  std::fill_n(v.row_unit, R, -1);
  std::fill_n(v.row_slot, R, -1);
  *v.num_tiles = 0;
  std::fill_n(v.tile_expert, M, -1);
  std::fill_n(v.tile_rows, M, -1);
  std::fill_n(v.tile_remote_rows, M, -1);
  std::fill_n(v.tile_key, M, -1);
  std::fill_n(v.tile_order, M, -1);
  std::fill_n(v.pull_unit, U, -1);
}

}  // namespace

HostPlan build_plan_host(const PlanConfig& cfg, const std::vector<RoutingView>& routing) {
  validate(cfg);
  const int W = cfg.world(), El = cfg.local_experts(), e0 = cfg.first_local_expert(), k = cfg.topk();
  const int tm = cfg.tile_m;
  COMET_REQUIRE(int(routing.size()) == W, "build_plan_host: routing has ", routing.size(), " ranks, the layout has ", W);
  check_routing(cfg, routing);

  HostPlan plan(cfg);
  const PlanView& v = plan.view();
  fill_unused(cfg, v);
  for (int s = 0; s < W; ++s) v.src_tokens[s] = routing[s].tokens;

  // Local expert index of an expert id, or -1 when another EP group holds it.
  auto local_of = [&](int32_t id) { return (id >= e0 && id < e0 + El) ? id - e0 : -1; };

  // Rows of every (local expert e, source position j).
  for (int j = 0; j < W; ++j) {
    const RoutingView& src = routing[cfg.source_at(j)];
    for (int t = 0; t < src.tokens; ++t)
      for (int slot = 0; slot < k; ++slot)
        if (int e = local_of(src.ids[size_t(t) * k + slot]); e >= 0) ++v.segment_rows[e * W + j];
  }

  // Expert segments, each padded to a multiple of tile_m; (e, j) sub-segments in position order.
  for (int e = 0; e < El; ++e) {
    int rows = 0;
    for (int j = 0; j < W; ++j) {
      v.segment_offset[e * W + j] = v.expert_offset[e] + rows;
      rows += v.segment_rows[e * W + j];
    }
    v.expert_rows[e] = rows;
    v.expert_offset[e + 1] = v.expert_offset[e] + (rows + tm - 1) / tm * tm;
  }
  const int total_rows = v.expert_offset[El];
  if (total_rows > cfg.cap.max_rows) {
    throw_plan_error(PlanError::rows_over_capacity, total_rows, cfg.cap.max_rows, 0, 0, cfg.shape.num_experts);
  }

  // Units in pull order (position, then token); each unit's rows go to the next free row of its
  // (e, j) sub-segment, which therefore fills in increasing token order.
  std::vector<int> next_row(v.segment_offset, v.segment_offset + El * W);
  int units = 0;
  for (int j = 0; j < W; ++j) {
    const int s = cfg.source_at(j);
    const RoutingView& src = routing[s];
    for (int t = 0; t < src.tokens; ++t) {
      const int32_t* ids = src.ids + size_t(t) * k;
      bool routed_here = false;
      for (int slot = 0; slot < k; ++slot) routed_here |= local_of(ids[slot]) >= 0;
      if (!routed_here) continue;
      const int u = units++;
      v.unit_src[u] = s;
      v.unit_token[u] = t;
      for (int slot = 0; slot < k; ++slot) {
        const int e = local_of(ids[slot]);
        if (e < 0) continue;  // stays -1 / 0
        const int row = next_row[e * W + j]++;
        v.unit_rows[size_t(u) * k + slot] = row;
        v.unit_gates[size_t(u) * k + slot] = src.gates[size_t(t) * k + slot];
        v.row_unit[row] = u;
        v.row_slot[row] = slot;
      }
    }
    if (j == 0) *v.num_local_units = units;
  }
  *v.num_units = units;

  // Pull positions: the local units, then the remote ones in unit order (source) or by their first row
  // (expert), i.e. the rows in order, each remote unit at the first of its rows.
  const int local_units = *v.num_local_units;
  int position = 0;
  for (; position < local_units; ++position) v.pull_unit[position] = position;
  if (cfg.pull_order == PullOrder::source) {
    for (; position < units; ++position) v.pull_unit[position] = position;
  } else {
    auto first_row = [&](int u) {
      int first = -1;
      for (int slot = 0; slot < k; ++slot) {
        const int row = v.unit_rows[size_t(u) * k + slot];
        if (row >= 0 && (first < 0 || row < first)) first = row;
      }
      return first;
    };
    for (int row = 0; row < total_rows; ++row) {
      const int u = v.row_unit[row];
      if (u >= local_units && first_row(u) == row) v.pull_unit[position++] = u;
    }
  }

  // M-tiles, read off the rows: expert, valid rows, remote rows, and the last remote unit as key.
  const int tiles = total_rows / tm;
  *v.num_tiles = tiles;
  for (int m = 0; m < tiles; ++m) {
    int e = 0;
    while (v.expert_offset[e + 1] <= m * tm) ++e;
    int rows = 0, remote = 0, key = -1;
    for (int row = m * tm; row < (m + 1) * tm; ++row) {
      const int u = v.row_unit[row];
      if (u < 0) continue;
      ++rows;
      if (v.unit_src[u] != cfg.rank) {
        ++remote;
        key = std::max(key, u);
      }
    }
    v.tile_expert[m] = e;
    v.tile_rows[m] = rows;
    v.tile_remote_rows[m] = remote;
    v.tile_key[m] = key;
  }
  std::vector<int> order(tiles);
  std::iota(order.begin(), order.end(), 0);
  const int chunk = plan_wave_chunk(cfg.wave_chunk, cfg.chunk_rule, std::accumulate(v.expert_rows, v.expert_rows + El, 0));
  auto wave = [&](int m) {
    const int e = v.tile_expert[m];
    return tile_order_wave(m, v.expert_offset[e] / tm, v.expert_offset[e + 1] / tm, chunk, v.tile_key, v.unit_src,
                           cfg.world(), cfg.rank, cfg.pull_order);
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return std::make_pair(wave(a), a) < std::make_pair(wave(b), b); });
  std::copy(order.begin(), order.end(), v.tile_order);
  return plan;
}

}  // namespace comet
