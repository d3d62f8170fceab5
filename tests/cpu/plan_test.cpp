// The host routing plan (build_plan_host), the specification the device builder is held to:
// configuration checks, the memory layout, hand-written expected plans for small cases, properties
// on random routings over EP / TP / EP x TP layouts, and bad routing rejected with a message naming
// the place. Hand-made cases use tile_m = 16, which validate() admits for tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comet/plan.hpp"
#include "support/layer0_order_checks.hpp"
#include "support/plan_configs.hpp"
#include "harness/plan_rewrite.hpp"
#include "harness/routing_gen.hpp"

namespace comet {
namespace {

using testing::make_routing;
using testing::RankRouting;
using testing::RoutingKind;
using testing::views;
using testing::make_config;
using testing::worst_rows;
using testing::Layout;
using testing::layouts_of;

// Distinct, exactly representable gates for hand-made routing.
float hand_gate(int source, int token, int slot) { return float(source) * 100.0f + float(token) + 0.25f * float(slot + 1); }

// A rank's routing from explicit ids, with hand_gate's gates.
RankRouting hand_routing(int source, const std::vector<std::vector<int32_t>>& ids) {
  RankRouting r;
  r.tokens = int(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    for (size_t slot = 0; slot < ids[t].size(); ++slot) {
      r.ids.push_back(ids[t][slot]);
      r.gates.push_back(hand_gate(source, int(t), int(slot)));
    }
  }
  return r;
}

template <class T>
std::vector<T> arr(const T* p, size_t n) {
  return std::vector<T>(p, p + n);
}

// n entries of `fill` with the given ones at the given positions.
std::vector<int32_t> sparse(size_t n, std::map<int, int32_t> at, int32_t fill = -1) {
  std::vector<int32_t> v(n, fill);
  for (auto [i, x] : at) v[i] = x;
  return v;
}

std::string message_of(const PlanConfig& cfg, const std::vector<RankRouting>& routing) {
  try {
    build_plan_host(cfg, views(routing));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- configuration and layout ------------------------------------------------------------------

TEST(PlanConfig, AcceptsUsualConfigurations) {
  EXPECT_NO_THROW(validate(make_config(8, 1, 256, 8, 3, 128, 4096, 4096 * 64)));
  EXPECT_NO_THROW(validate(make_config(1, 8, 8, 2, 7, 64, 1024, 1024 * 16)));
  EXPECT_NO_THROW(validate(make_config(2, 4, 16, 8, 0, 256, 100, 256)));
  EXPECT_NO_THROW(validate(make_config(2, 1, 4, 2, 1, 16, 4, 64)));  // tiny tiles for tests
}

TEST(PlanConfig, RejectsBadConfigurations) {
  auto msg = [](const PlanConfig& cfg) {
    try {
      validate(cfg);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 4, 128, 16, 1024)).find("rank 4 out of range [0, 4)"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, -1, 128, 16, 1024)).find("rank -1 out of range"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 0, 100, 16, 1000)).find("tile_m"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 0, 8, 16, 1024)).find("tile_m"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 0, 128, 0, 1024)).find("max_tokens_per_rank"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 0, 128, 16, 0)).find("max_rows must be positive"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 8, 2, 0, 128, 16, 1000)).find("multiple of tile_m"), std::string::npos);
  EXPECT_NE(msg(make_config(4, 1, 6, 2, 0, 128, 16, 1024)).find("divisible by ep"), std::string::npos);
  EXPECT_NE(msg(make_config(1, 1, 2048, 2, 0, 128, 16, 1024)).find("1024 local experts"), std::string::npos);
  EXPECT_NE(msg(make_config(8, 1, 8, 8, 0, 128, 1 << 26, 1024)).find("overflows int32"), std::string::npos);
  PlanConfig no_chunk = make_config(4, 1, 8, 2, 0, 128, 16, 1024);
  no_chunk.wave_chunk = 0;
  EXPECT_NE(msg(no_chunk).find("wave_chunk must be >= 1, got 0"), std::string::npos);
  PlanConfig bad_rule = make_config(4, 1, 8, 2, 0, 128, 16, 1024);
  bad_rule.chunk_rule = WaveChunkRule{100.0, {0, 2, -1, 0}};
  EXPECT_NE(msg(bad_rule).find("chunk of load class 4 must be >= 0 (0: none), got -1"), std::string::npos);
  bad_rule.chunk_rule = WaveChunkRule{std::nan(""), {0, 2, 0, 0}};
  EXPECT_NE(msg(bad_rule).find("expected_rows must be finite and >= 0"), std::string::npos);
  PlanConfig bad_order = make_config(4, 1, 8, 2, 0, 128, 16, 1024);
  bad_order.pull_order = PullOrder(2);
  EXPECT_NE(msg(bad_order).find("pull_order must be source (0) or expert (1), got 2"), std::string::npos);
  bad_rule.chunk_rule = WaveChunkRule{-1.0, {}};
  EXPECT_NE(msg(bad_rule).find("expected_rows must be finite and >= 0, got -1"), std::string::npos);
}

TEST(PlanLayout, ArraysAreAlignedOrderedAndDisjoint) {
  const PlanConfig cfg = make_config(4, 2, 16, 3, 5, 64, 37, 64 * 11);
  const size_t W = 8, El = 4, k = 3, U = 8 * 37, R = 64 * 11, M = 11;
  std::vector<std::byte> block(plan_bytes(cfg) + 256);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(block.data()) + 255) / 256 * 256);
  const PlanView v = carve_plan(cfg, base);
  // In PlanView order, with their sizes in bytes.
  const std::vector<std::pair<const void*, size_t>> arrays = {
      {v.status, kPlanStatusWords * 4}, {v.first_error, kPlanStatusWords * 4},
      {v.src_tokens, W * 4},            {v.expert_rows, El * 4},
      {v.expert_offset, (El + 1) * 4},  {v.segment_offset, El * W * 4}, {v.segment_rows, El * W * 4},
      {v.num_units, 4},                 {v.num_local_units, 4},     {v.unit_src, U * 4},
      {v.unit_token, U * 4},            {v.unit_rows, U * k * 4},   {v.unit_gates, U * k * 4},
      {v.row_unit, R * 4},              {v.row_slot, R * 4},        {v.num_tiles, 4},
      {v.tile_expert, M * 4},           {v.tile_rows, M * 4},       {v.tile_remote_rows, M * 4},
      {v.tile_key, M * 4},              {v.tile_order, M * 4},      {v.pull_unit, U * 4}};
  EXPECT_EQ(arrays.front().first, base);
  for (size_t i = 0; i < arrays.size(); ++i) {
    const char* p = static_cast<const char*>(arrays[i].first);
    EXPECT_EQ((p - base) % 256, 0) << "array " << i;
    if (i + 1 < arrays.size()) {
      EXPECT_LE(p + arrays[i].second, static_cast<const char*>(arrays[i + 1].first)) << "array " << i;
    } else {
      EXPECT_LE(size_t(p + arrays[i].second - base), plan_bytes(cfg));
    }
  }
  EXPECT_EQ(plan_bytes(cfg) % 256, 0u);
}

