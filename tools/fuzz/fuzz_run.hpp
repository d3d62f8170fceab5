// Runs comet-fuzz's families on the GPU: one LocalTeam and one FusedMoe per family, then its batches,
// each from poisoned buffers, each checked against the CPU reference (forward and, for training
// families, every gradient) or, for a faulty batch, against the answer the fault must get.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/reference.hpp"
#include "harness/device_buffer.hpp"
#include "tools/fuzz/fuzz_draw.hpp"

namespace comet::fuzz {

struct Outcome {
  std::string mismatch;          // empty: the layer answered right
  bool checked_backward = false;  // the batch ran a backward and its gradients were checked
  bool refused = false;           // the layer refused the batch (a fault, or rows over a tight capacity)
  uint64_t output_hash = 0;       // FNV-1a of every rank's output bits (a batch that ran)
  bool ok() const { return mismatch.empty(); }
};

class FamilyRun {
 public:
  // timeout_s bounds every wait of the layer's kernels: a hang is reported, never waited out.
  explicit FamilyRun(const Family& family, double timeout_s = 10.0);
  ~FamilyRun();

  // One batch: draw its inputs, run it, check it. `check` false runs it without the reference (soak).
  Outcome run(const Batch& batch, bool check = true);

  FusedMoe& layer() { return *fused_; }
  Team& team() { return *team_; }

 private:
  struct RankBuffers;
  Family f_;
  std::unique_ptr<Team> team_;
  std::unique_ptr<FusedMoe> fused_;
  reference::ExpertWeights<float> weights_;  // full weights [E][w0_rows][H], [E][H][F]
  std::vector<std::unique_ptr<RankBuffers>> ranks_;
};

}  // namespace comet::fuzz
