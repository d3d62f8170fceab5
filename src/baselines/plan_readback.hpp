// What the chunked baseline's host code reads back from a rank's device plan, once per routing (setup):
// a synchronisation of the rank's stream. It raises DeviceReportedError when the plan recorded bad
// routing, so the baseline never runs GEMMs over an empty or partial layout. (The sequential baseline
// reads per-expert rows only: HostPlanCounts::read, src/ops/host_plan_counts.hpp.)
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "comet/plan.hpp"

namespace comet::baselines {

// Everything the chunked pipeline lays its stages out from.
struct ChunkInputs {
  std::vector<int> segment_offset, segment_rows;  // [E_l * W]
  std::vector<int> unit_src;                      // [num_units]
};

// Status, segments and the source of every unit; synchronises `stream` (twice). Raises
// DeviceReportedError where the plan recorded bad routing.
ChunkInputs read_chunk_inputs(const PlanView& plan, int world, int local_experts, int num_experts, cudaStream_t stream);

}  // namespace comet::baselines
