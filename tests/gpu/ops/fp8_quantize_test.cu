// The GPU e4m3 quantisers (kernels/fp8_quantize.hpp) against the CPU oracle (comet/fp8.hpp), bitwise:
// every code, every scale and every padding byte of the packed activation records, and the codes and
// 128 x 128 scales of the weights. The inputs are bf16 values with rows scaled by 1e-3 and 1e3, a row of
// zeros and a block with one huge value (whose other values quantise to subnormal codes or zero). The
// outputs are poisoned first, so a byte the kernel forgets cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fp8.hpp"
#include "harness/device_buffer.hpp"
#include "kernels/fp8_quantize.hpp"
#include "support/expect_invalid.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

constexpr int kMaxReports = 10;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// [rows][cols] bf16-representable values, uniform in (-1, 1) times a per-row factor: rows 3, 10, 17, ...
// are scaled by 1e-3, rows 5, 12, 19, ... by 1e3; row rows / 2 is zeros (rows >= 3); the last column
// block of row min(1, rows - 1) holds one value of 30000.
std::vector<float> make_values(int rows, int cols, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float factor = r % 7 == 3 ? 1e-3f : r % 7 == 5 ? 1e3f : 1.f;
    for (int c = 0; c < cols; ++c) v[size_t(r) * cols + c] = round_to_bf16(u(gen) * factor);
  }
  if (rows >= 3)
    for (int c = 0; c < cols; ++c) v[size_t(rows / 2) * cols + c] = 0.f;
  const int huge_row = std::min(1, rows - 1);
  v[size_t(huge_row) * cols + (cols - fp8::kBlock) + 5] = round_to_bf16(30000.f);
  return v;
}

class QuantizeRows : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(QuantizeRows, RecordsMatchOracleBitwise) {
  const auto [rows, hidden] = GetParam();
  const std::vector<float> x = make_values(rows, hidden, 1000u + uint64_t(rows) * 31u + uint64_t(hidden));
  const fp8::Quantized q = fp8::quantize_activations(x.data(), rows, hidden);
  const int rb = fp8::record_bytes(hidden), blocks = hidden / fp8::kBlock;

