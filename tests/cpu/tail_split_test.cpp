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

// Every whole tile and every part is some block's item exactly once, whole tiles keep their
// round-robin blocks, and the longest block (whole tiles + parts / splits) is never longer than
// without the split, whatever the compute blocks.
double longest(const TailAssignment& a) {
  double worst = 0;
  for (int c = 0; c < a.n; ++c) worst = std::max(worst, a.whole_of(c) + double(a.phase_a_of(c) + a.phase_b_of(c)) / a.splits);
  return worst;
}

TEST(TailSplit, AssignmentRunsEveryTileAndPartOnce) {
  for (int n : {132, 124, 100, 37, 1})
    for (int m = 1; m < 120; m += 5)
      for (int nb : {1, 4, 16}) {
        const TailSplit t = tail_split_rule(m, nb, 100, kSms, kTailSplitSlots);
        if (t.splits == 1) continue;
        const TailAssignment a{n, m * t.n_cut, t.units * t.splits, t.splits};
        std::vector<int> whole(a.whole, 0), parts(a.parts, 0);
        for (int c = 0; c < n; ++c) {
          ASSERT_LE(a.items_of(c), a.max_items());
          for (int i = 0; i < a.max_items(); ++i) {
            const int item = a.item(c, i);
            if (i >= a.items_of(c)) {
              ASSERT_EQ(item, -1);
            } else if (item >= 0) {
              ASSERT_LT(item, a.whole);
              ASSERT_EQ(item % n, c) << "whole tiles keep their round-robin block";
              ++whole[item];
            } else {
              ASSERT_LE(item, -2);
              ASSERT_LT(-2 - item, a.parts);
              ++parts[-2 - item];
            }
          }
        }
        for (int x : whole) ASSERT_EQ(x, 1);
        for (int x : parts) ASSERT_EQ(x, 1);
        // Never longer than without the split (ceil(tiles / n) whole tiles on the longest block).
        const int unsplit = (m * nb + n - 1) / n;
        ASSERT_LE(longest(a), unsplit + 1e-9)
            << "n " << n << " m " << m << " nb " << nb;
      }
}

// Phi-3.5 EP 8 at 1024 tokens: 132 compute blocks run it in 2 1/3 waves instead of 3; with 32 comm
// blocks (100 compute blocks) in 3, as without the split (the parts fill the blocks with a free slot).
TEST(TailSplit, Phi35Ep8Waves) {
  const TailSplit t = tail_split_rule(18, 16, 100, kSms, kTailSplitSlots);
  const TailAssignment all{132, 18 * t.n_cut, t.units * t.splits, t.splits};
  EXPECT_NEAR(longest(all), 2.0 + 1.0 / 3, 1e-9);
  const TailAssignment fused{100, 18 * t.n_cut, t.units * t.splits, t.splits};
  EXPECT_NEAR(longest(fused), 3.0, 1e-9);
}

}  // namespace
