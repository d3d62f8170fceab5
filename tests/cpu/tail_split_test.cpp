// The tail split's rule (kernels/tail_split.hpp), evaluated on the host: the same inline code layer 1's
// kernel runs at its start.
#include <gtest/gtest.h>

#include "kernels/tail_split.hpp"

using namespace comet::kernels;

namespace {

constexpr int kSms = 132;

// Phi-3.5 EP 8 at 1024 tokens: 2 experts x 9 M-tiles, H = 4096 in 16 blocks of 256, K = 6400 (100
// K-tiles). 288 tiles leave a last wave of 24: the last 2 M-tiles (32 tiles) run 4 parts each.
TEST(TailSplit, SplitsTheLastWaveOfPhi35Ep8) {
  const TailSplit t = tail_split_rule(18, 16, 100, kSms, kTailSplitSlots);
  EXPECT_EQ(t.m_cut, 16);
  EXPECT_EQ(t.units, 32);
  EXPECT_EQ(t.splits, 4);
  // 256 whole tiles and 128 parts of a quarter: about 2.25 waves instead of 3.
  EXPECT_LE(t.m_cut * 16 + t.units * t.splits, 3 * kSms);
}

TEST(TailSplit, LeavesFullWavesAndNearlyFullOnesAlone) {
  EXPECT_EQ(tail_split_rule(33, 4, 100, kSms, kTailSplitSlots).splits, 1);  // 132 tiles: one full wave
  EXPECT_EQ(tail_split_rule(8, 16, 100, kSms, kTailSplitSlots).splits, 1);  // 128 of 132: nothing to gain
  const TailSplit none = tail_split_rule(8, 16, 100, kSms, kTailSplitSlots);
  EXPECT_EQ(none.m_cut, 8);
  EXPECT_EQ(none.units, 0);
}

TEST(TailSplit, NeedsFourKTilesPerPart) {
  // TP 8 layer 1 (K = F / 8 = 176-320: 3-5 K-tiles): never split.
  EXPECT_EQ(tail_split_rule(18, 16, 5, kSms, kTailSplitSlots).splits, 1);
  EXPECT_EQ(tail_split_rule(18, 16, 8, kSms, kTailSplitSlots).splits, 2);
  EXPECT_EQ(tail_split_rule(18, 16, 15, kSms, kTailSplitSlots).splits, 3);
}

TEST(TailSplit, SmallBatchesSplitEveryTileUpToTheCap) {
  // 3 M-tiles x 2 blocks: 6 tiles on 132 SMs, every one split, at most kTailSplitMaxSplits parts.
  const TailSplit t = tail_split_rule(3, 2, 200, kSms, kTailSplitSlots);
  EXPECT_EQ(t.m_cut, 0);
  EXPECT_EQ(t.units, 6);
  EXPECT_EQ(t.splits, kTailSplitMaxSplits);
}

TEST(TailSplit, PartsNeverExceedTheSlotsOrTheWave) {
  for (int m = 1; m < 300; m += 7)
    for (int nb : {1, 2, 3, 8, 16, 28, 56})
      for (int k : {1, 4, 9, 64, 400})
        for (int slots : {0, 10, kTailSplitSlots}) {
          const TailSplit t = tail_split_rule(m, nb, k, kSms, slots);
          ASSERT_GE(t.m_cut, 0);
          ASSERT_LE(t.m_cut, m);
          ASSERT_EQ(t.units, (m - t.m_cut) * nb);
          if (t.splits == 1) continue;
          ASSERT_LE(t.units * t.splits, slots);
          ASSERT_LE(t.units * t.splits, kSms);
          ASSERT_LE(t.splits, k / kTailSplitMinKTiles);
        }
}

TEST(TailSplit, PartsCoverKOnceInOrder) {
  for (int k : {8, 30, 100, 101})
    for (int s = 2; s <= kTailSplitMaxSplits && s <= k / kTailSplitMinKTiles; ++s) {
      EXPECT_EQ(tail_split_k_begin(0, s, k), 0);
      EXPECT_EQ(tail_split_k_begin(s, s, k), k);
      for (int p = 0; p < s; ++p) EXPECT_GE(tail_split_k_begin(p + 1, s, k) - tail_split_k_begin(p, s, k), kTailSplitMinKTiles);
    }
}

}  // namespace
