// The fused MoE layer on W virtual ranks (LocalTeam) against the CPU reference: layer 0's hidden rows,
// layer 1's expert outputs and the whole forward, for EP, TP and EP x TP, link=device and link=host,
// the ugly routings, and determinism across n_comm and repeats.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>

#include <unistd.h>

#include "comet/bf16.hpp"
#include "comet/device_plan.hpp"
#include "comet/fused_moe.hpp"
#include "comet/plan.hpp"
#include "comet/reference.hpp"
#include "kernels/launch_trace.hpp"
#include "tune/adaptive_split.hpp"
#include "support/bitwise.hpp"
#include "support/layer0_order_checks.hpp"
#include "support/layer_checks.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"
#include "harness/plan_rewrite.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

struct Case {
  const char* name;
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens;
  RoutingKind kind = RoutingKind::uniform;
  Link link = Link::device;
  LayerRequest l0 = forced(256, 2);
  LayerRequest l1 = forced(256, 4);
  int hot = 0;
  int wave_chunk = 0;  // MoeOptions::wave_chunk
  PullOrder pull_order = kDefaultPullOrder;  // MoeOptions::pull_order
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// Everything a case sets up: the team, the layer, the problem and each rank's device data.
MoeOptions options_of(const Case& c, const std::string& tune_table = "") {
  MoeOptions o;
  o.layer0 = c.l0;
  o.layer1 = c.l1;
  o.tune_table = tune_table;
  o.wave_chunk = c.wave_chunk;
  o.pull_order = c.pull_order;
  return o;
}

// Everything a case sets up: the team, the layer (its public face and the engine the steps run on),
// the problem and each rank's device data.
struct Harness {
  MoeProblem problem;
  LocalTeam team;
  FusedMoe fused;
  MoeEngine& moe;
  std::vector<std::unique_ptr<DeviceRank>> ranks;

