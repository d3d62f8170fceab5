// e4m3 (OCP FP8, Hopper's format) and the block-scaled quantisation DeepSeek-V3 trains with: the CPU
// side of comet's fp8 path (issue 17), so that every fp8 test has an oracle and a tolerance derived
// from the format rather than guessed.
//
// e4m3: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; largest finite 448, smallest normal 2^-6,
// subnormal step 2^-9; no infinities; NaN is S.1111.111. Rounding is to nearest, ties to even.
// Quantisation with a scale s stores e4m3(v / s) and means s * e4m3(v / s):
//   activations: one fp32 scale per row and 128-column block (1 x 128), s = amax / 448;
//   weights:     one fp32 scale per 128 x 128 block, s = amax / 448.
// A block of zeros gets s = 1.
#pragma once

#include <cstdint>
#include <vector>

namespace comet::fp8 {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr double kUnitRoundoff = 1.0 / 16;       // 2^-4: half an ulp, relative, for normal values
inline constexpr double kSubnormalHalfStep = 1.0 / 1024;  // 2^-10: half the subnormal step, absolute
inline constexpr int kBlock = 128;

uint8_t to_e4m3(float v);  // saturating: |v| > 448 gives +-448; NaN gives 0x7F
float from_e4m3(uint8_t code);

// Quantised rows x cols values with one scale per (row block, column block).
struct Quantized {
  int rows = 0, cols = 0;
  int block_rows = 1, block_cols = kBlock;  // 1 x 128 for activations, 128 x 128 for weights
  std::vector<uint8_t> codes;               // [rows][cols]
  std::vector<float> scales;                // [ceil(rows / block_rows)][ceil(cols / block_cols)]
  float scale_of(int r, int c) const;
  std::vector<float> dequantize() const;    // s * e4m3 value, [rows][cols]
};

Quantized quantize(const float* v, int rows, int cols, int block_rows, int block_cols);
inline Quantized quantize_activations(const float* x, int rows, int cols) { return quantize(x, rows, cols, 1, kBlock); }
inline Quantized quantize_weights(const float* w, int rows, int cols) { return quantize(w, rows, cols, kBlock, kBlock); }

// The packed row comet's fp8 layer 0 moves and multiplies: one token's H e4m3 codes (1 x 128 block
// scaled, as quantize_activations), then its H / 128 fp32 scales, then zeros up to a multiple of 16
// bytes, so that a record is one bulk copy for the dispatch role and the codes are a TMA view with row
// stride record_bytes(H). H must be a multiple of 128.
//   bytes [0, H)                          codes
//   bytes [H, H + 4 H / 128)              scales, block j at H + 4 j
//   bytes [H + 4 H / 128, record_bytes)   zero padding
inline constexpr int record_scales_offset(int hidden) { return hidden; }
inline constexpr int record_bytes(int hidden) { return hidden + (hidden / kBlock * 4 + 15) / 16 * 16; }

// Bound on |q(v) - v| for a value quantised with scale s: u |v| + s 2^-10 (normal and subnormal codes).
double quantization_error_bound(double v, double scale);
// Bound on |sum_i q(a_i) q(b_i) - sum_i a_i b_i| given each factor's scale, in exact arithmetic over the
// dequantised values: sum_i (|a_i| ea_i' + |b_i| eb_i' + ea_i eb_i) with e the bound above; what an
// fp8 GEMM can differ from the unquantised product before its own (fp32) accumulation error.
double dot_error_bound(const float* a, const float* scale_a, const float* b, const float* scale_b, int n);

}  // namespace comet::fp8
