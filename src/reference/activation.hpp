// Activations of the reference and their derivatives (scalar, templated on float / double).
#pragma once

#include <cmath>

#include "comet/shape.hpp"

namespace comet::reference::detail {

template <class T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

template <class T>
T silu(T z) {
  return z * sigmoid(z);
}

// d/dz [z s(z)] = s + z s (1 - s) = s (1 + z (1 - s))
template <class T>
T silu_grad(T z) {
  const T s = sigmoid(z);
  return s * (T(1) + z * (T(1) - s));
}

// GELU, tanh approximation: 0.5 z (1 + tanh(c (z + a z^3))), c = sqrt(2/pi), a = 0.044715.
template <class T>
constexpr T kGeluC = T(0.79788456080286535587989211986876);
template <class T>
constexpr T kGeluA = T(0.044715);

template <class T>
T gelu(T z) {
  return T(0.5) * z * (T(1) + std::tanh(kGeluC<T> * (z + kGeluA<T> * z * z * z)));
}

// d/dz = 0.5 (1 + tanh u) + 0.5 z (1 - tanh^2 u) c (1 + 3 a z^2), u = c (z + a z^3).
template <class T>
T gelu_grad(T z) {
  const T th = std::tanh(kGeluC<T> * (z + kGeluA<T> * z * z * z));
  return T(0.5) * (T(1) + th) + T(0.5) * z * (T(1) - th * th) * kGeluC<T> * (T(1) + T(3) * kGeluA<T> * z * z);
}

// The pre-activation of one token on an F-shard of width fs is z[0, nz) with nz = 2 fs for gated
// activations (gate values in [0, fs), up values in [fs, 2 fs)) and nz = fs otherwise.
inline int pre_activation_width(Activation act, int fs) { return is_gated(act) ? 2 * fs : fs; }

// h[f] = act(z) for f in [0, fs).
template <class T>
void activate(Activation act, const T* z, int fs, T* h) {
  for (int f = 0; f < fs; ++f) {
    switch (act) {
      case Activation::swiglu: h[f] = silu(z[f]) * z[fs + f]; break;
      case Activation::gelu: h[f] = gelu(z[f]); break;
      case Activation::silu: h[f] = silu(z[f]); break;
    }
  }
}

// dz = dh * d act / dz (product rule for swiglu: d gate = dh * up * silu'(gate), d up = dh * silu(gate)).
template <class T>
void activate_backward(Activation act, const T* z, const T* dh, int fs, T* dz) {
  for (int f = 0; f < fs; ++f) {
    switch (act) {
      case Activation::swiglu:
        dz[f] = dh[f] * z[fs + f] * silu_grad(z[f]);
        dz[fs + f] = dh[f] * silu(z[f]);
        break;
      case Activation::gelu: dz[f] = dh[f] * gelu_grad(z[f]); break;
      case Activation::silu: dz[f] = dh[f] * silu_grad(z[f]); break;
    }
  }
}

}  // namespace comet::reference::detail
