// e4m3 and block-scaled quantisation (comet/fp8.hpp) against CUDA's own conversion (cuda_fp8.h, host
// side) as the independent oracle, and the error bound the fp8 tests will use, shown to hold and to bite.
#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "comet/common.hpp"
#include "comet/fp8.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;

namespace {

uint8_t cuda_e4m3(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
float cuda_value(uint8_t c) { return float(__half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3))); }

TEST(Fp8, EveryCodeDecodesAsCudaDoesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float ours = fp8::from_e4m3(uint8_t(c)), cuda = cuda_value(uint8_t(c));
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(ours)) << c;
      continue;
    }
    EXPECT_EQ(ours, cuda) << "code " << c;
    // -0 encodes as 0x80 and +0 as 0x00: both round-trip to their own code.
    EXPECT_EQ(fp8::to_e4m3(ours), uint8_t(c)) << "code " << c;
  }
}

TEST(Fp8, RoundingMatchesCudaOnRandomTiesAndEdges) {
  std::mt19937 gen(7);
  std::vector<float> values = {0.f, -0.f, 448.f, 449.f, 464.f, 465.f, 1e9f, -1e9f, std::ldexp(1.f, -6),
                               std::ldexp(1.f, -9), std::ldexp(1.f, -10), std::ldexp(3.f, -11), std::ldexp(1.f, -12)};
  // Every midpoint between neighbouring finite codes: ties go to the even code.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = fp8::from_e4m3(uint8_t(c)), hi = fp8::from_e4m3(uint8_t(c + 1));
    values.push_back(0.5f * (lo + hi));
    values.push_back(-0.5f * (lo + hi));
  }
  std::uniform_real_distribution<float> mantissa(1.f, 2.f);
  std::uniform_int_distribution<int> exponent(-14, 10);
  for (int i = 0; i < 200000; ++i) values.push_back((i % 2 ? -1.f : 1.f) * std::ldexp(mantissa(gen), exponent(gen)));
  for (float v : values) ASSERT_EQ(fp8::to_e4m3(v), cuda_e4m3(v)) << "value " << v;
  EXPECT_EQ(fp8::to_e4m3(std::nanf("")) & 0x7F, 0x7F);
}

TEST(Fp8, BlockScalesMapEachBlocksLargestValueTo448) {
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.f, 1.f);
  const int rows = 3, cols = 300;  // the last column block is partial
  std::vector<float> x(size_t(rows) * cols);
  for (float& v : x) v = dist(gen);
  x[5] = 0;  // a block of zeros gets scale 1
  for (int c = 0; c < fp8::kBlock; ++c) x[size_t(1) * cols + c] = 0;
  const fp8::Quantized q = fp8::quantize_activations(x.data(), rows, cols);
  ASSERT_EQ(q.scales.size(), size_t(rows) * 3);
  EXPECT_EQ(q.scale_of(1, 0), 1.0f);
  const std::vector<float> back = q.dequantize();
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < 3; ++b) {
      float amax = 0;
      for (int c = b * 128; c < std::min(cols, (b + 1) * 128); ++c) amax = std::max(amax, std::fabs(x[size_t(r) * cols + c]));
      if (amax == 0) continue;
      EXPECT_FLOAT_EQ(q.scale_of(r, b * 128), amax / 448.f);
    }
  for (size_t i = 0; i < x.size(); ++i) {
    const double bound = fp8::quantization_error_bound(x[i], q.scale_of(int(i / cols), int(i % cols)));
    ASSERT_LE(std::fabs(back[i] - x[i]), bound) << i;
  }
  const std::vector<float> w(size_t(200) * 130, 0.25f);
  const fp8::Quantized qw = fp8::quantize_weights(w.data(), 200, 130);
  EXPECT_EQ(qw.scales.size(), 4u);  // 2 x 2 blocks of 128 x 128
  std::vector<float> bad(4, 1.f);
  bad[2] = std::nanf("");
  EXPECT_THROW(fp8::quantize_activations(bad.data(), 1, 4), InvalidArgument);
}

// The dot-product bound holds for random K, and is not loose by orders of magnitude: the worst error
// reaches a visible part of it (a bound 100x tighter would fail).
TEST(Fp8, DotProductErrorStaysWithinTheDerivedBound) {
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  double worst_fraction = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int K = 64 + 97 * trial % 2000;
    std::vector<float> a(K), b(K);
    for (float& v : a) v = dist(gen);
    for (float& v : b) v = dist(gen) * 0.02f;
    const fp8::Quantized qa = fp8::quantize_activations(a.data(), 1, K), qb = fp8::quantize_activations(b.data(), 1, K);
    const std::vector<float> da = qa.dequantize(), db = qb.dequantize();
    std::vector<float> sa(K), sb(K);
    double exact = 0, quant = 0;
    for (int i = 0; i < K; ++i) {
      sa[i] = qa.scale_of(0, i), sb[i] = qb.scale_of(0, i);
      exact += double(a[i]) * b[i];
      quant += double(da[i]) * db[i];
    }
    const double err = std::fabs(quant - exact), bound = fp8::dot_error_bound(a.data(), sa.data(), b.data(), sb.data(), K);
    ASSERT_LE(err, bound) << "trial " << trial << " K " << K;
    worst_fraction = std::max(worst_fraction, err / bound);
  }
  EXPECT_GT(worst_fraction, 0.01) << "the bound is far looser than the errors it bounds";
}

