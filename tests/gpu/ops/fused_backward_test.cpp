// The fused MoE layer's backward on W virtual ranks (LocalTeam) against the CPU reference backward
// (reference::backward: dx, the gate gradients and dW0 / dW1 of sum <dout, out>), for EP, TP and EP x TP,
// both links, the ugly routings and every activation; bitwise determinism across comm-block counts and
// repeats; the refusals (no training, a second backward of one forward).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>

#include "comet/bf16.hpp"
#include "comet/cuda_check.hpp"
#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "comet/weight_layout.hpp"
#include "support/bitwise.hpp"
#include "support/test_shapes.hpp"
#include "harness/moe_problem.hpp"
#include "ops/moe_engine.hpp"
#include "support/expect_invalid.hpp"
#include "support/layer_checks.hpp"
#include "support/test_layer.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

struct BwdCase {
  const char* name;
  MoeShape shape;
  Parallel par;
  std::vector<int> tokens;
  RoutingKind kind = RoutingKind::uniform;
  Link link = Link::device;
  LayerRequest l0 = forced(256, 2);  // forward layer 0 and the backward of layer 1 (same kind of kernel)
  LayerRequest l1 = forced(256, 4);  // forward layer 1 and the backward of layer 0
  GradType grad_type = GradType::f32;
  int hot = 0;
  bool fused_act = false;  // BackwardOptions::fused_activation
  WeightGradKernel wgrad = WeightGradKernel::persistent;  // BackwardOptions::weight_grad_kernel
  bool cublas = false;  // MoeOptions::cublas_backward
  bool check_schedule = false;  // MoeOptions::check_schedule
  std::string tune_table;       // MoeOptions::tune_table (empty: the default)
};

// The same case with MoeOptions::cublas_backward: the standalone GEMMs (the sequential schedule's) and
// the weight gradients (automatic) are cuBLAS's, with the rows the forward read back.
BwdCase with_cublas(BwdCase c, const char* name) {
  c.cublas = true;
  c.wgrad = WeightGradKernel::automatic;
  c.name = name;
  return c;
}

// The same case with the weight gradients from one of CUTLASS's grouped GEMMs (ping-pong by default).
BwdCase with_grouped_wgrad(BwdCase c, const char* name, WeightGradKernel kernel = WeightGradKernel::grouped) {
  c.wgrad = kernel;
  c.name = name;
  return c;
}

// The same case with the activation's backward in the GEMM's epilogue.
BwdCase with_fused_act(BwdCase c, const char* name) {
  c.fused_act = true;
  c.name = name;
  return c;
}

std::ostream& operator<<(std::ostream& os, const BwdCase& c) { return os << c.name; }

// One rank's gradient buffers.
struct RankGrads {
  DeviceBuffer dout, dx, dgates, dw0, dw1;
  RankGrad grad() const {
    return RankGrad{dout.get(), dx.get(), dgates.as<float>(), dw0.get(), dw1.get()};
  }
};

std::vector<float> random_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(u(gen));
  return v;
}

struct Harness {
  BwdCase c;
  MoeProblem problem;
  LocalTeam team;
  FusedMoe fused;
  MoeEngine& moe;
  std::vector<std::unique_ptr<DeviceRank>> ranks;
  std::vector<std::vector<float>> dout;  // per rank [T][H]
  std::vector<RankGrads> grads;

  static MoeOptions options_of(const BwdCase& c) {
    MoeOptions o;
    o.layer0 = c.l0;
    o.layer1 = c.l1;
    o.training = true;
    o.cublas_backward = c.cublas;
    o.check_schedule = c.check_schedule;
    o.tune_table = c.tune_table;
    return o;
  }

