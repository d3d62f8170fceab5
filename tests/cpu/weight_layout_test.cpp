// Per-rank weight layout: every local element maps back to the right full element, unsharding all
// ranks rebuilds the full weights, the swiglu interleave rule holds element by element, the layout
// reproduces the reference's hidden shard, and bad input is rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <string>

#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "support/expect_invalid.hpp"
#include "harness/routing_gen.hpp"

using namespace comet;
using comet::testing::expect_invalid;

namespace {

const Activation kActivations[] = {Activation::swiglu, Activation::gelu, Activation::silu};
const Parallel kLayouts[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 2}, {2, 4}, {8, 1}, {1, 8}};

// Full weights whose value is their own flat index (exact in fp32 below 2^24), so a local element's
// value says where it came from.
std::vector<float> iota_values(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

// Where local element (e, n, c) of rank r's w0 comes from, written from the rule in the brief rather
// than through w0_full_row.
size_t expected_w0_source(const MoeShape& s, const Parallel& p, int r, int e, int n, int c) {
  const int Fs = s.ffn / p.tp, i = r % p.tp, g = r / p.tp, El = s.num_experts / p.ep;
  int row;
  if (s.act == Activation::swiglu) {
    const int b = n / 16, q = n % 16;
    row = q < 8 ? i * Fs + 8 * b + q : s.ffn + i * Fs + 8 * b + (q - 8);
  } else {
    row = i * Fs + n;
  }
  return (size_t(g * El + e) * s.w0_rows() + row) * s.hidden + c;
}

size_t expected_w1_source(const MoeShape& s, const Parallel& p, int r, int e, int h, int f) {
  const int Fs = s.ffn / p.tp, i = r % p.tp, g = r / p.tp, El = s.num_experts / p.ep;
  return (size_t(g * El + e) * s.hidden + h) * s.ffn + i * Fs + f;
}

}  // namespace

TEST(WeightLayout, EveryLocalElementMapsBackToItsFullElement) {
  for (Activation act : kActivations)
    for (const Parallel& par : kLayouts) {
      const MoeShape shape{16, 64, 8, 2, act};
      SCOPED_TRACE(std::string(to_string(act)) + " ep=" + std::to_string(par.ep) + " tp=" + std::to_string(par.tp));
      const auto w0 = iota_values(size_t(8) * shape.w0_rows() * 16);
      const auto w1 = iota_values(size_t(8) * 16 * 64);
      // bf16 copies of random values, to check the bf16 variant maps (and rounds) the same way.
      const auto w0r = comet::testing::random_bf16_values(w0.size(), 1.0f, 3);
      const auto w1r = comet::testing::random_bf16_values(w1.size(), 1.0f, 4);
      for (int r = 0; r < par.world(); ++r) {
        const RankWeightsF32 l = shard_weights_f32(shape, par, r, w0, w1);
        const RankWeights b = shard_weights(shape, par, r, w0r, w1r);
        const int El = 8 / par.ep, Fs = 64 / par.tp, N0 = act == Activation::swiglu ? 2 * Fs : Fs;
        ASSERT_EQ(l.local_experts, El);
        ASSERT_EQ(l.ffn_shard, Fs);
        ASSERT_EQ(l.w0_rows, N0);
        ASSERT_EQ(l.hidden, 16);
        ASSERT_EQ(l.w0.size(), size_t(El) * N0 * 16);
        ASSERT_EQ(l.w1.size(), size_t(El) * 16 * Fs);
        ASSERT_EQ(b.w0.size(), l.w0.size());
        ASSERT_EQ(b.w1.size(), l.w1.size());
        for (int e = 0; e < El; ++e) {
          for (int n = 0; n < N0; ++n)
            for (int c = 0; c < 16; ++c) {
              const size_t local = (size_t(e) * N0 + n) * 16 + c, src = expected_w0_source(shape, par, r, e, n, c);
              ASSERT_EQ(size_t(l.w0[local]), src) << "rank " << r << " w0 e=" << e << " n=" << n << " c=" << c;
              ASSERT_EQ(b.w0[local], float_to_bf16(w0r[src])) << "rank " << r << " bf16 w0 " << local;
            }
          for (int h = 0; h < 16; ++h)
            for (int f = 0; f < Fs; ++f) {
              const size_t local = (size_t(e) * 16 + h) * Fs + f, src = expected_w1_source(shape, par, r, e, h, f);
              ASSERT_EQ(size_t(l.w1[local]), src) << "rank " << r << " w1 e=" << e << " h=" << h << " f=" << f;
              ASSERT_EQ(b.w1[local], float_to_bf16(w1r[src])) << "rank " << r << " bf16 w1 " << local;
            }
        }
      }
    }
}

