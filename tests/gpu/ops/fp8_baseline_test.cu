// The fp8 baseline GEMM (baselines/fp8_expert_gemm.hpp, cuBLASLt's block-scaled fp8) against a CPU
// oracle: x and the experts' weights quantised on the GPU (kernels/fp8_quantize.hpp), C for every row
// block compared with the product of the oracle's dequantised values (fp8::quantize_activations /
// quantize_weights(...).dequantize()) in double. Blocks of 1, 17, 128 and 300 rows (1 and 17 take the
// padded path through the output scratch, 17 at the very end of the records), one empty block, listed
// out of row order, with two rows no block names: those must keep their poison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "baselines/fp8_expert_gemm.hpp"
#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "harness/device_buffer.hpp"
#include "kernels/fp8_quantize.hpp"
#include "support/expect_invalid.hpp"

using namespace comet;
using namespace comet::testing;
using comet::baselines::Fp8ExpertGemm;
using comet::baselines::RowBlock;

namespace {

constexpr int kExperts = 3;
constexpr int kTotalRows = 448;  // records rows: blocks of 300, 1, 128 and 17 rows, and two unnamed rows
constexpr uint16_t kPoison = 0xFFFF;  // a bf16 NaN

// {expert, row, rows}: rows 300 and 302 belong to no block.
const std::vector<RowBlock> kBlocks = {
    {1, 0, 300}, {0, 301, 1}, {2, 303, 0}, {2, 431, 17}, {0, 303, 128},
};

std::vector<float> random_values(size_t count, uint64_t seed, int row_len) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    const size_t row = i / row_len;
    const float factor = row % 5 == 2 ? 1e-2f : row % 5 == 4 ? 30.f : 1.f;  // rows of other magnitudes
    v[i] = round_to_bf16(u(gen) * factor);
  }
  return v;
}

struct Shape {
  int n, k;
};

class Fp8Baseline : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8Baseline, MatchesDequantisedOracle) {
  const int n = GetParam().n, k = GetParam().k;
  const std::vector<float> x = random_values(size_t(kTotalRows) * k, 5u + uint64_t(k), k);
  const std::vector<float> w = random_values(size_t(kExperts) * n * k, 9u + uint64_t(n), k);
  const int rb = fp8::record_bytes(k), row_blocks = (n + fp8::kBlock - 1) / fp8::kBlock;

  DeviceBuffer dx(to_bf16(x)), dw(to_bf16(w));
  DeviceBuffer records(size_t(kTotalRows) * rb), codes(size_t(kExperts) * n * k);
  DeviceBuffer scales(size_t(kExperts) * row_blocks * (k / fp8::kBlock) * sizeof(float));
  DeviceBuffer c(size_t(kTotalRows) * n * 2);
  kernels::quantize_rows_e4m3(dx.get(), kTotalRows, k, records.get(), nullptr);
  kernels::quantize_weights_e4m3(dw.get(), kExperts, n, k, codes.get(), scales.as<float>(), nullptr);

  // The oracle: dequantised operands, products in double.
  const std::vector<float> a = fp8::quantize_activations(x.data(), kTotalRows, k).dequantize();
  std::vector<std::vector<float>> b;
  for (int e = 0; e < kExperts; ++e) b.push_back(fp8::quantize_weights(w.data() + size_t(e) * n * k, n, k).dequantize());