  explicit Harness(const BwdCase& bc, uint64_t seed = 1)
      : c(bc),
        problem(MoeProblem::make(c.shape, c.par, c.tokens, c.kind, seed, c.hot)),
        team(c.par.world(), c.link),
        fused(team, c.shape, c.par, MoeCapacity{problem.max_tokens(), 0}, options_of(c)),
        moe(fused.engine()) {
    team.set_timeout(3.0);
    const int W = c.par.world(), H = c.shape.hidden, k = c.shape.topk;
    const int El = c.par.local_experts(c.shape), Fs = c.par.ffn_shard(c.shape);
    const size_t w0_elems = size_t(El) * c.shape.w0_rows() / c.par.tp * H, w1_elems = size_t(El) * H * Fs;
    const size_t wbytes = c.grad_type == GradType::f32 ? 4 : 2;
    grads.resize(W);
    for (int r = 0; r < W; ++r) {
      ranks.push_back(upload_rank(problem, r));
      moe.set_weights(r, ranks[r]->w0.get(), ranks[r]->w1.get());
      const int T = c.tokens[r];
      dout.push_back(random_bf16(size_t(T) * H, seed * 1000 + r));
      RankGrads& g = grads[r];
      g.dout = DeviceBuffer(to_bf16(dout[r]));
      g.dx = DeviceBuffer(std::max<size_t>(size_t(T) * H * 2, 16));
      g.dgates = DeviceBuffer(std::max<size_t>(size_t(T) * k * 4, 16));
      g.dw0 = DeviceBuffer(w0_elems * wbytes);
      g.dw1 = DeviceBuffer(w1_elems * wbytes);
    }
  }
  std::vector<RankBatch> batches() const {
    std::vector<RankBatch> b;
    for (const auto& r : ranks) b.push_back(r->batch());
    return b;
  }
  std::vector<RankGrad> grad_list() const {
    std::vector<RankGrad> g;
    for (const auto& r : grads) g.push_back(r.grad());
    return g;
  }
  // Every data buffer of the layer and every output of both passes NaN: a call must rewrite all it reads.
  void poison() {
    for (int r = 0; r < c.par.world(); ++r) {
      moe.poison_buffers(r);
      ranks[r]->out.fill_bytes(0xFF);
      for (DeviceBuffer* b : {&grads[r].dx, &grads[r].dgates, &grads[r].dw0, &grads[r].dw1}) b->fill_bytes(0xFF);
    }
  }
  // Forward + backward through the public API, from poisoned buffers.
  void run() {
    poison();
    fused.forward(batches());
    fused.backward(grad_list(), nullptr, BackwardOptions{c.grad_type, false, c.fused_act, c.wgrad});
    fused.sync_and_check();
  }
  // Forward + backward step by step with explicit variants (bl1: backward of layer 1, bl0: of layer 0).
  void run_steps(const LayerRequest& bl1, const LayerRequest& bl0) {
    poison();
    fused.forward(batches());
    const int W = c.par.world();
    const BackwardOptions o{c.grad_type, false, c.fused_act, c.wgrad};
    for (int r = 0; r < W; ++r) moe.stage_grad(r, grads[r].grad());
    team.barrier();
    for (int r = 0; r < W; ++r) {
      moe.prepare_grad(r);
      moe.grad_layer1(r, LayerMode::fused, bl1, c.fused_act);
      moe.grad_gates(r);
      moe.grad_weights1(r, grads[r].grad(), o);
      moe.grad_layer0(r, LayerMode::fused, bl0);
      moe.grad_weights0(r, grads[r].grad(), o);
    }
    team.barrier();
    for (int r = 0; r < W; ++r) moe.finish_grad(r, grads[r].grad());
    fused.sync_and_check();
  }

  std::vector<float> weights_as_float(const DeviceBuffer& b, size_t n) const {
    if (c.grad_type == GradType::f32) return b.download<float>(n);
    std::vector<float> f(n);
    const auto bits = b.download<bf16_bits>(n);
    for (size_t i = 0; i < n; ++i) f[i] = bf16_to_float(bits[i]);
    return f;
  }
  // Everything the backward wrote, as floats: per rank dx, dgates, and the full dW0, dW1.
  reference::Gradients<float> gradients() const {
    const MoeShape& s = c.shape;
    const int W = c.par.world(), H = s.hidden, k = s.topk;
    const int El = c.par.local_experts(s), Fs = c.par.ffn_shard(s);
    const int n0 = s.w0_rows() / c.par.tp;
    reference::Gradients<float> g;
    g.dw0.assign(problem.weights.w0.size(), 0.f);
    g.dw1.assign(problem.weights.w1.size(), 0.f);
    for (int r = 0; r < W; ++r) {
      const int T = c.tokens[r];
      std::vector<float> dx(size_t(T) * H);
      const auto bits = grads[r].dx.download<bf16_bits>(dx.size());
      for (size_t i = 0; i < dx.size(); ++i) dx[i] = bf16_to_float(bits[i]);
      g.dx.push_back(dx);
      g.dgates.push_back(grads[r].dgates.download<float>(size_t(T) * k));
      unshard_add_w0(s, c.par, r, weights_as_float(grads[r].dw0, size_t(El) * n0 * H), g.dw0);
      unshard_add_w1(s, c.par, r, weights_as_float(grads[r].dw1, size_t(El) * H * Fs), g.dw1);
    }
    return g;
  }
  reference::Gradients<float> reference() const {
    return reference::backward(c.shape, c.par, problem.weights, problem.inputs, dout);
  }
};

void check_gradients(const Harness& h) {
  comet::testing::expect_gradients_match(h.problem, h.dout, h.reference(), h.gradients(),
                                         std::string("fused backward, ") + h.c.name);
}

class FusedBackwardCase : public ::testing::TestWithParam<BwdCase> {};

TEST_P(FusedBackwardCase, MatchesReference) {
  Harness h(GetParam());
  h.run();
  check_gradients(h);
}


