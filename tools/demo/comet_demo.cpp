// comet's main job in one program: the MoE layer on whatever hardware is here.
//   no GPU:  the CPU reference of the distributed layer at a small Mixtral-like shape (8 ranks, EP 4 x
//            TP 2): every rank's routing plan and a checksum of every rank's output.
//   a GPU:   the same problem through the fused layer on 8 virtual ranks (LocalTeam, link=host), forward
//            and backward, checked against the CPU reference (scripts/run then times the quick benchmark).
// Both print the backward too: the gradients of sum <dout, out> for a random dout.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/plan.hpp"
#include "comet/reference.hpp"
#include "comet/version.hpp"
#include "comet/weight_layout.hpp"
#include "harness/gpu_presence.hpp"
#include "harness/moe_problem.hpp"

using namespace comet;
using namespace comet::testing;

namespace {

const MoeShape kDemoShape{512, 1792, 8, 2, Activation::swiglu};  // Mixtral-8x7B's E, k, ratio F/H; smaller
const Parallel kDemoLayout{4, 2};
const std::vector<int> kDemoTokens{64, 48, 80, 0, 64, 33, 64, 127};  // uneven, one rank without tokens

double checksum(const std::vector<float>& v) {
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += v[i] * double(1 + i % 7);
  return s;
}

void print_plans(const MoeProblem& p) {
  const auto routing = [&] {
    std::vector<RoutingView> v;
    for (const auto& in : p.inputs) v.push_back(RoutingView{in.tokens, in.ids.data(), in.gates.data()});
    return v;
  }();
  std::printf("routing plans (tile_m 128):\n  rank  rows/expert        units(local+remote)  rows(padded)  tiles  order\n");
  for (int r = 0; r < p.par.world(); ++r) {
    PlanConfig cfg{p.shape, p.par, r, 128, PlanCapacity{p.max_tokens(), 8192}};
    const HostPlan plan = build_plan_host(cfg, routing);
    const PlanView& v = plan.view();
    std::string rows, order;
    for (int e = 0; e < cfg.local_experts(); ++e) rows += std::to_string(v.expert_rows[e]) + " ";
    for (int i = 0; i < *v.num_tiles; ++i) order += std::to_string(v.tile_order[i]) + " ";
    std::printf("  %4d  %-18s %5d = %3d + %-5d   %5d        %3d    %s\n", r, rows.c_str(), *v.num_units,
                *v.num_local_units, *v.num_units - *v.num_local_units, v.expert_offset[cfg.local_experts()],
                *v.num_tiles, order.c_str());
  }
}

// The output gradients of the demo's backward, per rank [T][H] (bf16 values).
std::vector<std::vector<float>> demo_douts(const MoeProblem& p) {
  std::vector<std::vector<float>> d;
  for (int r = 0; r < p.par.world(); ++r)
    d.push_back(random_bf16_values(size_t(p.inputs[r].tokens) * p.shape.hidden, 1.0f, 7000 + r));
  return d;
}

int run_cpu(const MoeProblem& p) {
  const auto out = reference::forward(p.shape, p.par, p.weights, p.inputs);
  std::printf("CPU reference output checksums:\n");
  for (size_t r = 0; r < out.size(); ++r) std::printf("  rank %zu: %4d tokens  checksum %+.6f\n", r, p.inputs[r].tokens, checksum(out[r]));
  const auto g = reference::backward(p.shape, p.par, p.weights, p.inputs, demo_douts(p));
  std::printf("CPU reference backward checksums: dW0 %+.6f  dW1 %+.6f\n", checksum(g.dw0), checksum(g.dw1));
  for (size_t r = 0; r < g.dx.size(); ++r)
    std::printf("  rank %zu: dx %+.6f  dgates %+.6f\n", r, checksum(g.dx[r]), checksum(g.dgates[r]));
  return 0;
}

// The fused backward of the last forward against reference::backward; returns the mismatches.
int check_backward(const MoeProblem& p, FusedMoe& moe) {
  const int W = p.par.world(), H = p.shape.hidden, k = p.shape.topk;
  const int El = p.par.local_experts(p.shape), Fs = p.par.ffn_shard(p.shape), n0 = p.shape.w0_rows() / p.par.tp;
  const auto dout = demo_douts(p);
  std::vector<DeviceBuffer> d_out, dx, dgates, dw0, dw1;
  std::vector<RankGrad> grads;
  for (int r = 0; r < W; ++r) {
    const int T = p.inputs[r].tokens;
    d_out.emplace_back(to_bf16(dout[r]));
    dx.emplace_back(std::max<size_t>(size_t(T) * H * 2, 16));
    dgates.emplace_back(std::max<size_t>(size_t(T) * k * 4, 16));
    dw0.emplace_back(size_t(El) * n0 * H * 4);
    dw1.emplace_back(size_t(El) * H * Fs * 4);
  }
  for (int r = 0; r < W; ++r)
    grads.push_back(RankGrad{d_out[r].get(), dx[r].get(), dgates[r].as<float>(), dw0[r].get(), dw1[r].get()});
  moe.backward(grads, nullptr, BackwardOptions{GradType::f32, false});
  moe.sync_and_check();
  const auto ref = reference::backward(p.shape, p.par, p.weights, p.inputs, dout);
  std::vector<float> w0(ref.dw0.size(), 0.f), w1(ref.dw1.size(), 0.f);
  int bad = 0;
  for (int r = 0; r < W; ++r) {
    unshard_add_w0(p.shape, p.par, r, dw0[r].download<float>(size_t(El) * n0 * H), w0);
    unshard_add_w1(p.shape, p.par, r, dw1[r].download<float>(size_t(El) * H * Fs), w1);
    const int T = p.inputs[r].tokens;
    if (T == 0) continue;
    std::vector<float> x(size_t(T) * H);
    const auto bits = dx[r].download<bf16_bits>(x.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(bits[i]);
    const double ex = relative_error(x, ref.dx[r]), eg = relative_error(dgates[r].download<float>(size_t(T) * k), ref.dgates[r]);
    bad += !(ex < 2e-2) + !(eg < 2e-2);
    std::printf("  rank %d: dx relative error %.2e, dgates %.2e\n", r, ex, eg);
  }
  const double e0 = relative_error(w0, ref.dw0), e1 = relative_error(w1, ref.dw1);
  bad += !(e0 < 2e-2) + !(e1 < 2e-2);
  std::printf("  dW0 relative error %.2e, dW1 %.2e\n", e0, e1);
  return bad;
}

int run_gpu(const MoeProblem& p) {
  const int W = p.par.world();
  LocalTeam team(W, Link::host);
  MoeOptions options;
  options.training = true;  // the demo runs the backward too
  FusedMoe moe(team, p.shape, p.par, MoeCapacity{p.max_tokens(), 0}, options);
  std::vector<std::unique_ptr<DeviceRank>> ranks;
  std::vector<RankBatch> batches;
  for (int r = 0; r < W; ++r) {
    ranks.push_back(upload_rank(p, r));
    moe.set_weights(r, ranks[r]->w0.get(), ranks[r]->w1.get());
    batches.push_back(ranks[r]->batch());
  }
  moe.forward(batches);
  moe.sync_and_check();
  const auto ref = reference::forward(p.shape, p.par, p.weights, p.inputs);
  std::printf("fused layer on %d virtual ranks (link=host) vs CPU reference:\n", W);
  int bad = 0;
  for (int r = 0; r < W; ++r) {
    const auto got = ranks[r]->output();
    const double err = relative_error(got, ref[r]);
    bad += !(err < 1.5e-2);
    std::printf("  rank %d: %4d tokens  checksum %+.6f (reference %+.6f)  relative error %.2e\n", r, p.inputs[r].tokens,
                checksum(got), checksum(ref[r]), err);
  }
  std::printf("fused backward (the gradients of sum <dout, out>) vs CPU reference:\n");
  bad += check_backward(p, moe);
  std::printf("%s\n", bad ? "MISMATCH against the reference" : "all ranks match the reference, forward and backward");
  return bad ? 1 : 0;
}

}  // namespace

int main() {
  std::printf("comet %s: fused MoE layer demo\n", version());
  const MoeProblem p = MoeProblem::make(kDemoShape, kDemoLayout, kDemoTokens, RoutingKind::uniform, 2026);
  std::printf("shape: H %d, F %d, E %d, top-%d, SwiGLU; %d ranks = EP %d x TP %d; tokens per rank:", kDemoShape.hidden,
              kDemoShape.ffn, kDemoShape.num_experts, kDemoShape.topk, kDemoLayout.world(), kDemoLayout.ep,
              kDemoLayout.tp);
  for (int t : kDemoTokens) std::printf(" %d", t);
  std::printf("\n");
  print_plans(p);
  if (!has_gpu()) {
    std::printf("no GPU here: running the CPU reference\n");
    return run_cpu(p);
  }
  return run_gpu(p);
}
