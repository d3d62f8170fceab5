// GoogleTest checks of a fused layer's buffers (its engine's) and outputs against the CPU reference, shared by the GPU
// tests of the fused layers and of the baselines (which run on FusedMoe's plan and comm roles).
#pragma once

#include <string>
#include <vector>

#include "comet/bf16.hpp"
#include "ops/moe_engine.hpp"
#include "harness/moe_problem.hpp"

namespace comet::testing {

std::vector<bf16_bits> download_bf16(const void* device_ptr, size_t n);

// Layer 0: every valid row of every rank's hidden buffer equals act(w0_e x) on the rank's F shard.
// Layer 1: every row of Y equals w1_e[:, shard] x (the GPU's own hidden row), which isolates GEMM1 from
// GEMM0's rounding. `what` names the system in failure messages.
void expect_layers_match(const MoeProblem& p, const MoeEngine& moe, const Team& team, const std::string& what);

// Every rank's output against `ref` (reference::forward of the problem): relative error of the whole
// output and of its worst row (harness/layer_compare.hpp has the tolerances).
void expect_outputs_match(const MoeProblem& p, const std::vector<std::vector<float>>& ref,
                          const std::vector<std::vector<float>>& got, const std::string& what);

// Every gradient of a backward against `ref` (reference::backward of the problem): per rank dx and the
// gate gradients, and dW0 / dW1 in the full weights' layout (each rank's unsharded: unshard_add_w0/w1).
// An expert that no token chose has zero gradients, exactly (harness/layer_compare.hpp has the tolerances).
void expect_gradients_match(const MoeProblem& p, const std::vector<std::vector<float>>& dout,
                            const reference::Gradients<float>& ref,
                            const reference::Gradients<float>& got, const std::string& what);

}  // namespace comet::testing