INSTANTIATE_TEST_SUITE_P(
    Layouts, FusedBackwardCase,
    ::testing::Values(
        BwdCase{"W1_single_rank", kSmallSwiglu, {1, 1}, {300}, RoutingKind::uniform, Link::device, forced(256, 0),
                forced(256, 0)},
        BwdCase{"EP2_device", kSmallSwiglu, {2, 1}, {37, 200}},
        BwdCase{"EP2_host_bf16_grads", kSmallSwiglu, {2, 1}, {130, 64}, RoutingKind::uniform, Link::host,
                forced(256, 2), forced(256, 4), GradType::bf16},
        BwdCase{"EP4_zero_token_rank", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
        BwdCase{"EP8_top8_host", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform, Link::host},
        BwdCase{"EP4_all_to_one_expert_top1_silu", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
        BwdCase{"EP4_zipf", kSmallSwiglu, {4, 1}, {300, 250, 20, 77}, RoutingKind::zipf},
        BwdCase{"TP4_gelu", kGelu, {1, 4}, {50, 70, 0, 129}},
        BwdCase{"TP2_host", kSmallSwiglu, {1, 2}, {160, 31}, RoutingKind::uniform, Link::host},
        BwdCase{"EP2xTP2_top8", kTop8, {2, 2}, {80, 0, 150, 41}},
        BwdCase{"EP4xTP2_host_zipf", kSmallSwiglu, {4, 2}, {20, 40, 60, 80, 100, 0, 7, 130}, RoutingKind::zipf,
                Link::host},
        // A forward with 192-wide tiles in both layers: the backward's launches (no 192) take the planner's.
        BwdCase{"EP4_forward_tile192", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::zipf, Link::device,
                forced(192, 2), forced(192, 4)},
        // Layer 0's 320-wide tile (N0 = 640 at TP 2): the backward's launch 2 (no 320) takes the planner's.
        BwdCase{"TP2_forward_tile320", MoeShape{256, 640, 8, 2, Activation::swiglu}, {1, 2}, {150, 31},
                RoutingKind::zipf, Link::device, forced(320, 2), forced(256, 4)},
        BwdCase{"EP4_tile128", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::uniform, Link::device,
                forced(128, 3, 4, 1), forced(128, 3, 4, 2)},
        BwdCase{"EP4_sequential_schedule", kGelu, {4, 1}, {120, 80, 33, 200}, RoutingKind::zipf, Link::host,
                forced(256, 0), forced(256, 0)},
        // The activation's backward in the epilogue (BackwardOptions::fused_activation): every
        // activation, partial N-blocks (TP 4: F_s = 96), both tiles, top-1 / top-8, a rank without
        // tokens, the sequential schedule.
        with_fused_act(BwdCase{"", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}}, "EP4_zero_token_rank_fused_act"),
        with_fused_act(BwdCase{"", kGelu, {1, 4}, {50, 70, 0, 129}}, "TP4_gelu_fused_act"),
        with_fused_act(BwdCase{"", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
                       "EP4_all_to_one_expert_top1_silu_fused_act"),
        with_fused_act(BwdCase{"", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::uniform, Link::host},
                       "EP8_top8_host_fused_act"),
        with_fused_act(BwdCase{"", kSmallSwiglu, {4, 1}, {120, 80, 33, 200}, RoutingKind::uniform, Link::device,
                               forced(128, 3, 4, 1), forced(128, 3, 4, 2)},
                       "EP4_tile128_fused_act"),
        with_fused_act(BwdCase{"", kGelu, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::host, forced(256, 0),
                               forced(256, 0)},
                       "EP2xTP2_sequential_schedule_fused_act"),
        // The weight gradients from CUTLASS's grouped GEMM: a rank without tokens, experts without rows
        // (M 0 groups, zeroed outputs), a partial N tile (TP 4: F_s = 96), bf16 main grads, top-8.
        with_grouped_wgrad(BwdCase{"", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}}, "EP4_zero_token_rank_grouped_wgrad"),
        with_grouped_wgrad(BwdCase{"", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
                           "EP4_all_to_one_expert_top1_silu_grouped_wgrad"),
        with_grouped_wgrad(BwdCase{"", kGelu, {1, 4}, {50, 70, 0, 129}}, "TP4_gelu_grouped_wgrad"),
        with_grouped_wgrad(BwdCase{"", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::uniform, Link::host,
                                   forced(256, 2), forced(256, 4), GradType::bf16},
                           "EP2xTP2_top8_bf16_grads_grouped_wgrad"),
        with_grouped_wgrad(BwdCase{"", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
                           "EP4_all_to_one_expert_top1_silu_grouped_cooperative_wgrad",
                           WeightGradKernel::grouped_cooperative),
        // 128 x 320 tiles: partial column blocks in both GEMMs (TP 4: F_s = 96), a rank without tokens.
        with_grouped_wgrad(BwdCase{"", kGelu, {1, 4}, {50, 70, 0, 129}}, "TP4_gelu_grouped_320_wgrad",
                           WeightGradKernel::grouped_320),
        // The sequential schedule's GEMMs (forward layer 1, backward launches 2 and 3) as CUTLASS's
        // grouped GEMMs (StandaloneGemm); with the fused activation backward launch 2 keeps ours.
        BwdCase{"EP4_zero_token_rank_grouped_gemms", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform,
                Link::device, with_standalone(forced(256, 0), StandaloneGemm::grouped),
                with_standalone(forced(256, 0), StandaloneGemm::grouped)},
        BwdCase{"EP4_all_to_one_expert_top1_silu_grouped_coop_gemms", kSilu, {4, 1}, {90, 200, 0, 129},
                RoutingKind::one_expert, Link::host, with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative),
                with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative)},
        BwdCase{"TP4_gelu_grouped_gemms", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device,
                with_standalone(forced(128, 0), StandaloneGemm::grouped),
                with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative)},
        BwdCase{"EP2xTP2_top8_bf16_grads_grouped_gemms", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf,
                Link::device, with_standalone(forced(256, 0), StandaloneGemm::grouped_cooperative),
                with_standalone(forced(256, 0), StandaloneGemm::grouped), GradType::bf16},
        // 128 x 160 tiles: partial column blocks (TP 4: F_s = 96 in launch 2), a rank without tokens.
        BwdCase{"TP4_gelu_grouped_160_gemms", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device,
                with_standalone(forced(256, 0), StandaloneGemm::grouped_160),
                with_standalone(forced(256, 0), StandaloneGemm::grouped_160)},
        BwdCase{"EP4_zero_token_rank_top8_grouped_160_gemms", kTop8, {4, 1}, {100, 0, 257, 3}, RoutingKind::zipf,
                Link::host, with_standalone(forced(256, 0), StandaloneGemm::grouped_160),
                with_standalone(forced(128, 0), StandaloneGemm::grouped_160)},
        // 128 x 320 tiles: a partial column block (F_s = 96 in launch 2), experts without rows.
        BwdCase{"TP4_gelu_grouped_320_gemms", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device,
                with_standalone(forced(256, 0), StandaloneGemm::grouped_320),
                with_standalone(forced(256, 0), StandaloneGemm::grouped_320)},
        BwdCase{"EP4_all_to_one_expert_top1_silu_grouped_320_gemms", kSilu, {4, 1}, {90, 200, 0, 129},
                RoutingKind::one_expert, Link::host, with_standalone(forced(256, 0), StandaloneGemm::grouped_320),
                with_standalone(forced(256, 0), StandaloneGemm::grouped_320)},
        with_fused_act(BwdCase{"", kGelu, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::host,
                               with_standalone(forced(256, 0), StandaloneGemm::grouped),
                               with_standalone(forced(256, 0), StandaloneGemm::grouped)},
                       "EP2xTP2_grouped_gemms_fused_act"),
        // cuBLAS's GEMMs (MoeOptions::cublas_backward) in the sequential schedule: a rank without tokens,
        // every token on one expert (experts without rows: zeroed weight gradients), partial tiles (TP 4:
        // F_s = 96), top-8 with bf16 main grads; and with comm blocks beside the data GEMMs (only the
        // weight gradients are cuBLAS's), and with the activation backward in launch 2's epilogue.
        with_cublas(BwdCase{"", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::uniform, Link::device,
                            forced(256, 0), forced(256, 0)},
                    "EP4_zero_token_rank_cublas"),
        with_cublas(BwdCase{"", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert, Link::host, forced(256, 0),
                            forced(256, 0)},
                    "EP4_all_to_one_expert_top1_silu_cublas"),
        with_cublas(BwdCase{"", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform, Link::device, forced(128, 0),
                            forced(256, 0)},
                    "TP4_gelu_cublas"),
        with_cublas(BwdCase{"", kTop8, {8, 1}, {100, 0, 33, 257, 1, 64, 128, 5}, RoutingKind::zipf, Link::host,
                            forced(256, 0), forced(256, 0), GradType::bf16},
                    "EP8_top8_zipf_bf16_grads_cublas"),
        with_cublas(BwdCase{"", kTop8, {2, 2}, {80, 0, 150, 41}}, "EP2xTP2_top8_fused_schedule_cublas"),
        with_cublas(with_fused_act(BwdCase{"", kGelu, {2, 2}, {80, 0, 150, 41}, RoutingKind::zipf, Link::host,
                                           forced(256, 0), forced(256, 0)},
                                   ""),
                    "EP2xTP2_sequential_schedule_fused_act_cublas")),
    [](const ::testing::TestParamInfo<BwdCase>& info) { return std::string(info.param.name); });

