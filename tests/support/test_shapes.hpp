// The small layer shapes the GPU tests of the fused layers, their backward and the baselines share: each
// exercises one thing the kernels must get right (a partial column block, top-8, GELU, top-1 SiLU).
#pragma once

#include "comet/shape.hpp"

namespace comet::testing {

inline const MoeShape kSmallSwiglu{256, 512, 8, 2, Activation::swiglu};
inline const MoeShape kTop8{512, 256, 16, 8, Activation::swiglu};
inline const MoeShape kGelu{384, 384, 8, 2, Activation::gelu};
inline const MoeShape kSilu{256, 640, 4, 1, Activation::silu};

}  // namespace comet::testing