  explicit Harness(const Case& c, uint64_t seed = 1, const std::string& tune_table = "")
      : problem(MoeProblem::make(c.shape, c.par, c.tokens, c.kind, seed, c.hot)),
        team(c.par.world(), c.link),
        fused(team, c.shape, c.par, MoeCapacity{problem.max_tokens(), 0}, options_of(c, tune_table)),
        moe(fused.engine()) {
    team.set_timeout(3.0);  // a stalled flag fails the test in seconds, not minutes
    for (int r = 0; r < c.par.world(); ++r) {
      ranks.push_back(upload_rank(problem, r));
      moe.set_weights(r, ranks[r]->w0.get(), ranks[r]->w1.get());
    }
  }
  std::vector<RankBatch> batches() const {
    std::vector<RankBatch> b;
    for (const auto& r : ranks) b.push_back(r->batch());
    return b;
  }
  // Every data buffer of the layer and every output NaN: a call must rewrite all that it reads.
  void poison() {
    for (int r = 0; r < problem.par.world(); ++r) {
      moe.poison_buffers(r);
      ranks[r]->out.fill_bytes(0xFF);
    }
  }
  // The steps of forward() with explicit variants, for both layers, from poisoned buffers;
  // after_prepare(rank), if given, runs between the rank's prepare and its layer 0.
  void run(const LayerRequest& l0, const LayerRequest& l1, const std::function<void(int)>& after_prepare = {}) {
    const int W = problem.par.world();
    poison();
    for (int r = 0; r < W; ++r) moe.stage(r, ranks[r]->batch());
    team.barrier();
    for (int r = 0; r < W; ++r) {
      moe.prepare(r);
      if (after_prepare) after_prepare(r);
      moe.layer0(r, LayerMode::fused, l0);
      moe.layer1(r, LayerMode::fused, l1);
    }
    team.barrier();
    for (int r = 0; r < W; ++r) moe.finish(r, ranks[r]->batch());
    moe.sync_and_check();
  }
  std::vector<std::vector<float>> outputs() const {
    std::vector<std::vector<float>> o;
    for (const auto& r : ranks) o.push_back(r->output());
    return o;
  }
};

void check_layers(const Harness& h) { expect_layers_match(h.problem, h.moe, h.team, "fused"); }

void check_outputs(const Harness& h, const std::vector<std::vector<float>>& got) {
  const auto ref = reference::forward(h.problem.shape, h.problem.par, h.problem.weights, h.problem.inputs);
  expect_outputs_match(h.problem, ref, got, "fused");
}

// The outputs of run(c.l0, c.l1) on a fresh layer, checked against the reference.
std::vector<std::vector<float>> checked_outputs(const Case& c) {
  Harness h(c);
  h.run(c.l0, c.l1);
  auto got = h.outputs();
  check_outputs(h, got);
  return got;
}

const std::string kNoTable = "/nonexistent/comet-test/tune.json";  // an empty table: the cost model picks

class FusedMoeCase : public ::testing::TestWithParam<Case> {};

// Through the public API, on a stream of the caller's.
TEST_P(FusedMoeCase, MatchesReference) {
  Harness h(GetParam());
  cudaStream_t caller = nullptr;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  h.fused.forward(h.batches(), caller);
  COMET_CUDA_CHECK(cudaStreamSynchronize(caller));
  COMET_CUDA_CHECK(cudaStreamDestroy(caller));
  h.fused.sync_and_check();
  check_outputs(h, h.outputs());
  check_layers(h);
}


INSTANTIATE_TEST_SUITE_P(
    Layouts, FusedMoeCase,
    ::testing::Values(
        Case{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}, RoutingKind::uniform, Link::device, forced(256, 0, 16, 1),
             forced(256, 0, 16, 1)},
        Case{"EP2_device", kSmallSwiglu, {2, 1}, {37, 200}},
        Case{"EP2_host", kSmallSwiglu, {2, 1}, {130, 64}, RoutingKind::uniform, Link::host},
        Case{"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
        Case{"EP8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform, Link::host},
        Case{"EP4_all_to_one_expert_top1", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert, Link::device},
        Case{"EP4_zipf", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf},
        Case{"EP4_local_only", kSmallSwiglu, {4, 1}, {64, 65, 66, 67}, RoutingKind::local_only},
        Case{"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}},
        Case{"TP2_host", kSmallSwiglu, {1, 2}, {160, 31}, RoutingKind::uniform, Link::host},
        Case{"EP2xTP2", kTop8, {2, 2}, {80, 0, 150, 41}},
        Case{"EP4xTP2_host", kSmallSwiglu, {4, 2}, {20, 40, 60, 80, 100, 0, 7, 130}, RoutingKind::zipf, Link::host},
        Case{"EP4_tile128", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::uniform, Link::device,
             forced(128, 3, 4, 1), forced(128, 3, 4, 2)},
        // Layer 0's 128x192 tiles: N = 1024 ends in a partial column block; N = 192 is one block.
        Case{"EP4_tile192", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::zipf, Link::device,
             forced(192, 3, 4, 1), forced(256, 3, 4, 1)},
        Case{"TP2_tile192_host_gelu", kGelu, {1, 2}, {90, 140}, RoutingKind::uniform, Link::host, forced(192, 2, 0, 1),
             forced(128, 2, 0, 1)},
        // Layer 1's 128x192 tiles: H = 256 is a whole block and a partial one (64 columns), H = 384 two
        // whole ones, H = 512 two and a partial one (128), under the combine's 256-column chunks.
        Case{"EP4_l1_tile192", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::zipf, Link::device,
             forced(256, 3, 4, 1), forced(192, 3, 4, 1)},
        Case{"TP2_l1_tile192_host_gelu", kGelu, {1, 2}, {90, 140}, RoutingKind::uniform, Link::host, forced(128, 2, 0, 1),
             forced(192, 2, 0, 1)},
        Case{"EP8_top8_l1_tile192_sequential", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform,
             Link::host, forced(256, 0), forced(192, 0)},
        Case{"EP8_one_expert_hot5", kTop8, {8, 1}, {64, 64, 64, 64, 64, 64, 64, 64}, RoutingKind::one_expert,
             Link::device, forced(256, 2, 16, 1),
             forced(256, 4, 16, 1), 5},
        // Layer 1's GEMM of the sequential schedule as CUTLASS's grouped GEMM (StandaloneGemm): a rank
        // without tokens, experts without rows (M 0 groups), a partial N (TP 4: F_s = 96 as K), top-8.
        Case{"EP4_zero_token_rank_grouped_l1", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform,
             Link::device, forced(256, 0), with_standalone(forced(256, 0), StandaloneGemm::grouped)},
        Case{"EP4_all_to_one_expert_top1_grouped_coop_l1", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert,
             Link::host, forced(256, 2), with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative)},
        Case{"TP4_gelu_grouped_l1", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device,
             forced(256, 0), with_standalone(forced(128, 0), StandaloneGemm::grouped)},
        Case{"EP2xTP2_top8_grouped_coop_l1", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::device,
             forced(256, 2), with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative)},
        Case{"EP4_zero_token_rank_grouped_160_l1", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform,
             Link::host, forced(256, 0), with_standalone(forced(256, 0), StandaloneGemm::grouped_160)},
        Case{"EP2xTP2_top8_grouped_320_l1", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::device,
             forced(256, 2), with_standalone(forced(256, 0), StandaloneGemm::grouped_320)}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// Same result, bitwise, whatever the number of comm blocks, and over repeated runs.
// The rows of a gathered-layout buffer [rows_cap][width] that hold a unit's row (not padding).
std::vector<bf16_bits> plan_rows(const Harness& h, int rank, const void* buffer, int width) {
  const HostPlan plan = h.moe.plan(rank).to_host(h.team.stream(rank));
  const auto all = download_bf16(buffer, size_t(h.moe.capacity().max_rows_per_rank) * width);
  std::vector<bf16_bits> rows;
  for (int row = 0; row < plan.view().expert_offset[plan.config().local_experts()]; ++row)
    if (plan.view().row_unit[row] >= 0) rows.insert(rows.end(), &all[size_t(row) * width], &all[size_t(row + 1) * width]);
  return rows;
}

TEST(FusedMoe, BitwiseAcrossCommBlocksAndRepeats) {
  Case c{"det", kTop8, {4, 1}, {200, 150, 0, 99}, RoutingKind::uniform, Link::host};
  Harness h(c);
  h.run(c.l0, c.l1);  // every run starts from NaN buffers: nothing is left over from the last one
  const auto first = h.outputs();
  const int Fs = c.par.ffn_shard(c.shape);
  const auto first_hidden = plan_rows(h, 0, h.moe.hidden(0), Fs);
  ASSERT_FALSE(first_hidden.empty());
  check_outputs(h, first);
  for (int n_comm : {1, 4, 16, 32}) {
    h.run(forced(256, n_comm, 2, 1), forced(256, n_comm, 3, 2));
    const auto got = h.outputs();
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_TRUE(bitwise_equal(got[r], first[r])) << "n_comm " << n_comm << " rank " << r;
    EXPECT_EQ(first_hidden, plan_rows(h, 0, h.moe.hidden(0), Fs)) << "layer 0 hidden rows differ with n_comm " << n_comm;
  }
  for (int rep = 0; rep < 10; ++rep) {
    h.run(c.l0, c.l1);
    const auto got = h.outputs();
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_TRUE(bitwise_equal(got[r], first[r])) << "repeat " << rep;
  }
}

// Layer 0 alone in its three modes gives the same hidden rows (comm_only then gemm_only == fused).
TEST(FusedMoe, Layer0ModesAgree) {
  Case c{"modes", kSmallSwiglu, {4, 1}, {120, 90, 60, 30}, RoutingKind::uniform, Link::host};
  Harness h(c);
  h.run(c.l0, c.l1);
  const int Fs = c.par.ffn_shard(c.shape), H = c.shape.hidden;
  const size_t n = size_t(h.moe.capacity().max_rows_per_rank) * Fs;
  const auto fused = download_bf16(h.moe.hidden(1), n);
  COMET_CUDA_CHECK(cudaMemset(h.moe.hidden(1), 0xFF, n * 2));
  COMET_CUDA_CHECK(cudaMemset(h.moe.gathered(1), 0xFF, size_t(h.moe.capacity().max_rows_per_rank) * H * 2));
  h.moe.prepare(1);
  h.moe.layer0(1, LayerMode::comm_only, c.l0);
  h.moe.layer0(1, LayerMode::gemm_only, c.l0);
  h.moe.sync_and_check();
  const HostPlan plan = h.moe.plan(1).to_host(h.team.stream(1));
  const auto split = download_bf16(h.moe.hidden(1), n);
  for (int row = 0; row < plan.view().expert_offset[plan.config().local_experts()]; ++row) {
    if (plan.view().row_unit[row] < 0) continue;
    ASSERT_EQ(0, std::memcmp(&fused[size_t(row) * Fs], &split[size_t(row) * Fs], size_t(Fs) * 2)) << "row " << row;
  }
}

// Sequential mode (n_comm 0 in both layers): the pull, the GEMMs and the combine as separate launches
// on the whole GPU. Same tiles and the same deterministic combine, so the outputs equal the fused
// run's bitwise, and the reference's.
TEST(FusedMoe, SequentialModeEqualsFusedBitwise) {
  Harness h(Case{"ep4_host", kSmallSwiglu, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::host});
  h.run(forced(256, 2), forced(256, 4));
  const auto fused = h.outputs();
  h.run(forced(256, 0), forced(256, 0));
  const auto sequential = h.outputs();
  check_outputs(h, sequential);
  check_layers(h);
  for (size_t r = 0; r < fused.size(); ++r)
    EXPECT_TRUE(bitwise_equal(fused[r], sequential[r])) << "rank " << r;
}

// Layer 0's fused launch with its tiles in m order (LayerRequest::m_order): the compute blocks take the
// tiles expert by expert and wait for each one's last source, instead of wave by wave. The same tiles
// and sums, so the same bits as arrival order, and the reference's; one comm block (the longest waits)
// and several, tiles 256 and 128, a rank without tokens, all tokens to one expert, top-8 on the host link.
TEST(FusedMoe, Layer0MOrderEqualsArrivalOrderBitwise) {
  for (const Case& c : {Case{"ep4_top8_zipf", kTop8, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::device},
                        Case{"ep8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform,
                             Link::host},
                        Case{"ep2tp2_one_expert", kSmallSwiglu, {2, 2}, {64, 129, 0, 33}, RoutingKind::one_expert,
                             Link::device}}) {
    SCOPED_TRACE(c.name);
    Harness h(c);
    for (int tile : {256, 128})
      for (int n_comm : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "tile " << tile << " n_comm " << n_comm);
        h.run(forced(tile, n_comm), forced(256, 2));
        const auto arrival = h.outputs();
        LayerRequest m_order = forced(tile, n_comm);
        m_order.m_order = true;
        h.run(m_order, forced(256, 2));
        EXPECT_TRUE(h.moe.last_decision(0, 0).m_order);
        const auto in_m_order = h.outputs();
        check_outputs(h, in_m_order);
        for (size_t r = 0; r < arrival.size(); ++r)
          EXPECT_TRUE(bitwise_equal(arrival[r], in_m_order[r]))
              << "rank " << r;
      }
  }
}

// The cases of the two order tests below (the same rows computed in another order): each with one comm
// block (the longest waits) and three, tiles 256 and 128; body(c, n_comm) gets c.l0 set.
template <class Body>
void for_each_order_case(Body&& body) {
  for (Case c : {Case{"ep4_top8_zipf", kTop8, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::device},
                 Case{"ep8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::zipf, Link::host},
                 Case{"ep2tp2_one_expert", kSmallSwiglu, {2, 2}, {64, 129, 0, 33}, RoutingKind::one_expert,
                      Link::device}}) {
    SCOPED_TRACE(c.name);
    for (int tile : {256, 128})
      for (int n_comm : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << "tile " << tile << " n_comm " << n_comm);
        c.l0 = forced(tile, n_comm);
        body(c, n_comm);
      }
  }
}

// The plan's chunked wave order (MoeOptions::wave_chunk: an expert's tiles in runs of N, each at its
// last tile's wave; pulled source by source, where the waves are) reorders layer 0's tiles only: the
// same bits as chunks of 1, and the reference's.
TEST(FusedMoe, WaveChunksGiveTheSameBits) {
  for_each_order_case([](Case c, int) {
    c.pull_order = PullOrder::source;
    c.wave_chunk = 1;
    const auto want = checked_outputs(c);
    for (int chunk : {2, 5, 1000}) {
      SCOPED_TRACE(::testing::Message() << "wave_chunk " << chunk);
      c.wave_chunk = chunk;
      Harness h(c);
      h.run(c.l0, c.l1);
      const auto got = h.outputs();
      for (size_t r = 0; r < want.size(); ++r) EXPECT_TRUE(bitwise_equal(want[r], got[r])) << "rank " << r;
    }
  });
}

// Pulled expert by expert (MoeOptions::pull_order), layer 0's comm blocks move the same rows in another
// order and its compute blocks take the tiles in m order (local ones first): the same bits as source by
// source, and the reference's, at wave chunks 1 and 3. Each rank's device plan is the host builder's.
TEST(FusedMoe, ExpertPullOrderGivesTheSameBits) {
  for_each_order_case([](Case c, int n_comm) {
    c.wave_chunk = n_comm;
    c.pull_order = PullOrder::source;
    const auto want = checked_outputs(c);
    c.pull_order = PullOrder::expert;
    Harness h(c);
    h.run(c.l0, c.l1);
    const auto got = h.outputs();
    check_outputs(h, got);
    std::vector<RoutingView> routing;
    for (const auto& in : h.problem.inputs) routing.push_back(RoutingView{in.tokens, in.ids.data(), in.gates.data()});
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(want[r], got[r])) << "rank " << r;
      const DevicePlan& plan = h.moe.plan(int(r));
      ASSERT_EQ(plan.config().pull_order, PullOrder::expert);
      const HostPlan expected = build_plan_host(plan.config(), routing);
      const HostPlan built = plan.to_host(h.team.stream(int(r)));
      const int units = *expected.view().num_units, tiles = *expected.view().num_tiles;
      ASSERT_EQ(*built.view().num_units, units);
      EXPECT_EQ(std::vector<int32_t>(built.view().pull_unit, built.view().pull_unit + units),
                std::vector<int32_t>(expected.view().pull_unit, expected.view().pull_unit + units))
          << "rank " << r;
      EXPECT_EQ(std::vector<int32_t>(built.view().tile_order, built.view().tile_order + tiles),
                std::vector<int32_t>(expected.view().tile_order, expected.view().tile_order + tiles))
          << "rank " << r;
    }
  });
}