// The activation's backward in the epilogue computes dPre and g h with activation_grad's arithmetic on
// D rounded to bf16, so dx, dW0 and dW1 are bitwise the two-pass path's; the gate gradients are the same
// sums in another order (per N-block partials), equal to fp32 rounding.
TEST(FusedBackward, FusedActivationGradIsTheTwoPassResult) {
  const BwdCase cases[] = {
      BwdCase{"swiglu_ep4", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
      BwdCase{"gelu_tp4", kGelu, {1, 4}, {50, 70, 0, 129}},
      BwdCase{"silu_one_expert", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
      BwdCase{"top8_ep2xtp2_tile128", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::uniform, Link::device,
              forced(128, 2), forced(128, 4)},
      BwdCase{"top8_ep2xtp2_tile256", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::uniform, Link::device,
              forced(256, 2), forced(256, 4)},
      BwdCase{"swiglu_w1_tile128_sequential", kSmallSwiglu, {1, 1}, {300}, RoutingKind::uniform, Link::device,
              forced(128, 0), forced(128, 0)},
      BwdCase{"silu_ep4_tile128_sequential", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::uniform, Link::host,
              forced(128, 0), forced(128, 0)},
  };
  for (const BwdCase& two_pass : cases) {
    Harness a(two_pass);
    a.run();
    const auto want = a.gradients();
    Harness b(with_fused_act(two_pass, two_pass.name));
    b.run();
    const auto got = b.gradients();
    EXPECT_TRUE(bitwise_equal(got.dw0, want.dw0)) << two_pass.name << ": dW0";
    EXPECT_TRUE(bitwise_equal(got.dw1, want.dw1)) << two_pass.name << ": dW1";
    for (size_t r = 0; r < want.dx.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(got.dx[r], want.dx[r])) << two_pass.name << ": dx of rank " << r;
      ASSERT_EQ(got.dgates[r].size(), want.dgates[r].size());
      size_t off = 0, first = 0;
      for (size_t i = 0; i < want.dgates[r].size(); ++i)
        if (!(std::fabs(got.dgates[r][i] - want.dgates[r][i]) <= 1e-4f * (1.f + std::fabs(want.dgates[r][i]))) &&
            off++ == 0)
          first = i;
      EXPECT_EQ(off, 0u) << two_pass.name << ": dgates of rank " << r << " differ beyond fp32 reordering, the first at "
                         << first << ": " << got.dgates[r][first] << " against " << want.dgates[r][first];
    }
  }
}

// What the epilogue writes, row by row, against the pass it replaces: after the backward of layer 1,
// dPre (in the pre-activations' buffer) and g h (in the hidden rows) bitwise equal, on both tiles, and
// each row's gate partials summed over its N-blocks equal to the pass's whole-row sum.
TEST(FusedBackward, FusedActivationEpilogueWritesThePassRows) {
  for (int tile : {128, 256}) {
    SCOPED_TRACE(tile);
    BwdCase c{"rows", kSmallSwiglu, {1, 1}, {300}, RoutingKind::uniform, Link::device, forced(tile, 0),
              forced(tile, 0)};
    struct Rows {
      std::vector<uint16_t> pre, hid;
      std::vector<float> partials;
      int blocks = 0;
    };
    auto after_grad_layer1 = [&](bool fused_act) {
      c.fused_act = fused_act;
      Harness h(c);
      h.poison();
      h.fused.forward(h.batches());
      h.moe.stage_grad(0, h.grads[0].grad());
      h.team.barrier();
      h.moe.prepare_grad(0);
      h.moe.grad_layer1(0, LayerMode::fused, forced(tile, 0), fused_act);
      COMET_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(h.moe.last_decision(0, 2).tile_n, tile) << "the backward of layer 1 ran another tile";
      const size_t rows = size_t(h.moe.capacity().max_rows_per_rank);
      const int fs = c.par.ffn_shard(c.shape);
      Rows out;
      out.pre.resize(rows * 2 * fs);
      out.hid.resize(rows * fs);
      out.blocks = h.moe.gate_blocks();
      out.partials.resize(rows * out.blocks);
      COMET_CUDA_CHECK(cudaMemcpy(out.pre.data(), h.moe.pre_activation(0), out.pre.size() * 2, cudaMemcpyDeviceToHost));
      COMET_CUDA_CHECK(cudaMemcpy(out.hid.data(), h.moe.hidden(0), out.hid.size() * 2, cudaMemcpyDeviceToHost));
      COMET_CUDA_CHECK(cudaMemcpy(out.partials.data(), h.moe.gate_partials(0), out.partials.size() * 4,
                                  cudaMemcpyDeviceToHost));
      return out;
    };
    const Rows want = after_grad_layer1(false), got = after_grad_layer1(true);
    const int fs = c.par.ffn_shard(c.shape);
    auto compare = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b, int ld, const char* what) {
      size_t bad = 0, first = 0;
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i] && bad++ == 0) first = i;
      // Where they differ: by 64-column chunk, and the first row tiles (128 rows) with any difference.
      std::vector<size_t> by_chunk((ld + 63) / 64, 0), by_tile(a.size() / ld / 128 + 1, 0);
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) ++by_chunk[(i % ld) / 64], ++by_tile[i / ld / 128];
      std::string where = "; by 64-column chunk:";
      for (size_t x : by_chunk) where += " " + std::to_string(x);
      where += "; by 128-row tile:";
      for (size_t x : by_tile) where += " " + std::to_string(x);
      EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << a.size() << " differ, the first at row " << first / ld
                         << " column " << first % ld << ": " << bf16_to_float(a[first]) << " against "
                         << bf16_to_float(b[first]) << where;
    };
    compare(got.pre, want.pre, 2 * fs, "dPre");
    compare(got.hid, want.hid, fs, "g h");
    const int used = (fs + tile - 1) / tile;
    size_t bad = 0;
    for (size_t row = 0; row < want.partials.size() / want.blocks; ++row) {
      float sum = 0.f;
      for (int b = 0; b < used; ++b) sum += got.partials[row * got.blocks + b];
      const float ref = want.partials[row * want.blocks];
      if (std::isnan(ref)) continue;  // a padding row: the pass leaves its partial as it was
      if (!(std::fabs(sum - ref) <= 1e-4f * (1.f + std::fabs(ref))) && bad++ == 0) {
        std::string parts;
        for (int b = 0; b < used; ++b) parts += " " + std::to_string(got.partials[row * got.blocks + b]);
        ADD_FAILURE() << "gate partials of row " << row << ": " << sum << " against " << ref << " (blocks:" << parts
                      << ")";
      }
    }
    EXPECT_EQ(bad, 0u) << "rows whose gate partials differ";
  }
}

