// The fused layer with an fp8 layer 0 (MoeOptions::dtype e4m3, issue 17) on W virtual ranks against the
// fp8 CPU reference (reference::quantize_layer0 / forward over the quantised operands): tokens quantised
// on their owner and dispatched as records, W0 quantised on the GPU (testing::quantize_w0), the
// block-scaled wgmma GEMM. EP, TP and EP x TP, both links, the ugly routings, partial N blocks (F_s 96),
// the sequential mode, bitwise equality across comm blocks, and the refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "support/expect_invalid.hpp"
#include "support/layer_checks.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

struct Fp8Case {
  const char* name;
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens;
  RoutingKind kind = RoutingKind::uniform;
  Link link = Link::device;
  int l0_comm = 2;
  int hot = 0;
};

std::ostream& operator<<(std::ostream& os, const Fp8Case& c) { return os << c.name; }

MoeOptions fp8_options(int l0_comm) {
  MoeOptions o;
  o.dtype = DType::e4m3;
  o.layer0 = forced(128, l0_comm);
  o.layer1 = forced(256, 4);
  return o;
}

struct Fp8Harness {
  MoeProblem problem;
  MoeProblem quantised;  // the same problem over the dequantised fp8 operands: the oracle's inputs
  LocalTeam team;
  FusedMoe fused;
  MoeEngine& moe;
  std::vector<std::unique_ptr<DeviceRank>> ranks;
  std::vector<Fp8W0> w0;

  explicit Fp8Harness(const Fp8Case& c, uint64_t seed = 1)
      : problem(MoeProblem::make(c.shape, c.par, c.tokens, c.kind, seed, c.hot)),
        quantised(problem),
        team(c.par.world(), c.link),
        fused(team, c.shape, c.par, MoeCapacity{problem.max_tokens(), 0}, fp8_options(c.l0_comm)),
        moe(fused.engine()) {
    team.set_timeout(3.0);
    const auto q = reference::quantize_layer0(problem.shape, problem.par, problem.weights, problem.inputs);
    quantised.weights = q.weights;
    quantised.inputs = q.ranks;
    for (int r = 0; r < c.par.world(); ++r) {
      ranks.push_back(upload_rank(problem, r));
      w0.push_back(quantize_w0(problem.shape, problem.par, ranks[r]->w0.get()));
      moe.set_weights(r, w0[r].codes.get(), ranks[r]->w1.get(), w0[r].scale_ptr());
    }
  }
  std::vector<RankBatch> batches() const {
    std::vector<RankBatch> b;
    for (const auto& r : ranks) b.push_back(r->batch());
    return b;
  }
  std::vector<std::vector<float>> forward(const LayerRequest& l0) {
    const int W = problem.par.world();
    for (int r = 0; r < W; ++r) {
      moe.poison_buffers(r);
      ranks[r]->out.fill_bytes(0xFF);
    }
    for (int r = 0; r < W; ++r) moe.stage(r, ranks[r]->batch());
    team.barrier();
    for (int r = 0; r < W; ++r) {
      moe.prepare(r);
      moe.layer0(r, LayerMode::fused, l0);
      moe.layer1(r, LayerMode::fused, forced(256, 4));
    }
    team.barrier();
    for (int r = 0; r < W; ++r) moe.finish(r, ranks[r]->batch());
    moe.sync_and_check();
    std::vector<std::vector<float>> o;
    for (const auto& r : ranks) o.push_back(r->output());
    return o;
  }
};

// Against the fp8 oracle with the forward's tolerances, and measurably closer to it than to the
// unquantised layer: fp8 moves the result by about e4m3's precision (2^-4), the GPU's own rounding
// (fp32 sums, bf16 hidden and output) by about 2^-8, so a layer 0 that skipped the quantisation
// (or used the wrong scales) lands near the other oracle and fails the second check.
void check_fp8(const Fp8Harness& h, const std::vector<std::vector<float>>& got, const std::string& what) {
  const auto ref8 = reference::forward(h.quantised.shape, h.quantised.par, h.quantised.weights, h.quantised.inputs);
  const auto ref16 = reference::forward(h.problem.shape, h.problem.par, h.problem.weights, h.problem.inputs);
  expect_outputs_match(h.quantised, ref8, got, what);
  std::vector<float> all_got, all8, all16;
  for (size_t r = 0; r < got.size(); ++r) {
    all_got.insert(all_got.end(), got[r].begin(), got[r].end());
    all8.insert(all8.end(), ref8[r].begin(), ref8[r].end());
    all16.insert(all16.end(), ref16[r].begin(), ref16[r].end());
  }
  if (all8.empty()) return;
  const double to8 = relative_error(all_got, all8), to16 = relative_error(all_got, all16);
  EXPECT_LT(to8, 0.5 * to16) << what << ": relative error " << to8 << " against the fp8 oracle, " << to16
                             << " against the unquantised one";
}

