// MoeOptions::check_schedule on the GPU (src/tune/schedule_check.hpp, src/ops/launch_timer.hpp): the
// layer alternates the planner's fused pick with the sequential schedule on its first calls, times both
// with events it reads back later, then keeps one. Every call's output against the CPU reference while
// that happens; both schedules seen; a verdict reached and then followed; nothing timed (and nothing
// broken) while the forward is captured in a CUDA graph; a forced n_comm left alone.
#include <gtest/gtest.h>

#include <set>
#include <string>

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

const std::vector<int> kTokens{300, 0, 257, 129};

// A layer on the host link (remote rows in pinned host memory) whose planner picks are fused splits
// (fused_picks_table: the cost model's own pick is the sequential schedule for some launches on some
// GPUs), with the check on unless the options say otherwise.
struct CheckedLayer {
  LocalTeam team{4, Link::host};
  TestLayer layer;
  static MoeOptions with_table(Team& team, MoeOptions o) {
    o.tune_table = fused_picks_table(team, kSmallSwiglu, Parallel{4, 1}, kTokens);
    return o;
  }
  static MoeOptions checking() {
    MoeOptions o;
    o.check_schedule = true;
    return o;
  }
  explicit CheckedLayer(const MoeOptions& o = checking(), uint64_t seed = 31)
      : layer(team, kSmallSwiglu, Parallel{4, 1}, kTokens, RoutingKind::uniform, seed, with_table(team, o)) {
    team.set_timeout(5.0);
  }
  MoeEngine& engine() { return layer.fused.engine(); }
  int tokens(int rank) const { return layer.ranks[rank]->tokens; }
  Schedule pick(int launch, int rank) {
    return engine().decision(launch, rank, LayerMode::fused, launch == 0 ? layer.fused.options().layer0
                                                                        : layer.fused.options().layer1).schedule;
  }
};

}  // namespace

TEST(ScheduleCheck, TimesBothSchedulesThenKeepsOneAndStaysRight) {
  CheckedLayer c;
  c.layer.forward();  // stages rank 0's tokens: its picks can be read
  for (int launch : {0, 1})
    ASSERT_EQ(c.pick(launch, 0), Schedule::fused) << "launch " << launch
                                                  << ": the planner's pick must be a fused split for the check to act";
  std::set<Schedule> seen[2];
  int calls = 1;
  // 2 x 6 launches per key and the times of the last ones read at a later call: a verdict by call ~20.
  for (; calls < 40 && !(c.engine().schedule_verdict(0, 0, c.tokens(0)) && c.engine().schedule_verdict(0, 1, c.tokens(0)));
       ++calls) {
    c.layer.forward();
    c.layer.expect_right("call " + std::to_string(calls));
    for (int launch : {0, 1}) seen[launch].insert(c.engine().last_decision(0, launch).schedule);
  }
  for (int launch : {0, 1}) {
    EXPECT_EQ(seen[launch].size(), 2u) << "launch " << launch << " ran only one schedule while checking";
    const auto verdict = c.engine().schedule_verdict(0, launch, c.tokens(0));
    ASSERT_TRUE(verdict.has_value()) << "launch " << launch << ": no verdict after " << calls << " calls";
    const auto medians = c.engine().schedule_medians(0, launch, c.tokens(0));
    ASSERT_TRUE(medians.has_value());
    EXPECT_GT(medians->first, 0.f);
    EXPECT_GT(medians->second, 0.f);
    std::printf("launch %d: pick %.3f ms, sequential %.3f ms -> %s\n", launch, medians->first, medians->second,
                *verdict == ScheduleArm::pick ? "pick" : "sequential");
  }
  for (int call = 0; call < 3; ++call) {  // decided: the verdict every call
    c.layer.forward();
    c.layer.expect_right("after the verdict, call " + std::to_string(call));
    for (int launch : {0, 1}) {
      const Schedule want = *c.engine().schedule_verdict(0, launch, c.tokens(0)) == ScheduleArm::pick
                                ? Schedule::fused
                                : Schedule::sequential;
      EXPECT_EQ(c.engine().last_decision(0, launch).schedule, want) << "launch " << launch;
    }
  }
}

TEST(ScheduleCheck, AForcedCommBlockCountIsNotChecked) {
  MoeOptions o = CheckedLayer::checking();
  o.layer0 = forced(256, 4);
  o.layer1 = forced(256, 4);
  CheckedLayer c(o);
  for (int call = 0; call < 16; ++call) {
    c.layer.forward();
    for (int launch : {0, 1}) {
      EXPECT_EQ(c.engine().last_decision(0, launch).schedule, Schedule::fused) << "call " << call;
      EXPECT_EQ(c.engine().last_decision(0, launch).n_comm, 4) << "call " << call;
    }
  }
  c.layer.expect_right("forced");
  for (int launch : {0, 1}) EXPECT_FALSE(c.engine().schedule_verdict(0, launch, c.tokens(0)).has_value());
}

// A check under way when the forward is captured: the capture times nothing (no event query while
// capturing), the replays are right, and eager calls after it go on checking.
TEST(ScheduleCheck, CaptureInTheMiddleOfACheck) {
  CheckedLayer c;
  for (int call = 0; call < 3; ++call) c.layer.forward();  // warm-ups and a first timed launch
  CapturedGraph graph(cudaStreamCaptureModeGlobal,
                      [&](cudaStream_t stream) { c.layer.fused.forward(c.layer.batches(), stream); });
  for (int replay = 0; replay < 2; ++replay) {
    c.layer.poison();
    graph.replay();
    c.layer.fused.sync_and_check();
    c.layer.expect_right("replay " + std::to_string(replay));
  }
  int calls = 0;
  for (; calls < 40 && !c.engine().schedule_verdict(0, 0, c.tokens(0)); ++calls) c.layer.forward();
  EXPECT_TRUE(c.engine().schedule_verdict(0, 0, c.tokens(0)).has_value()) << "no verdict " << calls
                                                                          << " eager calls after the capture";
  c.layer.expect_right("after the capture");
}
