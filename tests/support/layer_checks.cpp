#include "support/layer_checks.hpp"

#include <gtest/gtest.h>

#include "comet/cuda_check.hpp"
#include "comet/reference.hpp"
#include "harness/layer_compare.hpp"

namespace comet::testing {

std::vector<bf16_bits> download_bf16(const void* device_ptr, size_t n) {
  std::vector<bf16_bits> h(n);
  COMET_CUDA_CHECK(cudaMemcpy(h.data(), device_ptr, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

void expect_layers_match(const MoeProblem& p, const MoeEngine& moe, const Team& team, const std::string& what) {
  const MoeShape& s = p.shape;
  const Parallel& par = p.par;
  const int H = s.hidden, Fs = par.ffn_shard(s), k = s.topk;
  for (int r = 0; r < par.world(); ++r) {
    const HostPlan plan = moe.plan(r).to_host(team.stream(r));
    const PlanView& v = plan.view();
    const int rows = v.expert_offset[par.local_experts(s)];
    const auto hid = from_bf16(download_bf16(moe.hidden(r), size_t(rows) * Fs));
    const auto y = from_bf16(download_bf16(moe.expert_out(r), size_t(rows) * H));
    std::vector<float> hid_ref, hid_got, y_ref, y_got;
    const int f0 = par.tp_index(r) * Fs;
    for (int row = 0; row < rows; ++row) {
      const int u = v.row_unit[row];
      if (u < 0) continue;
      const auto& in = p.inputs[v.unit_src[u]];
      const int e = in.ids[size_t(v.unit_token[u]) * k + v.row_slot[row]];
      const float* x = &in.x[size_t(v.unit_token[u]) * H];
      const auto ref = reference::expert_hidden(s, p.weights, e, x, f0, f0 + Fs);
      hid_ref.insert(hid_ref.end(), ref.begin(), ref.end());
      hid_got.insert(hid_got.end(), hid.begin() + size_t(row) * Fs, hid.begin() + size_t(row + 1) * Fs);
      const auto yr = reference::expert_output(s, p.weights, e, &hid[size_t(row) * Fs], f0, f0 + Fs);
      y_ref.insert(y_ref.end(), yr.begin(), yr.end());
      y_got.insert(y_got.end(), y.begin() + size_t(row) * H, y.begin() + size_t(row + 1) * H);
    }
    EXPECT_LT(relative_error(hid_got, hid_ref), 1e-2) << what << ": layer 0 (GEMM0 + activation), rank " << r;
    EXPECT_LT(worst_row_error(hid_got, hid_ref, Fs), 3e-2) << what << ": layer 0 (GEMM0 + activation), rank " << r;
    EXPECT_LT(relative_error(y_got, y_ref), 1e-2) << what << ": layer 1 GEMM, rank " << r;
    EXPECT_LT(worst_row_error(y_got, y_ref, H), 3e-2) << what << ": layer 1 GEMM, rank " << r;
  }
}

void expect_outputs_match(const MoeProblem& p, const std::vector<std::vector<float>>& ref,
                          const std::vector<std::vector<float>>& got, const std::string& what) {
  EXPECT_EQ(compare_outputs(p.shape, ref, got), "") << what;
}

void expect_gradients_match(const MoeProblem& p, const std::vector<std::vector<float>>& dout,
                            const reference::Gradients<float>& ref, const reference::Gradients<float>& got,
                            const std::string& what) {
  EXPECT_EQ(compare_gradients(p.shape, ref, got, gate_grad_scales(p.shape, p.weights, p.inputs, dout)), "") << what;
}

}  // namespace comet::testing
