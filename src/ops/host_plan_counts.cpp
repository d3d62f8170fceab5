#include "ops/host_plan_counts.hpp"

#include <limits>

#include "comet/cuda_check.hpp"
#include "ops/stream_capture.hpp"

namespace comet {

HostPlanCounts::~HostPlanCounts() {
  if (ready_) cudaEventDestroy(ready_);
  if (words_) cudaFreeHost(words_);
}

void HostPlanCounts::read_async(const PlanView& plan, int local_experts, cudaStream_t stream) {
  pending_ = false;
  if (stream_capturing(stream)) return;
  if (!words_ || local_experts != local_experts_) {
    if (words_) COMET_CUDA_CHECK(cudaFreeHost(words_));
    words_ = nullptr;
    COMET_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&words_),
                                    sizeof(int32_t) * (kPlanStatusWords + 2 * size_t(local_experts) + 1)));
    local_experts_ = local_experts;
  }
  if (!ready_) COMET_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  int32_t* rows = words_ + kPlanStatusWords;
  const auto d2h = cudaMemcpyDeviceToHost;
  COMET_CUDA_CHECK(cudaMemcpyAsync(words_, plan.status, sizeof(int32_t) * kPlanStatusWords, d2h, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(rows, plan.expert_rows, sizeof(int32_t) * local_experts, d2h, stream));
  COMET_CUDA_CHECK(cudaMemcpyAsync(rows + local_experts, plan.expert_offset, sizeof(int32_t) * (local_experts + 1),
                                   d2h, stream));
  COMET_CUDA_CHECK(cudaEventRecord(ready_, stream));
  pending_ = true;
}

bool HostPlanCounts::wait(int rows_cap, ExpertRows& out) const {
  if (!pending_) return false;
  COMET_CUDA_CHECK(cudaEventSynchronize(ready_));
  if (words_[0] != 0) return false;  // the plan recorded bad routing: the device-shaped path reports it
  const int el = local_experts_;
  const int32_t* rows = words_ + kPlanStatusWords;
  const int32_t* offset = rows + el;
  out.rows.assign(rows, rows + el);
  out.offset.assign(offset, offset + el + 1);
  for (int e = 0; e < el; ++e)
    if (rows[e] < 0 || offset[e] < 0 || offset[e] + rows[e] > offset[e + 1] || offset[e + 1] > rows_cap) return false;
  return true;
}

ExpertRows HostPlanCounts::read(const PlanView& plan, int local_experts, int num_experts, cudaStream_t stream) {
  read_async(plan, local_experts, stream);
  COMET_REQUIRE(pending_, "the plan's expert rows are read on the host, which a CUDA graph capture cannot hold");
  ExpertRows out;
  if (!wait(std::numeric_limits<int>::max(), out)) {
    if (words_[0] != 0) throw DeviceReportedError(describe_plan_error(words_, num_experts));
    throw DeviceReportedError("the plan's expert rows / offsets are inconsistent");
  }
  return out;
}

}  // namespace comet
