// The schedule check's bookkeeping (src/tune/schedule_check.hpp; MoeOptions::check_schedule): which
// schedule each launch runs, which launches are timed, and the verdict from the times handed back.
#include <gtest/gtest.h>

#include <vector>

#include "comet/common.hpp"
#include "tune/schedule_check.hpp"

using namespace comet;

namespace {

using Next = ScheduleCheck::Next;
constexpr ScheduleArm kPick = ScheduleArm::pick, kSeq = ScheduleArm::sequential;

// Runs launches of `key` until `check` stops timing them, as the engine would with its times coming back
// at once: the pick's launches take pick_ms, the sequential ones seq_ms (index = their timed sample).
std::vector<Next> run_until_decided(ScheduleCheck& check, const ScheduleCheckKey& key, std::vector<float> pick_ms,
                                    std::vector<float> seq_ms) {
  std::vector<Next> launches;
  size_t taken[2] = {0, 0};
  for (int i = 0; i < 100 && !check.verdict(key); ++i) {
    const Next n = check.next(key);
    launches.push_back(n);
    if (!n.timed) continue;
    const std::vector<float>& ms = n.arm == kPick ? pick_ms : seq_ms;
    size_t& t = taken[int(n.arm)];
    check.add(key, n.arm, ms[t++ % ms.size()]);
  }
  return launches;
}

}  // namespace

TEST(ScheduleCheck, AlternatesWithAWarmUpOfEachThenTimesEachArmItsSamples) {
  ScheduleCheck check(3);
  const ScheduleCheckKey key{0, 4096};
  const auto launches = run_until_decided(check, key, {1.0f}, {2.0f});
  // pick (warm-up), sequential (warm-up), then pick / sequential timed in turn, 3 each.
  ASSERT_EQ(launches.size(), 8u);
  for (size_t i = 0; i < launches.size(); ++i) {
    EXPECT_EQ(launches[i].arm, i % 2 == 0 ? kPick : kSeq) << i;
    EXPECT_EQ(launches[i].timed, i >= 2) << i;
  }
  EXPECT_EQ(check.verdict(key), kPick);
  const auto m = check.medians(key);
  ASSERT_TRUE(m.has_value());
  EXPECT_FLOAT_EQ(m->first, 1.0f);
  EXPECT_FLOAT_EQ(m->second, 2.0f);
  // Decided: the verdict from now on, untimed; a late time changes nothing.
  for (int i = 0; i < 5; ++i) {
    const Next n = check.next(key);
    EXPECT_EQ(n.arm, kPick);
    EXPECT_FALSE(n.timed);
  }
  check.add(key, kSeq, 0.001f);
  EXPECT_EQ(check.verdict(key), kPick);
}

TEST(ScheduleCheck, TheSequentialScheduleWinsOnlyByTheMarginOnItsMedian) {
  {  // 10 % faster in the median (one slow outlier of its own does not matter): sequential
    ScheduleCheck check(5, 0.02);
    run_until_decided(check, {1, 1024}, {1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, {0.9f, 0.9f, 5.0f, 0.9f, 0.9f});
    EXPECT_EQ(check.verdict({1, 1024}), kSeq);
  }
  {  // 1 % faster: inside the margin, the pick stays
    ScheduleCheck check(5, 0.02);
    run_until_decided(check, {1, 1024}, {1.0f}, {0.99f});
    EXPECT_EQ(check.verdict({1, 1024}), kPick);
  }
  {  // the pick's median hides one fast outlier: 1.0 against 0.95, sequential
    ScheduleCheck check(5, 0.02);
    run_until_decided(check, {2, 16384}, {0.1f, 1.0f, 1.0f, 1.0f, 1.0f}, {0.95f});
    EXPECT_EQ(check.verdict({2, 16384}), kSeq);
  }
}

TEST(ScheduleCheck, RunsThePickUntimedWhileTheTimesAreOnTheirWay) {
  ScheduleCheck check(2);
  const ScheduleCheckKey key{3, 2048};
  std::vector<Next> timed;
  for (int i = 0; i < 6; ++i) {  // 2 warm-ups + 2 x 2 timed, no time handed back yet
    const Next n = check.next(key);
    if (n.timed) timed.push_back(n);
  }
  EXPECT_EQ(timed.size(), 4u);
  for (int i = 0; i < 3; ++i) {  // both arms have had their launches: the pick, untimed, until the times come
    const Next n = check.next(key);
    EXPECT_EQ(n.arm, kPick);
    EXPECT_FALSE(n.timed);
  }
  EXPECT_FALSE(check.verdict(key).has_value());
  check.add(key, kSeq, 0.5f);
  check.add(key, kPick, 1.0f);
  check.add(key, kSeq, 0.5f);
  EXPECT_FALSE(check.verdict(key).has_value());
  check.add(key, kPick, 1.0f);
  EXPECT_EQ(check.verdict(key), kSeq);
  EXPECT_EQ(check.next(key).arm, kSeq);
}

TEST(ScheduleCheck, ADroppedSampleIsTimedAgain) {
  ScheduleCheck check(1);
  const ScheduleCheckKey key{0, 256};
  EXPECT_FALSE(check.next(key).timed);  // pick warm-up
  EXPECT_FALSE(check.next(key).timed);  // sequential warm-up
  const Next a = check.next(key), b = check.next(key);
  ASSERT_TRUE(a.timed && b.timed);
  EXPECT_EQ(a.arm, kPick);
  EXPECT_EQ(b.arm, kSeq);
  check.drop(key, kSeq);  // its events could not be read (or no slot was free)
  check.add(key, kPick, 1.0f);
  const Next again = check.next(key);
  EXPECT_EQ(again.arm, kSeq);
  EXPECT_TRUE(again.timed);
  check.add(key, kSeq, 3.0f);
  EXPECT_EQ(check.verdict(key), kPick);
}

TEST(ScheduleCheck, KeysAreIndependent) {
  ScheduleCheck check(1);
  run_until_decided(check, {0, 1024}, {1.0f}, {0.5f});
  EXPECT_EQ(check.verdict({0, 1024}), kSeq);
  EXPECT_FALSE(check.verdict({0, 2048}).has_value());
  EXPECT_FALSE(check.verdict({1, 1024}).has_value());
  const Next n = check.next({1, 1024});  // a fresh key starts with the pick's warm-up
  EXPECT_EQ(n.arm, kPick);
  EXPECT_FALSE(n.timed);
}

TEST(ScheduleCheck, RefusesNonsenseSettings) {
  EXPECT_THROW(ScheduleCheck(0), InvalidArgument);
  EXPECT_THROW(ScheduleCheck(5, -0.1), InvalidArgument);
  EXPECT_THROW(ScheduleCheck(5, 1.0), InvalidArgument);
}
