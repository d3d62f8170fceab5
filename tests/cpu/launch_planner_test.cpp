// The launch planner on the host: every rule that shapes a launch (forced fields, table, cost model,
// clamps, schedule, rasterisation group, adaptive split) with a stand-in device of 132 SMs.
#include <gtest/gtest.h>

#include "comet/fused_moe.hpp"
#include "kernels/kernel_split.hpp"
#include "tune/launch_planner.hpp"

using namespace comet;

namespace {

const MoeShape kMixtral{4096, 14336, 8, 2, Activation::swiglu};

DeviceCaps h200_like(int* queries = nullptr) {
  DeviceCaps c;
  c.gpu = "TestGPU";
  c.sms = 132;
  c.l2_bytes = 60u << 20;
  c.resident_blocks = [queries](int, int) {
    if (queries) ++*queries;
    return 132;
  };
  return c;
}

LaunchPlanner planner(const Parallel& par, TuneTable table = {}, bool adaptive = true, int* queries = nullptr) {
  return LaunchPlanner(kMixtral, par, Link::host, h200_like(queries), std::move(table), PlannerPolicy{adaptive, false});
}

LayerRequest with_gemm(LayerRequest r, StandaloneGemm gemm) {
  r.standalone_gemm = gemm;
  return r;
}

LayerRequest tile(int tile_n) {
  LayerRequest r;
  r.tile_n = tile_n;
  return r;
}

TEST(LaunchPlanner, ForcedRequestIsObeyed) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  LayerRequest r = LayerRequest::forced(128, 5);
  r.m_group = 3;
  r.n_group = 2;
  const LaunchDecision& d = p.plan(1, LayerMode::fused, 4096, r).decision;
  EXPECT_STREQ(d.picked_by, "forced");
  EXPECT_EQ(d.tile_n, 128);
  EXPECT_EQ(d.n_comm, 5);
  EXPECT_EQ(d.m_group, 3);
  EXPECT_EQ(d.n_group, 2);
  EXPECT_EQ(d.schedule, Schedule::fused);
  EXPECT_EQ(d.resident_blocks, 132);
  EXPECT_FALSE(d.adaptive);  // the caller chose n_comm: the kernel keeps it
}

TEST(LaunchPlanner, TableThenCostModelAndEveryRequestFieldKept) {
  TuneTable t;
  LaunchPlanner probe = planner(Parallel{8, 1});
  t.put(probe.key(0, 4096), TuneEntry{LayerVariant{128, 200, 0, 1}, 1.0});  // n_comm above the grid
  const LaunchPlanner p = planner(Parallel{8, 1}, t);
  const LaunchDecision& hit = p.plan(0, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_STREQ(hit.picked_by, "table");
  EXPECT_EQ(hit.tile_n, 128);
  EXPECT_EQ(hit.n_comm, 131);  // clamped: leaves one compute block
  EXPECT_TRUE(hit.adaptive);
  LayerRequest group = tile(256);
  group.m_group = 7;
  const LaunchDecision& g = p.plan(0, LayerMode::fused, 4096, group).decision;
  EXPECT_EQ(g.tile_n, 256);
  EXPECT_EQ(g.m_group, 7);  // a table hit no longer drops a requested m_group
  const LaunchDecision& miss = p.plan(0, LayerMode::fused, 16384, LayerRequest{}).decision;
  EXPECT_STREQ(miss.picked_by, "cost_model");
  EXPECT_GE(miss.n_comm, 0);
}

TEST(LaunchPlanner, MemoKeysOnEveryRequestField) {
  int queries = 0;
  const LaunchPlanner p = planner(Parallel{8, 1}, {}, true, &queries);
  LayerRequest a = tile(256), b = tile(256);
  a.m_group = 2;
  b.m_group = 9;
  const LaunchDecision& da = p.plan(0, LayerMode::fused, 4096, a).decision;
  const LaunchDecision& db = p.plan(0, LayerMode::fused, 4096, b).decision;
  EXPECT_EQ(da.m_group, 2);
  EXPECT_EQ(db.m_group, 9);  // the first caller's knobs are not handed to the second
  EXPECT_EQ(&da, &p.plan(0, LayerMode::fused, 4096, a).decision);  // made once, then found
  EXPECT_EQ(queries, 1);                                           // the device is asked once per (layer, tile)
  EXPECT_NE(&da, &p.plan(0, LayerMode::fused, 4097, a).decision);  // tokens are part of the key
}

TEST(LaunchPlanner, SequentialScheduleAndSingleRank) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  const LaunchDecision& seq = p.plan(0, LayerMode::fused, 4096, LayerRequest::forced(256, 0)).decision;
  EXPECT_EQ(seq.schedule, Schedule::sequential);
  EXPECT_EQ(seq.n_comm, 0);
  EXPECT_FALSE(seq.adaptive);
  // One rank: layer 0 has nothing to pull, so the tuner's pick becomes the sequential schedule.
  const LaunchPlanner one = planner(Parallel{1, 1});
  const LaunchDecision& d = one.plan(0, LayerMode::fused, 4096, tile(256)).decision;
  EXPECT_EQ(d.n_comm, 0);
  EXPECT_EQ(d.schedule, Schedule::sequential);
  // gemm_only with a comm count at the grid is fine (no comm blocks run); fused is not.
  EXPECT_NO_THROW(p.plan(0, LayerMode::gemm_only, 4096, LayerRequest::forced(256, 132)));
  EXPECT_THROW(p.plan(0, LayerMode::fused, 4096, LayerRequest::forced(256, 132)), InvalidArgument);
}