  DeviceBuffer dx(to_bf16(x));
  DeviceBuffer records(size_t(rows) * rb);
  records.fill_bytes(0xA5);  // every byte, padding included, must be written
  kernels::quantize_rows_e4m3(dx.get(), rows, hidden, records.get(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got = records.download<uint8_t>(size_t(rows) * rb);

  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* rec = got.data() + size_t(r) * rb;
    for (int c = 0; c < hidden; ++c) {
      const uint8_t want = q.codes[size_t(r) * hidden + c];
      if (rec[c] != want && bad++ < kMaxReports)
        ADD_FAILURE() << "row " << r << " column " << c << ": code 0x" << std::hex << int(rec[c]) << ", oracle 0x"
                      << int(want) << std::dec << " (x = " << x[size_t(r) * hidden + c] << ")";
    }
    for (int j = 0; j < blocks; ++j) {
      float s;
      std::memcpy(&s, rec + fp8::record_scales_offset(hidden) + 4 * j, 4);
      const float want = q.scales[size_t(r) * blocks + j];
      if (bits_of(s) != bits_of(want) && bad++ < kMaxReports)
        ADD_FAILURE() << "row " << r << " block " << j << ": scale " << s << ", oracle " << want;
    }
    for (int p = hidden + 4 * blocks; p < rb; ++p)
      if (rec[p] != 0 && bad++ < kMaxReports)
        ADD_FAILURE() << "row " << r << " padding byte " << p << " is 0x" << std::hex << int(rec[p]) << std::dec;
  }
  EXPECT_EQ(bad, 0) << "mismatching bytes (rows " << rows << ", hidden " << hidden << ")";
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeRows,
                         ::testing::Combine(::testing::Values(1, 37, 300), ::testing::Values(128, 2048, 7168)),
                         [](const auto& info) {
                           std::string name = "rows";  // appended, not operator+ (GCC 12's -Wrestrict misfires)
                           name += std::to_string(std::get<0>(info.param));
                           name += "_hidden";
                           name += std::to_string(std::get<1>(info.param));
                           return name;
                         });

TEST(QuantizeWeights, CodesAndScalesMatchOracleBitwise) {
  const int mats = 3, rows = 200, cols = 256;  // row block 1 is partial (72 rows)
  std::vector<float> w;
  for (int m = 0; m < mats; ++m) {
    std::vector<float> one = make_values(rows, cols, 77u + uint64_t(m));
    if (m == 1)  // a whole 128 x 128 block of zeros: scale 1
      for (int r = fp8::kBlock; r < rows; ++r)
        for (int c = 0; c < fp8::kBlock; ++c) one[size_t(r) * cols + c] = 0.f;
    w.insert(w.end(), one.begin(), one.end());
  }
  const int row_blocks = (rows + fp8::kBlock - 1) / fp8::kBlock, col_blocks = cols / fp8::kBlock;
  const size_t per_mat = size_t(rows) * cols, scales_per_mat = size_t(row_blocks) * col_blocks;

  DeviceBuffer dw(to_bf16(w));
  DeviceBuffer codes(mats * per_mat), scales(mats * scales_per_mat * sizeof(float));
  codes.fill_bytes(0xA5);
  scales.fill_bytes(0xA5);
  kernels::quantize_weights_e4m3(dw.get(), mats, rows, cols, codes.get(), scales.as<float>(), nullptr);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  const auto got_codes = codes.download<uint8_t>(mats * per_mat);
  const auto got_scales = scales.download<float>(mats * scales_per_mat);

  int bad = 0;
  for (int m = 0; m < mats; ++m) {
    const fp8::Quantized q = fp8::quantize_weights(w.data() + m * per_mat, rows, cols);
    ASSERT_EQ(q.scales.size(), scales_per_mat);
    for (size_t i = 0; i < per_mat; ++i)
      if (got_codes[m * per_mat + i] != q.codes[i] && bad++ < kMaxReports)
        ADD_FAILURE() << "mat " << m << " row " << i / cols << " column " << i % cols << ": code 0x" << std::hex
                      << int(got_codes[m * per_mat + i]) << ", oracle 0x" << int(q.codes[i]) << std::dec;
    for (size_t i = 0; i < scales_per_mat; ++i)
      if (bits_of(got_scales[m * scales_per_mat + i]) != bits_of(q.scales[i]) && bad++ < kMaxReports)
        ADD_FAILURE() << "mat " << m << " block (" << i / col_blocks << ", " << i % col_blocks << "): scale "
                      << got_scales[m * scales_per_mat + i] << ", oracle " << q.scales[i];
    if (m == 1) EXPECT_EQ(q.scales[1 * col_blocks + 0], 1.0f);  // the zero block, as the oracle defines it
  }
  EXPECT_EQ(bad, 0);
}

TEST(QuantizeE4m3, BadArgumentsThrowBeforeAnyLaunch) {
  DeviceBuffer x(size_t(4) * 256 * 2), out(size_t(4) * fp8::record_bytes(256)), scales(64 * sizeof(float));
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
  expect_invalid([&] { kernels::quantize_rows_e4m3(x.get(), 4, 100, out.get(), nullptr); }, "multiple of 128");
  expect_invalid([&] { kernels::quantize_rows_e4m3(x.get(), 4, 0, out.get(), nullptr); }, "multiple of 128");
  expect_invalid([&] { kernels::quantize_rows_e4m3(x.get(), -1, 256, out.get(), nullptr); }, "rows");
  expect_invalid([&] { kernels::quantize_rows_e4m3(x.as<char>() + 2, 4, 256, out.get(), nullptr); }, "aligned");
  expect_invalid([&] { kernels::quantize_rows_e4m3(x.get(), 4, 256, out.as<char>() + 8, nullptr); }, "aligned");
  expect_invalid([&] { kernels::quantize_weights_e4m3(x.get(), 1, 4, 100, out.get(), scales.as<float>(), nullptr); },
                 "multiple of 128");
  expect_invalid([&] { kernels::quantize_weights_e4m3(x.get(), -1, 4, 128, out.get(), scales.as<float>(), nullptr); },
                 ">= 0");
  expect_invalid(
      [&] { kernels::quantize_weights_e4m3(x.get(), 1, 4, 128, out.get(), scales.as<float>() + 1, nullptr); },
      "aligned");
  // Nothing to do: no launch, no error, even without buffers.
  kernels::quantize_rows_e4m3(nullptr, 0, 256, nullptr, nullptr);
  kernels::quantize_weights_e4m3(nullptr, 0, 4, 128, nullptr, nullptr, nullptr);
  kernels::quantize_weights_e4m3(nullptr, 2, 0, 128, nullptr, nullptr, nullptr);
  // No launch happened above, so there is no launch error to find.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  COMET_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