// The fp8 layer-0 reference: every pre-activation z = w0_e x of every routed row, computed from the
// quantised tokens and weights, lies within the dot-product bound of the exact one (each factor with the
// scale of its own block: 1 x 128 for x, 128 x 128 of the rank's local layout for w0). EP 2, H = 384
// (three column blocks), a partial row block of w0 (w0_rows = 2 x 96), top-2 of 4 experts, a rank with
// no tokens.
TEST(Fp8Reference, Layer0PreActivationsStayWithinTheDotBound) {
  const MoeShape shape{384, 96, 4, 2, Activation::swiglu};
  const Parallel par{2, 1};
  const auto p = comet::testing::MoeProblem::make(shape, par, {37, 0}, comet::testing::RoutingKind::uniform, 5);
  const reference::Fp8Layer0<float> q = reference::quantize_layer0(shape, par, p.weights, p.inputs);
  const int H = shape.hidden, n0 = shape.w0_rows(), kb = H / fp8::kBlock;
  int checked = 0;
  double worst_fraction = 0;
  for (size_t s = 0; s < p.inputs.size(); ++s) {
    const auto& in = p.inputs[s];
    if (in.tokens == 0) continue;
    const fp8::Quantized qx = fp8::quantize_activations(in.x.data(), in.tokens, H);
    for (int t = 0; t < in.tokens; ++t)
      for (int j = 0; j < shape.topk; ++j) {
        const int e = in.ids[size_t(t) * shape.topk + j];
        const float* w = &p.weights.w0[size_t(e) * n0 * H];
        for (int n = 0; n < n0; ++n) {
          std::vector<float> sx(H), sw(H);
          double exact = 0, quant = 0;
          for (int i = 0; i < H; ++i) {
            sx[i] = qx.scale_of(t, i), sw[i] = q.w0_scales[(size_t(e) * n0 + n) * kb + i / fp8::kBlock];
            exact += double(w[size_t(n) * H + i]) * in.x[size_t(t) * H + i];
            quant += double(q.weights.w0[size_t(e) * n0 * H + size_t(n) * H + i]) * q.ranks[s].x[size_t(t) * H + i];
          }
          const double bound = fp8::dot_error_bound(&w[size_t(n) * H], sw.data(), &in.x[size_t(t) * H], sx.data(), H);
          ASSERT_LE(std::fabs(quant - exact), bound) << "rank " << s << " token " << t << " expert " << e << " row " << n;
          worst_fraction = std::max(worst_fraction, std::fabs(quant - exact) / bound);
          ++checked;
        }
      }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(worst_fraction, 0.01) << "the bound is far looser than the errors it bounds";
  // The whole layer: fp8 changes the result (quantisation happened) by about e4m3's precision.
  const auto fp32 = reference::forward(shape, par, p.weights, p.inputs);
  const auto f8 = reference::forward_fp8(shape, par, p.weights, p.inputs);
  const double rel = comet::testing::relative_error(f8[0], fp32[0]);
  EXPECT_GT(rel, 1e-4);
  EXPECT_LT(rel, 4 * fp8::kUnitRoundoff);
}

}  // namespace

namespace {

// The reference quantises w0 in 128 x 128 blocks of each rank's local layout (the GPU's B): with swiglu
// and TP 2 a local block interleaves gate and up rows, so the blocks are not blocks of the full w0. Each
// local block must carry one scale, amax / 448 of exactly its own values.
TEST(Fp8Reference, Layer0WeightBlocksFollowTheLocalLayout) {
  const MoeShape shape{256, 512, 4, 2, Activation::swiglu};  // F_s = 256: local w0 rows 512, 4 row blocks
  const Parallel par{2, 2};
  const auto p = comet::testing::MoeProblem::make(shape, par, {3, 3, 3, 3}, comet::testing::RoutingKind::uniform, 9);
  const reference::Fp8Layer0<float> q = reference::quantize_layer0(shape, par, p.weights, p.inputs);
  const int H = shape.hidden, n0 = shape.w0_rows(), kb = H / fp8::kBlock, El = par.local_experts(shape);
  int blocks = 0, mixed = 0;
  for (int r = 0; r < par.world(); ++r) {
    const RankWeightsF32 local = shard_weights_f32(shape, par, r, p.weights.w0, p.weights.w1);
    for (int e = 0; e < El; ++e) {
      const int expert = par.ep_index(r) * El + e;
      for (int b = 0; b * fp8::kBlock < local.w0_rows; ++b)
        for (int j = 0; j < kb; ++j) {
          float amax = 0;
          bool gate = false, up = false;
          for (int n = b * fp8::kBlock; n < std::min(local.w0_rows, (b + 1) * fp8::kBlock); ++n) {
            const int full = w0_full_row(shape, par, r, n);
            (full < shape.ffn ? gate : up) = true;
            for (int i = j * fp8::kBlock; i < (j + 1) * fp8::kBlock; ++i)
              amax = std::max(amax, std::fabs(local.w0[(size_t(e) * local.w0_rows + n) * H + i]));
          }
          for (int n = b * fp8::kBlock; n < std::min(local.w0_rows, (b + 1) * fp8::kBlock); ++n) {
            const int full = w0_full_row(shape, par, r, n);
            ASSERT_EQ(q.w0_scales[(size_t(expert) * n0 + full) * kb + j], amax / fp8::kE4m3Max)
                << "rank " << r << " expert " << expert << " local row " << n << " column block " << j;
          }
          ++blocks;
          mixed += gate && up;
        }
    }
  }
  EXPECT_EQ(blocks, par.world() * El * 4 * kb);
  EXPECT_EQ(mixed, blocks) << "every local swiglu block should hold gate and up rows";
}

}  // namespace
