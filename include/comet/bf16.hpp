// Host-side bfloat16 conversion (round to nearest even), for tests, the reference and weight layout.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace comet {

using bf16_bits = uint16_t;  // raw bfloat16 storage on the host

inline bf16_bits float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return bf16_bits((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_bits(u >> 16);
}

inline float bf16_to_float(bf16_bits b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

inline std::vector<bf16_bits> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_bits> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

inline std::vector<float> from_bf16(const std::vector<bf16_bits>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

}  // namespace comet