// The two weight-gradient kernels compute each element over the same K order in fp32 and round once:
// the same dW0 and dW1 bit for bit (dx and the gate gradients do not involve them).
TEST(FusedBackward, GroupedWeightGradIsThePersistentResult) {
  const BwdCase cases[] = {
      BwdCase{"swiglu_ep4_f32", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}},
      BwdCase{"silu_one_expert_f32", kSilu, {4, 1}, {90, 200, 0, 129}, RoutingKind::one_expert},
      BwdCase{"top8_ep2xtp2_bf16", kTop8, {2, 2}, {80, 0, 150, 41}, RoutingKind::uniform, Link::device,
              forced(256, 2), forced(256, 4), GradType::bf16},
  };
  for (const BwdCase& persistent : cases) {
    Harness a(persistent);
    a.run();
    const auto want = a.gradients();
    for (WeightGradKernel kernel :
         {WeightGradKernel::grouped, WeightGradKernel::grouped_cooperative, WeightGradKernel::grouped_320}) {
      Harness b(with_grouped_wgrad(persistent, persistent.name, kernel));
      b.run();
      const auto got = b.gradients();
      const std::string which = std::string(" (") + to_string(kernel) + ")";
      EXPECT_TRUE(bitwise_equal(got.dw0, want.dw0)) << persistent.name << which << ": dW0";
      EXPECT_TRUE(bitwise_equal(got.dw1, want.dw1)) << persistent.name << which << ": dW1";
    }
  }
}