TEST(PlanLayout, HostPlanCopiesOwnTheirStorage) {
  const PlanConfig cfg = make_config(2, 1, 4, 2, 0, 16, 4, 64);
  HostPlan a(cfg);
  EXPECT_EQ(a.bytes(), plan_bytes(cfg));
  a.view().tile_order[3] = 42;
  HostPlan b = a;
  EXPECT_NE(b.view().tile_order, a.view().tile_order);
  EXPECT_EQ(b.view().tile_order[3], 42);
  HostPlan c = std::move(b);
  EXPECT_EQ(c.view().tile_order[3], 42);
  EXPECT_EQ(b.view().status, nullptr);
  HostPlan d;
  d = c;
  EXPECT_EQ(d.view().tile_order[3], 42);
  EXPECT_NE(d.view().tile_order, c.view().tile_order);
}

TEST(PlanError, MessagesNameThePlace) {
  const int32_t range[] = {1, 2, 17, 1, 9};
  EXPECT_EQ(describe_plan_error(range, 8), "routing: expert id 9 out of range [0, 8) at rank 2, token 17, slot 1");
  EXPECT_EQ(describe_plan_error(range), "routing: expert id 9 out of range at rank 2, token 17, slot 1");
  const int32_t dup[] = {2, 3, 4, 5, 6};
  EXPECT_EQ(describe_plan_error(dup, 8),
            "routing: duplicate expert id 6 at rank 3, token 4, slot 5 (an earlier slot of the token chose it too)");
  const int32_t rows[] = {3, 70000, 65536, 0, 0};
  EXPECT_EQ(describe_plan_error(rows, 8),
            "routing: the plan needs 70000 rows (expert segments padded to tile_m), more than max_rows = 65536");
  const int32_t tokens[] = {4, 3, 5000, 4096, 0};
  EXPECT_EQ(describe_plan_error(tokens, 8), "routing: rank 3 has 5000 tokens, outside [0, 4096] (max_tokens_per_rank)");
  const int32_t ok[] = {0, 0, 0, 0, 0};
  EXPECT_EQ(describe_plan_error(ok, 8), "routing plan: no error");
  const int32_t unknown[] = {77, 0, 0, 0, 0};
  EXPECT_NE(describe_plan_error(unknown, 8).find("unknown error code 77"), std::string::npos);
}

// ---- hand-made plans ---------------------------------------------------------------------------

// W = 2 (EP), E = 4 (2 per rank), k = 2, tile_m = 16.
//   rank 0: t0 -> {1, 2}, t1 -> {0, 1}, t2 -> {3, 2}
//   rank 1: t0 -> {0, 3}, t1 -> {2, 1}
std::vector<RankRouting> two_rank_routing() {
  return {hand_routing(0, {{1, 2}, {0, 1}, {3, 2}}), hand_routing(1, {{0, 3}, {2, 1}})};
}

