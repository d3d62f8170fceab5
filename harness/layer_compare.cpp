#include "harness/layer_compare.hpp"

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

std::string compare_gradients(const MoeShape& shape, const reference::Gradients<float>& ref,
                              const reference::Gradients<float>& got) {
  std::ostringstream os;
  if (got.dx.size() != ref.dx.size() || got.dgates.size() != ref.dgates.size()) return "backward: rank counts differ\n";
  if (got.dw0.size() != ref.dw0.size() || got.dw1.size() != ref.dw1.size()) return "backward: dW sizes differ\n";
  std::vector<float> all_got, all_ref;  // every rank's gate gradients
  for (size_t r = 0; r < ref.dx.size(); ++r) {
    if (ref.dx[r].empty()) continue;
    const std::string rank = ", rank " + std::to_string(r);
    check(os, "dx" + rank, relative_error(got.dx[r], ref.dx[r]), kGradTolerance);
    check(os, "dx worst row" + rank, worst_row_error(got.dx[r], ref.dx[r], shape.hidden), kGradRowTolerance);
    check(os, "dgates" + rank, relative_error(got.dgates[r], ref.dgates[r]), kGradRowTolerance);
    all_got.insert(all_got.end(), got.dgates[r].begin(), got.dgates[r].end());
    all_ref.insert(all_ref.end(), ref.dgates[r].begin(), ref.dgates[r].end());
  }
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