TEST(WeightLayout, UnshardingAllRanksRebuildsTheFullWeightsExactly) {
  for (Activation act : kActivations)
    for (const Parallel& par : kLayouts) {
      const MoeShape shape{24, 64, 8, 2, act};
      SCOPED_TRACE(std::string(to_string(act)) + " ep=" + std::to_string(par.ep) + " tp=" + std::to_string(par.tp));
      const auto w0 = comet::testing::random_bf16_values(size_t(8) * shape.w0_rows() * 24, 1.0f, 10);
      const auto w1 = comet::testing::random_bf16_values(size_t(8) * 24 * 64, 1.0f, 11);
      std::vector<float> w0_back(w0.size(), 0.0f), w1_back(w1.size(), 0.0f);
      for (int r = 0; r < par.world(); ++r) {
        const RankWeightsF32 l = shard_weights_f32(shape, par, r, w0, w1);
        unshard_add_w0(shape, par, r, l.w0, w0_back);
        unshard_add_w1(shape, par, r, l.w1, w1_back);
      }
      EXPECT_EQ(w0_back, w0);  // each element added once onto zero: exact
      EXPECT_EQ(w1_back, w1);
    }
}

TEST(WeightLayout, UnshardAddsOntoExistingValues) {
  const MoeShape shape{8, 16, 2, 1, Activation::gelu};
  const Parallel par{1, 2};
  std::vector<float> w0_full(size_t(2) * 16 * 8, 1.0f);
  const std::vector<float> local(size_t(2) * 8 * 8, 2.0f);
  unshard_add_w0(shape, par, 1, local, w0_full);
  // Rank 1 holds rows [8, 16) of both experts.
  for (int e = 0; e < 2; ++e)
    for (int row = 0; row < 16; ++row)
      EXPECT_EQ(w0_full[(size_t(e) * 16 + row) * 8], row < 8 ? 1.0f : 3.0f) << "e=" << e << " row=" << row;
}

TEST(WeightLayout, SwigluInterleaveRuleOnExplicitElements) {
  // H = 8, F = 64, E = 4, ep = 2, tp = 2: F_s = 32, two experts per rank. Rank 3 = EP group 1, TP index 1:
  // experts 2 and 3, F columns [32, 64).
  const MoeShape shape{8, 64, 4, 2, Activation::swiglu};
  const Parallel par{2, 2};
  const auto w0 = iota_values(size_t(4) * 128 * 8);
  const auto w1 = iota_values(size_t(4) * 8 * 64);
  const RankWeightsF32 l = shard_weights_f32(shape, par, 3, w0, w1);
  ASSERT_EQ(l.w0_rows, 64);
  auto w0_local = [&](int e, int n, int c) { return size_t(l.w0[(size_t(e) * 64 + n) * 8 + c]); };
  auto w0_full = [&](int e, int row, int c) { return (size_t(e) * 128 + row) * 8 + c; };
  // Local expert 1 (= expert 3), block b = 1, q = 3, column 5.
  // Gate: local row 16*1 + 3 = 19 holds gate row 32 + 8 + 3 = 43.
  EXPECT_EQ(w0_local(1, 19, 5), w0_full(3, 43, 5));
  // Up: local row 16*1 + 8 + 3 = 27 holds up row F + 43 = 107.
  EXPECT_EQ(w0_local(1, 27, 5), w0_full(3, 107, 5));
  // The first and last rows of the shard.
  EXPECT_EQ(w0_local(0, 0, 0), w0_full(2, 32, 0));   // gate of f = 32
  EXPECT_EQ(w0_local(0, 8, 0), w0_full(2, 96, 0));   // up of f = 32
  EXPECT_EQ(w0_local(0, 63, 7), w0_full(2, 127, 7));  // up of f = 63
  EXPECT_EQ(w0_full_row(shape, par, 3, 19), 43);
  EXPECT_EQ(w0_full_row(shape, par, 3, 27), 107);
  EXPECT_EQ(w0_full_row(shape, par, 2, 27), 64 + 11);  // TP index 0
  // w1: local [1][h=6][f=5] = w1[3][6][32 + 5].
  EXPECT_EQ(size_t(l.w1[(size_t(1) * 8 + 6) * 32 + 5]), (size_t(3) * 8 + 6) * 64 + 37);
}

TEST(WeightLayout, GeluAndSiluRowsArePlainSlices) {
  for (Activation act : {Activation::gelu, Activation::silu}) {
    const MoeShape shape{8, 32, 2, 1, act};
    const Parallel par{1, 4};
    for (int r = 0; r < 4; ++r)
      for (int n = 0; n < 8; ++n) EXPECT_EQ(w0_full_row(shape, par, r, n), 8 * r + n);
  }
}

