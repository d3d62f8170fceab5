// The expert activations and their derivatives as the fused kernels compute them: fast-math forms (no
// slow-path calls), whose error is far below bf16's rounding. The forward's epilogue (epilogue.cuh)
// and the backward's activation kernel (activation_grad.cu) share them, so that the derivative is the
// derivative of what the forward computed.
#pragma once

#include "ptx/math.cuh"

namespace comet::kernels {

__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }
__device__ __forceinline__ float silu(float z) { return __fdividef(z, 1.0f + __expf(-z)); }
__device__ __forceinline__ float gelu_tanh(float z) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * z * (1.0f + dev::tanh_approx(c * (z + 0.044715f * z * z * z)));
}

// d/dz [z s(z)] = s (1 + z (1 - s))
__device__ __forceinline__ float silu_grad(float z) {
  const float s = sigmoid(z);
  return s * (1.0f + z * (1.0f - s));
}
// d/dz of the tanh form: 0.5 (1 + t) + 0.5 z (1 - t^2) c (1 + 3 a z^2), t = tanh(c (z + a z^3))
__device__ __forceinline__ float gelu_tanh_grad(float z) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float t = dev::tanh_approx(c * (z + a * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * c * (1.0f + 3.0f * a * z * z);
}

}  // namespace comet::kernels
