// StandaloneGemm::cublas in the forward (layer 1's sequential schedule): cuBLAS per expert, with the
// plan's per-expert rows read back to the host. A table's pick and a request in the options (the copy
// started after the plan build, waited for before the launch) and a request the options do not make
// (read when the launch needs it), each against the CPU reference, with a rank without tokens, experts without rows, a partial N (TP 4) and top-8; the same
// bits every run; under CUDA-graph capture (no host read) our kernel runs, and its bits are ours.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comet/cuda_check.hpp"
#include "comet/fused_moe.hpp"
#include "ops/moe_engine.hpp"
#include "support/captured_graph.hpp"
#include "support/test_layer.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

const std::string kNoTable = "/nonexistent/comet-test/tune.json";  // an empty table: the cost model picks

struct CublasCase {
  const char* name;
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens;
  RoutingKind kind;
  Link link;
};

const CublasCase kCases[] = {
    {"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform, Link::device},
    {"EP4_all_to_one_expert_top1", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert, Link::host},
    {"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device},
    {"EP2xTP2_top8_zipf", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::host},
};

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  for (size_t r = 0; r < a.size(); ++r)
    if (a[r].size() != b[r].size() || std::memcmp(a[r].data(), b[r].data(), a[r].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// Runs `body` for each case on a team of its own (a stalled flag fails in seconds).
void for_each_case(const std::function<void(const CublasCase&, LocalTeam&)>& body) {
  for (const CublasCase& c : kCases) {
    SCOPED_TRACE(c.name);
    LocalTeam team(c.par.world(), c.link);
    team.set_timeout(3.0);
    body(c, team);
  }
}

// Layer 1's standalone GEMM on every rank, as the last forward ran it.
void expect_layer1_ran(TestLayer& layer, StandaloneGemm want, const std::string& what) {
  for (const auto& r : layer.ranks) {
    const LaunchDecision& d = layer.fused.engine().last_decision(r->rank, 1);
    EXPECT_EQ(d.schedule, Schedule::sequential) << what << ": rank " << r->rank;
    EXPECT_EQ(d.standalone_gemm, want) << what << ": rank " << r->rank << " ran " << to_string(d.standalone_gemm);
  }
}

}  // namespace

TEST(CublasStandalone, TablePickMatchesTheReferenceAndRepeats) {
  for_each_case([](const CublasCase& c, LocalTeam& team) {
    MoeOptions o;
    o.tune_table = cublas_picks_table(team, c.shape, c.par, c.tokens);
    TestLayer layer(team, c.shape, c.par, c.tokens, c.kind, 7, o);
    layer.forward();
    layer.expect_right("cublas pick");
    expect_layer1_ran(layer, StandaloneGemm::cublas, "cublas pick");
    const auto first = layer.outputs();
    layer.forward();
    EXPECT_TRUE(same_bits(first, layer.outputs())) << "a second run changed the output bits";
  });
}

// Asked for in the layer's options: prepare() starts the read, as for a table's pick.
TEST(CublasStandalone, AForcedRequestMatchesTheReference) {
  for_each_case([](const CublasCase& c, LocalTeam& team) {
    MoeOptions o;
    o.tune_table = kNoTable;
    o.layer1 = with_standalone(forced(256, 0), StandaloneGemm::cublas);
    TestLayer layer(team, c.shape, c.par, c.tokens, c.kind, 11, o);
    for (int call = 0; call < 2; ++call) {
      layer.forward();
      layer.expect_right("forced cublas, call " + std::to_string(call));
      expect_layer1_ran(layer, StandaloneGemm::cublas, "forced cublas");
    }
  });
}

// The steps driven with a request the layer's options do not make: prepare() foresaw no cuBLAS and read
// no rows, so layer 1 reads them when it runs (waiting for the launches before it on the stream).
TEST(CublasStandalone, AnUnforeseenRequestReadsTheRowsWhenItNeedsThem) {
  for_each_case([](const CublasCase& c, LocalTeam& team) {
    MoeOptions o;
    o.tune_table = kNoTable;
    TestLayer layer(team, c.shape, c.par, c.tokens, c.kind, 13, o);
    MoeEngine& moe = layer.fused.engine();
    const LayerRequest l1 = with_standalone(forced(256, 0), StandaloneGemm::cublas);
    for (int call = 0; call < 2; ++call) {
      layer.poison();
      for (const auto& r : layer.ranks) moe.stage(r->rank, r->batch());
      team.barrier();
      for (const auto& r : layer.ranks) {
        moe.prepare(r->rank);
        moe.layer0(r->rank, LayerMode::fused, layer.fused.options().layer0);
        moe.layer1(r->rank, LayerMode::fused, l1);
      }
      team.barrier();
      for (const auto& r : layer.ranks) moe.finish(r->rank, r->batch());
      moe.sync_and_check();
      layer.expect_right("unforeseen cublas, call " + std::to_string(call));
      expect_layer1_ran(layer, StandaloneGemm::cublas, "unforeseen cublas");
    }
  });
}

// A capture cannot wait for a host read: the captured forward runs our GEMM (its bits are the ones our
// kernel gives eagerly), and eager calls after it run cuBLAS again.
TEST(CublasStandalone, UnderGraphCaptureOurKernelRuns) {
  const CublasCase& c = kCases[0];
  LocalTeam team(c.par.world(), c.link);
  team.set_timeout(3.0);
  MoeOptions ours_options;
  ours_options.tune_table = kNoTable;
  ours_options.layer1 = forced(256, 0);
  TestLayer ours(team, c.shape, c.par, c.tokens, c.kind, 5, ours_options);
  ours.forward();
  const auto ours_bits = ours.outputs();

  MoeOptions o;
  o.tune_table = cublas_picks_table(team, c.shape, c.par, c.tokens);
  TestLayer layer(team, c.shape, c.par, c.tokens, c.kind, 5, o);
  layer.forward();
  expect_layer1_ran(layer, StandaloneGemm::cublas, "eager");
  CapturedGraph graph(cudaStreamCaptureModeGlobal,
                      [&](cudaStream_t stream) { layer.fused.forward(layer.batches(), stream); });
  expect_layer1_ran(layer, StandaloneGemm::comet, "captured");
  layer.poison();
  graph.replay();
  layer.fused.sync_and_check();
  layer.expect_right("replay");
  EXPECT_TRUE(same_bits(ours_bits, layer.outputs())) << "the captured forward did not give our kernel's bits";
  layer.forward();
  expect_layer1_ran(layer, StandaloneGemm::cublas, "eager after the capture");
  layer.expect_right("eager after the capture");
}