TEST(LaunchPlanner, RejectsWhatNoKernelRuns) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  EXPECT_EQ(p.plan(1, LayerMode::fused, 64, LayerRequest::forced(192, 2)).decision.tile_n, 192);  // forward: compiled
  EXPECT_THROW(p.plan(0, LayerMode::fused, 64, LayerRequest::forced(160, 2)), InvalidArgument);
  EXPECT_THROW(p.plan(0, LayerMode::fused, 64, LayerRequest::forced(256, -1)), InvalidArgument);
  LayerRequest r = LayerRequest::forced(256, 2);
  r.m_group = 0;
  EXPECT_THROW(p.plan(0, LayerMode::fused, 64, r), InvalidArgument);
  r.m_group = 2000;
  EXPECT_THROW(p.plan(0, LayerMode::fused, 64, r), InvalidArgument);
  r.m_group.reset();
  r.n_group = 0;
  EXPECT_THROW(p.plan(1, LayerMode::fused, 64, r), InvalidArgument);
  EXPECT_THROW(p.plan(4, LayerMode::fused, 64, LayerRequest{}), InvalidArgument);
  EXPECT_THROW(p.plan(2, LayerMode::fused, 64, LayerRequest::forced(192, 2)), InvalidArgument);  // no grad 192
  // A table entry that is not compiled is reported as the table's fault.
  TuneTable bad;
  bad.put(p.key(3, 4096), TuneEntry{LayerVariant{192, 4, 0, 1}, 1.0});
  const LaunchPlanner q = planner(Parallel{8, 1}, bad);
  EXPECT_THROW(q.plan(3, LayerMode::fused, 4096, LayerRequest{}), InvalidArgument);
  // Layer 1's 192 comes from the table alone (the cost model has no waves to weigh it by).
  TuneTable l1_192;
  l1_192.put(p.key(1, 4096), TuneEntry{LayerVariant{192, 0, 0, 1}, 1.0});
  EXPECT_EQ(planner(Parallel{8, 1}, l1_192).plan(1, LayerMode::fused, 4096, LayerRequest{}).decision.tile_n, 192);
}

