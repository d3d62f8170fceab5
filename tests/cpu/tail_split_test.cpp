// The tail split's rule and block assignment (kernels/tail_split.hpp), evaluated on the host: the same
// inline code layer 1's kernel runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/tail_split.hpp"

using namespace comet::kernels;

namespace {

constexpr int kSms = 132;

// Phi-3.5 EP 8 at 1024 tokens: 2 experts x 9 M-tiles, H = 4096 in 16 blocks of 256, K = 6400 (100
// K-tiles). 288 tiles leave a last wave of 24: the last 2 column blocks (36 tiles) run 3 parts each.
TEST(TailSplit, SplitsTheLastWaveOfPhi35Ep8) {
  const TailSplit t = tail_split_rule(18, 16, 100, kSms, kTailSplitSlots);
  EXPECT_EQ(t.n_cut, 14);
  EXPECT_EQ(t.units, 36);
  EXPECT_EQ(t.splits, 3);
}

TEST(TailSplit, LeavesFullWavesAndNearlyFullOnesAlone) {
  EXPECT_EQ(tail_split_rule(33, 4, 100, kSms, kTailSplitSlots).splits, 1);  // 132 tiles: one full wave
  const TailSplit none = tail_split_rule(8, 16, 100, kSms, kTailSplitSlots);  // 128 of 132: nothing to gain
  EXPECT_EQ(none.splits, 1);
  EXPECT_EQ(none.n_cut, 16);
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
  EXPECT_EQ(t.n_cut, 0);
  EXPECT_EQ(t.units, 6);
  EXPECT_EQ(t.splits, kTailSplitMaxSplits);
}

TEST(TailSplit, PartsNeverExceedTheSlotsOrTheWave) {
  for (int m = 1; m < 300; m += 7)
    for (int nb : {1, 2, 3, 8, 16, 28, 56})
      for (int k : {1, 4, 9, 64, 400})
        for (int slots : {0, 10, kTailSplitSlots}) {
          const TailSplit t = tail_split_rule(m, nb, k, kSms, slots);
          ASSERT_GE(t.n_cut, 0);
          ASSERT_LE(t.n_cut, nb);
          ASSERT_EQ(t.units, (nb - t.n_cut) * m);
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

// The schedule's list (layer1_kernel.cuh): whole tiles, then the parts, dealt round-robin to n compute
// blocks. The longest block (whole tiles + parts / splits): Phi-3.5 EP 8 at 1024 tokens runs in 2 1/3
// waves instead of 3 on 132 compute blocks; with 32 comm blocks (100 compute blocks) in 3 1/3 instead
// of 3 (a block with a whole tile more can get a part too): the tuner weighs it (docs/design-changes.md).
double longest(int n, int whole, int parts, int splits) {
  std::vector<double> load(n, 0.0);
  for (int w = 0; w < whole + parts; ++w) load[w % n] += w < whole ? 1.0 : 1.0 / splits;
  return *std::max_element(load.begin(), load.end());
}

TEST(TailSplit, Phi35Ep8Waves) {
  const TailSplit t = tail_split_rule(18, 16, 100, kSms, kTailSplitSlots);
  EXPECT_NEAR(longest(132, 18 * t.n_cut, t.units * t.splits, t.splits), 2.0 + 1.0 / 3, 1e-9);
  EXPECT_NEAR(longest(132, 18 * 16, 0, 1), 3.0, 1e-9);
  EXPECT_NEAR(longest(100, 18 * t.n_cut, t.units * t.splits, t.splits), 3.0 + 1.0 / 3, 1e-9);
}

// On the wave the rule assumes (every resident block computing), a split never lengthens the longest
// block.
TEST(TailSplit, NeverLongerOnTheFullGrid) {
  for (int m = 1; m < 200; m += 3)
    for (int nb : {1, 2, 4, 8, 16, 28})
      for (int k : {8, 30, 100}) {
        const TailSplit t = tail_split_rule(m, nb, k, kSms, kTailSplitSlots);
        ASSERT_LE(longest(kSms, m * t.n_cut, t.units * t.splits, t.splits), longest(kSms, m * nb, 0, 1) + 1e-9)
            << "m " << m << " nb " << nb << " k " << k;
      }
}

}  // namespace