// The sequential schedule's GEMMs from CUTLASS's grouped GEMMs (launches 2 and 3, and the forward's
// layer 1) give the fused run's gradients bitwise.
TEST(FusedBackward, StandaloneGemmsGiveTheSameGradients) {
  const BwdCase fused{"swiglu_ep4", kSmallSwiglu, {4, 1}, {100, 0, 257, 3}, RoutingKind::zipf, Link::device};
  Harness a(fused);
  a.run();
  const auto want = a.gradients();
  for (StandaloneGemm g : kStandaloneGemms) {  // CUTLASS's, each against ours
    if (g == StandaloneGemm::comet || !gives_our_bits(g)) continue;
    BwdCase c = fused;
    c.l0 = with_standalone(forced(256, 0), g);
    c.l1 = with_standalone(forced(256, 0), g);
    Harness b(c);
    b.run();
    const auto got = b.gradients();
    EXPECT_TRUE(bitwise_equal(got.dw0, want.dw0)) << to_string(g) << ": dW0";
    EXPECT_TRUE(bitwise_equal(got.dw1, want.dw1)) << to_string(g) << ": dW1";
    for (size_t r = 0; r < want.dx.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(got.dx[r], want.dx[r])) << to_string(g) << ": dx of rank " << r;
      EXPECT_TRUE(bitwise_equal(got.dgates[r], want.dgates[r])) << to_string(g) << ": dgates of rank " << r;
    }
  }
}

// The forward's layer 1 and the backward of layer 0 (launch 3) in the sequential schedule, in one launch
// and in two: the same gradients, bitwise, twice in a row (the shared batch counter resets).
TEST(FusedBackward, OneLaunchSequentialGivesTheSameGradients) {
  const BwdCase base{"top8_ep4", kTop8, {4, 1}, {100, 0, 257, 3}, RoutingKind::zipf, Link::device,
                     forced(256, 0), with_one_launch(forced(256, 0), false)};
  Harness a(base);
  a.run();
  const auto want = a.gradients();
  check_gradients(a);
  BwdCase c = base;
  c.l1 = with_one_launch(forced(256, 0), true);
  Harness b(c);
  for (int repeat = 0; repeat < 2; ++repeat) {
    b.run();
    EXPECT_TRUE(b.moe.last_decision(0, 1).one_launch && b.moe.last_decision(0, 3).one_launch);
    const auto got = b.gradients();
    EXPECT_TRUE(bitwise_equal(got.dw0, want.dw0)) << "dW0, repeat " << repeat;
    EXPECT_TRUE(bitwise_equal(got.dw1, want.dw1)) << "dW1, repeat " << repeat;
    for (size_t r = 0; r < want.dx.size(); ++r) {
      EXPECT_TRUE(bitwise_equal(got.dx[r], want.dx[r])) << "dx of rank " << r << ", repeat " << repeat;
      EXPECT_TRUE(bitwise_equal(got.dgates[r], want.dgates[r])) << "dgates of rank " << r << ", repeat " << repeat;
    }
  }
}

