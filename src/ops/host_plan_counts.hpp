// A rank's per-expert rows as the host knows them, read back from its device plan (which keeps them on
// the device). Two readers: the fused backward's cuBLAS GEMMs (MoeOptions::cublas_backward), which start
// the copy right after the forward's plan build and wait for it in the backward, and the sequential
// baseline, which reads them every call (a synchronisation, as Megatron reads tokens_per_expert).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "comet/plan.hpp"

namespace comet {

// Each local expert's rows and first row in a rank's gathered buffer.
struct ExpertRows {
  std::vector<int> rows;    // [E_l]
  std::vector<int> offset;  // [E_l + 1]
};

// The plan's status words and per-expert rows / offsets, copied to pinned host memory.
class HostPlanCounts {
 public:
  HostPlanCounts() = default;
  ~HostPlanCounts();
  HostPlanCounts(const HostPlanCounts&) = delete;
  HostPlanCounts& operator=(const HostPlanCounts&) = delete;

  // Enqueues the copy of `plan`'s words on `stream`; none while the stream captures a graph (a capture
  // may not wait on the host, so the backward then runs the device-shaped kernels).
  void read_async(const PlanView& plan, int local_experts, cudaStream_t stream);
  // Waits for the last copy. False where none was enqueued, the plan recorded an error or the counts do
  // not fit `rows_cap` rows: the device-shaped kernels then run (and the error is reported as usual).
  bool wait(int rows_cap, ExpertRows& out) const;
  // Whether a copy was enqueued since the last clear (wait may be called for it, any number of times).
  bool pending() const { return pending_; }
  // Forgets the last copy (a new plan was built and not read).
  void clear() { pending_ = false; }
  // read_async + wait: throws DeviceReportedError where the plan recorded bad routing, InvalidArgument
  // under graph capture (a host read cannot be captured).
  ExpertRows read(const PlanView& plan, int local_experts, int num_experts, cudaStream_t stream);

 private:
  int32_t* words_ = nullptr;  // [kPlanStatusWords + 2 E_l + 1] pinned
  int local_experts_ = 0;
  cudaEvent_t ready_ = nullptr;
  bool pending_ = false;
};

}  // namespace comet