// What a kernel does with the layout: z = w0_local x, then hidden f = 8b + q from the pair of
// columns (16b + q, 16b + 8 + q) (swiglu) or column f (gelu/silu); must equal the reference's shard.
TEST(WeightLayout, LocalLayoutReproducesTheReferenceHiddenShard) {
  for (Activation act : kActivations) {
    const MoeShape shape{32, 64, 4, 1, act};
    const Parallel par{2, 2};
    SCOPED_TRACE(to_string(act));
    reference::ExpertWeights<float> w{comet::testing::random_bf16_values(size_t(4) * shape.w0_rows() * 32, 0.3f, 20),
                                      comet::testing::random_bf16_values(size_t(4) * 32 * 64, 0.3f, 21)};
    const auto x = comet::testing::random_bf16_values(32, 1.0f, 22);
    for (int r = 0; r < par.world(); ++r) {
      const RankWeightsF32 l = shard_weights_f32(shape, par, r, w.w0, w.w1);
      const int Fs = l.ffn_shard, f0 = par.tp_index(r) * Fs;
      for (int e = 0; e < l.local_experts; ++e) {
        const int expert = par.first_local_expert(shape, r) + e;
        std::vector<double> z(l.w0_rows, 0.0);
        for (int n = 0; n < l.w0_rows; ++n)
          for (int c = 0; c < 32; ++c) z[n] += double(l.w0[(size_t(e) * l.w0_rows + n) * 32 + c]) * x[c];
        const auto want = reference::expert_hidden(shape, w, expert, x.data(), f0, f0 + Fs);
        for (int f = 0; f < Fs; ++f) {
          double h;
          if (act == Activation::swiglu) {
            const double gate = z[16 * (f / 8) + f % 8], up = z[16 * (f / 8) + 8 + f % 8];
            h = gate / (1 + std::exp(-gate)) * up;
          } else if (act == Activation::silu) {
            h = z[f] / (1 + std::exp(-z[f]));
          } else {
            h = 0.5 * z[f] * (1 + std::tanh(0.7978845608028654 * (z[f] + 0.044715 * z[f] * z[f] * z[f])));
          }
          ASSERT_NEAR(want[f], h, 1e-5) << "rank " << r << " expert " << expert << " f " << f;
        }
        // w1_local row h is w1_e[h][f0 : f0 + Fs]: its product with the shard is expert_output's partial.
        const auto y = reference::expert_output(shape, w, expert, want.data(), f0, f0 + Fs);
        for (int h = 0; h < 32; ++h) {
          double acc = 0;
          for (int f = 0; f < Fs; ++f) acc += double(l.w1[(size_t(e) * 32 + h) * Fs + f]) * want[f];
          ASSERT_NEAR(y[h], acc, 1e-5) << "rank " << r << " expert " << expert << " h " << h;
        }
      }
    }
  }
}

TEST(WeightLayout, RejectsBadInputWithClearMessages) {
  const MoeShape shape{8, 16, 4, 2, Activation::swiglu};
  const Parallel par{2, 2};
  const std::vector<float> w0(size_t(4) * 32 * 8), w1(size_t(4) * 8 * 16);
  EXPECT_NO_THROW(shard_weights(shape, par, 3, w0, w1));
  expect_invalid([&] { shard_weights(shape, par, 4, w0, w1); }, "rank 4 out of range [0, 4)");
  expect_invalid([&] { shard_weights(shape, par, -1, w0, w1); }, "rank -1 out of range");
  expect_invalid([&] { shard_weights(shape, par, 0, w1, w1); }, "w0_full has 512 values, expected E*w0_rows*H = 1024");
  expect_invalid([&] { shard_weights_f32(shape, par, 0, w0, w0); }, "w1_full has 1024 values, expected E*H*F = 512");
  expect_invalid([&] { shard_weights(shape, Parallel{1, 4}, 0, w0, w1); }, "must be a multiple of 8");
  std::vector<float> full0 = w0, full1 = w1;
  const RankWeightsF32 l = shard_weights_f32(shape, par, 1, w0, w1);
  EXPECT_NO_THROW(unshard_add_w0(shape, par, 1, l.w0, full0));
  EXPECT_NO_THROW(unshard_add_w1(shape, par, 1, l.w1, full1));
  expect_invalid([&] { unshard_add_w0(shape, par, 1, l.w1, full0); }, "w0_local has 128 values, expected E_l*N0_s*H = 256");
  expect_invalid([&] { unshard_add_w1(shape, par, 1, l.w1, full0); }, "w1_full has 1024 values");
  expect_invalid([&] { unshard_add_w1(shape, par, 9, l.w1, full1); }, "rank 9 out of range");
  expect_invalid([&] { w0_full_row(shape, par, 0, 16); }, "local w0 row 16 out of range [0, 16)");
}
