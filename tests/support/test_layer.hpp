// A fused layer on a team with a random problem's data on the device, for GPU tests that drive it
// through the public API (FusedMoe) and check it against the CPU reference.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
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

// A tuner table whose entries give `launches` of a layer of this shape the variant `v` at each of these
// token counts, for tests that need the planner's pick whatever the cost model would pick on the GPU
// they run on. Saved to a file of its own; returns its path (MoeOptions::tune_table).
inline std::string picks_table(Team& team, const MoeShape& shape, const Parallel& par, const std::vector<int>& tokens,
                               const LayerVariant& v, const std::vector<int>& launches) {
  MoeOptions o;
  o.training = true;  // the backward's launches have keys too
  const int most = std::max(1, *std::max_element(tokens.begin(), tokens.end()));
  FusedMoe probe(team, shape, par, MoeCapacity{most, 0}, o);
  TuneTable table;
  for (int t : std::set<int>(tokens.begin(), tokens.end()))
    for (int launch : launches) table.put(probe.engine().planner().key(launch, std::max(1, t)), TuneEntry{v, 1.0});
  static int made = 0;
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("comet_picks_" + std::to_string(getpid()) + "_" + std::to_string(made++) + ".json"))
                               .string();
  table.save(path);
  return path;
}

// Every launch (0-3) a fused split (tile 256, n_comm 8).
inline std::string fused_picks_table(Team& team, const MoeShape& shape, const Parallel& par,
                                     const std::vector<int>& tokens) {
  return picks_table(team, shape, par, tokens, LayerVariant{256, 8, 0, 1}, {0, 1, 2, 3});
}

// Launches 1-3 the sequential schedule with cuBLAS's GEMM (StandaloneGemm::cublas).
inline std::string cublas_picks_table(Team& team, const MoeShape& shape, const Parallel& par,
                                      const std::vector<int>& tokens) {
  LayerVariant v{256, 0, 0, 1};
  v.standalone_gemm = StandaloneGemm::cublas;
  return picks_table(team, shape, par, tokens, v, {1, 2, 3});
}

}  // namespace comet::testing
