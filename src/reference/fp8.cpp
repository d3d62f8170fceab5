// e4m3 conversion and block-scaled quantisation (comet/fp8.hpp).
#include "comet/fp8.hpp"

#include <algorithm>
#include <cmath>

#include "comet/common.hpp"

namespace comet::fp8 {

uint8_t to_e4m3(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  // Saturate first: every value above 448 rounds to 448 or to 480, which e4m3 does not have.
  const double a = std::min(double(std::fabs(v)), double(kE4m3Max));
  // nearbyint rounds ties to even (the default rounding mode).
  if (a < std::ldexp(1.0, -6)) {
    // Subnormals are multiples of 2^-9; their codes are those multiples (8 x 2^-9 is the smallest
    // normal, code 0x08, so rounding up into it needs nothing special).
    return uint8_t(sign | uint8_t(std::nearbyint(a / std::ldexp(1.0, -9))));
  }
  int e = std::ilogb(a);                                       // a in [2^e, 2^(e + 1))
  int m = int(std::nearbyint(a / std::ldexp(1.0, e - 3)));     // 8..16: 1.mmm x 2^e in steps of 2^(e - 3)
  if (m == 16) ++e, m = 8;                                     // rounded up into the next binade
  return uint8_t(sign | uint8_t((e + 7) << 3) | uint8_t(m - 8));  // a <= 448 keeps e <= 8, m <= 14
}

float from_e4m3(uint8_t code) {
  const bool neg = code & 0x80;
  const int exp = (code >> 3) & 0xF, mant = code & 0x7;
  if (exp == 0xF && mant == 0x7) return std::nanf("");
  const double mag = exp == 0 ? std::ldexp(double(mant), -9) : std::ldexp(1.0 + mant / 8.0, exp - 7);
  return float(neg ? -mag : mag);
}

float Quantized::scale_of(int r, int c) const {
  const int cb = (cols + block_cols - 1) / block_cols;
  return scales[size_t(r / block_rows) * cb + c / block_cols];
}

std::vector<float> Quantized::dequantize() const {
  std::vector<float> out(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out[size_t(r) * cols + c] = float(double(scale_of(r, c)) * from_e4m3(codes[size_t(r) * cols + c]));
  return out;
}

Quantized quantize(const float* v, int rows, int cols, int block_rows, int block_cols) {
  COMET_REQUIRE(rows >= 0 && cols >= 0 && block_rows > 0 && block_cols > 0, "fp8::quantize: bad sizes");
  Quantized q;
  q.rows = rows, q.cols = cols, q.block_rows = block_rows, q.block_cols = block_cols;
  const int rb = (rows + block_rows - 1) / block_rows, cb = (cols + block_cols - 1) / block_cols;
  q.scales.assign(size_t(rb) * cb, 1.0f);
  q.codes.assign(size_t(rows) * cols, 0);
  for (int i = 0; i < rb; ++i)
    for (int j = 0; j < cb; ++j) {
      const int r1 = std::min(rows, (i + 1) * block_rows), c1 = std::min(cols, (j + 1) * block_cols);
      float amax = 0;
      bool finite = true;
      for (int r = i * block_rows; r < r1; ++r)
        for (int c = j * block_cols; c < c1; ++c) {
          const float a = std::fabs(v[size_t(r) * cols + c]);
          finite = finite && std::isfinite(a);
          amax = std::max(amax, a);
        }
      COMET_REQUIRE(finite, "fp8::quantize: a value in block (", i, ", ", j, ") is not finite");
      const float s = amax > 0 ? amax / kE4m3Max : 1.0f;
      q.scales[size_t(i) * cb + j] = s;
      for (int r = i * block_rows; r < r1; ++r)
        for (int c = j * block_cols; c < c1; ++c) q.codes[size_t(r) * cols + c] = to_e4m3(v[size_t(r) * cols + c] / s);
    }
  return q;
}

double quantization_error_bound(double v, double scale) {
  return kUnitRoundoff * std::fabs(v) + scale * kSubnormalHalfStep;
}

double dot_error_bound(const float* a, const float* scale_a, const float* b, const float* scale_b, int n) {
  double bound = 0;
  for (int i = 0; i < n; ++i) {
    const double ea = quantization_error_bound(a[i], scale_a[i]), eb = quantization_error_bound(b[i], scale_b[i]);
    bound += std::fabs(a[i]) * eb + std::fabs(b[i]) * ea + ea * eb;
  }
  return bound;
}

}  // namespace comet::fp8