  int max_rows = 0;
  for (const RowBlock& blk : kBlocks) max_rows += blk.rows;
  Fp8ExpertGemm gemm(max_rows, n, k);
  for (int round = 0; round < 2; ++round) {  // the second round runs on the cached algorithms
    SCOPED_TRACE("round " + std::to_string(round));
    c.fill_bytes(0xFF);
    gemm.run(records.get(), codes.get(), scales.as<float>(), c.get(), kBlocks, nullptr);
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = c.download<uint16_t>(size_t(kTotalRows) * n);

    int bad = 0;
    std::vector<bool> named(kTotalRows, false);
    for (const RowBlock& blk : kBlocks) {
      const std::vector<float>& be = b[blk.expert];
      for (int r = blk.row; r < blk.row + blk.rows; ++r) {
        named[r] = true;
        const float* ar = a.data() + size_t(r) * k;
        for (int col = 0; col < n; ++col) {
          const float* bc = be.data() + size_t(col) * k;
          double ref = 0, mag = 0;
          for (int i = 0; i < k; ++i) {
            ref += double(ar[i]) * double(bc[i]);
            mag += std::fabs(double(ar[i]) * double(bc[i]));
          }
          // Tolerance: C is rounded to bf16 (8 significant bits, round to nearest: 2^-8 |ref|). Before that,
          // each product of two e4m3 codes is exact in fp32 and the scales are applied per 128-deep block
          // partial sum in fp32; what remains is the accumulation: fp32 over k (k 2^-24 sum |a b|, ~3e-5
          // here) and, inside a 128-deep block, Hopper's fp8 tensor-core accumulator, which keeps about 14
          // significant bits (DeepSeek-V3 report, sect. 3.3.2) until cuBLASLt promotes the block's sum to
          // fp32: at most 2^-14 of the partial sum per addition, which for these rows of mixed signs stays
          // well below 1e-3 sum |a b|.
          const double tol = std::ldexp(1.0, -8) * std::fabs(ref) + 1e-3 * mag;
          const float g = bf16_to_float(got[size_t(r) * n + col]);
          if (!(std::fabs(double(g) - ref) <= tol) && bad++ < 10)
            ADD_FAILURE() << "n " << n << " k " << k << ", expert " << blk.expert << " row " << r << " column " << col
                          << ": got " << g << ", oracle " << ref << " (tolerance " << tol << ")";
        }
      }
    }
    for (int r = 0; r < kTotalRows; ++r) {
      if (named[r]) continue;
      for (int col = 0; col < n; ++col)
        if (got[size_t(r) * n + col] != kPoison && bad++ < 10)
          ADD_FAILURE() << "row " << r << " belongs to no block but column " << col << " was written";
    }
    EXPECT_EQ(bad, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Baseline,
                         ::testing::Values(Shape{256, 512}, Shape{384, 512},
                                           Shape{208, 512},   // a partial 128-row weight block
                                           Shape{256, 384}),  // k / 128 = 3: weight scales padded to 4
                         [](const auto& info) {
                           std::string name = "n";  // appended, not operator+ (GCC 12's -Wrestrict misfires on it)
                           name += std::to_string(info.param.n);
                           name += "_k";
                           name += std::to_string(info.param.k);
                           return name;
                         });

TEST(Fp8BaselineArgs, BadArgumentsThrow) {
  expect_invalid([] { Fp8ExpertGemm g(16, 100, 512); }, "multiple of 16");
  expect_invalid([] { Fp8ExpertGemm g(16, 256, 100); }, "multiple of 128");
  const int n = 256, k = 512;
  DeviceBuffer records(size_t(32) * fp8::record_bytes(k)), codes(size_t(n) * k), scales(64 * sizeof(float)),
      c(size_t(32) * n * 2);
  Fp8ExpertGemm gemm(16, n, k);
  const std::vector<RowBlock> too_many = {{0, 0, 10}, {0, 10, 10}};
  expect_invalid([&] { gemm.run(records.get(), codes.get(), scales.as<float>(), c.get(), too_many, nullptr); },
                 "max_rows");
  const std::vector<RowBlock> negative = {{0, -1, 4}};
  expect_invalid([&] { gemm.run(records.get(), codes.get(), scales.as<float>(), c.get(), negative, nullptr); },
                 "bad block");
  const std::vector<RowBlock> ok = {{0, 0, 4}};
  expect_invalid([&] { gemm.run(records.as<char>() + 4, codes.get(), scales.as<float>(), c.get(), ok, nullptr); },
                 "aligned");
  // Only empty blocks: nothing to do.
  gemm.run(records.get(), codes.get(), scales.as<float>(), c.get(), {{0, 0, 0}, {1, 5, 0}}, nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
