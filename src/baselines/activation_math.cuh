// The activations of the baselines' kernels and their derivatives, in the accurate forms (expf, tanhf)
// of the CPU reference (src/reference/activation.hpp): the baselines are the yardstick, so they do not
// take the fused epilogue's fast-math shortcuts.
#pragma once

namespace comet::baselines {

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
__device__ __forceinline__ float silu(float z) { return z / (1.0f + expf(-z)); }
// d/dz [z s(z)] = s (1 + z (1 - s))
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}

// GELU, tanh approximation: 0.5 z (1 + tanh u), u = c (z + a z^3), c = sqrt(2 / pi), a = 0.044715.
constexpr float kGeluC = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;
__device__ __forceinline__ float gelu_tanh(float z) {
  return 0.5f * z * (1.0f + tanhf(kGeluC * (z + kGeluA * z * z * z)));
}
// d/dz = 0.5 (1 + tanh u) + 0.5 z (1 - tanh^2 u) c (1 + 3 a z^2)
__device__ __forceinline__ float gelu_grad(float z) {
  const float th = tanhf(kGeluC * (z + kGeluA * z * z * z));
  return 0.5f * (1.0f + th) + 0.5f * z * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * kGeluA * z * z);
}

}  // namespace comet::baselines