class FusedFp8Case : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(FusedFp8Case, MatchesFp8Reference) {
  const Fp8Case& c = GetParam();
  Fp8Harness h(c);
  // Through the public API on a caller's stream, then the steps (layer 0's hidden rows checked too).
  cudaStream_t caller = nullptr;
  COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking));
  h.fused.forward(h.batches(), caller);
  COMET_CUDA_CHECK(cudaStreamSynchronize(caller));
  COMET_CUDA_CHECK(cudaStreamDestroy(caller));
  h.fused.sync_and_check();
  std::vector<std::vector<float>> api;
  for (const auto& r : h.ranks) api.push_back(r->output());
  check_fp8(h, api, "fp8 forward");
  const auto steps = h.forward(forced(128, c.l0_comm));
  check_fp8(h, steps, "fp8 steps");
  expect_layers_match(h.quantised, h.moe, h.team, "fp8 layer 0");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, FusedFp8Case,
    ::testing::Values(
        Fp8Case{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}, RoutingKind::uniform, Link::device, 0},
        Fp8Case{"EP2_device", kSmallSwiglu, {2, 1}, {37, 200}},
        Fp8Case{"EP4_zero_token_rank_host", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform, Link::host, 3},
        Fp8Case{"EP8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform, Link::host, 4},
        Fp8Case{"EP4_all_to_one_expert_top1", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
        Fp8Case{"EP4_zipf_sequential", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf, Link::device, 0},
        Fp8Case{"TP4_gelu_partial_n_block", kGelu, {1, 4}, {50, 70, 0, 129}},
        Fp8Case{"EP2xTP2_top8", kTop8, {2, 2}, {80, 0, 150, 41}},
        Fp8Case{"EP4xTP2_host_zipf", kSmallSwiglu, {4, 2}, {20, 40, 60, 80, 100, 0, 7, 130}, RoutingKind::zipf,
                Link::host, 2},
        Fp8Case{"EP8_one_expert_hot5", kTop8, {8, 1}, {64, 64, 64, 64, 64, 64, 64, 64}, RoutingKind::one_expert,
                Link::device, 2, 5}),
    [](const ::testing::TestParamInfo<Fp8Case>& info) { return std::string(info.param.name); });

// The same bits whatever the number of comm blocks (0: the sequential mode) and over repeats.
TEST(FusedFp8, BitwiseAcrossCommBlocksAndRepeats) {
  Fp8Harness h(Fp8Case{"EP4", kSmallSwiglu, {4, 1}, {120, 80, 0, 200}, RoutingKind::zipf});
  const auto first = h.forward(forced(128, 2));
  for (int n_comm : {0, 1, 5, 2}) {
    const auto again = h.forward(forced(128, n_comm));
    for (size_t r = 0; r < first.size(); ++r)
      ASSERT_EQ(0, std::memcmp(first[r].data(), again[r].data(), first[r].size() * sizeof(float)))
          << "rank " << r << " differs with n_comm " << n_comm;
  }
}

// Refused before any launch: an e4m3 w0 without scales, scales on a bf16 layer, training in fp8, a tile
// the fp8 kernel does not have, H that is not a multiple of 128.
TEST(FusedFp8, RefusesWhatItCannotRun) {
  const Parallel par{2, 1};
  LocalTeam team(2, Link::device);
  {
    FusedMoe fp8(team, kSmallSwiglu, par, MoeCapacity{64, 0}, fp8_options(2));
    DeviceBuffer w(1 << 20);
    expect_invalid([&] { fp8.set_weights(0, w.get(), w.get()); }, "block scales");
  }
  {
    FusedMoe bf16(team, kSmallSwiglu, par, MoeCapacity{64, 0});
    DeviceBuffer w(1 << 20);
    expect_invalid([&] { bf16.set_weights(0, w.get(), w.get(), w.as<float>()); }, "layer is bf16");
  }
  MoeOptions train = fp8_options(2);
  train.training = true;
  expect_invalid([&] { FusedMoe(team, kSmallSwiglu, par, MoeCapacity{64, 0}, train); }, "no backward");
  MoeOptions wide = fp8_options(2);
  wide.layer0 = forced(256, 2);
  expect_invalid([&] { FusedMoe(team, kSmallSwiglu, par, MoeCapacity{64, 0}, wide); }, "tile_n must be 128");
  const MoeShape odd{320, 256, 4, 2, Activation::swiglu};
  expect_invalid([&] { FusedMoe(team, odd, par, MoeCapacity{64, 0}, fp8_options(2)); }, "multiple of 128");
}

}  // namespace
