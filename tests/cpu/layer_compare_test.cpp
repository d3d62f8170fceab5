// The comparison every GPU check uses (harness/layer_compare.hpp): the gate gradients' bound lets the
// GPU's bf16 rounding of D and h pass on a badly conditioned sum, and still catches a wrong answer.
#include <gtest/gtest.h>

#include <cmath>

#include "comet/reference.hpp"
#include "harness/layer_compare.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

struct Case {
  MoeProblem p = MoeProblem::make(MoeShape{64, 32, 4, 2, Activation::silu}, Parallel{2, 1}, {1, 3},
                                  RoutingKind::uniform, 9);
  std::vector<std::vector<float>> dout{random_bf16_values(64, 1.f, 1), random_bf16_values(3 * 64, 1.f, 2)};
  reference::Gradients<float> ref = reference::backward(p.shape, p.par, p.weights, p.inputs, dout);
  std::vector<std::vector<float>> scales = gate_grad_scales(p.shape, p.weights, p.inputs, dout);
};

TEST(LayerCompare, GateGradientsWithinTheRoundingBoundPass) {
  Case c;
  reference::Gradients<float> got = c.ref;
  for (size_t r = 0; r < got.dgates.size(); ++r)
    for (size_t i = 0; i < got.dgates[r].size(); ++i) {
      ASSERT_GE(c.scales[r][i], std::fabs(c.ref.dgates[r][i]));  // |sum| <= sum of |terms|
      got.dgates[r][i] += float((i % 2 ? 1 : -1) * 0.9 * kGateGradBound * c.scales[r][i]);
    }
  EXPECT_EQ(compare_gradients(c.p.shape, c.ref, got, c.scales), "");
}

TEST(LayerCompare, WrongGateGradientsFail) {
  Case c;
  reference::Gradients<float> got = c.ref;
  std::swap(got.dgates[1][0], got.dgates[1][1]);  // one token's two slots exchanged
  EXPECT_NE(compare_gradients(c.p.shape, c.ref, got, c.scales).find("dgates, rank 1, token 0"), std::string::npos);
  got = c.ref;
  got.dgates[0][1] += float(1.1 * kGateGradBound * c.scales[0][1]);
  EXPECT_NE(compare_gradients(c.p.shape, c.ref, got, c.scales).find("dgates, rank 0, token 0, slot 1"), std::string::npos);
}

}  // namespace
