// What the baselines' host code reads back from a rank's device plan. Reading is a synchronisation of
// the rank's stream: the sequential baseline does it every call (as Megatron reads tokens_per_expert),
// the chunked one once per routing (setup). Both raise DeviceReportedError when the plan recorded bad
// routing, so a baseline never runs GEMMs over an empty or partial layout.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "comet/plan.hpp"

namespace comet::baselines {

// Per-expert rows and segment offsets of one rank's gathered buffer.
struct ExpertCounts {
  std::vector<int> rows;    // [E_l]
  std::vector<int> offset;  // [E_l + 1]
};

// Everything the chunked pipeline lays its stages out from.
struct ChunkInputs {
  std::vector<int> segment_offset, segment_rows;  // [E_l * W]
  std::vector<int> unit_src;                      // [num_units]
};

// Pinned host words for the per-call read (small, reused: callers read one plan at a time per reader).
class PlanReader {
 public:
  explicit PlanReader(int local_experts);
  ~PlanReader();
  PlanReader(const PlanReader&) = delete;
  PlanReader& operator=(const PlanReader&) = delete;

  // Status, expert_rows and expert_offset; synchronises `stream`.
  ExpertCounts read_counts(const PlanView& plan, int num_experts, cudaStream_t stream);
  // Status, segments and the source of every unit; synchronises `stream` (twice).
  ChunkInputs read_chunk_inputs(const PlanView& plan, int world, int num_experts, cudaStream_t stream);

 private:
  int local_experts_;
  int32_t* words_ = nullptr;  // [kPlanStatusWords + 2 E_l + 1]
};

}  // namespace comet::baselines