TEST(PlanHand, EpRankZero) {
  const PlanConfig cfg = make_config(2, 1, 4, 2, 0, 16, 4, 64);
  const auto routing = two_rank_routing();
  const HostPlan plan = build_plan_host(cfg, views(routing));
  const PlanView& v = plan.view();
  // Units: (0,t0) (0,t1) local, then (1,t0) (1,t1). Rank 0's t2 chose nothing here.
  // t1 chose experts 0 and 1, both here: ONE unit with two rows.
  EXPECT_EQ(arr(v.status, 5), std::vector<int32_t>(5, 0));
  EXPECT_EQ(arr(v.src_tokens, 2), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(*v.num_units, 4);
  EXPECT_EQ(*v.num_local_units, 2);
  EXPECT_EQ(arr(v.unit_src, 8), (std::vector<int32_t>{0, 0, 1, 1, -1, -1, -1, -1}));
  EXPECT_EQ(arr(v.unit_token, 8), (std::vector<int32_t>{0, 1, 0, 1, -1, -1, -1, -1}));
  // Expert 0: (0,t1) then (1,t0). Expert 1 from row 16: (0,t0) (0,t1) then (1,t1).
  EXPECT_EQ(arr(v.expert_rows, 2), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(arr(v.expert_offset, 3), (std::vector<int32_t>{0, 16, 32}));
  EXPECT_EQ(arr(v.segment_rows, 4), (std::vector<int32_t>{1, 1, 2, 1}));
  EXPECT_EQ(arr(v.segment_offset, 4), (std::vector<int32_t>{0, 1, 16, 18}));
  EXPECT_EQ(arr(v.unit_rows, 16), sparse(16, {{0, 16}, {2, 0}, {3, 17}, {4, 1}, {7, 18}}));
  std::vector<float> gates(16, 0.0f);
  gates[0] = hand_gate(0, 0, 0);
  gates[2] = hand_gate(0, 1, 0);
  gates[3] = hand_gate(0, 1, 1);
  gates[4] = hand_gate(1, 0, 0);
  gates[7] = hand_gate(1, 1, 1);
  EXPECT_EQ(arr(v.unit_gates, 16), gates);
  EXPECT_EQ(arr(v.row_unit, 64), sparse(64, {{0, 1}, {1, 2}, {16, 0}, {17, 1}, {18, 3}}));
  EXPECT_EQ(arr(v.row_slot, 64), sparse(64, {{0, 0}, {1, 0}, {16, 0}, {17, 1}, {18, 1}}));
  EXPECT_EQ(*v.num_tiles, 2);
  EXPECT_EQ(arr(v.tile_expert, 4), (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(arr(v.tile_rows, 4), (std::vector<int32_t>{2, 3, -1, -1}));
  EXPECT_EQ(arr(v.tile_remote_rows, 4), (std::vector<int32_t>{1, 1, -1, -1}));
  EXPECT_EQ(arr(v.tile_key, 4), (std::vector<int32_t>{2, 3, -1, -1}));
  EXPECT_EQ(arr(v.tile_order, 4), (std::vector<int32_t>{0, 1, -1, -1}));
}

TEST(PlanHand, EpRankOne) {
  const PlanConfig cfg = make_config(2, 1, 4, 2, 1, 16, 4, 64);
  const auto routing = two_rank_routing();
  const HostPlan plan = build_plan_host(cfg, views(routing));
  const PlanView& v = plan.view();
  // Position 0 is rank 1 itself, position 1 is rank 0. Local experts 2, 3.
  EXPECT_EQ(arr(v.src_tokens, 2), (std::vector<int32_t>{3, 2}));  // indexed by rank, not position
  EXPECT_EQ(*v.num_units, 4);
  EXPECT_EQ(*v.num_local_units, 2);
  EXPECT_EQ(arr(v.unit_src, 8), (std::vector<int32_t>{1, 1, 0, 0, -1, -1, -1, -1}));
  EXPECT_EQ(arr(v.unit_token, 8), (std::vector<int32_t>{0, 1, 0, 2, -1, -1, -1, -1}));
  // Expert 2: (1,t1) | (0,t0) (0,t2). Expert 3 from row 16: (1,t0) | (0,t2).
  EXPECT_EQ(arr(v.expert_rows, 2), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(arr(v.expert_offset, 3), (std::vector<int32_t>{0, 16, 32}));
  EXPECT_EQ(arr(v.segment_rows, 4), (std::vector<int32_t>{1, 2, 1, 1}));
  EXPECT_EQ(arr(v.segment_offset, 4), (std::vector<int32_t>{0, 1, 16, 17}));
  EXPECT_EQ(arr(v.unit_rows, 16), sparse(16, {{1, 16}, {2, 0}, {5, 1}, {6, 17}, {7, 2}}));
  EXPECT_EQ(arr(v.row_unit, 64), sparse(64, {{0, 1}, {1, 2}, {2, 3}, {16, 0}, {17, 3}}));
  EXPECT_EQ(arr(v.row_slot, 64), sparse(64, {{0, 0}, {1, 1}, {2, 1}, {16, 1}, {17, 0}}));
  EXPECT_EQ(v.unit_gates[7], hand_gate(0, 2, 1));
  EXPECT_EQ(v.unit_gates[6], hand_gate(0, 2, 0));
  EXPECT_EQ(v.unit_gates[0], 0.0f);
  EXPECT_EQ(*v.num_tiles, 2);
  EXPECT_EQ(arr(v.tile_expert, 4), (std::vector<int32_t>{0, 1, -1, -1}));
  EXPECT_EQ(arr(v.tile_rows, 4), (std::vector<int32_t>{3, 2, -1, -1}));
  EXPECT_EQ(arr(v.tile_remote_rows, 4), (std::vector<int32_t>{2, 1, -1, -1}));
  EXPECT_EQ(arr(v.tile_key, 4), (std::vector<int32_t>{3, 3, -1, -1}));  // equal keys: by m
  EXPECT_EQ(arr(v.tile_order, 4), (std::vector<int32_t>{0, 1, -1, -1}));
}

// k = 1, EP 4, rank 0 holds experts 0 and 1, 16 rows (one tile) per (expert, source) that has any:
//   expert 0: tiles 0, 1, 2 from ranks 1, 2, 3 (waves 1, 2, 3);
//   expert 1: tile 3 local, tiles 4, 5 from ranks 1 and 3 (waves 0, 1, 3).
std::vector<RankRouting> wave_chunk_hand_routing() {
  const std::vector<std::vector<int32_t>> to0(16, {0}), to1(16, {1});
  std::vector<std::vector<int32_t>> r1 = to0, r3 = to0;
  r1.insert(r1.end(), to1.begin(), to1.end());
  r3.insert(r3.end(), to1.begin(), to1.end());
  return {hand_routing(0, to1), hand_routing(1, r1), hand_routing(2, to0), hand_routing(3, r3)};
}

// wave_chunk cuts each expert's tiles into runs from its first tile, each run at its last tile's wave.
TEST(PlanHand, WaveChunkSchedulesAnExpertsTilesTogether) {
  const std::vector<RankRouting> routing = wave_chunk_hand_routing();
  const std::pair<int, std::vector<int32_t>> expected[] = {
      {1, {3, 0, 4, 1, 2, 5}},  // (wave, m): (0,3) (1,0) (1,4) (2,1) (3,2) (3,5)
      {2, {3, 4, 0, 1, 2, 5}},  // expert 0: {0,1} at 2, {2} at 3; expert 1: {3 local, 4 at 1}, {5} at 3
      {3, {3, 0, 1, 2, 4, 5}},  // expert 0: {0,1,2} at 3; expert 1: 3 local, {4,5} at 3
      {8, {3, 0, 1, 2, 4, 5}}};
  for (const auto& [chunk, order] : expected) {
    PlanConfig cfg = make_config(4, 1, 8, 1, 0, 16, 32, 128);
    cfg.wave_chunk = chunk;
    const HostPlan plan = build_plan_host(cfg, views(routing));
    const PlanView& v = plan.view();
    ASSERT_EQ(*v.num_tiles, 6);
    EXPECT_EQ(arr(v.tile_expert, 6), (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
    EXPECT_EQ(arr(v.tile_order, 8), (std::vector<int32_t>{order[0], order[1], order[2], order[3], order[4], order[5], -1, -1}))
        << "wave_chunk " << chunk;
  }
}

// The same routing (rank 0: 96 rows) under a chunk rule: the rank's load class, its rows against the
// rule's expected rows rounded to a power of two (1 below 1.41x, 2 below 2.83x, 4 below 5.66x, else 8),
// picks the chunk; a class without one, or no expected rows, keeps wave_chunk.
TEST(PlanHand, WaveChunkRuleFollowsTheRanksLoadClass) {
  const std::vector<RankRouting> routing = wave_chunk_hand_routing();
  // The orders of the test above: chunks 1, 2 and 3.
  const std::vector<int32_t> chunk1 = {3, 0, 4, 1, 2, 5, -1, -1}, chunk2 = {3, 4, 0, 1, 2, 5, -1, -1},
                             chunk3 = {3, 0, 1, 2, 4, 5, -1, -1};
  const WaveChunkRule rule_a{0, {0, 2, 3, 1}}, rule_b{0, {2, 0, 0, 3}};
  const struct {
    WaveChunkRule rule;
    double expected_rows;
    const std::vector<int32_t>& order;
  } cases[] = {
      {rule_a, 96.0, chunk1},   // 1.0x: class 1, no chunk: wave_chunk 1
      {rule_a, 68.0, chunk1},   // 1.41x: just below class 2
      {rule_a, 67.0, chunk2},   // 1.43x: class 2
      {rule_a, 48.0, chunk2},   // 2.0x: class 2
      {rule_a, 34.0, chunk2},   // 2.82x: just below class 4
      {rule_a, 33.0, chunk3},   // 2.91x: class 4
      {rule_a, 24.0, chunk3},   // 4.0x: class 4
      {rule_a, 12.0, chunk1},   // 8.0x: class 8, chunk 1
      {rule_b, 100.0, chunk2},  // 0.96x: class 1 has a chunk too
      {rule_b, 16.0, chunk3},   // 6.0x: class 8
      {rule_b, 0.0, chunk1},    // no expected rows: no rule
  };
  for (const auto& c : cases) {
    PlanConfig cfg = make_config(4, 1, 8, 1, 0, 16, 32, 128);
    cfg.chunk_rule = c.rule;
    cfg.chunk_rule.expected_rows = c.expected_rows;
    const HostPlan plan = build_plan_host(cfg, views(routing));
    ASSERT_EQ(std::accumulate(plan.view().expert_rows, plan.view().expert_rows + 2, 0), 96);
    EXPECT_EQ(arr(plan.view().tile_order, 8), c.order)
        << "expected_rows " << c.expected_rows << ", chunks " << c.rule.by_load[0] << " " << c.rule.by_load[1] << " "
        << c.rule.by_load[2] << " " << c.rule.by_load[3];
  }
}

// Rank 0 of EP 3 (experts 0 and 1 here), k = 2, tile 16. Rank 0: t0 -> {0, 2}. Rank 1: t0 -> {1, 4},
// t1 -> {0, 1}. Rank 2: t0 -> {0, 5}. Units: (0,t0) local = 0, (1,t0) = 1, (1,t1) = 2, (2,t0) = 3.
// Expert 0 (tile 0): rows 0 (unit 0), 1 (unit 2), 2 (unit 3); expert 1 (tile 1): rows 16 (unit 1), 17 (unit 2).
// Source by source, tile 1 completes in wave 1 and tile 0 in wave 2: order {1, 0}. Expert by expert,
// the pulls go by first row: unit 2 (row 1), 3 (row 2), 1 (row 16), and the tiles in m order.
TEST(PlanHand, PullOrderExpertByExpert) {
  const std::vector<RankRouting> routing = {hand_routing(0, {{0, 2}}), hand_routing(1, {{1, 4}, {0, 1}}),
                                            hand_routing(2, {{0, 5}})};
  const struct {
    PullOrder order;
    std::vector<int32_t> pulls, tiles;
  } cases[] = {{PullOrder::source, {0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1, -1}, {1, 0, -1, -1}},
               {PullOrder::expert, {0, 2, 3, 1, -1, -1, -1, -1, -1, -1, -1, -1}, {0, 1, -1, -1}}};
  for (const auto& c : cases) {
    PlanConfig cfg = make_config(3, 1, 6, 2, 0, 16, 4, 64);
    cfg.pull_order = c.order;
    const HostPlan plan = build_plan_host(cfg, views(routing));
    const PlanView& v = plan.view();
    ASSERT_EQ(*v.num_units, 4);
    EXPECT_EQ(arr(v.row_unit, 3), (std::vector<int32_t>{0, 2, 3}));
    EXPECT_EQ(arr(v.row_unit + 16, 2), (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(arr(v.pull_unit, 12), c.pulls) << "pull order " << int(c.order);
    EXPECT_EQ(arr(v.tile_order, 4), c.tiles) << "pull order " << int(c.order);
  }
}

// k = 1. Rank 0: 20 tokens to expert 1 (local, 2 tiles). Rank 1: 3 tokens to expert 0 (remote).
// The all-local tiles of expert 1 are scheduled before expert 0's tile that waits for the pull.
TEST(PlanHand, LocalTilesFirstAndEmptyPlan) {
  std::vector<std::vector<int32_t>> r0(20, {1}), r1(3, {0});
  const std::vector<RankRouting> routing = {hand_routing(0, r0), hand_routing(1, r1)};
  const HostPlan plan = build_plan_host(make_config(2, 1, 4, 1, 0, 16, 32, 64), views(routing));
  const PlanView& v = plan.view();
  EXPECT_EQ(*v.num_units, 23);
  EXPECT_EQ(*v.num_local_units, 20);
  EXPECT_EQ(arr(v.expert_rows, 2), (std::vector<int32_t>{3, 20}));
  EXPECT_EQ(arr(v.expert_offset, 3), (std::vector<int32_t>{0, 16, 48}));
  EXPECT_EQ(arr(v.segment_offset, 4), (std::vector<int32_t>{0, 0, 16, 36}));
  for (int row = 0; row < 3; ++row) EXPECT_EQ(v.row_unit[row], 20 + row);
  for (int row = 16; row < 36; ++row) EXPECT_EQ(v.row_unit[row], row - 16);
  EXPECT_EQ(*v.num_tiles, 3);
  EXPECT_EQ(arr(v.tile_expert, 4), (std::vector<int32_t>{0, 1, 1, -1}));
  EXPECT_EQ(arr(v.tile_rows, 4), (std::vector<int32_t>{3, 16, 4, -1}));
  EXPECT_EQ(arr(v.tile_remote_rows, 4), (std::vector<int32_t>{3, 0, 0, -1}));
  EXPECT_EQ(arr(v.tile_key, 4), (std::vector<int32_t>{22, -1, -1, -1}));
  EXPECT_EQ(arr(v.tile_order, 4), (std::vector<int32_t>{1, 2, 0, -1}));

  // Rank 1 holds experts 2 and 3, which nobody chose: an empty plan, everything "unused".
  const HostPlan empty = build_plan_host(make_config(2, 1, 4, 1, 1, 16, 32, 64), views(routing));
  const PlanView& e = empty.view();
  EXPECT_EQ(arr(e.src_tokens, 2), (std::vector<int32_t>{20, 3}));
  EXPECT_EQ(*e.num_units, 0);
  EXPECT_EQ(*e.num_local_units, 0);
  EXPECT_EQ(*e.num_tiles, 0);
  EXPECT_EQ(arr(e.expert_offset, 3), (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(arr(e.unit_src, 64), std::vector<int32_t>(64, -1));
  EXPECT_EQ(arr(e.row_unit, 64), std::vector<int32_t>(64, -1));
  EXPECT_EQ(arr(e.tile_order, 4), std::vector<int32_t>(4, -1));
}

// TP = 2, E = 2, k = 2: every rank holds every expert, every slot is a row on every rank.
// Rank 0: t0 -> {0, 1}. Rank 1: t0 -> {1, 0}, t1 -> {0, 1}. Plan of rank 1.
TEST(PlanHand, TensorParallelRankOne) {
  const std::vector<RankRouting> routing = {hand_routing(0, {{0, 1}}), hand_routing(1, {{1, 0}, {0, 1}})};
  const HostPlan plan = build_plan_host(make_config(1, 2, 2, 2, 1, 16, 2, 32), views(routing));
  const PlanView& v = plan.view();
  EXPECT_EQ(*v.num_units, 3);
  EXPECT_EQ(*v.num_local_units, 2);
  EXPECT_EQ(arr(v.unit_src, 4), (std::vector<int32_t>{1, 1, 0, -1}));
  EXPECT_EQ(arr(v.unit_token, 4), (std::vector<int32_t>{0, 1, 0, -1}));
  EXPECT_EQ(arr(v.segment_rows, 4), (std::vector<int32_t>{2, 1, 2, 1}));
  EXPECT_EQ(arr(v.segment_offset, 4), (std::vector<int32_t>{0, 2, 16, 18}));
  EXPECT_EQ(arr(v.unit_rows, 8), (std::vector<int32_t>{16, 0, 1, 17, 2, 18, -1, -1}));
  EXPECT_EQ(arr(v.row_unit, 32), sparse(32, {{0, 0}, {1, 1}, {2, 2}, {16, 0}, {17, 1}, {18, 2}}));
  EXPECT_EQ(arr(v.row_slot, 32), sparse(32, {{0, 1}, {1, 0}, {2, 0}, {16, 0}, {17, 1}, {18, 1}}));
  EXPECT_EQ(arr(v.tile_rows, 2), (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(arr(v.tile_remote_rows, 2), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(arr(v.tile_key, 2), (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(arr(v.tile_order, 2), (std::vector<int32_t>{0, 1}));
}

// ---- properties on random routings -------------------------------------------------------------

// Checks plan.hpp's definitions on a plan, from the routing, without the builder's algorithm.
void check_properties(const PlanConfig& cfg, const std::vector<RankRouting>& routing, const HostPlan& plan) {
  const PlanView& v = plan.view();
  const int W = cfg.world(), El = cfg.local_experts(), e0 = cfg.first_local_expert(), k = cfg.topk();
  const int tm = cfg.tile_m, U = cfg.max_units(), R = cfg.cap.max_rows, M = cfg.max_tiles();
  for (int i = 0; i < kPlanStatusWords; ++i) ASSERT_EQ(v.status[i], 0);
  for (int s = 0; s < W; ++s) ASSERT_EQ(v.src_tokens[s], routing[s].tokens);
  auto expert_of = [&](int s, int t, int slot) { return routing[s].ids[size_t(t) * k + slot]; };
  auto is_local = [&](int id) { return id >= e0 && id < e0 + El; };

  // Units: every (source, token) with a local expert, in (position, token) order.
  std::vector<std::pair<int, int>> units;
  int local_units = 0;
  std::vector<int> rows_of_expert(El, 0);
  for (int j = 0; j < W; ++j) {
    const int s = (cfg.rank + j) % W;
    for (int t = 0; t < routing[s].tokens; ++t) {
      bool here = false;
      for (int slot = 0; slot < k; ++slot) {
        if (is_local(expert_of(s, t, slot))) {
          here = true;
          ++rows_of_expert[expert_of(s, t, slot) - e0];
        }
      }
      if (here) {
        units.emplace_back(s, t);
        local_units += j == 0;
      }
    }
  }
  ASSERT_EQ(*v.num_units, int(units.size()));
  ASSERT_EQ(*v.num_local_units, local_units);
  for (int u = 0; u < U; ++u) {
    if (u < int(units.size())) {
      ASSERT_EQ(v.unit_src[u], units[u].first) << "unit " << u;
      ASSERT_EQ(v.unit_token[u], units[u].second) << "unit " << u;
    } else {
      ASSERT_EQ(v.unit_src[u], -1);
      ASSERT_EQ(v.unit_token[u], -1);
    }
  }

  // Each (unit, slot) whose expert is here has exactly one row, which points back at it; the gate
  // is the routing's. Other slots and unused units hold -1 / 0.
  for (int u = 0; u < U; ++u) {
    for (int slot = 0; slot < k; ++slot) {
      const int32_t row = v.unit_rows[size_t(u) * k + slot];
      const float gate = v.unit_gates[size_t(u) * k + slot];
      if (u < int(units.size()) && is_local(expert_of(units[u].first, units[u].second, slot))) {
        ASSERT_GE(row, 0);
        ASSERT_LT(row, R);
        ASSERT_EQ(v.row_unit[row], u);
        ASSERT_EQ(v.row_slot[row], slot);
        ASSERT_EQ(gate, routing[units[u].first].gates[size_t(units[u].second) * k + slot]);
      } else {
        ASSERT_EQ(row, -1) << "unit " << u << " slot " << slot;
        ASSERT_EQ(gate, 0.0f);
      }
    }
  }
  for (int row = 0; row < R; ++row) {
    const int u = v.row_unit[row];
    if (u < 0) {
      ASSERT_EQ(v.row_slot[row], -1) << "row " << row;
      continue;
    }
    ASSERT_LT(u, int(units.size()));
    ASSERT_GE(v.row_slot[row], 0);
    ASSERT_EQ(v.unit_rows[size_t(u) * k + v.row_slot[row]], row) << "row " << row;
  }

  // Expert segments: padded to tile_m, filled at the front, positions in order, tokens increasing.
  ASSERT_EQ(v.expert_offset[0], 0);
  for (int e = 0; e < El; ++e) {
    ASSERT_EQ(v.expert_rows[e], rows_of_expert[e]) << "expert " << e;
    ASSERT_EQ(v.expert_offset[e] % tm, 0);
    ASSERT_EQ(v.expert_offset[e + 1] - v.expert_offset[e], (rows_of_expert[e] + tm - 1) / tm * tm) << "expert " << e;
    int row = v.expert_offset[e];
    for (int j = 0; j < W; ++j) {
      ASSERT_EQ(v.segment_offset[e * W + j], row) << "segment " << e << "," << j;
      const int s = (cfg.rank + j) % W;
      int last_token = -1;
      for (int i = 0; i < v.segment_rows[e * W + j]; ++i, ++row) {
        const int u = v.row_unit[row];
        ASSERT_GE(u, 0) << "row " << row;
        ASSERT_EQ(v.unit_src[u], s) << "row " << row;
        ASSERT_GT(v.unit_token[u], last_token) << "row " << row;
        last_token = v.unit_token[u];
        ASSERT_EQ(expert_of(s, last_token, v.row_slot[row]), e0 + e) << "row " << row;
      }
    }
    ASSERT_EQ(row, v.expert_offset[e] + v.expert_rows[e]);
    for (; row < v.expert_offset[e + 1]; ++row) ASSERT_EQ(v.row_unit[row], -1) << "padding row " << row;
  }
  for (int row = v.expert_offset[El]; row < R; ++row) ASSERT_EQ(v.row_unit[row], -1);

  // Tiles: one expert each, counts and key read off the rows; the order sorted by (key, m).
  const int tiles = v.expert_offset[El] / tm;
  ASSERT_EQ(*v.num_tiles, tiles);
  for (int m = 0; m < M; ++m) {
    if (m >= tiles) {
      ASSERT_EQ(v.tile_expert[m], -1);
      ASSERT_EQ(v.tile_rows[m], -1);
      ASSERT_EQ(v.tile_remote_rows[m], -1);
      ASSERT_EQ(v.tile_key[m], -1);
      ASSERT_EQ(v.tile_order[m], -1);
      continue;
    }
    const int e = v.tile_expert[m];
    ASSERT_GE(e, 0);
    ASSERT_LT(e, El);
    ASSERT_LE(v.expert_offset[e], m * tm);
    ASSERT_LT(m * tm, v.expert_offset[e + 1]);
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
    ASSERT_GT(rows, 0);
    ASSERT_EQ(v.tile_rows[m], rows) << "tile " << m;
    ASSERT_EQ(v.tile_remote_rows[m], remote) << "tile " << m;
    ASSERT_EQ(v.tile_key[m], key) << "tile " << m;
  }
  // The order: by (order wave, m). A tile's wave is the source position of its last remote row (0 if
  // none); its order wave is 0 for an all-local tile, else the latest wave among the tiles of its chunk
  // (its expert's tiles cut into runs of the chunk from the expert's first tile). The chunk: wave_chunk,
  // or the chunk rule's for the rank's load class (its rows / expected rows: below sqrt 2 class 1, below
  // 2 sqrt 2 class 2, below 4 sqrt 2 class 4, else 8) where the rule has one.
  int chunk = cfg.wave_chunk;
  if (cfg.chunk_rule.expected_rows > 0) {
    const double x = std::accumulate(v.expert_rows, v.expert_rows + El, 0) / cfg.chunk_rule.expected_rows;
    const int c = cfg.chunk_rule.by_load[x < std::sqrt(2.0) ? 0 : x < std::sqrt(8.0) ? 1 : x < std::sqrt(32.0) ? 2 : 3];
    if (c > 0) chunk = c;
  }
  // Pulled expert by expert, every tile that waits for a pull is in wave 1.
  const bool by_expert = cfg.pull_order == PullOrder::expert;
  const auto wave = [&](int t) {
    return v.tile_key[t] < 0 ? 0 : by_expert ? 1 : cfg.position_of(v.unit_src[v.tile_key[t]]);
  };
  const auto order_wave = [&](int t) {
    if (v.tile_key[t] < 0) return 0;
    const int e = v.tile_expert[t], first = v.expert_offset[e] / tm, end = v.expert_offset[e + 1] / tm;
    const int lo = first + (t - first) / chunk * chunk;
    int latest = 0;
    for (int c = lo; c < std::min(lo + chunk, end); ++c) latest = std::max(latest, wave(c));
    return latest;
  };
  std::vector<int> seen(tiles, 0);
  for (int i = 0; i < tiles; ++i) {
    const int m = v.tile_order[i];
    ASSERT_GE(m, 0);
    ASSERT_LT(m, tiles);
    ++seen[m];
    if (i > 0) {
      const int p = v.tile_order[i - 1];
      ASSERT_LT(std::make_pair(order_wave(p), p), std::make_pair(order_wave(m), m)) << "order position " << i;
    }
  }
  ASSERT_EQ(seen, std::vector<int>(tiles, 1));

  // Pull positions: the local units in unit order, then every remote unit once: in unit order (source),
  // or (expert) by the smallest row any of its slots has here; -1 past the units.
  const int units_here = int(units.size());
  std::vector<std::pair<int, int>> remote;  // (sort key, unit)
  for (int u = local_units; u < units_here; ++u) {
    int first_row = R;
    for (int slot = 0; slot < k; ++slot)
      if (v.unit_rows[size_t(u) * k + slot] >= 0) first_row = std::min(first_row, int(v.unit_rows[size_t(u) * k + slot]));
    remote.emplace_back(by_expert ? first_row : u, u);
  }
  std::sort(remote.begin(), remote.end());
  for (int p = 0; p < U; ++p) {
    const int expected = p < local_units ? p : p < units_here ? remote[p - local_units].second : -1;
    ASSERT_EQ(v.pull_unit[p], expected) << "pull position " << p;
  }
  // Expert by expert, no tile waits for a later tile's pulls: tile m is complete once the pull has
  // passed the units whose first row is in tiles 0..m (its last pull is before that count's end).
  if (by_expert) {
    std::vector<int> position_of_unit(units_here, -1);
    for (int p = 0; p < units_here; ++p) position_of_unit[v.pull_unit[p]] = p;
    int pulled = local_units;  // positions of the units first-rowed in tiles 0..m
    for (int m = 0; m < tiles; ++m) {
      int done = -1;
      for (int row = m * tm; row < (m + 1) * tm; ++row) {
        const int u = v.row_unit[row];
        if (u < local_units) continue;
        done = std::max(done, position_of_unit[u]);
        bool first = true;  // no row of the unit before this one
        for (int slot = 0; slot < k; ++slot) first &= v.unit_rows[size_t(u) * k + slot] < 0 || v.unit_rows[size_t(u) * k + slot] >= row;
        pulled += first;
      }
      ASSERT_LT(done, pulled) << "tile " << m;
    }
  }
}

TEST(PlanProperties, RandomRoutingsOverLayouts) {
  const int E = 16, max_tokens = 40;
  const RoutingKind kinds[] = {RoutingKind::uniform, RoutingKind::zipf, RoutingKind::one_expert,
                               RoutingKind::local_only};
  uint64_t seed = 1;
  int plans = 0;
  for (int W : {1, 2, 4, 8}) {
    for (const Layout& lay : layouts_of(W)) {
      for (int k : {1, 2, 8}) {
        for (RoutingKind kind : kinds) {
          // local_only draws k distinct experts from the source's own group.
          if (kind == RoutingKind::local_only && E / lay.ep < k) continue;
          for (int variant = 0; variant < 2; ++variant, ++seed) {
            std::mt19937 rng(uint32_t(seed) * 7919u);
            // Token counts: random, with a rank of 0 tokens and one at capacity when W > 1.
            std::vector<int> tokens(W);
            for (int& t : tokens) t = std::uniform_int_distribution<int>(0, max_tokens)(rng);
            if (W > 1) {
              tokens[seed % W] = 0;
              tokens[(seed + 1) % W] = max_tokens;
            }
            const int hot = std::uniform_int_distribution<int>(0, E - 1)(rng);
            const auto routing = make_routing(MoeShape{64, 128, E, k, Activation::swiglu}, Parallel{lay.ep, lay.tp},
                                              tokens, kind, seed, hot);
            const int tile_m = variant == 0 ? 16 : 64;
            const int wave_chunk = 1 + int(seed % 3);
            for (int rank = 0; rank < W; ++rank) {
              PlanConfig cfg = make_config(lay.ep, lay.tp, E, k, rank, tile_m, max_tokens,
                                           worst_rows(W, max_tokens, k, E / lay.ep, tile_m));
              cfg.wave_chunk = wave_chunk;
              if (seed % 3 != 1) cfg.pull_order = PullOrder::expert;  // two plans in three
              // Every other plan under a chunk rule whose expected rows put the ranks in various classes.
              if (seed % 2) cfg.chunk_rule = WaveChunkRule{0.5 + (seed + rank) % 7 * 6.0, {0, 2, 3, 5}};
              SCOPED_TRACE(::testing::Message() << "W=" << W << " ep=" << lay.ep << " tp=" << lay.tp << " k=" << k
                                              << " " << testing::to_string(kind) << " tile_m=" << tile_m
                                              << " wave_chunk=" << wave_chunk << " pulls by "
                                              << (cfg.pull_order == PullOrder::expert ? "expert" : "source")
                                              << " rule expected_rows="
                                              << cfg.chunk_rule.expected_rows << " rank=" << rank << " seed=" << seed);
              const HostPlan plan = build_plan_host(cfg, views(routing));
              check_properties(cfg, routing, plan);
              if (::testing::Test::HasFatalFailure()) return;
              ++plans;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 500);
}

// comet-bench --expert-order size's rewrite of a plan (harness/plan_rewrite.hpp) over random routings
// and layouts: the order its definition gives (expect_smallest_expert_first), from expert-order plans.
TEST(PlanProperties, SmallestExpertFirstRewrite) {
  const int E = 16, max_tokens = 40;
  uint64_t seed = 11;
  int rewritten = 0;
  for (int W : {2, 4, 8}) {
    for (const Layout& lay : layouts_of(W)) {
      for (int k : {1, 2, 8}) {
        for (RoutingKind kind : {RoutingKind::uniform, RoutingKind::zipf, RoutingKind::one_expert}) {
          std::mt19937 rng(uint32_t(++seed) * 7919u);
          std::vector<int> tokens(W);
          for (int& t : tokens) t = std::uniform_int_distribution<int>(0, max_tokens)(rng);
          tokens[seed % W] = 0;
          const auto routing = make_routing(MoeShape{64, 128, E, k, Activation::swiglu}, Parallel{lay.ep, lay.tp},
                                            tokens, kind, seed, int(seed % E));
          for (int rank = 0; rank < W; ++rank) {
            PlanConfig cfg = make_config(lay.ep, lay.tp, E, k, rank, 16, max_tokens,
                                         worst_rows(W, max_tokens, k, E / lay.ep, 16));
            cfg.pull_order = PullOrder::expert;
            SCOPED_TRACE(::testing::Message() << "W=" << W << " ep=" << lay.ep << " tp=" << lay.tp << " k=" << k << " "
                                            << testing::to_string(kind) << " rank=" << rank << " seed=" << seed);
            const HostPlan plan = build_plan_host(cfg, views(routing));
            const testing::Layer0Order order = testing::smallest_expert_first(cfg, plan.view());
            testing::expect_smallest_expert_first(cfg, plan.view(), order.pull_unit, order.tile_order);
            if (::testing::Test::HasFatalFailure()) return;
            rewritten += *plan.view().num_units > *plan.view().num_local_units;
          }
        }
      }
    }
  }
  EXPECT_GT(rewritten, 50);
}

TEST(PlanProperties, EdgeCases) {
  const MoeShape shape{64, 128, 8, 2, Activation::swiglu};
  auto run = [&](const Parallel& par, const std::vector<RankRouting>& routing, int tile_m, const char* what) {
    for (int rank = 0; rank < par.world(); ++rank) {
      for (PullOrder order : {PullOrder::source, PullOrder::expert}) {
        SCOPED_TRACE(::testing::Message() << what << " rank=" << rank << " pull order " << int(order));
        PlanConfig cfg = make_config(par.ep, par.tp, 8, 2, rank, tile_m, 64, worst_rows(par.world(), 64, 2, 8 / par.ep, tile_m));
        cfg.pull_order = order;
        check_properties(cfg, routing, build_plan_host(cfg, views(routing)));
      }
    }
  };
  // Nobody has tokens.
  run(Parallel{4, 1}, make_routing(shape, Parallel{4, 1}, {0, 0, 0, 0}, RoutingKind::uniform, 3), 16, "no tokens");
  // All tokens' first slot to expert 5; every rank at capacity: one expert takes W * T rows.
  run(Parallel{2, 2}, make_routing(shape, Parallel{2, 2}, {64, 64, 64, 64}, RoutingKind::one_expert, 4, 5), 16,
      "one hot expert");
  // Exactly one tile's worth of rows per expert (tokens 0..15 of rank 0 to experts {0, 1}).
  std::vector<std::vector<int32_t>> ids(16, {0, 1});
  run(Parallel{2, 1}, {hand_routing(0, ids), hand_routing(1, {})}, 16, "full tiles");
  // One row more than a tile.
  ids.push_back({1, 0});
  run(Parallel{2, 1}, {hand_routing(0, ids), hand_routing(1, {{3, 0}})}, 16, "one past a tile");
}

TEST(PlanProperties, RowCapacityIsExact) {
  // 40 tokens of rank 0 to expert 0 (local, k = 1): 40 rows -> 48 padded with tile_m = 16.
  const std::vector<RankRouting> routing = {hand_routing(0, std::vector<std::vector<int32_t>>(40, {0})),
                                            hand_routing(1, {})};
  EXPECT_NO_THROW(build_plan_host(make_config(2, 1, 4, 1, 0, 16, 40, 48), views(routing)));
  EXPECT_EQ(message_of(make_config(2, 1, 4, 1, 0, 16, 40, 32), routing),
            "routing: the plan needs 48 rows (expert segments padded to tile_m), more than max_rows = 32");
  // Rank 1's plan has no rows at all, whatever its capacity.
  EXPECT_NO_THROW(build_plan_host(make_config(2, 1, 4, 1, 1, 16, 40, 16), views(routing)));
}

// ---- bad routing -------------------------------------------------------------------------------

// W = 4 (EP), E = 8, k = 2, 20 tokens per rank, valid except what each test breaks.
std::vector<RankRouting> valid_routing() {
  const MoeShape shape{64, 128, 8, 2, Activation::swiglu};
  return make_routing(shape, Parallel{4, 1}, {20, 20, 20, 20}, RoutingKind::uniform, 11);
}
PlanConfig bad_routing_config(int rank = 0) { return make_config(4, 1, 8, 2, rank, 64, 20, 640); }

TEST(PlanBadRouting, ExpertOutOfRange) {
  auto routing = valid_routing();
  routing[2].ids[17 * 2 + 1] = 9;
  for (int rank = 0; rank < 4; ++rank)  // every rank checks every rank's routing
    EXPECT_EQ(message_of(bad_routing_config(rank), routing),
              "routing: expert id 9 out of range [0, 8) at rank 2, token 17, slot 1");
  routing[2].ids[17 * 2 + 1] = 8;
  EXPECT_EQ(message_of(bad_routing_config(), routing), "routing: expert id 8 out of range [0, 8) at rank 2, token 17, slot 1");
}

TEST(PlanBadRouting, NegativeExpert) {
  auto routing = valid_routing();
  routing[0].ids[0] = -1;
  EXPECT_EQ(message_of(bad_routing_config(3), routing), "routing: expert id -1 out of range [0, 8) at rank 0, token 0, slot 0");
}

TEST(PlanBadRouting, DuplicateExpert) {
  auto routing = valid_routing();
  routing[1].ids[5 * 2 + 1] = routing[1].ids[5 * 2 + 0];
  const int id = routing[1].ids[10];
  EXPECT_EQ(message_of(bad_routing_config(2), routing),
            "routing: duplicate expert id " + std::to_string(id) +
                " at rank 1, token 5, slot 1 (an earlier slot of the token chose it too)");
}

TEST(PlanBadRouting, NonFiniteGate) {
  auto routing = valid_routing();
  routing[2].gates[6 * 2 + 1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(message_of(bad_routing_config(1), routing),
            "routing: gate weight nan at rank 2, token 6, slot 1 (gate weights must be finite)");
  routing[2].gates[6 * 2 + 1] = 0.5f;
  routing[0].gates[19 * 2] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(message_of(bad_routing_config(), routing),
            "routing: gate weight -inf at rank 0, token 19, slot 0 (gate weights must be finite)");
  // In one slot the id comes first: an id out of range with a NaN gate is named as the id.
  routing[0].ids[19 * 2] = 8;
  EXPECT_NE(message_of(bad_routing_config(), routing).find("expert id 8 out of range"), std::string::npos);
}

TEST(PlanBadRouting, TooManyTokens) {
  auto routing = valid_routing();
  routing[3].tokens = 21;
  routing[3].ids.insert(routing[3].ids.end(), {0, 1});
  routing[3].gates.insert(routing[3].gates.end(), {0.5f, 0.5f});
  EXPECT_EQ(message_of(bad_routing_config(), routing), "routing: rank 3 has 21 tokens, outside [0, 20] (max_tokens_per_rank)");
  routing[3].tokens = -2;
  EXPECT_EQ(message_of(bad_routing_config(), routing), "routing: rank 3 has -2 tokens, outside [0, 20] (max_tokens_per_rank)");
}

TEST(PlanBadRouting, FirstErrorInRankTokenSlotOrder) {
  auto routing = valid_routing();
  routing[3].ids[0] = 99;
  routing[1].ids[5 * 2 + 1] = -5;
  routing[1].ids[7 * 2 + 0] = 77;
  EXPECT_EQ(message_of(bad_routing_config(), routing), "routing: expert id -5 out of range [0, 8) at rank 1, token 5, slot 1");
  // A token count beats any expert id, whatever the ranks.
  routing[2].tokens = 30;
  routing[2].ids.resize(60, 0);
  routing[2].gates.resize(60, 0.5f);
  EXPECT_EQ(message_of(bad_routing_config(), routing), "routing: rank 2 has 30 tokens, outside [0, 20] (max_tokens_per_rank)");
  // Kinds do not rank: a duplicate at (rank 0, token 0, slot 1) comes before an id out of range at
  // (rank 0, token 1, slot 0).
  auto dup = valid_routing();
  dup[0].ids[1] = dup[0].ids[0];
  dup[0].ids[2] = 50;
  EXPECT_NE(message_of(bad_routing_config(), dup).find("duplicate expert id"), std::string::npos);
}

TEST(PlanBadRouting, WrongRankCount) {
  auto routing = valid_routing();
  routing.pop_back();
  EXPECT_NE(message_of(bad_routing_config(), routing).find("routing has 3 ranks, the layout has 4"), std::string::npos);
}

}  // namespace
}  // namespace comet
