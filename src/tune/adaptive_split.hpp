// Adaptive split: the fused kernel re-picks its number of comm blocks from the work the plan holds, so
// that a skewed batch does not run with the split tuned for uniform routing (the host cannot see the
// routing without a synchronisation). Every block evaluates the same cost model on the same plan
// counts at kernel start and so agrees on the split; the grid (all resident blocks) does not change.
//
// The rule keeps what the tuner measured where the batch looks like what it measured:
//   1. a rank whose rows put it in load class 2, 4 or 8 (skew; cost_model_eval.hpp) takes the table's
//      entry for that class if the tuner measured one (comet-tune from skewed sweeps);
//   2. otherwise, if the cost model picks the same n_comm for the plan's counts as for the uniform
//      expectation of the key, the host's pick (table or model) stands; if not, the model's pick for
//      the plan's counts replaces it.
// What the rule gained on the H200 sweeps: docs/design-changes.md (Tuner). Layer 0's entries of a class
// may also carry the plan's wave chunk (chunk_by_load), which the plan applies from the same class.
#pragma once

#include <cstdint>

#include "tune/cost_model_eval.hpp"
#include "comet/plan.hpp"

namespace comet {

struct AdaptiveSplit {
  int enabled = 0;
  CostModel model;
  LayerWork per_row;   // the layer's shape fields; flops = GEMM flops of one row (measured_work)
  int local_experts = 0;
  int sms = 0;         // the SM count the model's rates are per (the device's)
  int tile_n = 256;
  int n_host = 0;      // the host's pick (table or cost model), for the expected work of the key
  int n_expected = 0;  // the cost model's pick for that expected work (sequential mode excluded)
  double expected_rows = 0;          // the rank's rows under uniform routing (load_class's scale)
  int n_by_load[kLoadClasses] = {};  // the table's n_comm per load class for this tile shape; 0: none
  // Layer 0: the wave chunk the table's entry of each class was measured with (0: the default). The
  // plan, built before the launch, orders its tiles by it (wave_chunk_rule below), so a class's chunk
  // and n_comm run together.
  int chunk_by_load[kLoadClasses] = {};
  int32_t* chosen = nullptr;  // written by block 0: the split the launch ran with (diagnostics)
};

// Host: the split of a fused launch of `layer` for `tokens` per rank, whose host pick is n_host, with
// the cost model `m` of the device (`sms` SMs); `by_load` (may be null) holds the table's n_comm per
// load class (0 where it has none); `dtype` is layer 0's (e4m3: the fp8 rate and record bytes).
inline AdaptiveSplit make_adaptive_split(const MoeShape& s, const Parallel& p, int layer, int tokens, const CostModel& m,
                                         int sms, int tile_n, int n_host, int32_t* chosen,
                                         const int* by_load = nullptr, DType dtype = DType::bf16) {
  AdaptiveSplit a;
  a.enabled = 1;
  a.model = m;
  a.per_row = row_work(s, p, layer, dtype);
  a.local_experts = p.local_experts(s);
  a.sms = sms;
  a.tile_n = tile_n;
  a.n_host = n_host;
  a.n_expected = cost_best_n_comm(m, expected_work(s, p, layer, tokens, tile_n, dtype), sms, tile_n, false);
  a.chosen = chosen;
  a.expected_rows = expected_rows(s, p, tokens);
  for (int c = 0; c < kLoadClasses; ++c) a.n_by_load[c] = by_load ? by_load[c] : 0;
  return a;
}

// The plan's chunk rule that goes with a split (comet/plan.hpp: WaveChunkRule): none unless the split
// adapts and the table has a chunk for some class.
inline WaveChunkRule wave_chunk_rule(const AdaptiveSplit& a) {
  WaveChunkRule rule;
  if (!a.enabled) return rule;
  for (int c = 0; c < kLoadClasses; ++c) {
    rule.by_load[c] = a.chunk_by_load[c];
    if (a.chunk_by_load[c] > 0) rule.expected_rows = a.expected_rows;
  }
  return rule;
}

// The launch's comm blocks: the host's n_comm, or the adaptive pick, clamped to leave a compute block.
COMET_HD inline int adaptive_n_comm(const AdaptiveSplit& a, const PlanView& plan, int host_n_comm, int grid) {
  if (!a.enabled) return host_n_comm;
  int rows = 0;
  for (int e = 0; e < a.local_experts; ++e) rows += plan.expert_rows[e];
  const int measured = a.n_by_load[load_class_index(load_class(rows, a.expected_rows))];
  int n = measured;
  if (n <= 0) {
    const LayerWork w = measured_work(a.per_row, rows, *plan.num_units, *plan.num_local_units);
    const int n_plan = cost_best_n_comm(a.model, w, a.sms, a.tile_n, false);
    n = n_plan == a.n_expected ? a.n_host : n_plan;
  }
  return n < 1 ? 1 : (n > grid - 1 ? grid - 1 : n);
}

}  // namespace comet