// Layer 0's 320-wide tile: compiled for layer 0 alone, taken from a request or a table entry, never the
// cost model's pick; a transport without it (NVSHMEM: PlannerPolicy::layer0_tile_320 off) refuses the
// request, naming the widths it has, and runs a table's pick of it 256-wide.
TEST(LaunchPlanner, Layer0Tile320FromARequestOrTheTable) {
  const Parallel tp8{1, 8};
  const LaunchPlanner p = planner(tp8);
  EXPECT_EQ(p.plan(0, LayerMode::fused, 4096, LayerRequest::forced(320, 2)).decision.tile_n, 320);
  for (int layer : {1, 2, 3})
    EXPECT_THROW(p.plan(layer, LayerMode::fused, 4096, LayerRequest::forced(320, 2)), InvalidArgument) << layer;
  for (int tokens : {1, 1024, 16384}) EXPECT_NE(p.plan(0, LayerMode::fused, tokens, LayerRequest{}).decision.tile_n, 320);
  TuneTable t;
  t.put(p.key(0, 4096), TuneEntry{LayerVariant{320, 8, 0, 1}, 1.0});
  EXPECT_EQ(planner(tp8, t).plan(0, LayerMode::fused, 4096, LayerRequest{}).decision.tile_n, 320);
  PlannerPolicy no320;
  no320.layer0_tile_320 = false;
  const LaunchPlanner q(kMixtral, tp8, Link::host, h200_like(), t, no320);
  const LaunchDecision d = q.plan(0, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_EQ(d.tile_n, 256);
  EXPECT_EQ(d.n_comm, 8);
  try {
    q.plan(0, LayerMode::fused, 4096, LayerRequest::forced(320, 2));
    ADD_FAILURE() << "a 320 request over a transport without it";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tile_n must be 128, 192 or 256, got 320"), std::string::npos) << e.what();
  }
}

// The backward's launches (2: backward of layer 1, 3: of layer 0) have their own table keys, else the
// cost model on their own GEMM shapes: G W1 has N = F/tp (half of layer 0's N for SwiGLU), dPre W0 has
// K = W0 rows (twice layer 1's K).
TEST(LaunchPlanner, BackwardLaunchesHaveTheirOwnKeysAndShapes) {
  TuneTable t;
  const LaunchPlanner probe = planner(Parallel{8, 1});
  EXPECT_NE(probe.key(2, 4096).str(), probe.key(0, 4096).str());
  t.put(probe.key(0, 4096), TuneEntry{LayerVariant{256, 7, 0, 1}, 1.0});   // the forward's entry ...
  t.put(probe.key(3, 4096), TuneEntry{LayerVariant{128, 11, 0, 2}, 1.0});  // ... and the backward's own
  const LaunchPlanner p = planner(Parallel{8, 1}, t);
  const LaunchDecision& b1 = p.plan(2, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_STREQ(b1.picked_by, "cost_model");  // not layer 0's entry
  EXPECT_EQ(b1.layer, 2);
  const LaunchDecision& b0 = p.plan(3, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_STREQ(b0.picked_by, "table");
  EXPECT_EQ(b0.tile_n, 128);
  EXPECT_EQ(b0.n_comm, 11);
  const Parallel ep8{8, 1};
  const int fs = kMixtral.ffn, n0 = 2 * kMixtral.ffn;  // tp = 1
  EXPECT_EQ(row_work(kMixtral, ep8, 2).gemm_n, fs);
  EXPECT_EQ(row_work(kMixtral, ep8, 2).layer, 0);  // pulls like layer 0
  EXPECT_EQ(row_work(kMixtral, ep8, 3).layer, 1);  // combines like layer 1
  EXPECT_DOUBLE_EQ(row_work(kMixtral, ep8, 3).flops, 2.0 * kMixtral.hidden * n0);
  EXPECT_DOUBLE_EQ(expected_work(kMixtral, ep8, 2, 4096, 256).flops, expected_work(kMixtral, ep8, 0, 4096, 256).flops / 2);
  // One rank: nothing to pull in the backward of layer 1 either.
  const LaunchPlanner one(kMixtral, Parallel{1, 1}, Link::host, h200_like(), TuneTable{}, PlannerPolicy{});
  EXPECT_EQ(one.plan(2, LayerMode::fused, 4096, LayerRequest{}).decision.n_comm, 0);
}

// m_group when nobody sets it: a wave of work items, the L2 rule without waits, capped by 1/16 of the
// expected M-tiles in the fused layer 0, and at most 16.
TEST(LaunchPlanner, RasterisationRule) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  // Mixtral ep8: W0 shard 2 x 14336 -> 112 column blocks of 256; a wave of 130 compute blocks is 2 M-tiles.
  const LaunchDecision& small = p.plan(0, LayerMode::fused, 1024, LayerRequest::forced(256, 2)).decision;
  EXPECT_EQ(small.m_group, 2);
  // gemm_only: L2 / 4 over a 1 MB A tile is 15 M-tiles.
  const LaunchDecision& gemm = p.plan(0, LayerMode::gemm_only, 1024, LayerRequest::forced(256, 2)).decision;
  EXPECT_EQ(gemm.m_group, 15);
  // fused at 16384 tokens: 32768 expected rows / 128 = 256 M-tiles, /16 = 16, min(L2 rule 15).
  const LaunchDecision& large = p.plan(0, LayerMode::fused, 16384, LayerRequest::forced(256, 2)).decision;
  EXPECT_EQ(large.m_group, 15);
  // Layer 1 fused: one wave (n_group 1: one column block per M-tile -> 128 M-tiles), capped at 16.
  const LaunchDecision& l1 = p.plan(1, LayerMode::fused, 4096, LayerRequest::forced(256, 4)).decision;
  EXPECT_EQ(l1.m_group, 16);
}

// The L2 rule sizes A's tiles as the GEMM reads them: an e4m3 layer 0 reads records of H codes and H / 128
// scales (comet/fp8.hpp), about half a bf16 row, so twice as many M-tiles fit a quarter of L2.
TEST(LaunchPlanner, RasterisationRuleSizesFp8Rows) {
  const MoeShape deepseek{7168, 2048, 256, 8, Activation::swiglu};
  auto plan = [&](DType dtype) {
    const LaunchPlanner p(deepseek, Parallel{8, 1}, Link::host, h200_like(), TuneTable{},
                          PlannerPolicy{true, false, dtype});
    return p.plan(0, LayerMode::gemm_only, 4096, LayerRequest::forced(128, 0)).decision.m_group;
  };
  // 15 MB (a quarter of 60) over A tiles of 128 rows: bf16 128 x 7168 x 2 = 1.75 MB -> 8; e4m3 128 x 7392
  // bytes (7168 codes + 56 scales) = 0.90 MB -> 16 (also the cap). A wave (132 blocks over 32 column
  // blocks of 128) is 5 M-tiles, below both.
  EXPECT_EQ(plan(DType::bf16), 8);
  EXPECT_EQ(plan(DType::e4m3), 16);
}

// A combine layer's GEMM without comm blocks beside it groups half its column blocks (a wave reads A and
// B about equally often); with a combine in flight the column order stays the table's; a request wins.
TEST(LaunchPlanner, ColumnGroupsOfAGemmWithoutCombine) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  // Mixtral: H 4096 -> 16 column blocks of 256, 32 of 128.
  EXPECT_EQ(p.plan(1, LayerMode::gemm_only, 4096, LayerRequest::forced(256, 0)).decision.n_group, 8);
  EXPECT_EQ(p.plan(1, LayerMode::fused, 4096, LayerRequest::forced(128, 0)).decision.n_group, 16);  // sequential
  EXPECT_EQ(p.plan(3, LayerMode::gemm_only, 4096, LayerRequest::forced(256, 0)).decision.n_group, 8);
  EXPECT_EQ(p.plan(1, LayerMode::fused, 4096, LayerRequest::forced(256, 4)).decision.n_group, 1);
  LayerRequest r = LayerRequest::forced(256, 0);
  r.n_group = 3;
  EXPECT_EQ(p.plan(1, LayerMode::gemm_only, 4096, r).decision.n_group, 3);
  // Layer 0's schedule covers every column block of an M-tile; its n_group stays as given.
  EXPECT_EQ(p.plan(0, LayerMode::gemm_only, 4096, LayerRequest::forced(256, 0)).decision.n_group, 1);
}

TEST(LaunchPlanner, AdaptiveSplitOnlyWhereTheTunerChoseTheCommBlocks) {
  const LaunchPlanner on = planner(Parallel{8, 1});
  const PlannedLaunch& tuned = on.plan(1, LayerMode::fused, 4096, tile(256));
  EXPECT_EQ(tuned.decision.adaptive, tuned.decision.n_comm > 0);
  EXPECT_EQ(tuned.adapt.enabled, tuned.decision.adaptive ? 1 : 0);
  EXPECT_EQ(tuned.adapt.n_host, tuned.decision.n_comm);
  EXPECT_FALSE(on.plan(1, LayerMode::comm_only, 4096, tile(256)).decision.adaptive);
  const LaunchPlanner off = planner(Parallel{8, 1}, {}, false);
  EXPECT_FALSE(off.plan(1, LayerMode::fused, 4096, tile(256)).decision.adaptive);
}

// Layer 0's table entries of load classes > 1 carry the plan's wave chunk beside their n_comm: the
// adaptive split holds both per class, and the plan's chunk rule takes them (only where the split adapts,
// only entries of the launch's tile with comm blocks, only layer 0).
TEST(LaunchPlanner, Layer0sLoadClassEntriesCarryTheirWaveChunk) {
  const LaunchPlanner probe = planner(Parallel{8, 1});
  TuneTable t;
  auto entry = [](int tile_n, int n_comm, int chunk) {
    LayerVariant v{tile_n, n_comm, 0, 1};
    v.wave_chunk = chunk;
    return TuneEntry{v, 1.0};
  };
  t.put(probe.key(0, 4096), entry(256, 8, 0));
  t.put(probe.key(0, 4096, 2), entry(256, 6, 0));    // class 2: n_comm only (the default order)
  t.put(probe.key(0, 4096, 4), entry(256, 8, 2));    // class 4: chunk 2
  t.put(probe.key(0, 4096, 8), entry(128, 16, 4));   // class 8: another tile than the launch's: none
  t.put(probe.key(1, 4096), entry(256, 8, 0));
  t.put(probe.key(1, 4096, 4), entry(256, 4, 3));    // layer 1 has no tile order to cut
  const LaunchPlanner p = planner(Parallel{8, 1}, t);
  const PlannedLaunch& l0 = p.plan(0, LayerMode::fused, 4096, LayerRequest{});
  ASSERT_TRUE(l0.decision.adaptive);
  EXPECT_EQ(std::vector<int>(l0.adapt.n_by_load, l0.adapt.n_by_load + kLoadClasses), (std::vector<int>{0, 6, 8, 0}));
  EXPECT_EQ(std::vector<int>(l0.adapt.chunk_by_load, l0.adapt.chunk_by_load + kLoadClasses),
            (std::vector<int>{0, 0, 2, 0}));
  const WaveChunkRule rule = wave_chunk_rule(l0.adapt);
  EXPECT_EQ(std::vector<int>(rule.by_load, rule.by_load + 4), (std::vector<int>{0, 0, 2, 0}));
  EXPECT_DOUBLE_EQ(rule.expected_rows, l0.adapt.expected_rows);
  EXPECT_GT(rule.expected_rows, 0);
  const PlannedLaunch& l1 = p.plan(1, LayerMode::fused, 4096, LayerRequest{});
  EXPECT_EQ(std::vector<int>(l1.adapt.chunk_by_load, l1.adapt.chunk_by_load + kLoadClasses),
            (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(wave_chunk_rule(l1.adapt).expected_rows, 0);
  // A forced n_comm: no adaptive split, so no rule (the plan keeps the configured chunk).
  const PlannedLaunch& forced = p.plan(0, LayerMode::fused, 4096, LayerRequest::forced(256, 8));
  EXPECT_FALSE(forced.decision.adaptive);
  EXPECT_EQ(wave_chunk_rule(forced.adapt).expected_rows, 0);
  // No chunk in any class: no rule either.
  TuneTable plain;
  plain.put(probe.key(0, 4096), entry(256, 8, 0));
  plain.put(probe.key(0, 4096, 4), entry(256, 8, 0));
  const LaunchPlanner q = planner(Parallel{8, 1}, plain);
  EXPECT_EQ(wave_chunk_rule(q.plan(0, LayerMode::fused, 4096, LayerRequest{}).adapt).expected_rows, 0);
}

// batch_invariant: the tile shape no longer follows the table's per-bucket entries (a token's bits would
// change with the batch size), only the layer's shape; n_comm may still come from the table.
TEST(LaunchPlanner, BatchInvariantPinsTheTileShape) {
  TuneTable t;
  const LaunchPlanner probe = planner(Parallel{8, 1});
  t.put(probe.key(0, 1024), TuneEntry{LayerVariant{128, 6, 0, 1}, 1.0});
  t.put(probe.key(0, 16384), TuneEntry{LayerVariant{256, 8, 0, 1}, 1.0});
  const LaunchPlanner free(kMixtral, Parallel{8, 1}, Link::host, h200_like(), t, PlannerPolicy{true, false});
  EXPECT_EQ(free.plan(0, LayerMode::fused, 1024, LayerRequest{}).decision.tile_n, 128);
  EXPECT_EQ(free.plan(0, LayerMode::fused, 16384, LayerRequest{}).decision.tile_n, 256);
  const LaunchPlanner pinned(kMixtral, Parallel{8, 1}, Link::host, h200_like(), t, PlannerPolicy{true, true});
  const LaunchDecision& small = pinned.plan(0, LayerMode::fused, 1024, LayerRequest{}).decision;
  const LaunchDecision& large = pinned.plan(0, LayerMode::fused, 16384, LayerRequest{}).decision;
  EXPECT_EQ(small.tile_n, large.tile_n);
  EXPECT_EQ(small.tile_n, 256);  // Mixtral's W0 shard (28672 rows) pads to no width
  EXPECT_EQ(small.n_comm, 6);    // the table's comm blocks stay: they never change the result
}

}  // namespace

namespace {

LaunchPlanner fp8_planner(TuneTable table = {}) {
  return LaunchPlanner(kMixtral, Parallel{8, 1}, Link::host, h200_like(), std::move(table),
                       PlannerPolicy{true, false, DType::e4m3});
}

// An fp8 layer 0 (MoeOptions::dtype e4m3): its one compiled tile, table keys of its own (a bf16 entry of
// the same shape does not answer for it, an e4m3 one does), and layer 1 still bf16's.
TEST(LaunchPlanner, Fp8Layer0HasItsTileAndKeys) {
  const LaunchPlanner probe = fp8_planner();
  EXPECT_EQ(probe.key(0, 4096).dtype, "e4m3");
  EXPECT_EQ(probe.key(1, 4096).dtype, "bf16");
  EXPECT_THROW(probe.plan(0, LayerMode::fused, 4096, tile(256)), InvalidArgument);
  EXPECT_THROW(probe.plan(0, LayerMode::fused, 4096, tile(192)), InvalidArgument);
  EXPECT_EQ(probe.plan(1, LayerMode::fused, 4096, tile(256)).decision.tile_n, 256);  // layer 1 is bf16

  TuneKey bf16_key = probe.key(0, 4096);
  bf16_key.dtype = "bf16";
  TuneTable t;
  t.put(bf16_key, TuneEntry{LayerVariant{256, 7, 0, 1}, 1.0});
  t.put(probe.key(0, 16384), TuneEntry{LayerVariant{128, 5, 0, 1}, 1.0});
  t.put(probe.key(1, 4096), TuneEntry{LayerVariant{256, 3, 0, 1}, 1.0});
  const LaunchPlanner p = fp8_planner(t);
  const LaunchDecision& miss = p.plan(0, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_STREQ(miss.picked_by, "cost_model");
  EXPECT_EQ(miss.tile_n, 128);
  const LaunchDecision& hit = p.plan(0, LayerMode::fused, 16384, LayerRequest{}).decision;
  EXPECT_STREQ(hit.picked_by, "table");
  EXPECT_EQ(hit.tile_n, 128);
  EXPECT_EQ(hit.n_comm, 5);
  const LaunchDecision& l1 = p.plan(1, LayerMode::fused, 4096, LayerRequest{}).decision;
  EXPECT_STREQ(l1.picked_by, "table");
  EXPECT_EQ(l1.n_comm, 3);
}

// The cost model sees an fp8 layer 0 as fp8 work (its rate, its records), on the host and in the
// adaptive split the kernel evaluates; layer 1's split stays bf16's.
TEST(LaunchPlanner, Fp8Layer0IsCostedAsFp8) {
  const LaunchPlanner p = fp8_planner();
  const PlannedLaunch& l0 = p.plan(0, LayerMode::fused, 4096, LayerRequest{});
  ASSERT_TRUE(l0.decision.adaptive);
  EXPECT_TRUE(l0.adapt.per_row.fp8);
  EXPECT_DOUBLE_EQ(l0.adapt.per_row.row_bytes, 4224.0);
  const CostModel m = p.model();
  const LayerWork expected = expected_work(kMixtral, Parallel{8, 1}, 0, 4096, 128, DType::e4m3);
  EXPECT_EQ(l0.decision.n_comm, std::min(m.best_n_comm(expected, 132, 128), 131));
  const PlannedLaunch& l1 = p.plan(1, LayerMode::fused, 4096, tile(256));
  ASSERT_TRUE(l1.decision.adaptive);
  EXPECT_FALSE(l1.adapt.per_row.fp8);
  EXPECT_DOUBLE_EQ(l1.adapt.per_row.row_bytes, 8192.0);
  const PlannedLaunch& bf16_l0 = planner(Parallel{8, 1}).plan(0, LayerMode::fused, 4096, tile(128));
  ASSERT_TRUE(bf16_l0.decision.adaptive);
  EXPECT_FALSE(bf16_l0.adapt.per_row.fp8);
  EXPECT_DOUBLE_EQ(bf16_l0.adapt.per_row.row_bytes, 8192.0);
}

}  // namespace

// The weight-gradient GEMM rule against the H200 cases it was read from, and the H100's Qwen2-57B
// (launch_planner.cpp): W = 8, rows per expert = 8 x tokens x k / E.
TEST(LaunchPlanner, WeightGradKernelByShape) {
  const MoeShape qwen2{2048, 1408, 64, 4, Activation::swiglu};
  const MoeShape phi35{4096, 6400, 16, 2, Activation::swiglu};
  const MoeShape deepseek{7168, 2048, 256, 8, Activation::swiglu};
  auto pick = [](const MoeShape& s, Parallel par, int tokens) {
    return LaunchPlanner(s, par, Link::device, h200_like(), {}).weight_grad_kernel(tokens, WeightGradKernel::automatic);
  };
  const Parallel ep8{8, 1}, tp8{1, 8};
  using K = WeightGradKernel;
  // Short K (<= 2048 rows per expert): ping-pong, but not for one local expert nor for F/tp < 512.
  EXPECT_EQ(pick(kMixtral, tp8, 1024), K::grouped);      // 2048 rows, 8 experts, F/8 = 1792
  EXPECT_EQ(pick(kMixtral, ep8, 1024), K::persistent);   // one local expert
  EXPECT_EQ(pick(qwen2, ep8, 1024), K::grouped);         // 512 rows
  EXPECT_EQ(pick(qwen2, tp8, 1024), K::persistent);      // F/8 = 176
  EXPECT_EQ(pick(phi35, ep8, 1024), K::grouped);
  EXPECT_EQ(pick(deepseek, ep8, 1024), K::grouped);      // 256 rows
  EXPECT_EQ(pick(deepseek, tp8, 1024), K::persistent);   // F/8 = 256
  // Long K: the cooperative clusters where H >= 3072, else ours.
  const MoeShape qwen57{3584, 2560, 64, 8, Activation::swiglu};
  EXPECT_EQ(pick(qwen57, tp8, 16384), K::grouped_cooperative);  // 16384 rows, H = 3584
  EXPECT_EQ(pick(qwen57, ep8, 4096), K::grouped_cooperative);   // 4096 rows
  EXPECT_EQ(pick(kMixtral, ep8, 16384), K::grouped_cooperative);
  EXPECT_EQ(pick(deepseek, tp8, 16384), K::grouped_cooperative);  // 4096 rows
  EXPECT_EQ(pick(qwen2, ep8, 16384), K::persistent);              // H = 2048
  EXPECT_EQ(pick(kMixtral, ep8, 2048), K::grouped_cooperative);   // 4096 rows
  EXPECT_EQ(pick(phi35, ep8, 2048), K::grouped);                  // 2048 rows
  EXPECT_EQ(pick(phi35, ep8, 3000), K::persistent);               // 3000 rows: between the two rules
  // A request is obeyed.
  EXPECT_EQ(LaunchPlanner(kMixtral, ep8, Link::device, h200_like(), {}).weight_grad_kernel(1024, K::grouped), K::grouped);
}

// A measured weight-gradient pick (the table's kWeightGradLaunch key, of either link) comes before the rule;
// a request before both; a key of other tokens or another shape says nothing.
// MoeOptions::cublas_backward: the request, else cuBLAS where a rank has at most 2 local experts.
TEST(LaunchPlanner, CublasBackwardRule) {
  const MoeShape phi35{4096, 6400, 16, 2, Activation::swiglu};
  const Parallel ep8{8, 1}, tp8{1, 8}, ep4tp2{4, 2};
  auto rule = [](const MoeShape& s, Parallel par, std::optional<bool> asked = std::nullopt) {
    return LaunchPlanner(s, par, Link::device, h200_like(), {}).cublas_backward(asked);
  };
  EXPECT_TRUE(rule(kMixtral, ep8));    // 1 local expert
  EXPECT_TRUE(rule(phi35, ep8));       // 2
  EXPECT_TRUE(rule(kMixtral, ep4tp2)); // 2
  EXPECT_FALSE(rule(phi35, ep4tp2));   // 4
  EXPECT_FALSE(rule(kMixtral, tp8));   // 8
  EXPECT_FALSE(rule(kMixtral, ep8, false));
  EXPECT_TRUE(rule(kMixtral, tp8, true));
}

TEST(LaunchPlanner, WeightGradKernelFromTheTable) {
  using K = WeightGradKernel;
  const Parallel ep8{8, 1};
  const LaunchPlanner probe = planner(ep8);  // host link
  TuneTable t;
  LayerVariant persistent;
  persistent.weight_grad = K::persistent;
  TuneKey device_key = probe.key(kWeightGradLaunch, 16384);
  device_key.link = Link::device;  // measured on the device link: serves the host link's planner too
  t.put(device_key, TuneEntry{persistent, 1.0});
  LayerVariant pingpong;
  pingpong.weight_grad = K::grouped;
  t.put(probe.key(kWeightGradLaunch, 4096), TuneEntry{pingpong, 1.0});
  const LaunchPlanner p = planner(ep8, t);
  EXPECT_EQ(p.weight_grad_kernel(16384, K::automatic), K::persistent);  // the rule: cooperative (one expert, H 4096)
  EXPECT_EQ(p.weight_grad_kernel(4096, K::automatic), K::grouped);
  EXPECT_EQ(p.weight_grad_kernel(1024, K::automatic), K::persistent);   // no entry: the rule
  EXPECT_EQ(p.weight_grad_kernel(16384, K::grouped_cooperative), K::grouped_cooperative);
  const MoeShape qwen2{2048, 1408, 64, 4, Activation::swiglu};
  EXPECT_EQ(LaunchPlanner(qwen2, ep8, Link::host, h200_like(), t).weight_grad_kernel(4096, K::automatic), K::grouped);
}

// The standalone GEMM: only where a launch's GEMM runs without comm blocks beside it (gemm_only, or the
// sequential schedule) and is a plain product (not layer 0's, which applies the activation).
TEST(LaunchPlanner, StandaloneGemmOnlyWhereTheGemmRunsAlone) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  const LayerRequest seq = with_gemm(LayerRequest::forced(256, 0), StandaloneGemm::grouped);
  const LayerRequest fused = with_gemm(LayerRequest::forced(256, 4), StandaloneGemm::grouped);
  for (int layer : {1, 2, 3}) {
    EXPECT_EQ(p.plan(layer, LayerMode::fused, 4096, seq).decision.standalone_gemm, StandaloneGemm::grouped) << layer;
    EXPECT_EQ(p.plan(layer, LayerMode::gemm_only, 4096, fused).decision.standalone_gemm, StandaloneGemm::grouped)
        << layer;
    EXPECT_EQ(p.plan(layer, LayerMode::fused, 4096, fused).decision.standalone_gemm, StandaloneGemm::comet) << layer;
  }
  EXPECT_EQ(p.plan(0, LayerMode::fused, 4096, seq).decision.standalone_gemm, StandaloneGemm::comet);
  EXPECT_EQ(p.plan(0, LayerMode::gemm_only, 4096, seq).decision.standalone_gemm, StandaloneGemm::comet);
  // The memo tells requests apart by this field too.
  const LayerRequest seq_coop = with_gemm(LayerRequest::forced(256, 0), StandaloneGemm::grouped_cooperative);
  EXPECT_EQ(p.plan(1, LayerMode::fused, 4096, seq_coop).decision.standalone_gemm, StandaloneGemm::grouped_cooperative);
}

// A table's cuBLAS pick reaches the sequential schedule of layers 1-3 (never layer 0's, whose GEMM applies
// the activation), and is a launch of its own: no one-launch schedule, whatever the entry says.
TEST(LaunchPlanner, CublasPickIsTheSequentialSchedulesGemmInALaunchOfItsOwn) {
  TuneTable t;
  LayerVariant v{256, 0, 0, 1, StandaloneGemm::cublas};
  v.one_launch = true;
  const LaunchPlanner probe = planner(Parallel{8, 1});
  for (int layer : {0, 1, 2, 3}) t.put(probe.key(layer, 4096), TuneEntry{v, 1.0});
  const LaunchPlanner p = planner(Parallel{8, 1}, t);
  for (int layer : {1, 2, 3}) {
    const LaunchDecision& d = p.plan(layer, LayerMode::fused, 4096, LayerRequest{}).decision;
    EXPECT_EQ(d.schedule, Schedule::sequential) << layer;
    EXPECT_EQ(d.standalone_gemm, StandaloneGemm::cublas) << layer;
    EXPECT_FALSE(d.one_launch) << layer;
  }
  EXPECT_EQ(p.plan(0, LayerMode::fused, 4096, LayerRequest{}).decision.standalone_gemm, StandaloneGemm::comet);
  // Batch-invariant results: cuBLAS picks its kernel by the rows, so ours runs instead (unless asked for).
  const LaunchPlanner invariant(kMixtral, Parallel{8, 1}, Link::host, h200_like(), t, PlannerPolicy{true, true});
  EXPECT_EQ(invariant.plan(1, LayerMode::fused, 4096, LayerRequest{}).decision.standalone_gemm, StandaloneGemm::comet);
  LayerRequest asked = with_gemm(LayerRequest{}, StandaloneGemm::cublas);
  asked.n_comm = 0;
  EXPECT_EQ(invariant.plan(1, LayerMode::fused, 4096, asked).decision.standalone_gemm, StandaloneGemm::cublas);
  EXPECT_FALSE(gives_our_bits(StandaloneGemm::cublas));
  EXPECT_TRUE(gives_our_bits(StandaloneGemm::grouped_160));
}

// 128 x 320 tiles where N is narrow (variant.hpp: prefers_320_tiles): 256-wide tiles pad N by a fifth or
// more and 320-wide ones pad less.
TEST(LaunchPlanner, TilesOf320WhereNIsNarrow) {
  for (int n : {300, 320, 800}) EXPECT_TRUE(prefers_320_tiles(n)) << n;
  // 176 / 96 / 160: 320-wide pads more; 256 / 1792 / 14336: no padding; 640 / 960 / 1600: 256-wide pads < 1/5.
  for (int n : {0, 96, 160, 176, 256, 640, 960, 1600, 1792, 2048, 14336}) EXPECT_FALSE(prefers_320_tiles(n)) << n;
}

// With PlannerPolicy::narrow_n_tiles the weight gradients' cooperative pick takes the 320-wide tiles on a
// narrow N (dW1's N = F / tp; dW0's N = H keeps 256); a table's 128 x 160 standalone GEMM stays 160 wide
// (on CuTe's n160 atoms it is the faster one at N = 320 and 800); a request is obeyed as given. It is the
// default; without it nothing changes.
TEST(LaunchPlanner, NarrowNWeightGradientsRunOnTilesOf320) {
  using K = WeightGradKernel;
  const MoeShape qwen57{3584, 2560, 64, 8, Activation::swiglu};
  const Parallel tp8{1, 8};
  const PlannerPolicy narrow;
  EXPECT_TRUE(narrow.narrow_n_tiles);
  EXPECT_TRUE(MoeOptions{}.narrow_n_tiles);
  PlannerPolicy off;
  off.narrow_n_tiles = false;
  EXPECT_EQ(LaunchPlanner(qwen57, tp8, Link::device, h200_like(), {}, off).weight_grad_kernel(16384, K::automatic, 320),
            K::grouped_cooperative);
  const LaunchPlanner rule(qwen57, tp8, Link::device, h200_like(), {}, narrow);
  EXPECT_EQ(rule.weight_grad_kernel(16384, K::automatic, 320), K::grouped_320);      // the rule: cooperative
  EXPECT_EQ(rule.weight_grad_kernel(16384, K::automatic, 3584), K::grouped_cooperative);
  EXPECT_EQ(rule.weight_grad_kernel(16384, K::grouped_cooperative, 320), K::grouped_cooperative);  // requested
  EXPECT_EQ(rule.weight_grad_kernel(1024, K::automatic, 320), K::persistent);        // the rule: ours
  // What a pick runs per N (the benchmark's wgrad records time picks through it): both cooperative
  // kernels map to the same pair, the others stay.
  for (K picked : {K::grouped_cooperative, K::grouped_320}) {
    EXPECT_EQ(rule.picked_weight_grad_tiles(picked, 320), K::grouped_320) << to_string(picked);
    EXPECT_EQ(rule.picked_weight_grad_tiles(picked, 3584), K::grouped_cooperative) << to_string(picked);
    EXPECT_EQ(LaunchPlanner(qwen57, tp8, Link::device, h200_like(), {}, off).picked_weight_grad_tiles(picked, 320),
              K::grouped_cooperative) << to_string(picked);
  }
  for (K other : {K::persistent, K::grouped}) EXPECT_EQ(rule.picked_weight_grad_tiles(other, 320), other);
  TuneTable t;
  LayerVariant w;
  w.weight_grad = K::grouped_320;
  t.put(rule.key(kWeightGradLaunch, 4096), TuneEntry{w, 1.0});
  LayerVariant seq160{256, 0, 0, 1, StandaloneGemm::grouped_160};
  for (int layer : {2, 3}) t.put(rule.key(layer, 4096), TuneEntry{seq160, 1.0});
  EXPECT_EQ(LaunchPlanner(qwen57, tp8, Link::device, h200_like(), t, off).plan(2, LayerMode::fused, 4096, LayerRequest{})
                .decision.standalone_gemm,
            StandaloneGemm::grouped_160);
  const LaunchPlanner p(qwen57, tp8, Link::device, h200_like(), t, narrow);
  EXPECT_EQ(p.weight_grad_kernel(4096, K::automatic, 320), K::grouped_320);
  EXPECT_EQ(p.weight_grad_kernel(4096, K::automatic, 3584), K::grouped_cooperative);  // a 320 pick on a wide N
  for (int layer : {2, 3})
    EXPECT_EQ(p.plan(layer, LayerMode::fused, 4096, LayerRequest{}).decision.standalone_gemm,
              StandaloneGemm::grouped_160) << layer;
  const LayerRequest asked = with_gemm(LayerRequest::forced(256, 0), StandaloneGemm::grouped_160);
  EXPECT_EQ(p.plan(2, LayerMode::fused, 4096, asked).decision.standalone_gemm, StandaloneGemm::grouped_160);
}

// One launch for a combine launch's sequential schedule with our GEMM (layers 1 and 3): the table
// entry's choice or the request's; never for a pull launch, a fused or gemm_only / comm_only launch, or a
// standalone GEMM of CUTLASS's.
TEST(LaunchPlanner, OneLaunchOnlyForACombineLaunchsSequentialScheduleWithOurGemm) {
  const LaunchPlanner probe = planner(Parallel{8, 1});
  TuneTable t;
  LayerVariant seq_entry{256, 0, 0, 1};
  seq_entry.one_launch = true;
  for (int layer : {0, 1, 2, 3}) t.put(probe.key(layer, 4096), TuneEntry{seq_entry, 1.0});
  const LaunchPlanner p = planner(Parallel{8, 1}, t);
  LayerRequest on = LayerRequest::forced(256, 0), off = on;
  on.one_launch = true;
  off.one_launch = false;
  for (int layer : {1, 3}) {
    EXPECT_TRUE(p.plan(layer, LayerMode::fused, 4096, tile(256)).decision.one_launch) << layer;  // the table's
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, LayerRequest::forced(256, 0)).decision.one_launch) << layer;
    EXPECT_TRUE(p.plan(layer, LayerMode::fused, 4096, on).decision.one_launch) << layer;
    LayerRequest table_off = tile(256);
    table_off.one_launch = false;
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, table_off).decision.one_launch) << layer;  // memo keyed on it
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 8192, tile(256)).decision.one_launch) << layer;  // cost model: off
    LayerRequest fused = LayerRequest::forced(256, 4);
    fused.one_launch = true;
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, fused).decision.one_launch) << layer;
    EXPECT_FALSE(p.plan(layer, LayerMode::gemm_only, 4096, on).decision.one_launch) << layer;
    EXPECT_FALSE(p.plan(layer, LayerMode::comm_only, 4096, on).decision.one_launch) << layer;
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, with_gemm(on, StandaloneGemm::grouped)).decision.one_launch)
        << layer;
  }
  for (int layer : {0, 2}) {  // pulls keep two launches
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, tile(256)).decision.one_launch) << layer;
    EXPECT_FALSE(p.plan(layer, LayerMode::fused, 4096, on).decision.one_launch) << layer;
  }
}

