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
// fp32; the reference is fp32 throughout: 2e-2 on whole arrays, more room on single dx rows (small sums
// of cancelling terms).
inline constexpr double kGradTolerance = 2e-2;
inline constexpr double kGradRowTolerance = 6e-2;

// A gate gradient is one dot product, <D, h> = sum_f D_f h_f with D = W1_e^T dout_t and h the expert's
// hidden row, and the GPU reads both factors rounded to bf16 (8 significant bits: relative error at
// most 2^-8 each). Its error is therefore at most about 2^-7 sum_f |D_f h_f|, whatever the size of the
// sum itself, which cancellation can make arbitrarily small (a relative bound on one or two such sums,
// a rank with one or two tokens, fails for no fault of the GPU's). Each gate gradient is held to
// kGateGradBound * sum_f |D_f h_f| (1.5 x 2^-7: room for the fp32 sums and the fast activations);
// when there are at least kGateGradsForNorm of them, all ranks' together also to kGradTolerance.
inline constexpr double kGateGradBound = 1.5 / 128;
inline constexpr size_t kGateGradsForNorm = 64;

// Per rank [T][k]: sum_f |D_f h_f| of each gate gradient (over the whole of F), from the full fp32
// weights, every rank's inputs and its output gradients dout (per rank [T][H]).
std::vector<std::vector<float>> gate_grad_scales(const MoeShape& shape, const reference::ExpertWeights<float>& weights,
                                                 const std::vector<reference::RankInput<float>>& inputs,
                                                 const std::vector<std::vector<float>>& dout);

// Every rank's output (per rank [T_s][H]) against the reference's.
std::string compare_outputs(const MoeShape& shape, const std::vector<std::vector<float>>& ref,
                            const std::vector<std::vector<float>>& got);

// dx and dgates per rank, dW0 / dW1 in the full weights' layout; an expert no token chose must have
// exactly zero weight gradients. gate_scales: gate_grad_scales of the same inputs.
std::string compare_gradients(const MoeShape& shape, const reference::Gradients<float>& ref,
                              const reference::Gradients<float>& got,
                              const std::vector<std::vector<float>>& gate_scales);

}  // namespace comet::testing