// The same gradients, bitwise, whatever the comm blocks, tiles' grouping and repeats.
TEST(FusedBackward, BitwiseAcrossCommBlocksAndRepeats) {
  for (bool fused_act : {false, true}) {
    BwdCase c{"det", kTop8, {4, 1}, {200, 150, 0, 99}, RoutingKind::uniform, Link::host};
    c.fused_act = fused_act;
    SCOPED_TRACE(fused_act ? "activation backward in the epilogue" : "activation backward as its own pass");
    Harness h(c);
    h.run_steps(forced(256, 2), forced(256, 4));
    const auto first = h.gradients();
    check_gradients(h);
    for (int n_comm : {1, 8, 32, 0}) {
      h.run_steps(forced(256, n_comm, 2, 1), forced(256, n_comm, 3, 2));
      const auto got = h.gradients();
      for (int r = 0; r < 4; ++r) {
        EXPECT_TRUE(bitwise_equal(got.dx[r], first.dx[r])) << "dx, n_comm " << n_comm << " rank " << r;
        EXPECT_TRUE(bitwise_equal(got.dgates[r], first.dgates[r])) << "dgates, n_comm " << n_comm << " rank " << r;
      }
      EXPECT_TRUE(bitwise_equal(got.dw0, first.dw0)) << "dW0, n_comm " << n_comm;
      EXPECT_TRUE(bitwise_equal(got.dw1, first.dw1)) << "dW1, n_comm " << n_comm;
    }
    h.run();
    const auto again = h.gradients();
    EXPECT_TRUE(bitwise_equal(again.dw0, first.dw0) && bitwise_equal(again.dw1, first.dw1) && bitwise_equal(again.dx[0], first.dx[0]));
  }
}

// accumulate adds into the caller's gradients: two backwards of two identical forwards give twice one,
// exactly in fp32 and in bf16 too (the sum x + bf16(x) is formed in fp32 and rounded once, and x lies
// within a quarter ulp of 2 bf16(x) from it, so it rounds to 2 bf16(x)). (Partial tiles of the weight
// gradients, in M and N, are in MatchesReference: TP4_gelu, EP4_all_to_one_expert_top1_silu.)
TEST(FusedBackward, AccumulateAddsToMainGrads) {
  for (WeightGradKernel kernel :
       {WeightGradKernel::persistent, WeightGradKernel::grouped, WeightGradKernel::grouped_cooperative,
        WeightGradKernel::grouped_320})
  for (GradType type : {GradType::f32, GradType::bf16}) {
    BwdCase c{"acc", kSmallSwiglu, {2, 1}, {100, 60}};
    c.grad_type = type;
    c.wgrad = kernel;
    Harness h(c);
    h.run();
    const auto once = h.gradients();
    h.fused.forward(h.batches());
    h.fused.backward(h.grad_list(), nullptr, BackwardOptions{type, true, false, kernel});
    h.fused.sync_and_check();
    const auto twice = h.gradients();
    const std::string name = std::string(type == GradType::f32 ? "f32" : "bf16") + ", " + to_string(kernel);
    for (size_t i = 0; i < once.dw0.size(); ++i)
      ASSERT_EQ(twice.dw0[i], 2 * once.dw0[i]) << name << " dW0 element " << i;
    for (size_t i = 0; i < once.dw1.size(); ++i)
      ASSERT_EQ(twice.dw1[i], 2 * once.dw1[i]) << name << " dW1 element " << i;
  }
}

// cuBLAS's backward GEMMs (MoeOptions::cublas_backward) give the same bits every run, and add into main
// grads: twice one backward, to fp32 rounding (cuBLAS may take another algorithm with beta 1, so not
// bit for bit) or one bf16 ulp.
TEST(FusedBackward, CublasBackwardIsRepeatableAndAccumulates) {
  for (GradType type : {GradType::f32, GradType::bf16}) {
    BwdCase c = with_cublas(BwdCase{"", kTop8, {4, 1}, {200, 150, 0, 99}, RoutingKind::uniform, Link::host,
                                    forced(256, 0), forced(256, 0), type},
                            "cublas");
    Harness h(c);
    h.run();
    check_gradients(h);
    const auto once = h.gradients();
    h.run();
    const auto again = h.gradients();
    for (int r = 0; r < 4; ++r) EXPECT_TRUE(bitwise_equal(again.dx[r], once.dx[r])) << "dx rank " << r;
    EXPECT_TRUE(bitwise_equal(again.dw0, once.dw0) && bitwise_equal(again.dw1, once.dw1));
    h.fused.forward(h.batches());
    h.fused.backward(h.grad_list(), nullptr, BackwardOptions{type, true, false, WeightGradKernel::automatic});
    h.fused.sync_and_check();
    const auto twice = h.gradients();
    const float rel = type == GradType::f32 ? 1e-5f : 1.f / 128;
    auto near = [rel](float got, float want) { return std::abs(got - want) <= rel * std::abs(want) + 1e-6f; };
    for (size_t i = 0; i < once.dw0.size(); ++i)
      ASSERT_TRUE(near(twice.dw0[i], 2 * once.dw0[i])) << "dW0 element " << i << ": " << twice.dw0[i] << " against 2 x " << once.dw0[i];
    for (size_t i = 0; i < once.dw1.size(); ++i)
      ASSERT_TRUE(near(twice.dw1[i], 2 * once.dw1[i])) << "dW1 element " << i << ": " << twice.dw1[i] << " against 2 x " << once.dw1[i];
  }
}