// comet-bench --expert-order size (harness/plan_rewrite.hpp): the plan's pull order and tile order
// rewritten on the host after prepare, expert by expert with the smallest expert first. The same bits
// as the builders' order and the reference's, and the order its definition gives
// (expect_smallest_expert_first).
TEST(FusedMoe, SmallestExpertFirstRewriteGivesTheSameBits) {
  for_each_order_case([](Case c, int) {
    c.pull_order = PullOrder::expert;
    c.wave_chunk = 1;
    const auto want = checked_outputs(c);
    Harness h(c);
    h.run(c.l0, c.l1, [&](int r) { order_smallest_expert_first(h.moe.plan(r), h.team.stream(r)); });
    const auto got = h.outputs();
    for (int r = 0; r < h.problem.par.world(); ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      EXPECT_TRUE(bitwise_equal(want[r], got[r]));
      const HostPlan plan = h.moe.plan(r).to_host(h.team.stream(r));
      const PlanView& v = plan.view();
      expect_smallest_expert_first(plan.config(), v, std::vector<int32_t>(v.pull_unit, v.pull_unit + *v.num_units),
                                   std::vector<int32_t>(v.tile_order, v.tile_order + *v.num_tiles));
    }
  });
}

// Layer 0's timeline (MoeEngine::set_layer0_trace, comet-bench --trace): a traced launch gives the same
// bits; it stamps every block of the grid, releases exactly the tiles with remote rows, runs every
// (M-tile, N-block) once on a compute block, and no tile's loads start before its release (the stamps
// say what the flags enforce, so bench/trace_timeline.py can trust them). Both pull orders.
TEST(FusedMoe, Layer0TraceStampsEveryTileAfterItsRelease) {
  for (Case c : {Case{"ep8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::zipf, Link::host},
                 Case{"ep2tp2_one_expert", kSmallSwiglu, {2, 2}, {64, 129, 0, 33}, RoutingKind::one_expert,
                      Link::device}})
    for (PullOrder order : {PullOrder::source, PullOrder::expert}) {
      SCOPED_TRACE(::testing::Message() << c.name << (order == PullOrder::expert ? " expert" : " source"));
      constexpr int kTile = 256, kComm = 3;
      c.l0 = forced(kTile, kComm);
      c.pull_order = order;
      const auto want = checked_outputs(c);
      Harness h(c);
      kernels::LaunchTrace t;
      t.max_blocks = h.moe.resident_blocks(0, kTile);
      t.max_tiles = h.moe.capacity().max_rows_per_rank / kernels::kTileM + 1;
      t.n_blocks = (h.moe.w0_shard_rows() + kTile - 1) / kTile;
      DeviceBuffer stamps(t.words() * sizeof(unsigned long long));
      stamps.fill_bytes(0);
      t.stamps = stamps.as<unsigned long long>();
      h.moe.set_layer0_trace(0, t);
      h.run(c.l0, c.l1);
      h.moe.set_layer0_trace(0, {});
      const auto got = h.outputs();
      for (size_t r = 0; r < want.size(); ++r) EXPECT_TRUE(bitwise_equal(want[r], got[r])) << "rank " << r;

      const auto s = stamps.download<unsigned long long>(t.words());
      const HostPlan plan = h.moe.plan(0).to_host(h.team.stream(0));
      const PlanView& v = plan.view();
      for (int b = 0; b < t.max_blocks; ++b) {
        EXPECT_GT(s[2 * b], 0u) << "block " << b;
        EXPECT_GE(s[2 * b + 1], s[2 * b]) << "block " << b;
      }
      int released = 0;
      for (int m = 0; m < t.max_tiles; ++m) {
        const bool tile = m < *v.num_tiles, remote = tile && v.tile_remote_rows[m] > 0;
        const unsigned long long ready = s[t.ready_at(m)];
        EXPECT_EQ(ready > 0, remote) << "tile " << m;
        released += remote;
        for (int n = 0; n < t.n_blocks; ++n) {
          const size_t at = t.wait_at(m, n);
          if (!tile) {
            EXPECT_EQ(s[at] + s[at + 1] + s[at + 2], 0u) << "tile " << m << " past the plan's";
            continue;
          }
          EXPECT_GT(s[at], 0u) << "tile " << m << " n " << n;
          EXPECT_GE(s[at + 1], s[at]) << "tile " << m << " n " << n;
          EXPECT_GE(s[at + 2], unsigned(kComm)) << "tile " << m << " n " << n << ": not on a compute block";
          EXPECT_LT(s[at + 2], unsigned(t.max_blocks)) << "tile " << m << " n " << n;
          if (remote) EXPECT_GE(s[at + 1], ready) << "tile " << m << " n " << n << " loaded before its release";
        }
      }
      if (std::string(c.name) == "ep8_top8_host") EXPECT_GT(released, 0);
    }
}

// Layer 1's sequential schedule in one launch (each block combines after its last tile, batches taken
// from a shared counter) against the same schedule as a GEMM launch and a combine launch: the same
// bits, and the reference's, at every tile width; run twice in a row from poisoned buffers, so a counter
// that did not reset after the first launch would leave NaN rows in the second.
TEST(FusedMoe, OneLaunchSequentialEqualsTwoLaunchesBitwise) {
  for (const Case& c : {Case{"ep4_top8_zipf", kTop8, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::device},
                        Case{"tp2_gelu_host", kGelu, {1, 2}, {90, 140}, RoutingKind::uniform, Link::host},
                        Case{"ep2tp2_one_expert", kSmallSwiglu, {2, 2}, {64, 129, 0, 33}, RoutingKind::one_expert,
                             Link::device}}) {
    SCOPED_TRACE(c.name);
    Harness h(c);
    for (int tile : {256, 192, 128}) {
      h.run(forced(256, 0), with_one_launch(forced(tile, 0), false));
      const auto two = h.outputs();
      EXPECT_FALSE(h.moe.last_decision(0, 1).one_launch);
      check_outputs(h, two);
      for (int repeat = 0; repeat < 2; ++repeat) {
        h.run(forced(256, 0), with_one_launch(forced(tile, 0), true));
        EXPECT_TRUE(h.moe.last_decision(0, 1).one_launch);
        const auto one = h.outputs();
        for (size_t r = 0; r < one.size(); ++r)
          EXPECT_TRUE(bitwise_equal(one[r], two[r]))
              << "tile " << tile << " repeat " << repeat << " rank " << r;
      }
      check_layers(h);
    }
  }
}

// The sequential schedule's layer-1 GEMM from CUTLASS's grouped GEMMs gives our kernel's output bitwise
// (the same K order in fp32, one rounding to bf16), so the tuner's standalone GEMM never changes a
// result; partial N (TP 4) and experts without rows included.
TEST(FusedMoe, StandaloneGemmsGiveTheSameBits) {
  for (const Case& c : {Case{"ep4", kSmallSwiglu, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::device},
                        Case{"tp4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::one_expert, Link::device}}) {
    Harness h(c);
    h.run(forced(256, 2), forced(256, 4));
    const auto fused = h.outputs();
    for (StandaloneGemm g : kStandaloneGemms) {  // CUTLASS's, each against ours
      if (g == StandaloneGemm::comet || !gives_our_bits(g)) continue;
      h.run(forced(256, 0), with_standalone(forced(256, 0), g));
      const auto got = h.outputs();
      for (size_t r = 0; r < fused.size(); ++r)
        EXPECT_TRUE(bitwise_equal(fused[r], got[r]))
            << c.name << " " << to_string(g) << ": rank " << r;
    }
  }
}

// Runs c with 256-wide tiles (checked against the CPU reference), then with 128- and 192-wide ones in
// layer 1 (and layer 0 too: layer0_too), sequential and with n_comm comm blocks: every run gives the
// first run's bits.
void expect_tile_widths_give_the_same_bits(const Case& c, bool layer0_too, int n_comm) {
  SCOPED_TRACE(c.name);
  Harness h(c);
  h.run(forced(256, 2), forced(256, n_comm));
  const auto want = h.outputs();
  check_outputs(h, want);
  for (int tile : {128, 192}) {
    for (int comm : {0, n_comm}) {
      h.run(layer0_too ? forced(tile, comm) : forced(256, 2), forced(tile, comm));
      const auto got = h.outputs();
      for (size_t r = 0; r < got.size(); ++r)
        EXPECT_TRUE(bitwise_equal(got[r], want[r]))
            << "tile " << tile << " n_comm " << comm << " rank " << r;
    }
  }
}

// Layer 1's tile width changes which blocks compute an output element, not the order in which its K is
// summed: 128, 192 and 256-wide tiles give the same bits, fused and in the sequential schedule (so the
// tuner's tile pick never changes a result); partial column blocks (H = 512 at 192) included.
TEST(FusedMoe, Layer1TileWidthsGiveTheSameBits) {
  for (const Case& c : {Case{"ep4_top8", kTop8, {4, 1}, {96, 0, 130, 77}, RoutingKind::zipf, Link::device},
                        Case{"tp2_gelu", kGelu, {1, 2}, {90, 140}, RoutingKind::uniform, Link::host}})
    expect_tile_widths_give_the_same_bits(c, /*layer0_too=*/false, 4);
}

// Neither layer's tile width changes the K order: 128, 192 and 256-wide tiles in both layers at once
// give the same bits, with partial last column blocks in each: H = 320 is 256 + 64, 192 + 128 and
// 2 x 128 + 64 in layer 1; N0 = 576 is 2 x 256 + 64 and 4 x 128 + 64 in layer 0; TP 4 GELU's N0 = 96 is
// one partial block at every width. (On 2026-12-06 it held the narrow last blocks of 7dc1f76, reverted,
// to the wide tiles' bits.)
TEST(FusedMoe, TileWidthsOfBothLayersGiveTheSameBits) {
  for (const Case& c : {Case{"ep2_h320_n576", MoeShape{320, 288, 8, 2, Activation::swiglu}, {2, 1}, {130, 77},
                             RoutingKind::zipf, Link::device},
                        Case{"tp4_gelu_n96", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::host}})
    expect_tile_widths_give_the_same_bits(c, /*layer0_too=*/true, 2);
}

// Layer 0's 128x320 tiles (two 64 x 160 wgmma atoms across N; swiglu's gate / up pairs never straddle
// them): the reference's outputs and the 256-wide tiles' bits, fused and in the sequential schedule,
// where 320 divides N0 (640: two whole blocks, the Qwen2-57B TP 8 shard's shape at a smaller H), where
// it does not (576: 320 + 256, a partial block), and where N0 is one partial block (TP 4 GELU: 96); a
// rank without tokens, top-8, a skewed routing and all tokens to one expert among them.
TEST(FusedMoe, Layer0Tile320MatchesTheReferenceAndTheWideTilesBits) {
  for (const Case& c : {Case{"tp2_f640_n640", MoeShape{256, 640, 8, 2, Activation::swiglu}, {1, 2}, {150, 0},
                             RoutingKind::zipf, Link::device},
                        Case{"ep2_h320_n576", MoeShape{320, 288, 8, 2, Activation::swiglu}, {2, 1}, {130, 77},
                             RoutingKind::zipf, Link::host},
                        Case{"ep4_top8_n640", MoeShape{192, 320, 16, 8, Activation::swiglu}, {4, 1}, {96, 0, 130, 77},
                             RoutingKind::uniform, Link::device},
                        Case{"ep2xtp2_one_expert", MoeShape{128, 1280, 8, 2, Activation::swiglu}, {2, 2}, {64, 129, 0, 33},
                             RoutingKind::one_expert, Link::device},
                        Case{"tp4_gelu_n96", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::host}}) {
    SCOPED_TRACE(c.name);
    Harness h(c);
    h.run(forced(256, 2), forced(256, 4));
    const auto want = h.outputs();
    check_outputs(h, want);
    for (int comm : {0, 1, 3}) {
      h.run(forced(320, comm), forced(256, 4));
      const auto got = h.outputs();
      check_outputs(h, got);
      for (size_t r = 0; r < got.size(); ++r)
        EXPECT_TRUE(bitwise_equal(got[r], want[r])) << "n_comm " << comm << " rank " << r;
    }
  }
}

// Adaptive split: with the tuner's n_comm, each fused launch re-picks its comm blocks on the device
// from the plan's counts. The kernel's pick is the rule of tune/adaptive_split.hpp evaluated here on
// the host plan, and the outputs equal a forced run's bitwise (n_comm never changes the result).
TEST(FusedMoe, AdaptiveSplitFollowsThePlanAndKeepsTheResult) {
  Case c{"adaptive", kTop8, {4, 1}, {300, 20, 250, 77}, RoutingKind::zipf, Link::host};
  c.l0 = c.l1 = LayerRequest{};
  c.l0.tile_n = c.l1.tile_n = 256;
  Harness h(c, 1, kNoTable);  // the cost model picks
  ASSERT_TRUE(h.moe.options().adaptive_split);
  const int W = c.par.world();
  for (int r = 0; r < W; ++r) h.moe.stage(r, h.ranks[r]->batch());
  h.team.barrier();
  std::vector<std::array<int, 2>> used(W);
  for (int r = 0; r < W; ++r) {
    h.moe.prepare(r);
    h.moe.layer0(r, LayerMode::fused, c.l0);
    used[r][0] = h.moe.last_n_comm(r, 0);
    h.moe.layer1(r, LayerMode::fused, c.l1);
    used[r][1] = h.moe.last_n_comm(r, 1);
  }
  h.team.barrier();
  for (int r = 0; r < W; ++r) h.moe.finish(r, h.ranks[r]->batch());
  h.moe.sync_and_check();
  const auto adaptive = h.outputs();
  check_outputs(h, adaptive);

  for (int r = 0; r < W; ++r) {
    const HostPlan plan = h.moe.plan(r).to_host(h.team.stream(r));
    for (int layer = 0; layer < 2; ++layer) {
      const LaunchDecision& d = h.moe.last_decision(r, layer);
      EXPECT_STREQ(d.picked_by, "cost_model");
      EXPECT_EQ(d.adaptive, d.n_comm > 0);
      const int tokens = std::max(1, c.tokens[r]);
      const AdaptiveSplit a = make_adaptive_split(c.shape, c.par, layer, tokens, h.moe.planner().model(),
                                                  h.moe.planner().caps().sms, d.tile_n, d.n_comm, nullptr);
      const int want = d.n_comm == 0 ? 0 : adaptive_n_comm(a, plan.view(), d.n_comm, d.resident_blocks);
      EXPECT_EQ(used[r][layer], want) << "rank " << r << " layer " << layer << " (host pick " << d.n_comm << ")";
    }
  }
  h.run(forced(256, 4), forced(256, 4));
  const auto forced = h.outputs();
  for (int r = 0; r < W; ++r)
    EXPECT_TRUE(bitwise_equal(adaptive[r], forced[r])) << "rank " << r;
}

// The tuner's wave chunk per load class (layer 0's table entries of classes 2, 4 and 8 carry one beside
// their n_comm): prepare() gives each rank's plan the chunk rule of layer 0's adaptive split, so a
// skewed rank orders its tiles in its class's chunks (the host builder's order at that chunk, computed
// here from the class's definition) and runs its class's n_comm; a forced launch after it re-orders the
// plan by default; the outputs are the reference's, and the default order's bit for bit.
TEST(FusedMoe, TableWaveChunkOrdersTheSkewedRanksPlans) {
  Case c{"table_chunk", kTop8, {4, 1}, {300, 20, 250, 77}, RoutingKind::zipf, Link::host};
  c.pull_order = PullOrder::source;  // the chunks cut the source order's waves (expert by expert has one)
  c.l0 = c.l1 = LayerRequest{};
  c.l0.tile_n = c.l1.tile_n = 256;
  const int kChunks[kLoadClasses] = {0, 2, 3, 5};  // per class; class c's n_comm is 2 + c
  std::string table;
  {
    LocalTeam probe_team(c.par.world(), c.link);
    FusedMoe probe(probe_team, c.shape, c.par, MoeCapacity{300, 0}, MoeOptions{});
    const LaunchPlanner& planner = probe.engine().planner();
    TuneTable t;
    for (int tokens : c.tokens) {
      const int tk = std::max(1, tokens);
      t.put(planner.key(0, tk), TuneEntry{LayerVariant{256, 2, 0, 1}, 1.0});
      t.put(planner.key(1, tk), TuneEntry{LayerVariant{256, 4, 0, 1}, 1.0});
      for (int cl = 1; cl < kLoadClasses; ++cl) {
        LayerVariant v{256, 2 + cl, 0, 1};
        v.wave_chunk = kChunks[cl];
        t.put(planner.key(0, tk, 1 << cl), TuneEntry{v, 1.0});
      }
    }
    table = (std::filesystem::temp_directory_path() / ("comet_chunk_table_" + std::to_string(getpid()) + ".json"))
                .string();
    t.save(table);
  }
  Harness h(c, 1, table);
  const int W = c.par.world();
  for (int r = 0; r < W; ++r) h.moe.stage(r, h.ranks[r]->batch());
  h.team.barrier();
  std::vector<int> used(W);
  for (int r = 0; r < W; ++r) {
    h.moe.prepare(r);
    h.moe.layer0(r, LayerMode::fused, c.l0);
    used[r] = h.moe.last_n_comm(r, 0);
    h.moe.layer1(r, LayerMode::fused, c.l1);
  }
  h.team.barrier();
  for (int r = 0; r < W; ++r) h.moe.finish(r, h.ranks[r]->batch());
  h.moe.sync_and_check();
  std::remove(table.c_str());
  const auto tuned = h.outputs();
  check_outputs(h, tuned);

  std::vector<RoutingView> routing;
  for (const auto& in : h.problem.inputs) routing.push_back(RoutingView{in.tokens, in.ids.data(), in.gates.data()});
  int skewed = 0;
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    const DevicePlan& plan = h.moe.plan(r);
    const WaveChunkRule& rule = plan.config().chunk_rule;
    EXPECT_DOUBLE_EQ(rule.expected_rows, expected_rows(c.shape, c.par, std::max(1, c.tokens[r])));
    EXPECT_EQ(std::vector<int>(rule.by_load, rule.by_load + kLoadClasses),
              std::vector<int>(kChunks, kChunks + kLoadClasses));
    const HostPlan got = plan.to_host(h.team.stream(r));
    const int El = c.par.local_experts(c.shape);
    const double x = std::accumulate(got.view().expert_rows, got.view().expert_rows + El, 0) / rule.expected_rows;
    const int cl = x < std::sqrt(2.0) ? 0 : x < std::sqrt(8.0) ? 1 : x < std::sqrt(32.0) ? 2 : 3;
    skewed += cl > 0;
    PlanConfig cfg = plan.config();
    cfg.chunk_rule = WaveChunkRule{};
    cfg.wave_chunk = cl > 0 ? kChunks[cl] : kDefaultWaveChunk;
    const HostPlan want = build_plan_host(cfg, routing);
    const int tiles = *want.view().num_tiles;
    ASSERT_EQ(*got.view().num_tiles, tiles);
    EXPECT_EQ(std::vector<int32_t>(got.view().tile_order, got.view().tile_order + tiles),
              std::vector<int32_t>(want.view().tile_order, want.view().tile_order + tiles))
        << "load class " << (1 << cl) << " (rows / expected " << x << "), chunk " << cfg.wave_chunk;
    if (cl > 0) EXPECT_EQ(used[r], 2 + cl) << "the n_comm of load class " << (1 << cl);
  }
  EXPECT_GT(skewed, 0) << "no rank of the case is skewed: the rule went untested";

  // A launch forced to an n_comm does not adapt, so it has no chunk rule: layer0() re-runs the order
  // kernel of a plan prepare() ordered for options.layer0, and the plan is back in the default order.
  h.run(forced(256, 3), forced(256, 4));
  const auto reordered = h.outputs();
  for (int r = 0; r < W; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r << ", forced launch");
    const DevicePlan& plan = h.moe.plan(r);
    EXPECT_TRUE(plan.config().chunk_rule == WaveChunkRule{});
    PlanConfig cfg = plan.config();
    cfg.wave_chunk = kDefaultWaveChunk;
    const HostPlan want = build_plan_host(cfg, routing);
    const HostPlan got = plan.to_host(h.team.stream(r));
    const int tiles = *want.view().num_tiles;
    EXPECT_EQ(std::vector<int32_t>(got.view().tile_order, got.view().tile_order + tiles),
              std::vector<int32_t>(want.view().tile_order, want.view().tile_order + tiles));
    EXPECT_TRUE(bitwise_equal(reordered[r], tuned[r]));
  }

  Case plain = c;
  plain.wave_chunk = kDefaultWaveChunk;  // every batch in the default order
  Harness d(plain);
  d.run(forced(256, 3), forced(256, 4));
  const auto want = d.outputs();
  for (int r = 0; r < W; ++r) EXPECT_TRUE(bitwise_equal(tuned[r], want[r])) << "rank " << r;
}

// ---- after a failure (issue 21) ---------------------------------------------------------------------

// A call whose routing the device refuses writes NaN, not the last call's sums, and its error is kept
// through later good calls until sync_and_check reads it (once).
TEST(FusedMoe, RefusedRoutingPoisonsItsOutputAndStaysReported) {
  Case c{"refused", kSmallSwiglu, {2, 1}, {70, 130}};
  Harness h(c);
  h.run(c.l0, c.l1);  // a good call first: its sums are what a stale output would show
  check_outputs(h, h.outputs());
  std::vector<int32_t> bad = h.problem.inputs[1].ids;
  bad[5 * c.shape.topk + 1] = c.shape.num_experts;  // rank 1, token 5, slot 1: out of range
  h.ranks[1]->ids.upload(bad);  // complete before the ranks' streams read it (DeviceBuffer::upload)
  cudaStream_t caller = h.team.stream(0);
  h.fused.forward(h.batches(), caller);
  COMET_CUDA_CHECK(cudaStreamSynchronize(caller));
  for (const auto& out : h.outputs()) EXPECT_TRUE(all_nan(out)) << "a refused call's output must be NaN";
  const auto& good = h.problem.inputs[1].ids;
  h.ranks[1]->ids.upload(good);
  h.fused.forward(h.batches(), caller);  // good again: right output, the earlier error still kept
  COMET_CUDA_CHECK(cudaStreamSynchronize(caller));
  check_outputs(h, h.outputs());
  try {
    h.fused.sync_and_check();
    ADD_FAILURE() << "the refused call's error was lost";
  } catch (const DeviceReportedError& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 8 out of range [0, 8) at rank 1, token 5, slot 1"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(h.fused.sync_and_check());  // read once
  h.run(c.l0, c.l1);
  check_outputs(h, h.outputs());
}

// A bounded wait that expires part-way through a call (a timeout of ~1 us while 8 KB rows cross the
// host link) leaves arrival counts and the abort word behind. The failed call's output is NaN on the
// ranks that timed out; sync_and_check reports the timeout and resets what the call left, so the next
// call is right (before, it either gave up at once or released tiles on stale counts).
TEST(FusedMoe, RightAfterATimeout) {
  Case c{"timeout", MoeShape{4096, 512, 8, 2, Activation::swiglu}, {2, 1}, {300, 260}, RoutingKind::uniform,
         Link::host};
  Harness h(c);
  h.team.set_timeout(1e-6);
  const int W = c.par.world();
  for (int r = 0; r < W; ++r) h.moe.stage(r, h.ranks[r]->batch());
  h.team.barrier();
  for (int r = 0; r < W; ++r) {
    h.moe.prepare(r);
    h.moe.layer0(r, LayerMode::fused, c.l0);
    h.moe.layer1(r, LayerMode::fused, c.l1);
  }
  h.team.barrier();
  for (int r = 0; r < W; ++r) h.moe.finish(r, h.ranks[r]->batch());
  for (int r = 0; r < W; ++r) COMET_CUDA_CHECK(cudaStreamSynchronize(h.team.stream(r)));
  int timed_out = 0;
  const auto failed = h.outputs();
  for (int r = 0; r < W; ++r) {
    try {
      h.team.check(r);
    } catch (const TimeoutError& e) {
      ++timed_out;
      EXPECT_TRUE(all_nan(failed[r])) << "rank " << r << " timed out (" << e.what() << ") but wrote numbers";
    }
  }
  ASSERT_GT(timed_out, 0) << "no wait expired: the test did not make the failure it is about";
  h.team.set_timeout(3.0);
  EXPECT_THROW(h.moe.sync_and_check(), TimeoutError);
  EXPECT_NO_THROW(h.moe.sync_and_check());  // reported once, then cleared
  for (int rep = 0; rep < 3; ++rep) {
    h.run(c.l0, c.l1);
    check_outputs(h, h.outputs());
  }
}

// The epoch (the flags' generation) is 64-bit: starting just below 2^31 and 2^32, calls cross both
// limits and stay right (an int32 epoch compared with >= would release every tile at the wrap).
TEST(FusedMoe, RightAcrossThe32BitEpochLimits) {
  Case c{"epoch", kSmallSwiglu, {2, 1}, {150, 90}, RoutingKind::zipf, Link::device};
  Harness h(c);
  for (uint64_t start : {(1ull << 31) - 2, (1ull << 32) - 2}) {
    for (int r = 0; r < c.par.world(); ++r) h.moe.set_epoch(r, start);
    for (int call = 0; call < 4; ++call) {
      SCOPED_TRACE(::testing::Message() << "epoch " << start + call + 1);
      h.run(c.l0, c.l1);
      check_outputs(h, h.outputs());
    }
  }
}

// A unit range is a range: a malformed one is refused before launch.
TEST(FusedMoe, MalformedUnitRangeIsRefused) {
  Case c{"units", kSmallSwiglu, {2, 1}, {20, 30}};
  Harness h(c);
  for (int r = 0; r < 2; ++r) h.moe.stage(r, h.ranks[r]->batch());
  h.team.barrier();
  h.moe.prepare(0);
  EXPECT_THROW(h.moe.layer0(0, LayerMode::comm_only, c.l0, UnitRange{5, 2}), InvalidArgument);
  EXPECT_THROW(h.moe.layer1(0, LayerMode::comm_only, c.l1, UnitRange{-3, 2}), InvalidArgument);
  EXPECT_THROW(h.moe.layer0(0, LayerMode::fused, c.l0, UnitRange{0, 2}), InvalidArgument);
  h.moe.sync_and_check();
}

// Automatic options (tile_n 0, n_comm -1): the tuner picks tile shape and n_comm per layer. With an
// empty table the cost model takes 128x192 tiles for layer 0 of a shard whose N (352) wastes 31 % of
// 256-wide tiles, and 128x256 for layer 1 (N = H = 256); F_s = 176 is not a multiple of the 64-wide K
// step either.
TEST(FusedMoe, AutomaticOptionsLetTheTunerPickTheTileShape) {
  Case c{"auto", MoeShape{256, 352, 8, 2, Activation::swiglu}, Parallel{1, 2}, {70, 33}};
  c.l0 = c.l1 = LayerRequest{};
  Harness h(c, 1, kNoTable);
  for (int r = 0; r < 2; ++r) h.moe.stage(r, h.ranks[r]->batch());
  const LaunchDecision t0 = h.moe.decision(0, 0, LayerMode::fused, h.moe.options().layer0);
  const LaunchDecision t1 = h.moe.decision(1, 0, LayerMode::fused, h.moe.options().layer1);
  EXPECT_STREQ(t0.picked_by, "cost_model");
  EXPECT_EQ(t0.tile_n, 192);
  EXPECT_EQ(t1.tile_n, 256);
  // n_comm: the cost model's own pick for this work (over the device link it may be 0, sequential mode).
  EXPECT_GE(t0.n_comm, 0);
  EXPECT_LT(t0.n_comm, t0.resident_blocks);
  EXPECT_EQ(t0.schedule == Schedule::sequential, t0.n_comm == 0);
  // A forced n_comm with an automatic shape keeps the shape pick.
  LayerRequest comm3;
  comm3.n_comm = 3;
  EXPECT_EQ(h.moe.decision(0, 0, LayerMode::fused, comm3).tile_n, 192);
  EXPECT_EQ(h.moe.decision(0, 0, LayerMode::fused, comm3).n_comm, 3);
  EXPECT_FALSE(h.moe.decision(0, 0, LayerMode::fused, comm3).adaptive);  // a forced n_comm stays
  // A requested m_group is obeyed whoever picks the rest.
  LayerRequest group5;
  group5.m_group = 5;
  EXPECT_EQ(h.moe.decision(0, 0, LayerMode::fused, group5).m_group, 5);
  h.moe.forward(h.batches());
  h.moe.sync_and_check();
  check_outputs(h, h.outputs());
  check_layers(h);
}

TEST(FusedMoe, RejectsBadInputBeforeLaunch) {
  Case c{"bad", kSmallSwiglu, {2, 1}, {10, 10}};
  Harness h(c);
  RankBatch b = h.ranks[0]->batch();
  b.tokens = h.moe.capacity().max_tokens_per_rank + 1;
  EXPECT_THROW(h.moe.stage(0, b), InvalidArgument);
  b = h.ranks[0]->batch();
  b.x = nullptr;
  EXPECT_THROW(h.moe.stage(0, b), InvalidArgument);
  b = h.ranks[0]->batch();
  b.x = static_cast<const char*>(b.x) + 2;  // bf16-aligned, not 16-byte aligned
  EXPECT_THROW(h.moe.stage(0, b), InvalidArgument);
  b = h.ranks[0]->batch();
  b.ids_type = static_cast<IdType>(7);
  EXPECT_THROW(h.moe.stage(0, b), InvalidArgument);
  EXPECT_THROW(h.moe.set_weights(0, static_cast<const char*>(h.ranks[0]->w0.get()) + 8, h.ranks[0]->w1.get()),
               InvalidArgument);
  EXPECT_THROW(h.moe.layer0(0, LayerMode::fused, forced(160, 2, 16)), InvalidArgument);
  EXPECT_THROW(h.moe.layer1(0, LayerMode::fused, forced(320, 2, 16)), InvalidArgument);  // not compiled
  LayerRequest bad = forced(256, 2);
  bad.m_group = -1;
  EXPECT_THROW(h.moe.layer0(0, LayerMode::fused, bad), InvalidArgument);
  bad.m_group = 1 << 20;  // would overflow the work-item arithmetic
  EXPECT_THROW(h.moe.layer0(0, LayerMode::fused, bad), InvalidArgument);
  EXPECT_THROW(h.moe.layer1(0, LayerMode::fused, forced(256, 2, 0, 0)), InvalidArgument);  // n_group < 1
  EXPECT_THROW(h.moe.layer1(0, LayerMode::fused, forced(256, 100000, 16)), InvalidArgument);
  EXPECT_THROW(h.moe.stage(5, h.ranks[0]->batch()), InvalidArgument);
  EXPECT_THROW(h.fused.forward(h.ranks[0]->batch(), nullptr), InvalidArgument);  // two local ranks, one batch
  LocalTeam three(3);
  EXPECT_THROW(FusedMoe(three, kSmallSwiglu, Parallel{2, 1}, MoeCapacity{16, 0}), InvalidArgument);
}

// Routing that lives on the GPU is checked there: an id out of range is reported, not followed.
TEST(FusedMoe, ReportsBadDeviceRouting) {
  Case c{"badroute", kSmallSwiglu, {2, 1}, {10, 10}};
  Harness h(c);
  std::vector<int32_t> ids = h.problem.inputs[1].ids;
  ids[7] = 99;  // token 3, slot 1
  h.ranks[1]->ids.upload(ids);
  try {
    h.moe.forward(h.batches());
    h.moe.sync_and_check();
    FAIL() << "bad routing was not reported";
  } catch (const DeviceReportedError& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
}

// Expert ids as int64 (torch.topk's type) give the int32 run's output bitwise; an id past int32 is
// reported as out of range, not wrapped onto a valid expert.
TEST(FusedMoe, Int64IdsMatchInt32Bitwise) {
  Case c{"ids64", kTop8, {4, 1}, {100, 0, 33, 257}, RoutingKind::zipf, Link::device};
  Harness h(c);
  h.fused.forward(h.batches(), nullptr);
  h.fused.sync_and_check();
  const auto want = h.outputs();
  std::vector<DeviceBuffer> ids64;
  std::vector<RankBatch> batches = h.batches();
  for (int r = 0; r < c.par.world(); ++r) {
    const std::vector<int32_t>& ids = h.problem.inputs[r].ids;
    ids64.emplace_back(std::vector<int64_t>(ids.begin(), ids.end()));
    batches[r].ids = ids64.back().get();
    batches[r].ids_type = IdType::i64;
    h.ranks[r]->out.fill_bytes(0xFF);
  }
  h.fused.forward(batches, nullptr);
  h.fused.sync_and_check();
  const auto got = h.outputs();
  for (size_t r = 0; r < got.size(); ++r)
    EXPECT_TRUE(bitwise_equal(got[r], want[r])) << "rank " << r;

  std::vector<int64_t> wide(h.problem.inputs[3].ids.begin(), h.problem.inputs[3].ids.end());
  wide[5] = (int64_t(1) << 32) + 1;  // wraps onto expert 1 if narrowed blindly
  ids64[3].upload(wide);
  h.fused.forward(batches, nullptr);
  EXPECT_THROW(h.fused.sync_and_check(), DeviceReportedError);
}

}  // namespace
