// The standalone expert GEMM (CUTLASS's grouped GEMM, kernels/expert_gemm_grouped.cuh) in both tile
// orders, called directly: every schedule against a CPU reference, and down M (CUTLASS's order) bitwise
// equal to along N (ours: the order moves whole tiles between blocks and times, never a K step, so it
// cannot change a result). Experts without rows, partial M-tiles and partial column blocks of every tile
// width (N = 320: 2.5 x 128, 2 x 160, 1.25 x 256), both weight layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "comet/bf16.hpp"
#include "harness/device_buffer.hpp"
#include "harness/routing_gen.hpp"
#include "kernels/fused_layers.hpp"

namespace comet {
namespace {

using testing::DeviceBuffer;

std::vector<bf16_bits> to_bits(const std::vector<float>& v) {
  std::vector<bf16_bits> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

TEST(ExpertGemmGrouped, BothTileOrdersMatchTheReferenceBitwiseAlike) {
  const std::vector<int32_t> rows{130, 0, 77, 300};  // partial M-tiles; an expert without rows
  const int experts = int(rows.size()), k = 192, n = 320;
  std::vector<int32_t> offset(experts + 1, 0);
  for (int e = 0; e < experts; ++e) offset[e + 1] = offset[e] + (rows[e] + 127) / 128 * 128;
  const int cap = offset[experts];
  const std::vector<float> a = testing::random_bf16_values(size_t(cap) * k, 1.0f, 7);
  const std::vector<float> w = testing::random_bf16_values(size_t(experts) * k * n, 0.1f, 8);
  DeviceBuffer d_a(to_bits(a)), d_w(to_bits(w)), d_offset(offset), d_rows(rows), out(size_t(cap) * n * 2);
  DeviceBuffer workspace(kernels::expert_gemm_grouped_workspace_bytes(experts));

  for (bool w_kn : {true, false}) {
    // The reference: fp32 sums of the bf16 operands. W_e is [k][n] (w_kn) or [n][k].
    std::vector<float> want(size_t(cap) * n, 0.f);
    for (int e = 0; e < experts; ++e)
      for (int r = offset[e]; r < offset[e] + rows[e]; ++r)
        for (int j = 0; j < n; ++j) {
          float sum = 0;
          for (int i = 0; i < k; ++i) {
            const size_t wi = size_t(e) * k * n + (w_kn ? size_t(i) * n + j : size_t(j) * k + i);
            sum += a[size_t(r) * k + i] * w[wi];
          }
          want[size_t(r) * n + j] = sum;
        }
    for (StandaloneGemm g : kStandaloneGemms) {
      if (g == StandaloneGemm::comet || g == StandaloneGemm::cublas) continue;  // CUTLASS's grouped GEMMs
      std::vector<bf16_bits> by_order[2];
      for (kernels::GroupRaster order : {kernels::GroupRaster::along_m, kernels::GroupRaster::along_n}) {
        SCOPED_TRACE(::testing::Message() << to_string(g) << (w_kn ? " W [k][n]" : " W [n][k]")
                                        << (order == kernels::GroupRaster::along_n ? " along N" : " down M"));
        out.fill_bytes(0xFF);  // NaN: a row that is not written cannot pass
        kernels::ExpertGemmLaunch l;
        l.a = d_a.get();
        l.k = k;
        l.w = d_w.get();
        l.w_kn = w_kn;
        l.n = n;
        l.out = out.get();
        l.experts = experts;
        l.expert_offset = d_offset.as<int32_t>();
        l.expert_rows = d_rows.as<int32_t>();
        l.kernel = g;
        l.raster = order;
        l.workspace = workspace.get();
        l.workspace_bytes = workspace.bytes();
        kernels::launch_expert_gemm_grouped(l, nullptr);
        COMET_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<bf16_bits> got = out.download<bf16_bits>(size_t(cap) * n);
        int bad = 0;
        for (int e = 0; e < experts; ++e)
          for (int r = offset[e]; r < offset[e] + rows[e]; ++r)
            for (int j = 0; j < n; ++j) {
              const float ref = want[size_t(r) * n + j], v = bf16_to_float(got[size_t(r) * n + j]);
              if (!(std::fabs(v - ref) <= 1e-2f * std::fabs(ref) + 1e-2f) && bad++ < 5)
                ADD_FAILURE() << "row " << r << " col " << j << ": " << v << ", want " << ref;
            }
        EXPECT_EQ(bad, 0);
        by_order[order == kernels::GroupRaster::along_n] = std::move(got);
      }
      for (int e = 0; e < experts; ++e)
        for (int r = offset[e]; r < offset[e] + rows[e]; ++r)
          for (int j = 0; j < n; ++j)
            ASSERT_EQ(by_order[0][size_t(r) * n + j], by_order[1][size_t(r) * n + j])
                << to_string(g) << ": the two orders differ at row " << r << " col " << j;
    }
  }
}

}  // namespace
}  // namespace comet
