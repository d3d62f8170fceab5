#include "harness/layer_compare.hpp"

#include <cmath>
#include <sstream>
#include <vector>

#include "harness/moe_problem.hpp"

namespace comet::testing {
namespace {

// Appends "what: error e > bound b" when e exceeds b (NaN counts as +inf in relative_error).
void check(std::ostringstream& os, const std::string& what, double e, double bound) {
  if (!(e < bound)) os << what << ": error " << e << " > " << bound << "\n";
}

}  // namespace

std::string compare_outputs(const MoeShape& shape, const std::vector<std::vector<float>>& ref,
                            const std::vector<std::vector<float>>& got) {
  std::ostringstream os;
  if (got.size() != ref.size()) return "forward: " + std::to_string(got.size()) + " ranks, expected " +
                                       std::to_string(ref.size()) + "\n";
  for (size_t r = 0; r < ref.size(); ++r) {
    const std::string rank = "forward, rank " + std::to_string(r);
    check(os, rank, relative_error(got[r], ref[r]), kForwardTolerance);
    if (!ref[r].empty()) check(os, rank + " worst row", worst_row_error(got[r], ref[r], shape.hidden), kForwardRowTolerance);
  }
  return os.str();
}

std::vector<std::vector<float>> gate_grad_scales(const MoeShape& shape, const reference::ExpertWeights<float>& weights,
                                                 const std::vector<reference::RankInput<float>>& inputs,
                                                 const std::vector<std::vector<float>>& dout) {
  const int H = shape.hidden, F = shape.ffn, k = shape.topk;
  std::vector<std::vector<float>> scales(inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    const auto& in = inputs[r];
    scales[r].assign(size_t(in.tokens) * k, 0.f);
    for (int t = 0; t < in.tokens; ++t) {
      for (int j = 0; j < k; ++j) {
        const int e = in.ids[size_t(t) * k + j];
        const auto h = reference::expert_hidden(shape, weights, e, &in.x[size_t(t) * H], 0, F);
        const float* w1 = &weights.w1[size_t(e) * H * F];
        const float* g = &dout[r][size_t(t) * H];
        double sum = 0;
        for (int f = 0; f < F; ++f) {
          double d = 0;
          for (int i = 0; i < H; ++i) d += double(g[i]) * w1[size_t(i) * F + f];
          sum += std::fabs(d * h[f]);
        }
        scales[r][size_t(t) * k + j] = float(sum);
      }
    }
  }
  return scales;
}

std::string compare_gradients(const MoeShape& shape, const reference::Gradients<float>& ref,
                              const reference::Gradients<float>& got,
                              const std::vector<std::vector<float>>& gate_scales) {
  std::ostringstream os;
  if (got.dx.size() != ref.dx.size() || got.dgates.size() != ref.dgates.size()) return "backward: rank counts differ\n";
  if (gate_scales.size() != ref.dgates.size()) return "backward: gate scales for another number of ranks\n";
  if (got.dw0.size() != ref.dw0.size() || got.dw1.size() != ref.dw1.size()) return "backward: dW sizes differ\n";
  std::vector<float> all_got, all_ref;  // every rank's gate gradients
  for (size_t r = 0; r < ref.dx.size(); ++r) {
    if (ref.dx[r].empty()) continue;
    const std::string rank = ", rank " + std::to_string(r);
    check(os, "dx" + rank, relative_error(got.dx[r], ref.dx[r]), kGradTolerance);
    check(os, "dx worst row" + rank, worst_row_error(got.dx[r], ref.dx[r], shape.hidden), kGradRowTolerance);
    if (got.dgates[r].size() != ref.dgates[r].size() || gate_scales[r].size() != ref.dgates[r].size()) {
      os << "dgates" << rank << ": sizes differ\n";
      continue;
    }
    for (size_t i = 0; i < ref.dgates[r].size(); ++i) {
      const double err = std::fabs(double(got.dgates[r][i]) - ref.dgates[r][i]);
      if (!(err <= kGateGradBound * gate_scales[r][i] + 1e-30)) {
        os << "dgates" << rank << ", token " << i / shape.topk << ", slot " << i % shape.topk << ": " << got.dgates[r][i]
           << " against " << ref.dgates[r][i] << ", more than " << kGateGradBound << " x sum |D_f h_f| = "
           << kGateGradBound * gate_scales[r][i] << " off\n";
        break;
      }
    }
    all_got.insert(all_got.end(), got.dgates[r].begin(), got.dgates[r].end());
    all_ref.insert(all_ref.end(), ref.dgates[r].begin(), ref.dgates[r].end());
  }
  if (all_ref.size() >= kGateGradsForNorm)
    check(os, "dgates of every rank", relative_error(all_got, all_ref), kGradTolerance);
  check(os, "dW0", relative_error(got.dw0, ref.dw0), kGradTolerance);
  check(os, "dW1", relative_error(got.dw1, ref.dw1), kGradTolerance);
  const size_t per0 = size_t(shape.w0_rows()) * shape.hidden, per1 = size_t(shape.hidden) * shape.ffn;
  for (int e = 0; e < shape.num_experts; ++e) {
    bool unused = true;
    for (size_t i = 0; i < per1 && unused; ++i) unused = ref.dw1[e * per1 + i] == 0.f;
    if (!unused) continue;
    bool zero = true;
    for (size_t i = 0; i < per0 && zero; ++i) zero = got.dw0[e * per0 + i] == 0.f;
    for (size_t i = 0; i < per1 && zero; ++i) zero = got.dw1[e * per1 + i] == 0.f;
    if (!zero) os << "dW0 / dW1 of expert " << e << ", which no token chose, are not zero\n";
  }
  return os.str();
}

}  // namespace comet::testing
