// A fused layer on a team with a random problem's data on the device, for GPU tests that drive it
// through the public API (FusedMoe) and check it against the CPU reference.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "harness/moe_problem.hpp"
#include "ops/moe_engine.hpp"
#include "support/layer_checks.hpp"

namespace comet::testing {

// One layer on a team, with its problem's data on the device: run from poisoned buffers, checked
// against the CPU reference.
struct TestLayer {
  MoeProblem problem;
  FusedMoe fused;
  std::vector<std::unique_ptr<DeviceRank>> ranks;

  // capacity: max_tokens_per_rank 0 takes the problem's largest token count.
  TestLayer(Team& team, const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens, RoutingKind kind,
            uint64_t seed, const MoeOptions& options = {}, MoeCapacity capacity = {})
      : problem(MoeProblem::make(shape, par, tokens, kind, seed)),
        fused(team, shape, par, with_tokens(capacity, problem.max_tokens()), options) {
    for (int r = 0; r < par.world(); ++r) {
      ranks.push_back(upload_rank(problem, r));
      fused.set_weights(r, ranks[r]->w0.get(), ranks[r]->w1.get());
    }
  }
  static MoeCapacity with_tokens(MoeCapacity c, int tokens) {
    if (c.max_tokens_per_rank == 0) c.max_tokens_per_rank = tokens;
    return c;
  }
  std::vector<RankBatch> batches() const {
    std::vector<RankBatch> b;
    for (const auto& r : ranks) b.push_back(r->batch());
    return b;
  }
  void poison() {
    for (const auto& r : ranks) {
      fused.engine().poison_buffers(r->rank);
      r->out.fill_bytes(0xFF);
    }
  }
  void forward(cudaStream_t stream = nullptr) {
    poison();
    fused.forward(batches(), stream);
    fused.sync_and_check();
  }
  std::vector<std::vector<float>> outputs() const {
    std::vector<std::vector<float>> o;
    for (const auto& r : ranks) o.push_back(r->output());
    return o;
  }
  void expect_right(const std::string& what) const {
    const auto ref = reference::forward(problem.shape, problem.par, problem.weights, problem.inputs);
    expect_outputs_match(problem, ref, outputs(), what);
  }
};

}  // namespace comet::testing