// m order (LayerRequest::m_order) is a way to run layer 0's fused launch: kept where its compute blocks
// wait for rows, dropped where nothing waits (the sequential schedule, gemm_only), refused elsewhere;
// the kernel's split then leaves the arrival order.
TEST(LaunchPlanner, MOrderIsLayerZerosFusedLaunchOnly) {
  const LaunchPlanner p = planner(Parallel{8, 1});
  LayerRequest fused = LayerRequest::forced(256, 4), seq = LayerRequest::forced(256, 0);
  fused.m_order = seq.m_order = true;
  const LaunchDecision& d = p.plan(0, LayerMode::fused, 4096, fused).decision;
  EXPECT_TRUE(d.m_order);
  EXPECT_FALSE(p.plan(0, LayerMode::fused, 4096, LayerRequest::forced(256, 4)).decision.m_order);  // memo keyed
  EXPECT_FALSE(p.plan(0, LayerMode::fused, 4096, seq).decision.m_order);
  EXPECT_FALSE(p.plan(0, LayerMode::gemm_only, 4096, fused).decision.m_order);
  for (int layer : {1, 2, 3}) {
    EXPECT_THROW(p.plan(layer, LayerMode::fused, 4096, fused), InvalidArgument) << layer;
    LayerRequest off = LayerRequest::forced(256, 4);
    off.m_order = false;
    EXPECT_NO_THROW(p.plan(layer, LayerMode::fused, 4096, off)) << layer;
  }
  kernels::GridSplit g;
  g.mode = kernels::Mode::fused;
  g.n_comm = 4;
  EXPECT_TRUE(kernels::kernel_split(g, kernels::LaunchLimits{132, 132}, 0).arrival_order);
  g.m_order = true;
  EXPECT_FALSE(kernels::kernel_split(g, kernels::LaunchLimits{132, 132}, 0).arrival_order);
  g.m_order = false;
  g.mode = kernels::Mode::gemm_only;
  EXPECT_FALSE(kernels::kernel_split(g, kernels::LaunchLimits{132, 132}, 0).arrival_order);
}
