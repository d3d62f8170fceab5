// Capacity resolution and the per-rank footprint (comet/footprint.hpp), worked by hand for real shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "comet/footprint.hpp"
#include "kernels/fused_layers.hpp"
#include "support/expect_invalid.hpp"

using namespace comet;
using comet::testing::expect_invalid;

namespace {

const MoeShape kMixtral{4096, 14336, 8, 2, Activation::swiglu};
const MoeShape kDeepSeekV3{7168, 2048, 256, 8, Activation::swiglu};

TEST(Capacity, WorstCaseByDefault) {
  // Mixtral EP 8: E_l = 1, so a token brings at most one row: 8 * 4096 + 127 = 32895 -> 32896.
  EXPECT_EQ(resolve_capacity(kMixtral, Parallel{8, 1}, MoeCapacity{4096}).max_rows_per_rank, 32896);
  // DeepSeek-V3 EP 8: E_l = 32, k = 8: 8 * 4096 * 8 + 32 * 127 = 266208 -> 266240.
  EXPECT_EQ(resolve_capacity(kDeepSeekV3, Parallel{8, 1}, MoeCapacity{4096}).max_rows_per_rank, 266240);
  // An explicit count is rounded up to the tile and kept.
  EXPECT_EQ(resolve_capacity(kMixtral, Parallel{8, 1}, MoeCapacity{4096, 1000}).max_rows_per_rank, 1024);
}

TEST(Capacity, LoadFactorSizesForTheMeanLoad) {
  // DeepSeek-V3 EP 8, 4096 tokens: mean 8 * 4096 * 8 * 32 / 256 = 32768 rows; x 1.5 = 49152, + 4064
  // padding = 53216 -> 53248 (a fifth of the worst case).
  const MoeCapacity c = resolve_capacity(kDeepSeekV3, Parallel{8, 1}, MoeCapacity{4096, 0, 1.5});
  EXPECT_EQ(c.max_rows_per_rank, 53248);
  EXPECT_EQ(c.load_factor, 0.0);
  // TP 8 (E_l = E): the mean is the worst case, and the factor never goes past it.
  EXPECT_EQ(resolve_capacity(kDeepSeekV3, Parallel{1, 8}, MoeCapacity{4096, 0, 2.0}).max_rows_per_rank,
            resolve_capacity(kDeepSeekV3, Parallel{1, 8}, MoeCapacity{4096}).max_rows_per_rank);
  // Mixtral EP 4 x TP 2 (E_l 2): mean 8 * 1000 * 2 * 2 / 8 = 4000; x 1.25 = 5000 + 254 = 5254 -> 5376.
  EXPECT_EQ(resolve_capacity(kMixtral, Parallel{4, 2}, MoeCapacity{1000, 0, 1.25}).max_rows_per_rank, 5376);
}

TEST(Capacity, BadCapacitiesAreRefused) {
  const Parallel ep8{8, 1};
  expect_invalid([&] { resolve_capacity(kMixtral, ep8, MoeCapacity{0}); }, "must be positive");
  expect_invalid([&] { resolve_capacity(kMixtral, ep8, MoeCapacity{16, -1}); }, ">= 0");
  expect_invalid([&] { resolve_capacity(kMixtral, ep8, MoeCapacity{16, 0, -0.5}); }, "load_factor");
  expect_invalid([&] { resolve_capacity(kMixtral, ep8, MoeCapacity{16, 0, std::nan("")}); }, "load_factor");
  expect_invalid([&] { resolve_capacity(kMixtral, ep8, MoeCapacity{16, 512, 1.5}); }, "not both");
  expect_invalid([&] { resolve_capacity(kDeepSeekV3, Parallel{1, 8}, MoeCapacity{1 << 26}); }, "rows");
}

// An fp8 layer 0 exports its tokens as records (fp8.hpp: 7168 codes + 56 scales = 7392 bytes at H 7168)
// instead of bf16 rows; every other buffer is the bf16 layer's (A keeps bf16 size: Y shares it).
TEST(Footprint, Fp8ExportsRecords) {
  const Parallel ep8{8, 1};
  const MoeCapacity cap = resolve_capacity(kDeepSeekV3, ep8, MoeCapacity{4096});
  const LayerFootprint bf16 = layer_footprint(kDeepSeekV3, ep8, cap, false);
  const LayerFootprint fp8 = layer_footprint(kDeepSeekV3, ep8, cap, false, DType::e4m3);
  const size_t T = 4096, H = 7168;
  EXPECT_EQ(fp8.symmetric, bf16.symmetric - T * H * 2 + T * 7392);
  EXPECT_EQ(fp8.compute(), bf16.compute());
}

TEST(Footprint, ExpertOutputsShareTheGatheredRowsWithoutTraining) {
  const Parallel ep8{8, 1};
  const MoeCapacity cap = resolve_capacity(kDeepSeekV3, ep8, MoeCapacity{4096});
  const LayerFootprint inf = layer_footprint(kDeepSeekV3, ep8, cap, false);
  const LayerFootprint train = layer_footprint(kDeepSeekV3, ep8, cap, true);
  const size_t rows = 266240, H = 7168, T = 4096, W = 8, Fs = 2048;
  EXPECT_EQ(inf.gathered, rows * H * 2);
  EXPECT_EQ(inf.expert_out, 0u);
  EXPECT_EQ(train.expert_out, rows * H * 2);
  EXPECT_EQ(inf.hidden, rows * Fs * 2);
  EXPECT_EQ(inf.self_partial, T * H * 2);
  EXPECT_EQ(inf.training, 0u);
  // Training: pre-activations (2 F_s columns), output gradients, gate partials (one per 128 columns of
  // F_s: 16); D lives in Y (F_s <= H).
  EXPECT_EQ(gate_partial_columns(kDeepSeekV3, ep8), 16);
  EXPECT_EQ(train.training, rows * 2 * Fs * 2 + rows * H * 2 + rows * 16 * 4);
  // CUTLASS's grouped GEMMs' workspaces (per-expert arguments, tensor maps), small next to the rows: the
  // standalone expert GEMM's; training adds the two weight-gradient launches'.
  const size_t gemm_workspace = kernels::expert_gemm_grouped_workspace_bytes(256 / 8);
  const size_t wgrad_workspaces = 2 * kernels::weight_grad_grouped_workspace_bytes(256 / 8);
  EXPECT_GT(gemm_workspace, 0u);
  EXPECT_GT(wgrad_workspaces, 0u);
  EXPECT_LT(gemm_workspace + wgrad_workspaces, size_t(4) << 20);
  EXPECT_EQ(inf.workspaces, gemm_workspace);
  EXPECT_EQ(train.workspaces, gemm_workspace + wgrad_workspaces);
  // x, routing (16-byte header, ids, gates), receive slots, failure words; training adds the
  // gate-gradient slots.
  EXPECT_EQ(inf.symmetric, T * H * 2 + 16 + T * 8 * 8 + W * T * H * 2 + W * 4);
  EXPECT_EQ(train.symmetric, inf.symmetric + W * T * 8 * 4);
  EXPECT_GT(inf.plan, 0u);
  EXPECT_EQ(inf.total(), inf.compute() + inf.symmetric);
  // The worst-case inference layer: 5.50 GB per rank (9.32 GB with A and Y apart).
  EXPECT_LT(inf.total(), 5.6e9);
  EXPECT_GT(inf.total(), 5.4e9);
}

TEST(Footprint, DRowsGetTheirOwnBufferWhenWiderThanH) {
  const MoeShape wide{256, 1024, 4, 1, Activation::silu};  // F_s = 1024 > H: D cannot live in Y
  const Parallel p{2, 1};
  const MoeCapacity cap = resolve_capacity(wide, p, MoeCapacity{64});
  const size_t rows = size_t(cap.max_rows_per_rank);
  const LayerFootprint f = layer_footprint(wide, p, cap, true);
  EXPECT_EQ(f.training, rows * 1024 * 2 + rows * 256 * 2 + rows * 8 * 4 + rows * 1024 * 2);
  expect_invalid([&] { layer_footprint(wide, p, MoeCapacity{64, 0}, true); }, "resolved");
}

}  // namespace