// MoeOptions::check_schedule in training: the backward's two launches (and the forward's) alternate the
// planner's fused pick with the sequential schedule until each has a verdict (the backward of layer 0
// timed with the weight gradients beside or after it); every step's gradients against the CPU reference.
TEST(FusedBackward, ScheduleCheckTimesTheBackwardsLaunchesAndStaysRight) {
  BwdCase c{"EP4_host_check_schedule", kSmallSwiglu, {4, 1}, {300, 0, 257, 129}, RoutingKind::uniform, Link::host,
            LayerRequest{}, LayerRequest{}};
  c.check_schedule = true;
  LocalTeam probe_team(c.par.world(), c.link);  // the table's keys: this layer's on this GPU
  c.tune_table = fused_picks_table(probe_team, c.shape, c.par, c.tokens);
  Harness h(c);
  h.run();
  for (int launch : {2, 3})
    ASSERT_EQ(h.moe.decision(launch, 0, LayerMode::fused, LayerRequest{}).schedule, Schedule::fused)
        << "launch " << launch << ": the planner's pick must be a fused split for the check to act";
  check_gradients(h);
  std::set<Schedule> seen[2];
  auto decided = [&] {
    return h.moe.schedule_verdict(0, 2, c.tokens[0]).has_value() && h.moe.schedule_verdict(0, 3, c.tokens[0]).has_value();
  };
  int steps = 1;
  for (; steps < 40 && !decided(); ++steps) {
    h.run();
    check_gradients(h);
    for (int launch : {2, 3}) seen[launch - 2].insert(h.moe.last_decision(0, launch).schedule);
  }
  ASSERT_TRUE(decided()) << "no verdict for the backward's launches after " << steps << " steps";
  for (int launch : {2, 3}) {
    EXPECT_EQ(seen[launch - 2].size(), 2u) << "launch " << launch << " ran only one schedule while checking";
    const auto m = h.moe.schedule_medians(0, launch, c.tokens[0]);
    ASSERT_TRUE(m.has_value());
    std::printf("launch %d: pick %.3f ms, sequential %.3f ms\n", launch, m->first, m->second);
  }
  h.run();
  check_gradients(h);
  for (int launch : {2, 3})
    EXPECT_EQ(h.moe.last_decision(0, launch).schedule,
              *h.moe.schedule_verdict(0, launch, c.tokens[0]) == ScheduleArm::pick ? Schedule::fused
                                                                                   : Schedule::sequential)
        << "launch " << launch;
}

// A table's StandaloneGemm::cublas picks for layer 1 and the backward's two launches (the sequential
// schedule with cuBLAS per expert, the rows read back after the forward's plan build), the weight
// gradients left to the rule (our kernels on these shapes): gradients against the CPU reference, the
// same bits on a second step, and each launch reporting that cuBLAS ran.
TEST(FusedBackward, TableCublasPicksMatchTheReference) {
  for (BwdCase c : {BwdCase{"EP4_zero_token_rank_cublas_picks", kSmallSwiglu, {4, 1}, {100, 0, 257, 3},
                            RoutingKind::uniform, Link::device, LayerRequest{}, LayerRequest{}},
                    BwdCase{"TP4_gelu_cublas_picks", kGelu, {1, 4}, {50, 70, 0, 129}, RoutingKind::uniform,
                            Link::host, LayerRequest{}, LayerRequest{}}}) {
    SCOPED_TRACE(c.name);
    c.wgrad = WeightGradKernel::automatic;
    LocalTeam probe_team(c.par.world(), c.link);  // the table's keys: this layer's on this GPU
    c.tune_table = cublas_picks_table(probe_team, c.shape, c.par, c.tokens);
    Harness h(c);
    h.run();
    check_gradients(h);
    for (int r = 0; r < c.par.world(); ++r)
      for (int launch : {1, 2, 3}) {
        const StandaloneGemm ran = h.moe.last_decision(r, launch).standalone_gemm;
        EXPECT_EQ(ran, StandaloneGemm::cublas) << "rank " << r << " launch " << launch << " ran " << to_string(ran);
      }
    const auto once = h.gradients();
    h.run();
    const auto again = h.gradients();
    EXPECT_TRUE(bitwise_equal(again.dw0, once.dw0) && bitwise_equal(again.dw1, once.dw1));
    for (int r = 0; r < c.par.world(); ++r) {
      EXPECT_TRUE(bitwise_equal(again.dx[r], once.dx[r])) << "dx rank " << r;
      EXPECT_TRUE(bitwise_equal(again.dgates[r], once.dgates[r])) << "dgates rank " << r;
    }
  }
}

TEST(FusedBackward, RefusesWithoutASavedForward) {
  BwdCase c{"refuse", kSmallSwiglu, {2, 1}, {40, 50}};
  Harness h(c);
  // No forward yet.
  expect_invalid([&] { h.fused.backward(h.grad_list()); }, "no forward to differentiate");
  h.run();
  // The forward was consumed by the first backward.
  expect_invalid([&] { h.fused.backward(h.grad_list()); }, "no forward to differentiate");
  // A layer built for inference.
  MoeOptions o;
  FusedMoe inference(h.team, c.shape, c.par, MoeCapacity{h.problem.max_tokens(), 0}, o);
  for (int r = 0; r < 2; ++r) inference.set_weights(r, h.ranks[r]->w0.get(), h.ranks[r]->w1.get());
  inference.forward(h.batches());
  expect_invalid([&] { inference.backward(h.grad_list()); }, "without MoeOptions::training");
  // A null gradient pointer.
  h.fused.forward(h.batches());
  auto bad = h.grad_list();
  bad[1].dw0 = nullptr;
  expect_invalid([&] { h.fused.backward(bad); }, "null dw0/dw1");
}

}  // namespace
