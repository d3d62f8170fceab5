// The fused layer beyond toy sizes and in the ways a framework uses it (issue 21): a DeepSeek-V3-like
// expert layout (E 256, top-8, 32 local experts, H 4096, 4096 tokens), every dispatch_store_lag, a
// call where no rank has tokens, top-k = E, two layers interleaved on one team, and the forward
// captured in a CUDA graph and replayed on new inputs. Each against the CPU reference, each run from
// NaN-poisoned buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "support/captured_graph.hpp"
#include "support/layer_checks.hpp"
#include "support/test_layer.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

using Layer = TestLayer;

// DeepSeek-V3's expert layout (256 experts, top-8, EP 8: 32 local experts) at H 4096 with 4096 tokens
// in all (512 per rank), F kept small so that the CPU reference stays quick; Zipf routing makes some
// experts hot and others empty.
TEST(FusedMoeUses, DeepSeekExpertLayoutAt4096Tokens) {
  LocalTeam team(8, Link::device);
  team.set_timeout(10.0);
  Layer l(team, MoeShape{4096, 256, 256, 8, Activation::swiglu}, Parallel{8, 1}, std::vector<int>(8, 512),
          RoutingKind::zipf, 5);
  l.forward();
  l.expect_right("deepseek layout");
  EXPECT_EQ(l.fused.last_decision(0, 0).tile_n > 0, true);
}

// Long rows leave fewer shared-memory stages, and a layer-0 comm block then runs fewer bulk-copy
// pipelines (dispatch_role.cuh: issuers_for). With the 128x256 tile's 215 KB, H 16384 (32 KB rows,
// 6 stages) runs 2 pipelines of 3 stages and H 32768 (64 KB rows, 3 stages) one; the model shapes
// (H <= 7168) all run 4. Both against the CPU reference, with a rank that has no tokens; the second
// with every token's first slot on one expert.
TEST(FusedMoeUses, LongRowsRunFewerPullPipelines) {
  for (int hidden : {16384, 32768}) {
    const RoutingKind kind = hidden == 16384 ? RoutingKind::uniform : RoutingKind::one_expert;
    LocalTeam team(4, Link::device);
    team.set_timeout(10.0);
    MoeOptions o;
    o.layer0 = forced(256, 3);
    o.layer1 = forced(256, 4);
    Layer l(team, MoeShape{hidden, 128, 8, 2, Activation::swiglu}, Parallel{4, 1}, {40, 0, 33, 17}, kind, 12, o);
    l.forward();
    l.expect_right("H " + std::to_string(hidden));
  }
}

// Every bulk-store lag gives the default's output bitwise.
TEST(FusedMoeUses, EveryDispatchStoreLagGivesTheSameBits) {
  LocalTeam team(4, Link::host);
  team.set_timeout(3.0);
  MoeOptions o;
  o.layer0 = forced(256, 3);
  o.layer1 = forced(256, 4);
  Layer l(team, kTop8, Parallel{4, 1}, {200, 131, 0, 77}, RoutingKind::uniform, 9, o);
  l.forward();
  l.expect_right("default lag");
  const auto want = l.outputs();
  for (int lag : {1, 2, 8}) {
    l.fused.engine().set_dispatch_store_lag(lag);
    l.forward();
    const auto got = l.outputs();
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_EQ(0, std::memcmp(got[r].data(), want[r].data(), got[r].size() * 4)) << "lag " << lag << " rank " << r;
  }
}

// A call where no rank has a token does nothing wrong, and the next call with tokens is right.
TEST(FusedMoeUses, NoRankWithTokensThenTokens) {
  LocalTeam team(4, Link::device);
  team.set_timeout(3.0);
  Layer l(team, kSmallSwiglu, Parallel{2, 2}, {90, 60, 0, 33}, RoutingKind::uniform, 4);
  std::vector<RankBatch> empty = l.batches();
  for (RankBatch& b : empty) b.tokens = 0;
  l.fused.forward(empty, nullptr);
  EXPECT_NO_THROW(l.fused.sync_and_check());
  l.forward();
  l.expect_right("after an empty call");
}

// top-k = E: every token goes to every expert (the most rows a token can make).
TEST(FusedMoeUses, TopKEqualsTheNumberOfExperts) {
  LocalTeam team(2, Link::host);
  team.set_timeout(3.0);
  Layer l(team, MoeShape{256, 256, 8, 8, Activation::swiglu}, Parallel{2, 1}, {70, 129}, RoutingKind::uniform, 6);
  l.forward();
  l.expect_right("k = E");
}

// Two layers of a model on one team, called in turn (as a decoder stack does): each stays right.
TEST(FusedMoeUses, TwoLayersInterleavedOnOneTeam) {
  LocalTeam team(4, Link::device);
  team.set_timeout(3.0);
  Layer a(team, kSmallSwiglu, Parallel{4, 1}, {100, 20, 0, 150}, RoutingKind::zipf, 11);
  Layer b(team, kTop8, Parallel{2, 2}, {64, 128, 3, 0}, RoutingKind::uniform, 12);
  for (int step = 0; step < 3; ++step) {
    a.forward();
    b.forward();
    a.expect_right("layer a, step " + std::to_string(step));
    b.expect_right("layer b, step " + std::to_string(step));
  }
}

// The forward captured once in a CUDA graph, then replayed on new tokens, routing and weights written
// into the same buffers: every replay equals the reference of what the buffers hold.
TEST(FusedMoeUses, CapturedInACudaGraphAndReplayedOnNewInputs) {
  LocalTeam team(4, Link::device);
  team.set_timeout(3.0);
  const MoeShape shape = kSmallSwiglu;
  const Parallel par{4, 1};
  const std::vector<int> tokens{120, 45, 0, 200};
  Layer l(team, shape, par, tokens, RoutingKind::uniform, 21);
  l.forward();  // eager first: the planner's picks are memoised before capture
  CapturedGraph graph(cudaStreamCaptureModeThreadLocal,
                      [&](cudaStream_t stream) { l.fused.forward(l.batches(), stream); });
  for (int replay = 0; replay < 4; ++replay) {
    // New inputs in the captured buffers: another problem of the same sizes.
    l.problem = MoeProblem::make(shape, par, tokens, replay % 2 ? RoutingKind::zipf : RoutingKind::uniform, 100 + replay);
    for (int r = 0; r < par.world(); ++r) {
      const auto fresh = upload_rank(l.problem, r);
      DeviceRank& d = *l.ranks[r];
      for (auto [dst, src] : {std::pair{&d.x, &fresh->x}, {&d.ids, &fresh->ids}, {&d.gates, &fresh->gates},
                              {&d.w0, &fresh->w0}, {&d.w1, &fresh->w1}}) {
        ASSERT_EQ(dst->bytes(), src->bytes());
        COMET_CUDA_CHECK(cudaMemcpy(dst->get(), src->get(), src->bytes(), cudaMemcpyDeviceToDevice));
      }
    }
    l.poison();
    graph.replay();
    l.fused.sync_and_check();
    l.expect_right("graph replay " + std::to_string(replay));
  }
}

}  // namespace
