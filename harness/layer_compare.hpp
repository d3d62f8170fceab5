// A layer's outputs and gradients against the CPU reference, with the one set of tolerances every
// check uses (the GoogleTest checks in tests/support and the fuzz driver): each function returns an
// empty string when the result is right, else what is wrong (rank, array, error and bound).
#pragma once

#include <string>
#include <vector>

#include "comet/reference.hpp"
#include "comet/shape.hpp"

namespace comet::testing {

// Whole-output relative error and the worst single row's (a misplaced row hides in a global norm).
inline constexpr double kForwardTolerance = 1.5e-2;
inline constexpr double kForwardRowTolerance = 5e-2;
// The backward rounds G, the saved hidden rows and pre-activations, D, dPre and dA to bf16 and sums in
// fp32; the reference is fp32 throughout: 2e-2 on whole arrays, more room on single dx rows and on one
// rank's gate gradients (small sums of cancelling terms: a rank with one or two tokens has one or two
// such sums; every rank's gate gradients together are held to 2e-2).
inline constexpr double kGradTolerance = 2e-2;
inline constexpr double kGradRowTolerance = 6e-2;

// Every rank's output (per rank [T_s][H]) against the reference's.
std::string compare_outputs(const MoeShape& shape, const std::vector<std::vector<float>>& ref,
                            const std::vector<std::vector<float>>& got);

// dx and dgates per rank, dW0 / dW1 in the full weights' layout; an expert no token chose must have
// exactly zero weight gradients.
std::string compare_gradients(const MoeShape& shape, const reference::Gradients<float>& ref,
                              const reference::Gradients<float>& got);

}  // namespace comet::testing
