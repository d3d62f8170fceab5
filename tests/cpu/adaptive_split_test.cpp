// The adaptive split's rule (tune/adaptive_split.hpp) on plan counts, evaluated on the host: the
// same inline code the fused kernels run at their start.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tune/cost_model_eval.hpp"
#include "tune/adaptive_split.hpp"

using namespace comet;

namespace {

// Qwen1.5-MoE-A2.7B-like layer 1 (64 experts, top-8), EP 8, 4096 tokens per rank, over the host link.
struct Layer1Case {
  MoeShape shape{3584, 2560, 64, 8, Activation::swiglu};
  Parallel par{8, 1};
  int tokens = 4096, sms = 132, layer = 1, tile_n = 256;
  CostModel model = CostModel::defaults(Link::host);

  AdaptiveSplit split(int n_host) const {
    return make_adaptive_split(shape, par, layer, tokens, model, sms, tile_n, n_host, nullptr);
  }
};

// A plan that only holds the counts the rule reads.
struct CountsPlan {
  std::vector<int32_t> expert_rows;
  int32_t units = 0, local_units = 0;
  PlanView view() {
    PlanView v;
    v.expert_rows = expert_rows.data();
    v.num_units = &units;
    v.num_local_units = &local_units;
    return v;
  }
};

CountsPlan counts(int experts, double rows, double units, double local_units) {
  CountsPlan c;
  c.expert_rows.assign(experts, int32_t(std::lround(rows / experts)));
  c.units = int32_t(std::lround(units));
  c.local_units = int32_t(std::lround(local_units));
  return c;
}

}  // namespace

TEST(AdaptiveSplit, MeasuredWorkOfTheExpectedCountsIsTheExpectedWork) {
  const Layer1Case s;
  const LayerWork e = expected_work(s.shape, s.par, s.layer, s.tokens, s.tile_n);
  const double reach = 1.0 - std::pow(1.0 - 1.0 / s.par.ep, s.shape.topk);
  const double units = s.par.world() * s.tokens * reach, rows = s.par.world() * s.tokens * s.shape.topk / s.par.ep;
  const LayerWork m = measured_work(s.split(0).per_row, rows, units, s.tokens * reach);
  EXPECT_NEAR(m.flops / e.flops, 1.0, 1e-9);
  EXPECT_NEAR(m.link_bytes / e.link_bytes, 1.0, 1e-9);
  EXPECT_NEAR(m.comm_units / e.comm_units, 1.0, 1e-9);
  EXPECT_NEAR(m.rows_per_unit / e.rows_per_unit, 1.0, 1e-9);
}

TEST(AdaptiveSplit, KeepsTheHostPickWhereThePlanLooksAsExpected) {
  const Layer1Case s;
  const double reach = 1.0 - std::pow(1.0 - 1.0 / s.par.ep, s.shape.topk);
  CountsPlan uniform = counts(8, 8.0 * s.tokens * 8 / 8, 8.0 * s.tokens * reach, s.tokens * reach);
  // 7 is no candidate of the model: only the host (a measured table entry) could have chosen it.
  EXPECT_EQ(adaptive_n_comm(s.split(7), uniform.view(), 7, 132), 7);
}

TEST(AdaptiveSplit, FollowsThePlanWhereRoutingIsSkewed) {
  const Layer1Case s;
  // Zipf-like counts measured on rank 0 (H200 sweep, 4096 tokens): 4.3x the rows but 1.5x the
  // pulled units of uniform routing, so far less comm per GEMM flop.
  CountsPlan skewed = counts(8, 139351, 28669 * 8.0 / 7.0, 28669 / 7.0);
  const AdaptiveSplit a = s.split(32);
  const LayerWork w = measured_work(a.per_row, 139351, skewed.units, skewed.local_units);
  const int n_plan = cost_best_n_comm(s.model, w, s.sms, s.tile_n, false);
  ASSERT_NE(n_plan, a.n_expected) << "the skewed counts should move the model's pick";
  EXPECT_LT(n_plan, a.n_expected);  // less comm per flop: fewer comm blocks
  EXPECT_EQ(adaptive_n_comm(a, skewed.view(), 32, 132), n_plan);
  // Whatever the pick, a compute block is left, and a disabled split keeps the host's value.
  EXPECT_LE(adaptive_n_comm(a, skewed.view(), 32, 3), 2);
  AdaptiveSplit off = a;
  off.enabled = 0;
  EXPECT_EQ(adaptive_n_comm(off, skewed.view(), 32, 132), 32);
}

TEST(AdaptiveSplit, LoadClassesArePowersOfTwoOfTheUniformRows) {
  EXPECT_EQ(load_class(0, 1000), 1);
  EXPECT_EQ(load_class(1000, 1000), 1);
  EXPECT_EQ(load_class(1414, 1000), 1);  // < sqrt(2) x
  EXPECT_EQ(load_class(1415, 1000), 2);
  EXPECT_EQ(load_class(2828, 1000), 2);
  EXPECT_EQ(load_class(2829, 1000), 4);
  EXPECT_EQ(load_class(4300, 1000), 4);  // the Zipf 1.2 hot rank of the H200 sweeps
  EXPECT_EQ(load_class(5657, 1000), 8);
  EXPECT_EQ(load_class(1e9, 1000), 8);
  EXPECT_EQ(load_class(10, 0), 1);  // no expectation: uniform
  for (int c : {1, 2, 4, 8}) EXPECT_EQ(1 << load_class_index(c), c);
}

TEST(AdaptiveSplit, TakesTheTablesEntryForTheBatchsLoadClass) {
  const Layer1Case s;
  const double expected = s.par.world() * double(s.tokens) * s.shape.topk / s.par.ep;  // 32768 rows
  // The tuner measured 5 comm blocks for class 4 (5 is no candidate of the model: only the table).
  const int by_load[kLoadClasses] = {0, 0, 5, 0};
  const AdaptiveSplit a = make_adaptive_split(s.shape, s.par, s.layer, s.tokens, s.model, s.sms,
                                                                s.tile_n, 32, nullptr, by_load);
  EXPECT_DOUBLE_EQ(a.expected_rows, expected);
  CountsPlan skewed = counts(8, 139351, 28669 * 8.0 / 7.0, 28669 / 7.0);  // 4.25x: class 4
  EXPECT_EQ(adaptive_n_comm(a, skewed.view(), 32, 132), 5);
  EXPECT_EQ(adaptive_n_comm(a, skewed.view(), 32, 4), 3);  // still leaves a compute block
  // Class 2 has no entry: the rule of the counts decides, as without a table.
  CountsPlan twice = counts(8, 2.0 * expected, 28669 * 8.0 / 7.0, 28669 / 7.0);
  const AdaptiveSplit no_table = s.split(32);
  EXPECT_EQ(adaptive_n_comm(a, twice.view(), 32, 132), adaptive_n_comm(no_table, twice.view(), 32, 132));
  // A uniform batch is class 1: the host's pick, whatever the skewed entries say.
  const double reach = 1.0 - std::pow(1.0 - 1.0 / s.par.ep, s.shape.topk);
  CountsPlan uniform = counts(8, expected, 8.0 * s.tokens * reach, s.tokens * reach);
  EXPECT_EQ(adaptive_n_comm(a, uniform.view(), 32, 132), 32);
}
